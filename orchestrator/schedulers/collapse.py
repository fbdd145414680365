"""Ray Tune adapter for collapse early stopping (Bergsma et al. 2025, https://arxiv.org/abs/2509.25087).

The decisions are `orchestrator.collapse.CollapseStopper`'s; this class only feeds it Tune's
results and persists its state to a JSON file after every decision, because Tune never calls a
scheduler's save/restore and a resumed sweep would otherwise forget which trials it stopped and
what it had predicted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from orchestrator.collapse import CollapseStopper


class CollapseScheduler(FIFOScheduler):
    # One result at a time: a buffered batch would let a trial run past its rung.
    _supports_buffered_results = False

    def __init__(
        self,
        stopper: CollapseStopper,
        *,
        metric: str,
        mode: str = "min",
        progress_attr: str = "progress",
        state_path: str | os.PathLike | None = None,
        on_decision: Callable[[str, dict[str, Any]], None] | None = None,
        diagnostics: Any = None,
    ) -> None:
        super().__init__()
        if mode != "min":
            raise ValueError("collapse early stopping compares losses: the objective mode must be 'min'")
        self.stopper = stopper
        self._metric = metric
        self._mode = mode
        self.progress_attr = progress_attr
        self.state_path = Path(state_path) if state_path else None
        self.decisions: dict[str, dict[str, Any]] = {}
        self.on_decision = on_decision
        self.diagnostics = diagnostics
        self._load()

    def _load(self) -> None:
        if self.state_path and self.state_path.is_file():
            saved = json.loads(self.state_path.read_text())
            self.stopper.load_state_dict(saved["stopper"])
            self.decisions = saved.get("decisions", {})

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Tuner.restore unpickles the scheduler pickled when the sweep began, with the state it
        # had then; the decisions taken since live in the state file.
        self.__dict__.update(state)
        self._load()

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        if metric and metric != self._metric:
            return False
        return True

    def _persist(self) -> None:
        if not self.state_path:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stopper": self.stopper.state_dict(), "decisions": self.decisions}))
        os.replace(tmp, self.state_path)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        tid = trial.trial_id
        if self.decisions.get(tid, {}).get("action") == "stop":
            return TrialScheduler.STOP  # decided before a restart: stays decided
        loss = result.get(self._metric)
        progress = result.get(self.progress_attr)
        if loss is None or progress is None:
            return TrialScheduler.CONTINUE
        decision = self.stopper.observe(tid, float(progress), float(loss), tau=result.get("tau"), tpp=result.get("tpp"))
        record = decision.to_dict()
        changed = record != self.decisions.get(tid)
        self.decisions[tid] = record
        if changed:
            self._persist()
            if decision.stop:
                why = "non-finite loss: diverged" if decision.diverged else (
                    f"predicted final {self._metric} {decision.predicted:.4f} > kept-quantile cutoff {decision.cutoff:.4f}")
                print(f"ladder: stopped trial {tid} at {decision.progress:.0%} of training ({why})", file=sys.stderr, flush=True)
            if self.on_decision:
                self.on_decision(tid, record)
        if self.diagnostics is not None:
            try:
                self.diagnostics.observe(self.stopper, tid, result, record)
            except Exception as exc:  # a diagnostic must never stop a sweep
                print(f"ladder: collapse diagnostic failed for {tid}: {exc}", file=sys.stderr)
        return TrialScheduler.STOP if decision.stop else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        self.stopper.complete(trial.trial_id)
        self._persist()

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self._persist()

    def debug_string(self) -> str:
        stopped = sum(1 for d in self.decisions.values() if d.get("action") == "stop")
        return f"CollapseScheduler: {stopped} of {len(self.decisions)} trials stopped"

