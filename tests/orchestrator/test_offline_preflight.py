"""A sweep's preflight stays offline and names each missing thing once (issue: a check of a sweep
over hub models that took 50 s of hub retries offline and repeated the same data per model)."""

import os
import socket
import threading

from tests.conftest import REPO, run_cli


class Listener:
    """A local 'hub' that counts the connections made to it and answers none of them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self.sock.close()


def test_sweep_check_over_hub_models_never_contacts_the_hub_and_lists_each_missing_item_once(tmp_path):
    hub = Listener()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{hub.port}", HF_HOME=str(tmp_path / "hf"))
    try:
        done = run_cli(["sweep", str(REPO / "sweeps/repro/pica_real.py"), "--check"], tmp_path, env=env)
    finally:
        hub.close()
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert hub.connections == 0, f"{hub.connections} connections to the hub during the check"
    assert "Retrying" not in out
    # Two base models x two tasks (plus an eval set): each missing model and file named once, one per line.
    items = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("- ")]
    assert len(items) == len(set(items)) >= 5, done.stdout
    assert sum("google/gemma-2b" in i for i in items) == 1 and sum("gsm8k" in i for i in items) == 1, items
