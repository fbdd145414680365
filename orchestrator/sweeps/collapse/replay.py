"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

Replaying stopping policies on the finished full curves of a sweep: the audit a user runs before
trusting early stopping on a new family, and the benchmark against ASHA and friends.

Every policy returns the compute it would have spent (the sum over trials of the training
fraction each was run to, weighted by per-trial cost, over the cost of running every trial to
the end), the trial it picks, and its regret: the pick's final loss over the best final loss, - 1.
A trial's final loss is its curve's last value (averaged over `final_window`) unless `finals`
gives it, e.g. a held-out evaluation at the end of training.

The rung-based policies are replayed synchronously (successive halving): at each rung all
surviving trials are scored and the best ceil(keep_quantile * n) go on; after the last rung the
survivors run to the end and the best final loss among them is the pick. Collapse and ASHA share
this skeleton and differ only in the score (predicted final loss against current loss), so at
equal rungs and quantile they spend exactly the same compute. `replay_stopper` replays the live,
asynchronous `CollapseStopper` instead, trial after trial. Curves must be finished; a curve with
a non-finite loss diverged there and is never the best.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.sweeps.collapse.curves import as_curve, smooth
from orchestrator.sweeps.collapse.divisor import fit_divisor
from orchestrator.sweeps.collapse.reference import Reference, ReferenceFamily, resolve_reference
from orchestrator.sweeps.collapse.stopper import CollapseStopper

