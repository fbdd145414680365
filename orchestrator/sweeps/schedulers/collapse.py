"""Ray Tune adapter for collapse early stopping (Bergsma et al. 2025, https://arxiv.org/abs/2509.25087).

The decisions are `orchestrator.sweeps.collapse.CollapseStopper`'s; this class only feeds it Tune's
results and persists its state, because Tune never calls a scheduler's save/restore and a
resumed sweep would otherwise forget which trials it stopped and what it had predicted.

Persistence is an append-only journal beside the state file (`<state>.journal.jsonl`), so that a
decision costs the same after 20,000 reports as after 20: each result appends its point, each
changed decision appends the trial's new decision state, one short line each. The state file
(`scheduler.json`: the stopper with its curves, and the decisions) is the journal folded up; it is
rewritten when a scheduler starts on an existing journal (a resumed sweep) and when the sweep
ends (`checkpoint()`). `read_state(path)` gives the current state at any time, journal included.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from orchestrator.sweeps.collapse import CollapseStopper


def journal_of(state_path: str | os.PathLike) -> Path:
    return Path(state_path).with_suffix(".journal.jsonl")


def _fold(state_path: Path, stopper: CollapseStopper) -> dict[str, dict[str, Any]]:
    """Load the state file into `stopper`, replay the journal over it; returns the decisions."""
    decisions: dict[str, dict[str, Any]] = {}
    if state_path.is_file():
        saved = json.loads(state_path.read_text())
        stopper.load_state_dict(saved["stopper"])
        decisions = saved.get("decisions", {})
    journal = journal_of(state_path)
    if journal.is_file():
        for line in journal.read_text().splitlines():
            try:
                event = json.loads(line)
                if event[0] == "p":
                    _, tid, p, loss, tau, tpp = event
                    stopper.replay(tid, float(p), float(loss), tau=tau, tpp=tpp)
                elif event[0] == "d":
                    _, tid, record, trial_state = event
                    if record is not None:
                        decisions[tid] = record
                    stopper.set_trial_state(tid, trial_state)
            except (ValueError, TypeError, KeyError, IndexError):
                continue  # a line cut short by a kill mid-write
    return decisions


def read_state(state_path: str | os.PathLike) -> dict[str, Any]:
    """The collapse scheduler's state as of now: {'stopper': ..., 'decisions': ...}, journal included."""
    state_path = Path(state_path)
    saved = json.loads(state_path.read_text()) if state_path.is_file() else None
    if saved is None and not journal_of(state_path).is_file():
        return {"stopper": None, "decisions": {}}
    config = (saved or {}).get("stopper", {}).get("config") or _journal_config(state_path)
    from orchestrator.sweeps.collapse.reference import EmpiricalReference  # noqa: F401  (a reference is not needed to read)

    stopper = CollapseStopper(lambda t: t, **config)
    decisions = _fold(state_path, stopper)
    return {"stopper": stopper.state_dict(), "decisions": decisions}


def _journal_config(state_path: Path) -> dict[str, Any]:
    first = journal_of(state_path).read_text().splitlines()[:1]
    event = json.loads(first[0]) if first else None
    if not event or event[0] != "c":
        raise ValueError(f"{journal_of(state_path)} does not start with the stopper's configuration")
    return event[1]


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
        self.announce = True
        """Print a line when a trial is stopped (off while the sweep's view shows why)."""
        self._load()

    @property
    def journal_path(self) -> Path | None:
        return journal_of(self.state_path) if self.state_path else None

    def _load(self) -> None:
        self._journal = None
        if not self.state_path:
            return
        if self.state_path.is_file() or self.journal_path.is_file():
            self.decisions = _fold(self.state_path, self.stopper)
            self.checkpoint()  # fold the journal into the state file: the next one starts short

    def checkpoint(self) -> None:
        """Write the whole state (curves and decisions) to the state file and start a new journal."""
        if not self.state_path:
            return
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stopper": self.stopper.state_dict(), "decisions": self.decisions}))
        os.replace(tmp, self.state_path)
        self.journal_path.unlink(missing_ok=True)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Tuner.restore unpickles the scheduler pickled when the sweep began, with the state it
        # had then; the decisions taken since live in the state file and its journal.
        self.__dict__.update(state)
        self._load()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_journal"] = None  # an open file does not pickle; reopened on the next append
        return state

    def _write(self, event: list[Any]) -> None:
        if not self.journal_path:
            return
        if self._journal is None:
            self.journal_path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.journal_path.is_file()
            self._journal = open(self.journal_path, "a", encoding="utf-8")
            if fresh:  # so that the journal alone can be read without the state file
                self._journal.write(json.dumps(["c", self.stopper.config]) + "\n")
        self._journal.write(json.dumps(event) + "\n")
        self._journal.flush()  # in the OS's hands: survives the driver's death, not the machine's

    def _append(self, tid: str, progress: float, loss: float, tau: Any, tpp: Any) -> None:
        num = lambda x: float(x) if x is not None and math.isfinite(float(x)) else None  # noqa: E731
        self._write(["p", tid, progress, loss, num(tau), num(tpp)])

    def _persist(self, tid: str) -> None:
        self._write(["d", tid, self.decisions.get(tid), self.stopper.trial_state(tid)])

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        if metric and metric != self._metric:
            return False
        return True

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
            self._persist(tid)
            if decision.stop and getattr(self, "announce", True):
                why = "non-finite loss: diverged" if decision.diverged else (
                    f"predicted final {self._metric} {decision.predicted:.4f} > kept-quantile cutoff {decision.cutoff:.4f}")
                print(f"ladder: stopped trial {tid} at {decision.progress:.0%} of training ({why})", file=sys.stderr, flush=True)
            if self.on_decision:
                self.on_decision(tid, record)
        if self.diagnostics is not None:
            try:
                self.diagnostics.submit(self.stopper, tid, result, record)
            except Exception as exc:  # a diagnostic must never stop a sweep
                print(f"ladder: collapse diagnostic failed for {tid}: {exc}", file=sys.stderr)
        return TrialScheduler.STOP if decision.stop else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        self.stopper.complete(trial.trial_id)
        self._persist(trial.trial_id)
        self._flush_diagnostics(trial.trial_id)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self._persist(trial.trial_id)
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

