"""`ladder ui`: its start-up time and memory, and a screenshot of a sweep in a real browser.

Runs a 6-trial median-rule sweep of the synthetic `curves` workload in a new folder (about a
minute on 2 cores; or pass --store-dir, a folder whose mlruns.db holds a sweep already), starts
`ladder ui` there, measures the seconds until the server answers /health and the processes and
resident memory it holds, then takes a headless Chromium screenshot of the sweep's experiment
page in MLflow's model-training view.

    .venv/bin/python benchmarks/ui.py OUTDIR [--store-dir DIR] [--experiment NAME]

Needs Chromium (Debian: `apt-get install chromium`); not part of `make test`. Writes
OUTDIR/ui.json (the numbers) and OUTDIR/sweep.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LADDER = [sys.executable, "-m", "orchestrator.commands.cli"]
SWEEP = """
from orchestrator.sweep import Sweep
sweep = Sweep(name="{name}", workload="curves", base="smoke",
              overrides={{"steps": 100, "report_every": 5, "checkpoint_every": 50}},
              points=tuple({{"lr": lr}} for lr in (1e-2, 2e-2, 5e-3, 5e-2, 2e-3, 1e-1)),
              scheduler="median", scheduler_options={{"grace_period": 0.2}}, objective=("eval/loss", "min"))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_memory(pgid: int) -> tuple[int, float]:
    """Processes in the process group and their summed resident memory (MiB), from ps."""
    out = subprocess.run(["ps", "-e", "-o", "pgid=,rss="], capture_output=True, text=True, check=True).stdout
    rss = [int(r) for g, r in (line.split() for line in out.splitlines()) if int(g) == pgid]
    return len(rss), sum(rss) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--store-dir", type=Path, help="folder with an mlruns.db holding a sweep (default: run one)")
    parser.add_argument("--experiment", default="ui_demo", help="the sweep's experiment; default ui_demo")
    parser.add_argument("--wait", type=float, default=20.0, help="seconds the page may take to draw; default 20")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        sys.exit("benchmarks/ui.py: no Chromium found: install it (Debian: apt-get install chromium)")
    args.outdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    env.pop("MLFLOW_TRACKING_URI", None)
    work = args.store_dir or Path(tempfile.mkdtemp(prefix="ladder-ui-"))
    if args.store_dir is None:
        (work / "sweep.py").write_text(SWEEP.format(name=args.experiment))
        subprocess.run(LADDER + ["sweep", "sweep.py"], cwd=work, env=env, check=True)
    from orchestrator.tracking import sink as tracking

    client = tracking.client(f"sqlite:///{work.resolve() / tracking.DEFAULT_DB}")
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        sys.exit(f"benchmarks/ui.py: no experiment {args.experiment!r} in {work}/mlruns.db: name one with --experiment")

    port = free_port()
    started = time.monotonic()
    server = subprocess.Popen(LADDER + ["ui", "--port", str(port)], cwd=work, env=env, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read() == b"OK":
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() - started > 180:
                    sys.exit(f"benchmarks/ui.py: ladder ui did not answer:\n{server.stdout.read()}")
                time.sleep(0.1)
        start_s = time.monotonic() - started
        time.sleep(3)  # settled
        processes, rss_mib = group_memory(os.getpgid(server.pid))
        from orchestrator.sweeps.summary import experiment_page

        url = f"http://127.0.0.1:{port}/{experiment_page(client.tracking_uri, args.experiment)}"
        png = args.outdir / "sweep.png"
        with tempfile.TemporaryDirectory(prefix="ladder-chromium-") as profile:
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                            f"--user-data-dir={profile}", f"--virtual-time-budget={int(args.wait * 1000)}",
                            "--window-size=1920,1080", f"--screenshot={png}", url],
                           check=True, capture_output=True, timeout=180)
        numbers = {"start_s": round(start_s, 2), "processes": processes, "rss_mib": round(rss_mib, 1),
                   "load_average": os.getloadavg(), "cpus": os.cpu_count(), "url": url, "screenshot": str(png)}
        (args.outdir / "ui.json").write_text(json.dumps(numbers, indent=2))
        print(json.dumps(numbers, indent=2))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
