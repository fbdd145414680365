"""Reference curves for collapse early stopping, read from finished runs in MLflow.

A reference sweep (e.g. `sweeps/celerity_reference.py`) trains small models under the controls
(tau, tpp) the tuning sweep will use. Its finished runs become either a table of empirical
references, one per (tau, tpp) with seeds averaged (`kind="empirical"`), or the paper's
parametric curve fitted across them (`kind="parametric"`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

import numpy as np

from orchestrator.tracking import sink as tracking
from orchestrator.sweep import REFERENCE_OPTIONS, SweepError, resolved_options


def finished_curves(experiment: str, metric: str, uri: str | None = None) -> list[dict[str, Any]]:
    """Every finished trial run of an experiment: progress, metric, tau and tpp arrays."""
    c = tracking.client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise SweepError(
            f"reference experiment {experiment!r} not found in {uri or tracking.tracking_uri()}: "
            "run the reference sweep first (e.g. `ladder sweep sweeps/celerity_reference.py`)"
        )
    runs = c.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED' and tags.`ladder.trial_id` != ''")
    curves = []
    for run in runs:
        if run.data.tags.get("ladder.stopped_early") == "true":
            continue  # a stopped trial's curve has no final loss to normalize by
        loss = {m.step: m.value for m in c.get_metric_history(run.info.run_id, metric)}
        progress = {m.step: m.value for m in c.get_metric_history(run.info.run_id, "progress")}
        steps = sorted(set(loss) & set(progress))
        if len(steps) < 3:
            continue
        tau = c.get_metric_history(run.info.run_id, "tau")
        tpp = c.get_metric_history(run.info.run_id, "tpp")
        curves.append(
            {
                "run_id": run.info.run_id,
                "progress": np.array([progress[s] for s in steps]),
                "loss": np.array([loss[s] for s in steps]),
                "tau": tau[-1].value if tau else float("nan"),
                "tpp": tpp[-1].value if tpp else float("nan"),
                "params": dict(run.data.params),
            }
        )
    if not curves:
        raise SweepError(f"reference experiment {experiment!r} has no finished runs reporting {metric!r} and progress")
    return curves


def load_reference(spec: Mapping[str, Any], *, metric: str, uri: str | None = None) -> Any:
    """Build the reference a collapse scheduler compares trials with."""
    from orchestrator.sweeps.collapse import ControlledCurve, EmpiricalReference, ReferenceTable, fit_parametric

    spec = resolved_options(spec, REFERENCE_OPTIONS)  # the keys Sweep.check() accepts, with their defaults
    kind = spec["kind"]
    curves = finished_curves(spec["experiment"], spec["metric"] or metric, uri)
    smooth_window = float(spec["smooth_window"])
    if kind == "parametric":
        return fit_parametric([ControlledCurve(c["progress"], c["loss"], c["tau"], c["tpp"]) for c in curves])
    if kind != "empirical":
        raise SweepError(f"reference kind must be 'empirical' or 'parametric', got {kind!r}")
    if all(not np.isfinite(c["tau"]) and not np.isfinite(c["tpp"]) for c in curves):
        # A workload that reports no controls (no tau, no tpp): one shape for every trial.
        return EmpiricalReference([(c["progress"], c["loss"]) for c in curves], smooth_window=smooth_window)
    groups: dict[tuple[float, float], list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for c in curves:
        key = (round(c["tau"], 4), round(c["tpp"], 3))
        groups[key].append((c["progress"], c["loss"]))
    entries = {key: EmpiricalReference(runs, smooth_window=smooth_window) for key, runs in groups.items()}
    return ReferenceTable(entries, rtol=float(spec["rtol"]))
