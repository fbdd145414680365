"""Whether a sweep is valid and whether it can run here are separate questions: `check()` judges
the file; placement (CPUs, GPUs) and the job environment are checked where the sweep launches."""

from __future__ import annotations

import pytest

from conftest import REPO
from orchestrator.commands.cli import main
from orchestrator.sweep import Sweep, SweepError, load_sweep_file
from orchestrator.sweeps.tune_run import check_job_environment, resolve_concurrency, runs_root, run_sweep


def gpu_sweep(**kw) -> Sweep:
    return Sweep(name="g", workload="celerity_lm", base="smoke", workers=2, cpus_per_worker=1, gpus_per_worker=1, **kw)


def test_gpu_requests_are_valid_and_placed_against_gpus():
    s = gpu_sweep()
    s.check()
    assert s.trial_resources() == {"CPU": 2, "GPU": 2} and s.describe_resources() == "2 workers x (1 CPU, 1 GPU)"
    with pytest.raises(SweepError, match=r"a trial needs 2 GPUs \(2 workers x 1\) but this machine \(local Ray\) has 0"):
        resolve_concurrency(s, 16, 0, where="this machine (local Ray)")
    assert resolve_concurrency(s, 16, 8) == 4  # GPUs bind before CPUs
    assert resolve_concurrency(gpu_sweep(max_concurrent=2), 16, 8) == 2
    with pytest.raises(SweepError, match="gpus_per_worker must be >= 0"):
        Sweep(name="g", workload="celerity_lm", base="smoke", gpus_per_worker=-1).check()


def test_cluster_sweep_checks_here_and_says_why_it_cannot_run_here(workdir, capsys):
    assert main(["sweep", str(REPO / "sweeps" / "celerity_family_cluster.py"), "--check"]) == 0
    out = capsys.readouterr().out
    assert "is valid: 5 trials of celerity_lm, each 32 workers x (8 CPU, 1 GPU)" in out
    assert "not runnable here" in out and "data folder" in out
    # Running it here is refused before anything is recorded.
    assert main(["sweep", str(REPO / "sweeps" / "celerity_family_cluster.py")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (workdir / "mlruns.db").exists()


def test_cluster_sweep_members_span_the_family_and_use_zero_where_memory_needs_it():
    import runpy

    ns = runpy.run_path(str(REPO / "sweeps" / "celerity_family_cluster.py"))
    members = ns["MEMBERS"]
    assert len(members) == 5 and members[0].params < 0.2e9 and members[-1].params > 1e9
    assert all(m.batch_size % ns["WORKERS"] == 0 for m in members)
    limit = 0.85 * ns["GPU_MEMORY_GB"]
    for m in members:
        stage = ns["STAGES"][(m.width, m.depth)]
        assert ns["gpu_memory_gb"](m.width, m.depth, m.batch_size, stage) <= limit
        if stage:  # the lowest stage that fits: one below it does not
            assert ns["gpu_memory_gb"](m.width, m.depth, m.batch_size, stage - 1) > limit
    assert ns["STAGES"][(2048, 24)] >= 1 and ns["STAGES"][(768, 14)] == 0
    points = load_sweep_file(REPO / "sweeps" / "celerity_family_cluster.py").points
    assert points[-1]["zero_stage"] == ns["STAGES"][(2048, 24)] and "zero_stage" not in points[0]


def test_a_job_without_shared_storage_and_tracking_server_is_refused(monkeypatch, workdir):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    check_job_environment()  # not a job: the local defaults are fine
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.delenv("LADDER_RUNS_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(SweepError, match="set LADDER_RUNS_DIR and MLFLOW_TRACKING_URI in the job's environment"):
        run_sweep(Sweep(name="j", workload="celerity_lm", base="smoke"))
    assert not (workdir / "mlruns.db").exists()
    monkeypatch.setenv("LADDER_RUNS_DIR", str(workdir / "shared"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir / 'm.db'}")
    check_job_environment()
    assert runs_root() == (workdir / "shared").resolve()