Curves = Mapping[str, tuple[ArrayLike, ArrayLike]]


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    compute_fraction: float
    """Compute spent over the compute of running every trial to the end."""
    chosen: str | None
    """The trial the policy picks."""
    regret: float
    """final_loss(chosen) / best final loss - 1 (inf when the pick diverged)."""
    trained_to: dict[str, float] = field(default_factory=dict)
    """The training fraction each trial was run to."""
    scores: dict[str, float] = field(default_factory=dict)
    """The last score each trial was ranked by (predicted or current loss)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Sweep:
    curves: dict[str, tuple[np.ndarray, np.ndarray]]
    finals: dict[str, float]
    diverged_at: dict[str, float]
    costs: dict[str, float]

    def result(self, policy: str, trained: dict[str, float], chosen: str | None, scores: dict[str, float]) -> ReplayResult:
        spent = sum(self.costs[t] * x for t, x in trained.items())
        compute = spent / sum(self.costs.values())
        best = min(self.finals.values())
        regret = math.inf if chosen is None or not math.isfinite(self.finals[chosen]) else self.finals[chosen] / best - 1
        return ReplayResult(policy, compute, chosen, regret, trained, scores)


def _sweep(
    curves: Curves,
    costs: Mapping[str, float] | None,
    final_window: float,
    finals_given: Mapping[str, float] | None = None,
    min_final_progress: float = 0.99,
) -> _Sweep:
    if not curves:
        raise ValueError("replay needs at least one curve")
    prepared, finals, diverged = {}, {}, {}
    for tid, (progress, loss) in curves.items():
        p, y = as_curve(progress, loss)
        bad = ~np.isfinite(y)
        if bad.any():
            diverged[tid] = float(p[np.argmax(bad)])
            finals[tid] = math.inf
        else:
            if p.size == 0 or p[-1] < min_final_progress:
                raise ValueError(f"trial {tid!r} is not finished (last progress {p[-1] if p.size else None}): replay needs full curves")
            finals[tid] = float(smooth(p, y, final_window)[-1])
        if finals_given is not None and tid not in diverged:
            finals[tid] = float(finals_given[tid])
        prepared[tid] = (p, y)
    if all(math.isinf(v) for v in finals.values()):
        raise ValueError("every trial diverged: there is no best final loss to compare with")
    cost = {t: float(costs[t]) if costs else 1.0 for t in prepared}
    return _Sweep(prepared, finals, diverged, cost)


def _successive_halving(
    sweep: _Sweep, rungs: Sequence[float], keep_quantile: float, score: Callable[[str, float], float], policy: str
) -> ReplayResult:
    if not 0 <= keep_quantile <= 1:
        raise ValueError(f"keep_quantile must be in [0, 1], got {keep_quantile}")
    alive = sorted(sweep.curves)
    trained = {t: 0.0 for t in alive}
    scores: dict[str, float] = {}
    for rung in sorted(rungs):
        survivors = []
        for t in alive:
            if sweep.diverged_at.get(t, math.inf) <= rung:
                trained[t] = sweep.diverged_at[t]  # stopped the moment it reported a NaN
                continue
            trained[t] = rung
            scores[t] = score(t, rung)
            survivors.append(t)
        ranked = sorted(survivors, key=lambda t: (not math.isfinite(scores[t]), scores[t], t))
        alive = ranked[: max(1, math.ceil(keep_quantile * len(ranked)))] if ranked else []
    finishers = []
    for t in alive:
        if t in sweep.diverged_at:
            trained[t] = sweep.diverged_at[t]
        else:
            trained[t] = 1.0
            finishers.append(t)
    chosen = min(finishers, key=lambda t: sweep.finals[t]) if finishers else None
    return sweep.result(policy, trained, chosen, scores)


def _current(sweep: _Sweep, smooth_window: float) -> Callable[[str, float], float]:
    def score(t: str, at: float) -> float:
        p, y = sweep.curves[t]
        ys = smooth(p, y, smooth_window)
        seen = np.flatnonzero(p <= at)
        return float(ys[seen[-1]]) if seen.size else math.inf

    return score


def replay_collapse(
    curves: Curves,
    reference: Reference | ReferenceFamily,
    *,
    controls: Mapping[str, tuple[float, float]] | None = None,
    rungs: Sequence[float] = (0.1, 0.2, 0.3),
    keep_quantile: float = 0.5,
    window_start: float = 0.5,
    warmup_frac: float = 0.0,
    smooth_window: float | None = None,
    final_window: float = 0.0,
    finals: Mapping[str, float] | None = None,
    costs: Mapping[str, float] | None = None,
) -> ReplayResult:
    """Successive halving on the collapse-predicted final loss. `controls` maps each trial to
    its (tau, tpp) when `reference` is a family. With one rung and keep_quantile 0 this is the
    paper's "predicted best" at that stop point."""
    sweep = _sweep(curves, costs, final_window, finals)
    if smooth_window is None:
        smooth_window = float(getattr(reference, "smooth_window", 0.0))

    def score(t: str, at: float) -> float:
        tau, tpp = controls[t] if controls else (None, None)
        ref = resolve_reference(reference, tau, tpp)
        p, y = sweep.curves[t]
        ys = smooth(p, y, smooth_window)
        try:
            return fit_divisor(p, ys, ref, (max(warmup_frac, at * window_start), at))
        except ValueError:
            return math.inf

    return _successive_halving(sweep, rungs, keep_quantile, score, "collapse")


def replay_asha(
    curves: Curves,
    *,
    rungs: Sequence[float] = (0.1, 0.2, 0.3),
    keep_quantile: float = 0.5,
    smooth_window: float = 0.0,
    final_window: float = 0.0,
    finals: Mapping[str, float] | None = None,
    costs: Mapping[str, float] | None = None,
) -> ReplayResult:
    """Successive halving on the current loss at each rung (ASHA's rule; its default of the raw
    reported value is `smooth_window=0`)."""
    sweep = _sweep(curves, costs, final_window, finals)
    return _successive_halving(sweep, rungs, keep_quantile, _current(sweep, smooth_window), "asha")


def replay_current_best(
    curves: Curves,
    *,
    stop_at: float = 0.3,
    smooth_window: float = 0.0,
    final_window: float = 0.0,
    finals: Mapping[str, float] | None = None,
    costs: Mapping[str, float] | None = None,
) -> ReplayResult:
    """Run every trial to `stop_at`, pick the lowest current loss, finish only that one (the
    paper's "current best")."""
    sweep = _sweep(curves, costs, final_window, finals)
    return _successive_halving(sweep, (stop_at,), 0.0, _current(sweep, smooth_window), "current-best")


