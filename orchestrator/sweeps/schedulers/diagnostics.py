"""Deviation-from-collapse diagnostic while trials train (Bergsma et al. 2025, Sec. 4 and App. A).

For each trial result the collapse scheduler sees, this logs to the trial's MLflow run
`collapse/pred_final_loss` (the divisor fitted to the prefix so far) and, once the early-align
window [0.25, 0.5] has passed, `collapse/residual` (the normalized curve minus the reference,
divisor frozen from that window). When the residual stays above its seed-noise threshold, the run
is tagged `collapse.deviation_at` with the training fraction where the deviation began, and the
console says so.

The scheduler calls `submit`, which only copies the trial's curve and queues it: the fits and
MLflow writes run on a background thread, off Tune's decision path. A diagnostic is computed
when a trial has advanced `every` training fraction since its last one (and at its last report),
and logged through one buffered MLflow sink per trial.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
from typing import Any

import numpy as np

from orchestrator.tracking import sink as tracking
from orchestrator.sweeps.collapse import (
    ALIGN,
    EmpiricalReference,
    calibrate_threshold,
    collapse_residual,
    detect_deviation,
    resolve_reference,
    seed_threshold,
)


class CollapseDiagnostics:
    def __init__(self, *, experiment: str, sweep_id: str, uri: str | None, window: int = 3, consecutive: int = 2,
                 every: float = 0.02) -> None:
        self.experiment = experiment
        self.sweep_id = sweep_id
        self.uri = uri
        self.window = window
        self.consecutive = consecutive
        self._runs: dict[str, str | None] = {}
        self._flagged: set[str] = set()
        self.every = every
        self._last: dict[str, float] = {}
        self._sinks: dict[str, Any] = {}
        self._queue: queue.Queue | None = None

    def submit(self, stopper: Any, trial_id: str, result: dict, decision: dict) -> None:
        """Queue a diagnostic of the trial's curve as it is now; it is computed and logged beside
        the scheduler, which does not wait for it."""
        trial = stopper._trials.get(str(trial_id))
        if trial is None or len(trial.progress) < 2 or decision.get("diverged"):
            return
        now = float(trial.progress[-1])
        if now - self._last.get(trial_id, -1.0) < self.every and now < 1.0 - 1e-9:
            return
        self._last[trial_id] = now
        if self._queue is None:
            self._queue = queue.Queue()
            threading.Thread(target=self._work, name="collapse-diagnostics", daemon=True).start()
        self._queue.put((_CurveSnapshot(stopper, str(trial_id)), trial_id, dict(result), dict(decision)))

    def _work(self) -> None:
        while True:
            snapshot, trial_id, result, decision = self._queue.get()
            try:
                if snapshot is None:  # a trial ended: send what its sink holds
                    self._flush_sinks(trial_id)
                    continue
                self.observe(snapshot, trial_id, result, decision, throttle=False)
            except Exception as exc:  # a diagnostic must never stop a sweep
                print(f"ladder: collapse diagnostic failed for {trial_id}: {exc}", file=sys.stderr)
            finally:
                self._queue.task_done()

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

    def observe(self, stopper: Any, trial_id: str, result: dict, decision: dict, *, throttle: bool = True) -> dict[str, float]:
        """Compute the diagnostic for the trial's curve so far and log it; returns what was logged."""
        progress, loss = stopper.curve(trial_id)
        if progress.size < 2 or decision.get("diverged"):
            return {}
        now = float(progress[-1])
        if throttle:
            if now - self._last.get(trial_id, -1.0) < self.every and now < 1.0 - 1e-9:
                return {}
            self._last[trial_id] = now
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
            if run_id not in self._sinks:
                self._sinks[run_id] = tracking.MlflowSink(run_id, self.uri)
            self._sinks[run_id].log_metrics(metrics, step)
            if now >= 1.0 - 1e-9:
                self._sinks[run_id].flush()
        return metrics

    def __getstate__(self) -> dict[str, Any]:
        self.flush()
        state = dict(self.__dict__)
        state["_sinks"] = {}  # clients, buffers and the worker thread stay with the process that made them
        state["_queue"] = None
        return state

    def flush(self, trial_id: str | None = None) -> None:
        """Send what is buffered: for one trial, after its queued diagnostics (without waiting for
        them); for all, waiting until the queue is done."""
        if trial_id is not None and self._queue is not None:
            self._queue.put((None, trial_id, {}, {}))
            return
        if self._queue is not None:
            self._queue.join()
        self._flush_sinks(trial_id)

    def _flush_sinks(self, trial_id: str | None = None) -> None:
        run_ids = [self._runs.get(trial_id)] if trial_id is not None else list(self._sinks)
        for run_id in run_ids:
            if run_id in self._sinks:
                self._sinks[run_id].flush()


class _CurveSnapshot:
    """What `observe` reads of a stopper, copied at one report, so that the diagnostic can run on
    another thread while the stopper takes further reports."""

    def __init__(self, stopper: Any, trial_id: str) -> None:
        from orchestrator.sweeps.collapse.stopper import _Trial

        t = stopper._trials[trial_id]
        self._trial = _Trial(progress=list(t.progress), loss=list(t.loss),
                             controls=dict(t.controls) if t.controls else None)
        self._stopper = stopper
        self.reference = stopper.reference

    def curve(self, trial_id: str) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self._trial.progress), np.asarray(self._trial.loss)

    def predict(self, trial_id: str) -> Any:
        # The stopper's fit reads only its configuration and reference, which do not change.
        return self._stopper._estimate(str(trial_id), self._trial, self._trial.progress[-1], salt="now")
