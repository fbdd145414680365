"""Faults injected into real processes: nothing reported is lost, nothing is recorded twice.

Each test prints `points reported / recorded` for the fault it injects.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LADDER, free_port, run_cli, shifted, start_mlflow_server, stop_process_group
from orchestrator.runners import registry
from orchestrator.tracking import sink as tracking

# The synthetic curves workload paced by sleeping: the run lasts as long on a loaded machine as
# on an idle one, and its reported steps are known in advance.
SHORT_RUN = ["--set", "steps=402", "report_every=3", "checkpoint_every=201", "step_time_s=0.03"]  # 12 s


def _expected_steps(cfg, total: int) -> list[int]:
    steps = list(range(cfg.log_every, total + 1, cfg.log_every))
    return steps if steps and steps[-1] == total else steps + [total]


def _wait(predicate, what: str, proc: subprocess.Popen | None = None, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _run_ids(url: str) -> list[str]:
    c = tracking.client(url)
    exp = c.get_experiment_by_name("curves")
    return [r.info.run_id for r in c.search_runs([exp.experiment_id])] if exp else []


def _recorded(url: str, run_id: str) -> list[int]:
    return [m.step for m in tracking.client(url).get_metric_history(run_id, "train/loss")]


def _start_run(workdir: Path, url: str, args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_TRACKING_URI": url, "LADDER_TRACKING_RETRY_MAX_S": "1"}
    return subprocess.Popen(LADDER + ["run", "curves", "--smoke", "--local", *args], cwd=workdir, env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def _check_complete(url: str, run_id: str, what: str) -> None:
    c = tracking.client(url)
    run = c.get_run(run_id)
    steps_total, every = int(run.data.params["steps"]), int(run.data.params["report_every"])
    expected = list(range(every, steps_total + 1, every))
    steps = _recorded(url, run_id)
    print(f"{what}: points reported {len(expected)}, recorded {len(steps)}, distinct {len(set(steps))}")
    assert sorted(steps) == expected, f"missing {sorted(set(expected) - set(steps))}, extra {len(steps) - len(set(steps))}"
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_tracking_server_outage_mid_run_loses_nothing(workdir):
    """The server stops mid-run and comes back: training goes on and every point reaches it. The
    run goes on training while the server is down until it has noticed the outage; it is then
    frozen (SIGSTOP) while the server restarts, however long that takes on this machine, and
    continues (SIGCONT) with the server back."""
    port, data = free_port(), workdir / "srv"
    url = f"http://127.0.0.1:{port}"
    server = start_mlflow_server(data, port)
    log = workdir / "run.log"
    proc = _start_run(workdir, url, ["--set", "steps=600", "report_every=3", "checkpoint_every=150",
                                     "step_time_s=0.03"], log)  # 18 s
    try:
        _wait(lambda: (ids := _run_ids(url)) and len(_recorded(url, ids[0])) >= 2, "the first points", proc)
        (run_id,) = _run_ids(url)
        stop_process_group(server, signal.SIGKILL)
        _wait(lambda: "unreachable" in log.read_text(), "the console to report the outage", proc)
        os.killpg(proc.pid, signal.SIGSTOP)
        try:
            server = start_mlflow_server(data, port)
        finally:
            os.killpg(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        console = log.read_text()
        assert "is back after" in console, console[-2000:]
        _check_complete(url, run_id, "tracking server outage")
        assert not list((workdir / "ladder-runs/outbox").glob("*.jsonl")), "points left undelivered"
    finally:
        stop_process_group(proc)
        stop_process_group(server)


@pytest.mark.slow
def test_tracking_server_down_until_the_end_is_synced_later(workdir):
    """The server is gone for the rest of the run: the run finishes, keeps its points, `ladder sync` sends them."""
    port, data = free_port(), workdir / "srv"
    url = f"http://127.0.0.1:{port}"
    server = start_mlflow_server(data, port)
    log = workdir / "run.log"
    proc = _start_run(workdir, url, SHORT_RUN, log)
    try:
        _wait(lambda: "[curves] step" in log.read_text(), "training to start", proc)
        (run_id,) = _run_ids(url)
        stop_process_group(server, signal.SIGKILL)  # gone at once, as a crashed server is
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        console = log.read_text()
        assert "unreachable" in console and "ladder sync" in console, console[-2000:]
        box = workdir / "ladder-runs/outbox" / f"{run_id}.jsonl"
        assert box.is_file()
        kinds = [json.loads(line)["kind"] for line in box.read_text().splitlines()]
        assert "metrics" in kinds and kinds[-1] == "end"

        down = run_cli(["sync"], workdir, env={"MLFLOW_TRACKING_URI": url})
        assert down.returncode == 1 and "still unreachable" in down.stdout, down.stdout + down.stderr
        server = start_mlflow_server(data, port)
        out = run_cli(["sync"], workdir, env={"MLFLOW_TRACKING_URI": url})
        assert out.returncode == 0 and "sent" in out.stdout, out.stdout + out.stderr
        _check_complete(url, run_id, "tracking server down until the end, then `ladder sync`")
        assert not box.exists()
    finally:
        stop_process_group(proc)
        stop_process_group(server)


def test_unreachable_tracking_server_at_start_is_refused_quickly(workdir):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    out = run_cli(["run", "curves", "--smoke", "--local"], workdir, env={"MLFLOW_TRACKING_URI": url})
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"the MLflow tracking server {url} does not answer" in out.stderr
    assert "Traceback" not in out.stderr
    assert time.monotonic() - started < 60, "MLflow's own retries ran before giving up"
    assert not (workdir / "ladder-runs" / "curves").exists() or not any((workdir / "ladder-runs" / "curves").iterdir())


def _train_workers(root_pid: int) -> list:
    """Ray Train worker processes started under `root_pid` (this test's own driver), and no others."""
    import psutil

    found = []
    for p in psutil.Process(root_pid).children(recursive=True):
        try:
            if "RayTrainWorker" in " ".join(p.cmdline()) or "RayTrainWorker" in p.name():
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_killed_ray_train_worker_restarts_from_its_checkpoint(workdir):
    """SIGKILL one of two DDP workers mid-run: the group restarts from its last checkpoint and
    the MLflow run ends with every step recorded exactly once. It is also the test of a two-worker
    DDP run from the CLI (console, tags, curve), which would cost a Ray Train start of its own."""
    import signal

    log = workdir / "run.log"
    proc = subprocess.Popen(
        LADDER + ["run", "celerity_lm", "--smoke", "--workers", "2", "--max-failures", "1",
                  "--set", "tpp=4", "checkpoint_every_frac=0.2", f"seed={shifted(0)}"],
        cwd=workdir, start_new_session=True, stdout=open(log, "w"), stderr=subprocess.STDOUT)  # worker lines reach either stream
    try:
        # A checkpoint folder exists while it is still being written; Ray Train restores only
        # those its controller has registered (listed in its snapshot file): wait for one.
        def ckpts() -> list:
            snapshots = list(workdir.glob("ladder-runs/ray/*/checkpoint_manager_snapshot.json"))
            try:
                return json.loads(snapshots[0].read_text())["checkpoint_results"] if snapshots else []
            except (ValueError, OSError):  # caught mid-write
                return []

        _wait(lambda: len(ckpts()) >= 1, "the first registered checkpoint", proc, timeout=400)
        workers = _train_workers(proc.pid)
        assert len(workers) == 2, [w.pid for w in workers]
        killed_at = int(ckpts()[-1]["metrics"]["step"])
        os.kill(workers[1].pid, signal.SIGKILL)
        assert proc.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        stop_process_group(proc)
    (run_dir,) = list((workdir / "ladder-runs" / "celerity_lm").iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    c = tracking.client(record["tracking_uri"])
    run = c.get_run(record["mlflow_run_id"])
    cfg = registry.load("celerity_lm").smoke()
    total = int(run.data.metrics["tokens"] // (cfg.batch_size * cfg.seq_len))
    expected = _expected_steps(cfg, total)
    steps = [m.step for m in c.get_metric_history(run.info.run_id, "train/loss")]
    print(f"Ray Train worker SIGKILL after the checkpoint of step {killed_at}: points reported {len(expected)}, "
          f"recorded {len(steps)}, distinct {len(set(steps))}")
    assert sorted(steps) == expected, f"missing {sorted(set(expected) - set(steps))}, duplicates {len(steps) - len(set(steps))}"
    assert run.info.status == "FINISHED"
    # Otherwise it is an ordinary two-worker DDP run from the CLI: its console, tags and curve.
    console = log.read_text()
    assert "celerity_lm: finished" in console and f"step {total}/{total}" in console, console[-3000:]
    assert run.data.tags["ladder.world_size"] == "2" and run.data.tags["ladder.backend"] == "gloo"
    loss = sorted(c.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)
    # margin: last/first train/loss worst 0.507 over seeds 1-5 (threshold 0.8), measured in-process on
    # one worker (smoke() is tpp=4: this config and global batch; test_tracking's run): 0.496, 0.498,
    # 0.507, 0.481, 0.486 (seed 0: 0.513). Here it is rank 0's half of the batch.
    assert loss[-1].value < 0.8 * loss[0].value, "the run did not train"
    assert max(m.value for m in c.get_metric_history(run.info.run_id, "progress")) == pytest.approx(1.0)
    restored = [int(line.rsplit(" ", 1)[1]) for line in log.read_text().splitlines()
                if "ladder: restored from the checkpoint of step" in line]
    assert restored and min(restored) >= killed_at > 0, log.read_text()[-3000:]  # continued, not restarted from 0
