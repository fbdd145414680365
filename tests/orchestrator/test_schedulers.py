"""The Tune adapter of collapse stopping: decisions come from the pure stopper, and survive a
restart of the sweep's driver through the state file (Tune itself never saves schedulers)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from orchestrator.sweeps.collapse import CollapseStopper, EmpiricalReference
from orchestrator.sweeps.schedulers import build
from orchestrator.sweeps.schedulers.collapse import CollapseScheduler, journal_of, read_state


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
    saved = read_state(state)
    assert saved["decisions"]["bad"]["action"] == "stop"
    assert abs(saved["decisions"]["good"]["predicted"] - 2.0) < 0.02

    again = CollapseScheduler(CollapseStopper(_reference(), rungs=(0.2, 0.4)), metric="eval/loss", state_path=state)
    assert again.on_trial_result(None, SimpleNamespace(trial_id="bad"), {"progress": 0.6, "eval/loss": 2.0}) == "STOP"
    decided = lambda d: {k: v for k, v in d.items() if k != "progress"}  # noqa: E731 (progress moves on every report)
    assert decided(again.decisions["good"]) == decided(sched.decisions["good"])
    assert again.stopper.state_dict() == sched.stopper.state_dict()  # curves and rung records alike


def test_persistence_appends_one_line_per_result_and_survives_a_torn_line(tmp_path):
    state = tmp_path / "scheduler.json"
    sched = CollapseScheduler(CollapseStopper(_reference(), rungs=(0.2, 0.4)), metric="eval/loss", state_path=state)
    _feed(sched, "good", 1.0, 0.3)
    journal = journal_of(state)
    lines = journal.read_text().splitlines()
    sizes = []
    for i in range(5):
        _feed_one = sched.on_trial_result(None, SimpleNamespace(trial_id="late"), {"progress": 0.01 * (i + 1), "eval/loss": 3.0})
        assert _feed_one == "CONTINUE"
        sizes.append(len(journal.read_text().splitlines()))
    assert sizes == sorted(sizes) and sizes[-1] - sizes[0] <= 8  # a line or two per result, never a rewrite
    assert not state.exists()  # the folded state file is written only when a scheduler starts or ends
    with open(journal, "a") as fh:
        fh.write('["p", "late", 0.0')  # the driver died mid-write
    again = CollapseScheduler(CollapseStopper(_reference(), rungs=(0.2, 0.4)), metric="eval/loss", state_path=state)
    assert again.stopper.state_dict() == sched.stopper.state_dict()
    assert state.is_file() and not journal.exists()
    assert len(lines) > 3


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


def test_asha_and_median_let_a_trial_at_its_end_finish():
    """Ray's rules answer STOP to a trial's 100% report (ASHA at max_t); ours CONTINUE there, so
    that `train` returns and its final metrics are recorded, and keep STOP everywhere else."""
    from types import SimpleNamespace

    from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

    def drive(scheduler, reports):
        scheduler.set_search_properties("eval/loss", "min")
        trials = [SimpleNamespace(trial_id=f"t{i}", status="RUNNING") for i in range(len(reports))]
        for t in trials:
            scheduler.on_trial_add(None, t)
        actions = []
        for t, curve in zip(trials, reports):
            for pct, loss in curve:
                actions.append(scheduler.on_trial_result(None, t, {"progress_pct": pct, "eval/loss": loss,
                                                                   "training_iteration": pct}))
        return actions

    good, bad = [(50.0, 1.0), (100.0, 0.9)], [(50.0, 2.0), (100.0, 1.9)]
    ray_asha = AsyncHyperBandScheduler(time_attr="progress_pct", max_t=100, grace_period=50, reduction_factor=2)
    assert drive(ray_asha, [good])[-1] == TrialScheduler.STOP  # what Ray does at the end
    ours = build("asha", {"grace_period": 0.5}, metric="eval/loss", mode="min")
    assert drive(ours, [good]) == [TrialScheduler.CONTINUE, TrialScheduler.CONTINUE]
    # Mid-run decisions are Ray's own: the worse trial is still stopped at the 50% rung.
    assert drive(build("asha", {"grace_period": 0.5}, metric="eval/loss", mode="min"), [good, bad])[2] == TrialScheduler.STOP
