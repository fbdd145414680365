"""A finished sweep's curves read back from MLflow: every trial that ran to the end, with its
progress and objective arrays, its controls (tau, tpp), its compute weight and its params.

The early-stopping audit (`orchestrator.sweeps.audit`) replays policies on them and the family plots
(`orchestrator.sweeps.plots`) draw them; both read them through here.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.sweep import SweepError

FULL = 0.99
"""A curve whose last progress reaches this ran to the end (as the replays require)."""


@dataclass(frozen=True)
class TrialCurve:
    """One trial's full curve and what the audit needs about it."""

    trial_id: str
    run_id: str
    progress: np.ndarray
    loss: np.ndarray
    tau: float
    tpp: float
    cost: float
    """N * D when the run recorded both (else D, else 1): the compute weight of the trial."""
    params: dict[str, str]
    """The run's MLflow params (the flattened config)."""
    label: str = ""
    """The trial's point of the search space, e.g. 'tau=0.1036'."""

    @property
    def diverged(self) -> bool:
        return bool(np.any(~np.isfinite(self.loss)))


@dataclass(frozen=True)
class SweepCurves:
    experiment: str
    sweep_id: str
    parent_run_id: str | None
    metric: str
    trials: list[TrialCurve]
    left_out: dict[str, str] = field(default_factory=dict)
    """trial id -> why it is not audited (stopped early, still running, too few points)."""


def _history(c: Any, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in c.get_metric_history(run_id, key)}


def load_sweep(
    experiment: str, metric: str = "eval/loss", *, uri: str | None = None, sweep_id: str | None = None
) -> SweepCurves:
    """The full curves of one invocation of a sweep: `sweep_id`, or the latest one holding at
    least two full curves. Raises SweepError naming the problem and the fix."""
    from orchestrator.tracking import sink as tracking

    store = uri or tracking.tracking_uri()
    c = tracking.client(store)
    exp = c.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage == "deleted":
        names = sorted(e.name for e in c.search_experiments())
        from orchestrator.runners.config import closest

        hint = closest(experiment, names) if names else None
        known = f" Known experiments: {', '.join(names)}." if names else " The store holds no experiments."
        did = f" Did you mean {hint!r}?" if hint else ""
        raise SweepError(
            f"experiment {experiment!r} not found in {store}.{did}{known} Run the sweep first "
            "(`ladder sweep FILE` with scheduler='fifo'), or point MLFLOW_TRACKING_URI at the store that holds it"
        )
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`ladder.trial_id` != ''", max_results=50000)
    by_sweep: dict[str, list[Any]] = defaultdict(list)
    for run in runs:
        by_sweep[run.data.tags.get("ladder.sweep_id", "")].append(run)
    if not by_sweep:
        raise SweepError(
            f"experiment {experiment!r} holds no sweep trials (runs tagged ladder.trial_id): the audit replays "
            "the trials of a sweep; run one with `ladder sweep FILE` and scheduler='fifo'"
        )
    if sweep_id is not None and sweep_id not in by_sweep:
        raise SweepError(f"experiment {experiment!r} has no sweep {sweep_id!r}; it has {', '.join(sorted(by_sweep))}")
    candidates = [sweep_id] if sweep_id else sorted(by_sweep, key=lambda s: max(r.info.start_time for r in by_sweep[s]), reverse=True)
    reasons: dict[str, dict[str, str]] = {}
    for sid in candidates:
        loaded = _load_invocation(c, experiment, sid, by_sweep[sid], metric)
        if len(loaded.trials) >= 2:
            return loaded
        reasons[sid] = loaded.left_out
    detail = "; ".join(
        f"sweep {sid}: " + (", ".join(f"{t} {why}" for t, why in sorted(r.items())[:6]) or "no trials")
        + (" ..." if len(r) > 6 else "")
        for sid, r in reasons.items()
    )
    raise SweepError(
        f"experiment {experiment!r} has fewer than two trials whose {metric!r} curve ran to the end ({detail}). "
        "The audit replays stopping policies on full curves: rerun the sweep with scheduler='fifo' so that "
        "every trial finishes (or choose --metric among what the trials report)"
    )


def _label(trial_params: str | None) -> str:
    try:
        point = json.loads(trial_params or "{}")
    except json.JSONDecodeError:
        return ""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(point.items()))


def _load_invocation(c: Any, experiment: str, sweep_id: str, runs: list[Any], metric: str) -> SweepCurves:
    from orchestrator.tracking.sink import get_final

    trials, left_out = [], {}
    parents = {r.data.tags.get("mlflow.parentRunId") for r in runs} - {None}
    for run in sorted(runs, key=lambda r: r.data.tags["ladder.trial_id"]):
        tags = run.data.tags
        tid = tags["ladder.trial_id"]
        if run.info.status != "FINISHED":
            left_out[tid] = f"is {run.info.status.lower()}"
            continue
        if tags.get("ladder.stopped_early") == "true":
            left_out[tid] = f"was stopped early at {float(tags.get('ladder.stopped_at', 'nan')):.0%}"
            continue
        loss = _history(c, run.info.run_id, metric)
        progress = _history(c, run.info.run_id, "progress")
        steps = sorted(set(loss) & set(progress))
        if len(steps) < 3:
            left_out[tid] = f"reported {metric!r} with progress at {len(steps)} steps (needs 3)"
            continue
        p = np.array([progress[s] for s in steps], dtype=float)
        y = np.array([loss[s] for s in steps], dtype=float)
        if np.all(np.isfinite(y)) and p.max() < FULL:
            left_out[tid] = f"ended at progress {p.max():.0%}"
            continue
        last = run.data.metrics
        final = get_final(run, mlflow_client=c) or {}
        n_params, tokens = final.get("params"), last.get("tokens")
        cost = float(n_params) * float(tokens) if n_params and tokens else float(tokens or 1.0)
        trials.append(
            TrialCurve(tid, run.info.run_id, p, y, float(last.get("tau", math.nan)), float(last.get("tpp", math.nan)),
                       cost, dict(run.data.params), _label(tags.get("ladder.trial_params")))
        )
    parent = parents.pop() if len(parents) == 1 else None
    return SweepCurves(experiment, sweep_id, parent, metric, trials, left_out)
