"""celerity_lm under Ray Train: a real local Ray, two DDP workers over gloo, recorded in MLflow."""

from __future__ import annotations

import pytest

from conftest import run_cli
from orchestrator import tracking


@pytest.mark.slow
def test_two_worker_ddp_run_from_the_cli(workdir):
    out = run_cli(["run", "celerity_lm", "--smoke", "--workers", "2"], workdir, timeout=420)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "celerity_lm: finished" in out.stdout
    assert "step 270/270" in out.stderr + out.stdout  # progress lines reach the driver's console
    c = tracking.client(f"sqlite:///{workdir / 'mlruns.db'}")
    exp = c.get_experiment_by_name("celerity_lm")
    (run,) = c.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["ladder.world_size"] == "2" and run.data.tags["ladder.backend"] == "gloo"
    loss = c.get_metric_history(run.info.run_id, "train/loss")
    assert len(loss) >= 20 and loss[-1].value < 0.8 * loss[0].value
    progress = c.get_metric_history(run.info.run_id, "progress")
    assert max(m.value for m in progress) == pytest.approx(1.0)
    # Ray Train kept checkpoints in the run's storage.
    assert list((workdir / "ladder-runs" / "ray").glob("*/checkpoint_*"))
