"""Every registered workload's smoke() through the local Run: the contract, checked."""

from __future__ import annotations

import dataclasses
import math

import pytest

from orchestrator import registry
from orchestrator.config import field_docs
from orchestrator.run import LocalRun

NAMES = sorted(registry.WORKLOADS)


class Killed(Exception):
    """Stands in for the process dying: raised from inside the loop, after a checkpoint."""


class DiesAfterCheckpoint(LocalRun):
    def __init__(self, *args, extra_reports: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.saved_step: int | None = None
        self.extra_reports = extra_reports

    def save(self, state):
        super().save(state)
        self.last_saved_step = int(state["step"])
        if self.saved_step is None:
            self.saved_step = int(state["step"])

    def report(self, metrics, *, step):
        super().report(metrics, step=step)
        if self.saved_step is not None and step > self.saved_step:
            self.extra_reports -= 1
            if self.extra_reports < 0:
                raise Killed()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_config_fields_are_typed_and_documented(name):
    w = registry.load(name)
    assert dataclasses.is_dataclass(w.Config) and w.Config.__dataclass_params__.frozen
    docs = field_docs(w.Config)
    missing = [f.name for f in dataclasses.fields(w.Config) if not docs.get(f.name)]
    assert not missing, f"{name}.Config fields without a docstring: {missing}"
    assert isinstance(w.smoke(), w.Config)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_smoke_reports_loss_and_progress_to_one(name, tmp_path):
    w = registry.load(name)
    run = LocalRun(tmp_path)
    final = w.train(w.smoke(), run)
    losses = [m["train/loss"] for _, m in run.history if "train/loss" in m]
    progress = [m["progress"] for _, m in run.history if "progress" in m]
    steps = [s for s, _ in run.history]
    assert losses, "no train/loss reported"
    assert progress and all(b >= a for a, b in zip(progress, progress[1:])), "progress must not go back"
    assert progress[-1] == pytest.approx(1.0, abs=1e-6)
    assert steps == sorted(steps)
    assert final and all(isinstance(v, float) for v in final.values())
    assert any(math.isfinite(v) for v in final.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_killed_run_continues_from_its_checkpoint(name, tmp_path):
    w = registry.load(name)
    cfg = w.smoke()
    first = DiesAfterCheckpoint(tmp_path)
    with pytest.raises(Killed):
        w.train(cfg, first)
    assert first.saved_step is not None and first.saved_step > 0, "smoke() never checkpointed"
    killed_at = first.history[-1][0]
    assert killed_at > first.saved_step

    second = LocalRun(tmp_path)
    w.train(cfg, second)
    # The newest checkpoint: a workload may save again within the one report it makes past the first.
    assert second.restored_step == first.last_saved_step
    resumed_steps = [s for s, _ in second.history]
    assert resumed_steps[0] > first.saved_step, "the restarted run began again from step 0"
    assert second.history[-1][1]["progress"] == pytest.approx(1.0, abs=1e-6)
