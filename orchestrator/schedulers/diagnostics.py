"""Deviation-from-collapse diagnostic while trials train (Bergsma et al. 2025, Sec. 4 and App. A).

For each trial result the collapse scheduler sees, this logs to the trial's MLflow run
`collapse/pred_final_loss` (the divisor fitted to the prefix so far) and, once the early-align
window [0.25, 0.5] has passed, `collapse/residual` (the normalized curve minus the reference,
divisor frozen from that window). When the residual stays above its seed-noise threshold, the run
is tagged `collapse.deviation_at` with the training fraction where the deviation began, and the
console says so.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from orchestrator import tracking
from orchestrator.collapse import (
    ALIGN,
    EmpiricalReference,
    calibrate_threshold,
    collapse_residual,
    detect_deviation,
    resolve_reference,
    seed_threshold,
)


class CollapseDiagnostics:
    def __init__(self, *, experiment: str, sweep_id: str, uri: str | None, window: int = 3, consecutive: int = 2) -> None:
        self.experiment = experiment
        self.sweep_id = sweep_id
        self.uri = uri
        self.window = window
        self.consecutive = consecutive
        self._runs: dict[str, str | None] = {}
        self._flagged: set[str] = set()

    def _run_id(self, trial_id: str) -> str | None:
        if trial_id not in self._runs:
            c = tracking.client(self.uri)
            exp = c.get_experiment_by_name(self.experiment)
            found = c.search_runs(
                [exp.experiment_id],
                filter_string=f"tags.`ladder.trial_id` = '{trial_id}' and tags.`ladder.sweep_id` = '{self.sweep_id}'",
                max_results=1,
            ) if exp else []
            if not found:
                return None  # the trial has not opened its run yet; look again next time
            self._runs[trial_id] = found[0].info.run_id
        return self._runs[trial_id]

    def observe(self, stopper: Any, trial_id: str, result: dict, decision: dict) -> dict[str, float]:
        """Compute the diagnostic for the trial's curve so far and log it; returns what was logged."""
        progress, loss = stopper.curve(trial_id)
        if progress.size < 2 or decision.get("diverged"):
            return {}
        metrics: dict[str, float] = {}
        estimate = stopper.predict(trial_id)
        if estimate is not None and math.isfinite(estimate.value):
            metrics["collapse/pred_final_loss"] = float(estimate.value)
        ref = resolve_reference(stopper.reference, result.get("tau"), result.get("tpp"))
        if progress[-1] > ALIGN[1] and np.count_nonzero((progress >= ALIGN[0]) & (progress <= ALIGN[1])) >= 1:
            res = collapse_residual(progress, loss, ref)
            metrics["collapse/residual"] = float(res.residual[-1])
            if isinstance(ref, EmpiricalReference) and ref.n_runs >= 2:
                threshold = calibrate_threshold(ref)
            else:
                threshold = seed_threshold(lambda t: np.full_like(t, np.nan))
            onset = detect_deviation(res.progress, res.residual, threshold, window=self.window,
                                     consecutive=self.consecutive, start=ALIGN[1])
            if onset is not None and trial_id not in self._flagged:
                self._flagged.add(trial_id)
                print(f"ladder: trial {trial_id} deviates from the collapsed curve since {onset:.0%} of training "
                      "(residual above its seed-noise threshold)", file=sys.stderr, flush=True)
                run_id = self._run_id(trial_id)
                if run_id:
                    tracking.set_tags(run_id, {"collapse.deviation_at": f"{onset:.4f}"}, uri=self.uri)
        run_id = self._run_id(trial_id)
        if run_id and metrics:
            step = int(result.get("step", result.get("training_iteration", 0)))
            sink = tracking.MlflowSink(run_id, self.uri)
            sink.log_metrics(metrics, step)
            sink.flush()
        return metrics
