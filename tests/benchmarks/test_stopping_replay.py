"""The asynchronous replay behind the stopping benchmark (benchmarks/stopping_replay.py): its event
loop's timing and accounting, and each peer driven through it as its library drives it."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest

from conftest import REPO

# loaded by its path: the benchmarks folder stays off sys.path (its script names are generic)
_spec = importlib.util.spec_from_file_location("stopping_replay", REPO / "benchmarks" / "stopping_replay.py")
sr = sys.modules.setdefault("stopping_replay", importlib.util.module_from_spec(_spec))
if not hasattr(sr, "simulate"):
    _spec.loader.exec_module(sr)

T = np.linspace(0.05, 1.0, 20)


def shifted(n: int, *, gap: float = 0.1, cost=None) -> list[sr.Curve]:
    """Curves of one shape, trial i `gap * i` above trial 0 everywhere: the order never changes."""
    return [sr.Curve(f"t{i}", T, 2.0 + gap * i + np.exp(-5 * T), 1.0 if cost is None else cost[i]) for i in range(n)]


class Recorder(sr.Policy):
    def __init__(self, stop_at: dict[str, int] | None = None) -> None:
        self.seen: list[tuple[str, int]] = []
        self.stop_at = stop_at or {}

    def result(self, curve, index):
        self.seen.append((curve.trial_id, index))
        return sr.STOP if self.stop_at.get(curve.trial_id) == index else sr.CONTINUE


def test_a_policy_that_never_stops_spends_everything_and_picks_the_best():
    curves = shifted(5)
    out = sr.simulate(curves, sr.Policy(), order=[3, 1, 4, 0, 2], workers=2)
    assert out.compute == pytest.approx(1.0) and out.regret == 0.0 and out.chosen == "t0" and out.stopped == 0


def test_one_worker_runs_trials_one_after_another_in_launch_order():
    rec = Recorder()
    sr.simulate(shifted(3), rec, order=[2, 0, 1], workers=1)
    assert [tid for tid, _ in rec.seen] == ["t2"] * 20 + ["t0"] * 20 + ["t1"] * 20


def test_reports_arrive_at_times_proportional_to_cost():
    rec = Recorder()
    sr.simulate(shifted(2, cost=[1.0, 4.0]), rec, order=[1, 0], workers=2)
    # the cheap trial reports four times as fast: it is done when the dear one is a quarter through
    done = rec.seen.index(("t0", 19))
    assert sum(1 for tid, _ in rec.seen[: done + 1] if tid == "t1") in (4, 5, 6)


def test_a_stop_counts_the_fraction_reached_weighted_by_cost_plus_the_overhead():
    rec = Recorder(stop_at={"t1": 3})
    rec.overhead = 0.25
    out = sr.simulate(shifted(2, cost=[1.0, 3.0]), rec, order=[0, 1], workers=2)
    assert out.trained_to == {"t0": 1.0, "t1": pytest.approx(T[3])}
    assert out.compute == pytest.approx((1.0 + 3.0 * T[3]) / 4.0 + 0.25) and out.stopped == 1


def test_stopping_the_best_trial_is_regret_and_a_diverged_trial_is_never_picked():
    curves = shifted(3)
    broken = sr.Curve("t0", T, np.where(T > 0.5, np.nan, curves[0].loss))
    out = sr.simulate([broken, *curves[1:]], Recorder(stop_at={"t1": 2}), order=[0, 1, 2], workers=3)
    assert out.chosen == "t2" and out.regret == pytest.approx(curves[2].final / curves[1].final - 1)
    assert out.trained_to["t0"] == pytest.approx(T[T > 0.5][0])


def test_the_order_must_be_a_permutation():
    with pytest.raises(ValueError, match="permutation"):
        sr.simulate(shifted(3), sr.Policy(), order=[0, 0, 1])


def test_ray_asha_stops_the_worse_half_and_keeps_the_best():
    out = sr.simulate(shifted(8), sr.ladder_scheduler("asha", {"grace_period": 0.2, "reduction_factor": 2}),
                      order=list(range(8)), workers=8)
    assert out.chosen == "t0" and out.regret == 0.0
    assert out.stopped >= 3 and out.compute < 0.7
    assert all(x == 1.0 or x == pytest.approx(0.2) or x == pytest.approx(0.4) or x == pytest.approx(0.8)
               for x in out.trained_to.values()), out.trained_to


def test_ray_hyperband_pauses_and_resumes_without_deadlock():
    curves = shifted(9)
    rec_policy = sr.ladder_scheduler("hyperband", {"reduction_factor": 3, "brackets": 2})
    out = sr.simulate(curves, rec_policy, order=list(range(9))[::-1], workers=3)
    assert out.chosen == "t0" and out.regret == 0.0
    assert 0 < out.stopped < 9 and out.compute < 1.0
    assert rec_policy.scheduler.decisions, "HyperBand recorded no halving"


def test_ray_median_rule_stops_trials_worse_than_the_median():
    out = sr.simulate(shifted(8), sr.ladder_scheduler("median", {"grace_period": 0.2, "min_samples_required": 3}),
                      order=list(range(8)), workers=8)
    assert out.chosen == "t0" and out.stopped >= 2


def test_optuna_pruners_prune_through_a_study():
    import optuna

    policy = sr.OptunaPruner(optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2), study_name="x")
    out = sr.simulate(shifted(8), policy, order=list(range(8)), workers=1)
    pruned = [t for t in policy.study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert len(pruned) == out.stopped >= 4 and out.chosen == "t0"
    assert [t.number for t in policy.study.trials] == list(range(8))  # asked in launch order


def test_collapse_through_its_tune_scheduler_stops_trials_predicted_worse():
    from orchestrator.sweeps.collapse import EmpiricalReference

    curves = shifted(8)
    ref = EmpiricalReference([(c.progress, c.loss) for c in curves[:2]], smooth_window=0.0)
    out = sr.simulate(curves, sr.ladder_scheduler("collapse", {}, reference=ref, overhead=0.1),
                      order=list(range(8)), workers=8)
    assert out.chosen == "t0" and out.stopped >= 3
    assert out.compute == pytest.approx(sum(out.trained_to.values()) / 8 + 0.1)


def test_power_law_predictions_extrapolate_a_power_law_and_not_a_rising_curve():
    t = np.linspace(0.1, 0.4, 12)
    pred = sr.power_law_predictions(t, 2.0 + 0.5 * t ** -0.7, members=8)
    assert np.allclose(pred, 2.5, atol=0.02), pred
    rising = sr.power_law_predictions(t, 2.0 + t, members=4)
    assert np.allclose(rising, 2.4), rising


def test_the_power_law_peer_stops_a_trial_bound_to_lose_once_one_finished():
    curves = shifted(4, gap=0.5)
    out = sr.simulate(curves, sr.PowerLawEnsemble(grace=0.2), order=[0, 1, 2, 3], workers=1)
    assert out.chosen == "t0" and out.stopped == 3 and out.compute < 0.6


def test_frontier_takes_the_best_setting_within_each_level():
    reps = [sr.Replays("p", "cheap", np.array([0.2, 0.2]), np.array([0.1, 0.3])),
            sr.Replays("p", "dear", np.array([0.5, 0.5]), np.array([0.0, 0.0]))]
    low, high, none = sr.frontier(reps, [0.3, 0.6, 0.1])
    assert (low.setting, low.regret[0]) == ("cheap", pytest.approx(0.2)) and low.regret[1] < 0.2 < low.regret[2]
    assert (high.setting, high.regret) == ("dear", (0.0, 0.0, 0.0))
    assert none.setting is None and math.isinf(none.regret[0])


def test_replays_share_their_orders_across_policies():
    a, b = sr.orders(6, 3, seed=1), sr.orders(6, 3, seed=1)
    assert a == b and all(sorted(o) == list(range(6)) for o in a) and len({tuple(o) for o in a}) == 3


def test_collapse_with_its_own_first_finishers_as_reference_judges_only_after_they_finish():
    curves = shifted(8)
    policy = sr.SelfReferenceCollapse(2, {"rungs": (0.3, 0.6)}, controls=False)
    out = sr.simulate(curves, policy, order=list(range(8)), workers=2)
    # the first two launched (t0, t1) ran unjudged to the end and became the reference; later
    # trials were judged against it, and the worse among them stopped
    assert policy.reference.built is not None and [c.trial_id for c in policy.reference.runs] == ["t0", "t1"]
    assert out.chosen == "t0" and out.stopped >= 3 and out.compute < 0.8 and policy.overhead == 0.0
    assert out.trained_to["t0"] == out.trained_to["t1"] == 1.0


def _grid(gap: float = 0.1) -> tuple[list[sr.Curve], "sr.RecordedGrid"]:
    """Six recorded points a in {1, 2, 3} x b in {0, 1}; the final loss grows with a + 3b."""
    points = [{"a": a, "b": b} for a in (1, 2, 3) for b in (0, 1)]
    curves = [sr.Curve(f"r{i}", T, 2.0 + gap * (p["a"] + 3 * p["b"]) + np.exp(-5 * T)) for i, p in enumerate(points)]
    return curves, sr.RecordedGrid(curves, points)


def test_a_recorded_grid_finds_each_point_and_refuses_an_unrecorded_one():
    curves, grid = _grid()
    assert grid.axes == {"a": [1.0, 2.0, 3.0], "b": [0.0, 1.0]}
    assert grid.curve({"a": 2, "b": 1.0}) is curves[3]
    with pytest.raises(KeyError, match="not recorded"):
        grid.curve({"a": 4, "b": 0})
    with pytest.raises(ValueError, match="two recorded curves"):
        sr.RecordedGrid(curves[:2], [{"a": 1}, {"a": 1}])


def test_a_search_draws_its_budget_from_ladders_searcher_which_learns_how_each_trial_ended():
    from orchestrator.sweep import Sweep, choice
    from orchestrator.sweeps.search import build

    curves, grid = _grid()
    budget = 9
    sweep = Sweep(name="replay_search", workload="curves", base="smoke", space={"a": choice(1, 2, 3), "b": choice(0, 1)},
                  search="tpe", num_samples=budget, seed=3)
    source = sr.TuneSearch(build(sweep), grid, metric="eval/loss")
    out = sr.simulate(curves, sr.Policy(), source=source, budget=budget, workers=2)
    assert len(out.trained_to) == budget and all(p == 1.0 for p in out.trained_to.values())
    assert out.compute == pytest.approx(1.0)  # every proposal to the end, at the grid's mean cost
    study = source.searcher.study
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * budget
    for t in study.trials:  # each told the final loss of the recorded curve at its point
        assert t.value == pytest.approx(grid.curve(t.params).final)
    finals = {c.trial_id: c.final for c in curves}
    best_found = min(finals[source.point[p]] for p in out.trained_to)
    assert out.regret == pytest.approx(best_found / min(finals.values()) - 1)

    # stopped by a scheduler: the searcher tells Optuna the trial was pruned
    source = sr.TuneSearch(build(sweep), grid, metric="eval/loss")
    out = sr.simulate(curves, sr.ladder_scheduler("asha", {"grace_period": 0.2, "reduction_factor": 2}),
                      source=source, budget=budget, workers=1)
    states = [t.state.name for t in source.searcher.study.trials]
    assert out.stopped > 0 and states.count("PRUNED") == out.stopped and len(states) == budget
    assert out.compute < 1.0


def test_optuna_standalone_search_asks_its_study_for_each_point_and_prunes_through_it():
    import optuna

    curves, grid = _grid()
    policy = sr.OptunaPruner(optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=2),
                             study_name="s", sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3))
    source = sr.OptunaSearch(policy, grid)
    out = sr.simulate(curves, policy, source=source, budget=8, workers=1)
    trials = policy.study.trials
    assert len(trials) == 8 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    assert sum(t.state.name == "PRUNED" for t in trials) == out.stopped > 0
    for tid, t in zip(sorted(source.point), trials):  # proposal k replays the curve at study trial k's params
        assert source.point[tid] == grid.curve(t.params).trial_id
    with pytest.raises(ValueError, match="budget"):
        sr.simulate(curves, sr.Policy(), source=source, budget=0)
