"""`ray job submit` end to end on a real two-node Ray cluster started on this machine.

The head (`ray start --head`) and a second node (`ray start --address`) run with token
authentication on, bound to 127.0.0.1. An unauthenticated submission is refused; a sweep of a
user's own workload (the package `ladder new` writes, in a project folder outside the repo that is
the job's working directory) submitted with the token runs as a job, its two one-CPU trials land
one on each node (each node has one CPU) and import the workload from the working directory Ray
unpacked there, and their MLflow child runs, in a SQLite store the job was pointed at, carry the
ids of both nodes. The test starts each node as its own process group and stops exactly those
groups: `ray stop` would stop every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MLFLOW_", "LADDER_RUNS")) and k != "PYTHONPATH"}
    # A home of its own: Ray neither reads nor writes the machine's ~/.ray/auth_token.
    env.update(HOME=str(tmp / "home"), PATH=f"{BIN}{os.pathsep}{env['PATH']}", RAY_USAGE_STATS_ENABLED="0")
    env.update(extra)
    return env


def _get(url: str, token: str | None) -> tuple[int, dict | None]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError):  # not listening yet
        return 0, None


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop nodes: SIGTERM each one's process group at once, wait for them together a few seconds,
    then SIGKILL whatever of the groups is left (a `ray start --block` head often outlives the
    SIGTERM by far more: nothing of a node lives outside its group)."""
    for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 15)):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "home").mkdir()
        self.token = secrets.token_hex(32)
        self.token_file = tmp / "ray-token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self.gcs, self.dash = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.dash}"
        self.nodes: list[subprocess.Popen] = []

    def env(self, **extra: str) -> dict[str, str]:
        return _env(self.tmp, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file), **extra)

    def start_node(self, *args: str, name: str) -> None:
        common = ["--block", "--num-cpus=1", "--num-gpus=0", "--node-ip-address=127.0.0.1",
                  "--object-store-memory=100000000", f"--dashboard-agent-listen-port={free_port()}",
                  "--disable-usage-stats"]
        log = open(self.tmp / f"{name}.log", "w")
        self.nodes.append(subprocess.Popen([str(BIN / "ray"), "start", *args, *common], env=self.env(), cwd=self.tmp,
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def alive_nodes(self) -> list[str]:
        code, body = _get(f"{self.url}/api/v0/nodes?limit=100", self.token)
        if code != 200 or not body:
            return []
        rows = body.get("data", {}).get("result", {}).get("result", [])
        return [r["node_id"] for r in rows if r.get("state") == "ALIVE"]

    def wait_for_nodes(self, n: int, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = self.alive_nodes()
            if len(nodes) >= n:
                return nodes
            if any(p.poll() is not None for p in self.nodes):
                break
            time.sleep(1)
        logs = "\n".join((self.tmp / f).read_text()[-1500:] for f in ("head.log", "worker.log") if (self.tmp / f).exists())
        raise AssertionError(f"the cluster did not reach {n} nodes:\n{logs}")

    def cpu_seconds(self) -> float:
        """CPU time the nodes' processes used so far, reaped children included (a diagnostic)."""
        import psutil

        total = 0.0
        groups = {p.pid for p in self.nodes}
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) in groups:
                    t = proc.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
            except (psutil.Error, ProcessLookupError):
                continue
        return total

    def stop(self) -> None:
        _stop(self.nodes)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    # Ray's socket paths live under its temp dir and must stay under 108 bytes: short ones. Each
    # node has its own, as on separate machines: a node unpacks job working directories there,
    # and two nodes sharing one would replace the driver's working directory under it.
    ray_tmp, worker_tmp = tempfile.mkdtemp(prefix="ladder-ray-"), tempfile.mkdtemp(prefix="ladder-ray-")
    try:
        for attempt in range(2):
            try:
                c.start_node("--head", f"--port={c.gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={c.dash}",
                             f"--ray-client-server-port={free_port()}", f"--temp-dir={ray_tmp}", name="head")
                c.wait_for_nodes(1, timeout=120)
                c.start_node(f"--address=127.0.0.1:{c.gcs}", f"--temp-dir={worker_tmp}", name="worker")
                c.nodes_ids = c.wait_for_nodes(2, timeout=120)
                break
            except AssertionError as exc:
                # A port picked free can be taken by another process (another test's Ray) before
                # the node binds it: start once more on fresh ports; any other failure is real.
                if attempt or "Failed to bind" not in str(exc):
                    raise
                c.stop()
                c.nodes = []
                c.gcs, c.dash = free_port(), free_port()
                c.url = f"http://127.0.0.1:{c.dash}"
        yield c
    finally:
        c.stop()
        for folder in (ray_tmp, worker_tmp):
            shutil.rmtree(folder, ignore_errors=True)


def _ray(args: list[str], env: dict[str, str], timeout: float, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


CLUSTER_SWEEP = """
from orchestrator.sweep import Sweep, seeds

# 4,000 steps (a few seconds): long enough that the second trial starts on the other node while the
# first still trains, instead of reusing the first one's process when it is done.
sweep = Sweep(name="sparse_moe_cluster", workload="mylab.sparse_moe", base="smoke", space={"seed": seeds(2)},
              overrides={"steps": 4000, "eval_every": 400, "checkpoint_every": 2000},
              scheduler="fifo", objective=("eval/loss", "min"))
"""


def _project(tmp_path: Path) -> Path:
    """A user's project outside the repo: the package `ladder new` writes, and a two-trial sweep of it."""
    from orchestrator.commands import scaffold

    project = tmp_path / "project"
    folder, module = scaffold.new("sparse_moe", project / "mylab", cwd=project)
    assert module == "mylab.sparse_moe"
    (folder / "cluster.py").write_text(CLUSTER_SWEEP)
    return project


def test_submitted_sweep_runs_on_both_nodes_and_lands_in_mlflow(cluster, tmp_path):
    started = time.monotonic()
    # Token authentication is on: no token, or a wrong one, is refused.
    assert _get(f"{cluster.url}/api/jobs/", None)[0] == 401
    assert _get(f"{cluster.url}/api/jobs/", "not-the-token")[0] == 403
    refused = _ray(["job", "submit", "--address", cluster.url, "--", "echo", "never"],
                   _env(tmp_path, RAY_AUTH_MODE="disabled"), timeout=120)
    assert refused.returncode != 0 and "Missing authentication token" in refused.stderr + refused.stdout

    db = tmp_path / "mlflow.db"
    runtime_env = {"env_vars": {"MLFLOW_TRACKING_URI": f"sqlite:///{db}", "LADDER_RUNS_DIR": str(tmp_path / "runs")}}
    # The job's working directory is the user's project, not ladder's checkout: each node unpacks it
    # and imports the workload mylab.sparse_moe from there (docs/cluster.md, "Your own workload").
    submit = _ray(["job", "submit", "--address", cluster.url, "--submission-id", "ladder-smoke", "--working-dir", ".",
                   "--runtime-env-json", json.dumps(runtime_env), "--", "ladder", "sweep", "mylab/sparse_moe/cluster.py"],
                  cluster.env(), timeout=400, cwd=_project(tmp_path))
    assert submit.returncode == 0, (submit.stdout + submit.stderr)[-4000:]
    code, job = _get(f"{cluster.url}/api/jobs/ladder-smoke", cluster.token)
    assert code == 200 and job["status"] == "SUCCEEDED", job
    assert "sweep 'sparse_moe_cluster' finished" in submit.stdout + submit.stderr

    with sqlite3.connect(db) as con:
        runs = con.execute(
            "select r.run_uuid, r.status from runs r join experiments e on r.experiment_id = e.experiment_id "
            "join tags t on t.run_uuid = r.run_uuid where e.name = 'sparse_moe_cluster' and t.key = 'mlflow.parentRunId'"
        ).fetchall()
        nodes = {row[0] for row in con.execute("select value from tags where key = 'ladder.node_id'")}
        losses = {row[0] for row in con.execute("select run_uuid from latest_metrics where key = 'eval/loss'")}
    assert len(runs) == 2 and all(status == "FINISHED" for _, status in runs), runs
    assert nodes == set(cluster.nodes_ids), f"trials ran on {nodes}, the cluster's nodes are {cluster.nodes_ids}"
    assert {run for run, _ in runs} <= losses  # every trial's curve (the parent run may hold a summary too)
    assert (tmp_path / "runs" / "sweeps" / "sparse_moe_cluster" / "sweep.json").is_file()
    print(f"two-node job test: {time.monotonic() - started:.0f} s after the cluster was up; "
          f"the cluster's processes used {cluster.cpu_seconds():.0f} s of CPU")
