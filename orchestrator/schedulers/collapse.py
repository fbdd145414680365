"""Ray Tune adapter for collapse early stopping (Bergsma et al. 2025, https://arxiv.org/abs/2509.25087).

The decisions are `orchestrator.collapse.CollapseStopper`'s; this class only feeds it Tune's
results and persists its state, because Tune never calls a scheduler's save/restore and a
resumed sweep would otherwise forget which trials it stopped and what it had predicted.

Persistence is incremental, so that a decision costs the same after 20,000 reports as after
20: every result's point is appended to a journal (`<state>.points.jsonl`, one short line), and
the state file proper (decisions and the stopper's rung records, without the curves) is
rewritten only when a decision changes: at rungs, stops and completions. A restore loads the
state and replays the journal's points into the curves.
"""

from __future__ import annotations

import json
import math
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

    @property
    def journal_path(self) -> Path | None:
        return self.state_path.with_suffix(".points.jsonl") if self.state_path else None

    def _load(self) -> None:
        self._journal = None
        if self.state_path and self.state_path.is_file():
            saved = json.loads(self.state_path.read_text())
            self.stopper.load_state_dict(saved["stopper"])
            self.decisions = saved.get("decisions", {})
        if self.journal_path and self.journal_path.is_file():
            for line in self.journal_path.read_text().splitlines():
                try:
                    tid, p, loss, tau, tpp = json.loads(line)
                except (ValueError, TypeError):
                    continue  # a line cut short by a kill mid-write
                self.stopper.replay(tid, float(p), float(loss), tau=tau, tpp=tpp)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_journal"] = None  # an open file does not pickle; reopened on the next append
        return state

    def _append(self, tid: str, progress: float, loss: float, tau: Any, tpp: Any) -> None:
        if not self.journal_path:
            return
        if self._journal is None:
            self.journal_path.parent.mkdir(parents=True, exist_ok=True)
            self._journal = open(self.journal_path, "a", encoding="utf-8")
        num = lambda x: float(x) if x is not None and math.isfinite(float(x)) else None  # noqa: E731
        self._journal.write(json.dumps([tid, progress, loss if math.isfinite(loss) else None, num(tau), num(tpp)]) + "\n")
        self._journal.flush()  # in the OS's hands: survives the driver's death, not the machine's

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
        tmp.write_text(json.dumps({"stopper": self.stopper.state_dict(curves=False), "decisions": self.decisions}))
        os.replace(tmp, self.state_path)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        tid = trial.trial_id
        if self.decisions.get(tid, {}).get("action") == "stop":
            return TrialScheduler.STOP  # decided before a restart: stays decided
        loss = result.get(self._metric)
        progress = result.get(self.progress_attr)
        if loss is None or progress is None:
            return TrialScheduler.CONTINUE
        tau, tpp = result.get("tau"), result.get("tpp")
        if math.isfinite(float(loss)):
            self._append(tid, float(progress), float(loss), tau, tpp)
        decision = self.stopper.observe(tid, float(progress), float(loss), tau=tau, tpp=tpp)
        record = decision.to_dict()
        before = self.decisions.get(tid) or {}
        # The progress moves with every report; the decision changes only at rungs and stops.
        changed = {k: v for k, v in record.items() if k != "progress"} != {k: v for k, v in before.items() if k != "progress"}
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
        self._flush_diagnostics(trial.trial_id)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self._persist()
        self._flush_diagnostics(trial.trial_id)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        self._flush_diagnostics(trial.trial_id)

    def _flush_diagnostics(self, trial_id: str | None = None) -> None:
        if self.diagnostics is not None and hasattr(self.diagnostics, "flush"):
            try:
                self.diagnostics.flush(trial_id)
            except Exception as exc:  # a diagnostic must never stop a sweep
                print(f"ladder: collapse diagnostic failed to record: {exc}", file=sys.stderr)

    def debug_string(self) -> str:
        stopped = sum(1 for d in self.decisions.values() if d.get("action") == "stop")
        return f"CollapseScheduler: {stopped} of {len(self.decisions)} trials stopped"