def replay_median(
    curves: Curves,
    *,
    grace: float = 0.1,
    check_every: float = 0.05,
    min_samples: int = 3,
    smooth_window: float = 0.0,
    final_window: float = 0.0,
    finals: Mapping[str, float] | None = None,
    costs: Mapping[str, float] | None = None,
) -> ReplayResult:
    """Median stopping as Ray's `MedianStoppingRule` states it, checked every `check_every`
    from `grace` on: stop a trial whose best loss so far is worse than the median of the other
    running trials' mean losses up to now (when at least `min_samples` others are running)."""
    sweep = _sweep(curves, costs, final_window, finals)
    alive = sorted(sweep.curves)
    trained = {t: 0.0 for t in alive}
    smoothed = {t: smooth(p, y, smooth_window) for t, (p, y) in sweep.curves.items()}
    scores: dict[str, float] = {}
    for at in np.arange(grace, 1.0, check_every):
        at = float(at)
        running = []
        for t in alive:
            if sweep.diverged_at.get(t, math.inf) <= at:
                trained[t] = sweep.diverged_at[t]
            else:
                trained[t] = at
                running.append(t)
        best_so_far, running_mean = {}, {}
        for t in running:
            p = sweep.curves[t][0]
            seen = smoothed[t][p <= at]
            best_so_far[t] = float(np.min(seen)) if seen.size else math.inf
            running_mean[t] = float(np.mean(seen)) if seen.size else math.inf
        alive = []
        for t in running:
            others = [running_mean[o] for o in running if o != t]
            stop = len(others) >= min_samples and best_so_far[t] > float(np.median(others))
            scores[t] = best_so_far[t]
            if not stop:
                alive.append(t)
    finishers = []
    for t in alive:
        trained[t] = sweep.diverged_at.get(t, 1.0)
        if t not in sweep.diverged_at:
            finishers.append(t)
    chosen = min(finishers, key=lambda t: sweep.finals[t]) if finishers else None
    return sweep.result("median", trained, chosen, scores)


def replay_random(
    curves: Curves,
    *,
    seed: int = 0,
    final_window: float = 0.0,
    finals: Mapping[str, float] | None = None,
    costs: Mapping[str, float] | None = None,
) -> ReplayResult:
    """Pick one trial uniformly at random (seeded) and train only that one."""
    sweep = _sweep(curves, costs, final_window, finals)
    ids = sorted(sweep.curves)
    chosen = ids[int(np.random.default_rng(seed).integers(len(ids)))]
    trained = {t: 0.0 for t in ids}
    trained[chosen] = sweep.diverged_at.get(chosen, 1.0)
    return sweep.result("random", trained, chosen, {})


def replay_stopper(
    curves: Curves,
    stopper: CollapseStopper,
    *,
    controls: Mapping[str, tuple[float, float]] | None = None,
    order: Sequence[str] | None = None,
    final_window: float = 0.0,
    finals: Mapping[str, float] | None = None,
    costs: Mapping[str, float] | None = None,
) -> ReplayResult:
    """Feed each trial's curve, point by point and one trial after another in `order`, to a live
    (asynchronous) stopper: what the scheduler would have done with one trial at a time."""
    sweep = _sweep(curves, costs, final_window, finals)
    trained: dict[str, float] = {}
    scores: dict[str, float] = {}
    finishers = []
    for t in order or sorted(sweep.curves):
        p, y = sweep.curves[t]
        tau, tpp = controls[t] if controls else (None, None)
        trained[t] = 1.0
        for pi, yi in zip(p.tolist(), y.tolist()):
            d = stopper.observe(t, pi, yi, tau=tau, tpp=tpp)
            if d.predicted is not None:
                scores[t] = d.predicted
            if d.stop:
                trained[t] = pi
                break
        else:
            stopper.complete(t)
            finishers.append(t)
    chosen = min(finishers, key=lambda t: sweep.finals[t]) if finishers else None
    return sweep.result("collapse-async", trained, chosen, scores)
