"""The Tune adapter of collapse stopping: decisions come from the pure stopper, and survive a
restart of the sweep's driver through the state file (Tune itself never saves schedulers)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from orchestrator.collapse import CollapseStopper, EmpiricalReference
from orchestrator.schedulers import build
from orchestrator.schedulers.collapse import CollapseScheduler


def _reference() -> EmpiricalReference:
    t = np.linspace(0.02, 1.0, 50)
    return EmpiricalReference([(t, 2.0 + 3.0 * (1 - t) ** 2)])


def _feed(scheduler, tid: str, scale: float, upto: float):
    actions = []
    for p in np.linspace(0.02, upto, int(upto * 50)):
        result = {"progress": float(p), "eval/loss": float(scale * (2.0 + 3.0 * (1 - p) ** 2)), "tau": 0.2, "tpp": 8.0}
        actions.append(scheduler.on_trial_result(None, SimpleNamespace(trial_id=tid), result))
    return actions


def test_worse_trials_stop_and_decisions_survive_a_restart(tmp_path):
    state = tmp_path / "scheduler.json"
    sched = CollapseScheduler(CollapseStopper(_reference(), rungs=(0.2, 0.4)), metric="eval/loss", state_path=state)
    assert "STOP" not in _feed(sched, "good", 1.0, 0.5)
    bad = _feed(sched, "bad", 1.3, 0.5)
    assert bad[-1] == "STOP"
    saved = json.loads(state.read_text())
    assert saved["decisions"]["bad"]["action"] == "stop"
    assert abs(saved["decisions"]["good"]["predicted"] - 2.0) < 0.02

    again = CollapseScheduler(CollapseStopper(_reference(), rungs=(0.2, 0.4)), metric="eval/loss", state_path=state)
    assert again.on_trial_result(None, SimpleNamespace(trial_id="bad"), {"progress": 0.6, "eval/loss": 2.0}) == "STOP"
    assert again.decisions["good"] == sched.decisions["good"]


def test_nan_loss_stops_the_trial_as_diverged(tmp_path):
    sched = CollapseScheduler(CollapseStopper(_reference()), metric="eval/loss", state_path=tmp_path / "s.json")
    action = sched.on_trial_result(None, SimpleNamespace(trial_id="x"), {"progress": 0.1, "eval/loss": float("nan")})
    assert action == "STOP" and sched.decisions["x"]["diverged"]


def test_schedulers_by_name():
    from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, MedianStoppingRule

    assert isinstance(build("asha", {}, metric="eval/loss", mode="min"), AsyncHyperBandScheduler)
    assert isinstance(build("median", {}, metric="eval/loss", mode="min"), MedianStoppingRule)
    assert type(build("fifo", {}, metric="eval/loss", mode="min")) is FIFOScheduler


def test_an_unpickled_scheduler_takes_up_the_saved_decisions(tmp_path):
    # Tuner.restore unpickles the scheduler object pickled at the sweep's start.
    import pickle

    state = tmp_path / "scheduler.json"
    sched = CollapseScheduler(CollapseStopper(_reference(), rungs=(0.2, 0.4)), metric="eval/loss", state_path=state)
    frozen = pickle.dumps(sched)
    _feed(sched, "good", 1.0, 0.5)
    _feed(sched, "bad", 1.3, 0.5)
    restored = pickle.loads(frozen)
    assert restored.decisions["bad"]["action"] == "stop"
    assert restored.on_trial_result(None, SimpleNamespace(trial_id="bad"), {"progress": 0.7, "eval/loss": 2.0}) == "STOP"
