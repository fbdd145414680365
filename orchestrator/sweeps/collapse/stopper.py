"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

Collapse early stopping as pure decision logic (no Ray): the Ray Tune scheduler is an adapter that
feeds reports to `CollapseStopper.observe` and persists `state_dict()`.

At each rung r of training fraction a trial's predicted final loss is the divisor c* that aligns
its curve over [max(warmup_frac, r * window_start), r] with the reference (the paper's App. D,
steps 4-6, made asynchronous as in ASHA). The trial stops when c* is worse than the
`keep_quantile` quantile of the predictions recorded at that rung so far, itself included. A
non-finite loss stops the trial at once, marked diverged.

Defaults (reconstructions; the paper tunes by stopping everything at one point): rungs 0.1, 0.2,
0.3 — predictions from a 20-30% prefix are within ~1% at small scale, while a 10% prefix can err by
several percent, so the first rung is a coarse cut — and keep_quantile 0.5 (reduction factor 2),
which spends about 26% of a full sweep's compute when every rung halves the field. The fit window
[r/2, r] is the one measured at small scale; it drops the early phase, whose shape depends on
warmup and on how token-bound the smallest models are.

Prefer a held-out eval loss on a fixed set when the workload reports one: it cuts the seed-to-seed
spread of normalized curves several-fold compared with the per-step training loss.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.sweeps.collapse.curves import smooth
from orchestrator.sweeps.collapse.divisor import DivisorEstimate, fit_divisor_with_uncertainty
from orchestrator.sweeps.collapse.reference import EmpiricalReference, Reference, ReferenceFamily, resolve_reference

CONTINUE, STOP = "continue", "stop"
STATE_VERSION = 1


@dataclass(frozen=True)
class Decision:
    """What to do with a trial after a report, and why."""

    trial_id: str
    action: str
    """'continue' or 'stop'."""
    progress: float
    """The trial's training fraction when decided."""
    rung: float | None = None
    """The rung this decision was taken at; None between rungs."""
    predicted: float | None = None
    """Predicted final loss at the latest rung (None before the first)."""
    predicted_std: float | None = None
    """Its uncertainty (see `fit_divisor_with_uncertainty`)."""
    cutoff: float | None = None
    """The rung's quantile of predictions the trial was compared with."""
    diverged: bool = False
    """True when the trial reported a NaN or infinite loss."""
    reason: str = ""

    @property
    def stop(self) -> bool:
        return self.action == STOP

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Trial:
    progress: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    controls: dict[str, float] | None = None
    status: str = "running"  # running | stopped | diverged | completed
    stopped_at: float | None = None
    next_rung: int = 0
    rungs: dict[str, dict[str, Any]] = field(default_factory=dict)  # rung index -> decision


class CollapseStopper:
    """Asynchronous rung-based early stopping on collapse-predicted final loss.

    `reference` is one reference curve, or a family (`ParametricFit`, `ReferenceTable`) asked
    for each trial's (tau, tpp), given with its first report. `keep_quantile` is the fraction of
    trials kept at each rung; `reduction_factor` is the ASHA spelling of the same (keep 1/rf).
    `smooth_window=None` uses the reference's own smoothing. `margin` (in standard errors of the
    trial's own prediction, 0 by default) stops a trial only when its prediction is worse than the
    kept quantile by more than `margin` x its bootstrap standard error. Reports whose progress does not
    exceed the trial's last recorded one are ignored, so that a trial restored from a checkpoint
    and re-reporting points it had already sent is neither double-counted nor re-decided.
    A reference whose `ready` attribute is False (one still being built, e.g. from the sweep's
    own first finishers) defers the rung decisions of a trial: they are taken, each on the
    points up to its rung, at the trial's first report after the reference is ready.
    """

    def __init__(
        self,
        reference: Reference | ReferenceFamily,
        *,
        rungs: Sequence[float] = (0.1, 0.2, 0.3),
        keep_quantile: float | None = None,
        reduction_factor: float | None = None,
        window_start: float = 0.5,
        warmup_frac: float = 0.0,
        smooth_window: float | None = None,
        min_samples: int = 2,
        min_points: int = 1,
        n_boot: int = 100,
        margin: float = 0.0,
    ) -> None:
        if keep_quantile is not None and reduction_factor is not None:
            raise ValueError("give keep_quantile or reduction_factor, not both")
        if reduction_factor is not None:
            if reduction_factor < 1:
                raise ValueError(f"reduction_factor must be >= 1, got {reduction_factor}")
            keep_quantile = 1.0 / reduction_factor
        keep_quantile = 0.5 if keep_quantile is None else float(keep_quantile)
        if not 0 <= keep_quantile <= 1:
            raise ValueError(f"keep_quantile must be in [0, 1], got {keep_quantile}")
        rungs = [float(r) for r in rungs]
        if rungs != sorted(rungs) or len(set(rungs)) != len(rungs) or any(not 0 < r <= 1 for r in rungs):
            raise ValueError(f"rungs must be increasing training fractions in (0, 1], got {rungs}")
        if not 0 <= window_start < 1:
            raise ValueError(f"window_start must be in [0, 1), got {window_start}")
        if not (math.isfinite(float(margin)) and float(margin) >= 0):
            raise ValueError(f"margin must be a finite number of standard errors >= 0, got {margin!r}")
        self.reference = reference
        if smooth_window is None:
            smooth_window = float(getattr(reference, "smooth_window", 0.0))
        self.config: dict[str, Any] = {
            "rungs": rungs,
            "keep_quantile": keep_quantile,
            "window_start": float(window_start),
            "warmup_frac": float(warmup_frac),
            "smooth_window": float(smooth_window),
            "min_samples": int(min_samples),
            "min_points": int(min_points),
            "n_boot": int(n_boot),
            "margin": float(margin),
        }
        self._trials: dict[str, _Trial] = {}
        self._recorded: list[dict[str, float]] = [{} for _ in rungs]

    @property
    def rungs(self) -> list[float]:
        return list(self.config["rungs"])

    # -- reports ------------------------------------------------------------------------------

    def observe(
        self,
        trial_id: str,
        progress: float | ArrayLike,
        loss: float | ArrayLike,
        *,
        tau: float | None = None,
        tpp: float | None = None,
    ) -> Decision:
        """Record one report (or several, as arrays) of a trial and decide on it."""
        tid = str(trial_id)
        trial = self._trials.setdefault(tid, _Trial())
        if trial.controls is None and tau is not None and tpp is not None:
            if math.isfinite(float(tau)) and math.isfinite(float(tpp)):  # the state stays strict JSON
                trial.controls = {"tau": float(tau), "tpp": float(tpp)}
        if trial.status in ("stopped", "diverged"):
            return self._final_decision(tid, trial)
        ps = np.atleast_1d(np.asarray(progress, dtype=float))
        ls = np.atleast_1d(np.asarray(loss, dtype=float))
        if ps.shape != ls.shape:
            raise ValueError(f"progress and loss differ in shape: {ps.shape} vs {ls.shape}")
        decision: Decision | None = None
        for p, value in zip(ps.tolist(), ls.tolist()):
            if not math.isfinite(p):
                continue
            if not math.isfinite(value):
                trial.status, trial.stopped_at = "diverged", p
                return self._final_decision(tid, trial)
            if trial.progress and p <= trial.progress[-1]:
                continue
            trial.progress.append(p)
            trial.loss.append(value)
            rungs = self.config["rungs"]
            while trial.next_rung < len(rungs) and p >= rungs[trial.next_rung]:
                if not getattr(self._reference_for(trial), "ready", True):
                    break  # a reference still being built (e.g. from the sweep's first finishers): decide later
                decision = self._decide_at_rung(tid, trial, trial.next_rung)
                trial.next_rung += 1
                if decision.stop:
                    trial.status, trial.stopped_at = "stopped", p
                    return decision
        return decision or self._between_rungs(tid, trial)

    def complete(self, trial_id: str) -> None:
        """Mark a trial that ran to its end (its decisions stay as they were)."""
        trial = self._trials.setdefault(str(trial_id), _Trial())
        if trial.status == "running":
            trial.status = "completed"

    def status(self, trial_id: str) -> str:
        """'running', 'stopped', 'diverged', 'completed', or 'unknown'."""
        trial = self._trials.get(str(trial_id))
        return trial.status if trial else "unknown"

    def trial_ids(self) -> list[str]:
        return list(self._trials)

    def rung_decisions(self, trial_id: str) -> dict[float, dict[str, Any]]:
        """The decisions taken for a trial, by rung."""
        trial = self._trials[str(trial_id)]
        return {self.config["rungs"][int(i)]: dict(d) for i, d in trial.rungs.items()}

    def curve(self, trial_id: str) -> tuple[np.ndarray, np.ndarray]:
        trial = self._trials[str(trial_id)]
        return np.asarray(trial.progress), np.asarray(trial.loss)

    def predict(self, trial_id: str) -> DivisorEstimate | None:
        """The current predicted final loss from everything reported so far (for logging
        between rungs), or None when the window holds too few points."""
        trial = self._trials.get(str(trial_id))
        if trial is None or not trial.progress:
            return None
        return self._estimate(str(trial_id), trial, trial.progress[-1], salt="now")

    # -- decisions ----------------------------------------------------------------------------

    def _reference_for(self, trial: _Trial) -> Reference:
        controls = trial.controls or {}
        return resolve_reference(self.reference, controls.get("tau"), controls.get("tpp"))

    def _estimate(self, tid: str, trial: _Trial, upto: float, salt: str) -> DivisorEstimate | None:
        cfg = self.config
        lo = max(cfg["warmup_frac"], upto * cfg["window_start"])
        if not lo < upto:
            return None
        p = np.asarray(trial.progress)
        y = smooth(p, np.asarray(trial.loss), cfg["smooth_window"])
        keep = p <= upto
        p, y = p[keep], y[keep]
        n = int(np.count_nonzero(p >= lo))
        if n < cfg["min_points"]:
            return None
        ref = self._reference_for(trial)
        sigma = ref.sigma if isinstance(ref, EmpiricalReference) and ref.n_runs >= 2 else None
        block = None
        if cfg["smooth_window"] > 0:
            # smoothed points are correlated over one smoothing window: bootstrap whole windows
            block = max(1, round(n * cfg["smooth_window"] / (upto - lo)))
        seed = zlib.crc32(f"{tid}|{salt}".encode())  # stable across processes, unlike hash()
        try:
            return fit_divisor_with_uncertainty(
                p, y, ref, (lo, upto), sigma=sigma, n_boot=cfg["n_boot"], block=block, seed=seed
            )
        except ValueError:
            return None

    def _decide_at_rung(self, tid: str, trial: _Trial, index: int) -> Decision:
        rung = self.config["rungs"][index]
        now = trial.progress[-1]
        est = self._estimate(tid, trial, rung, salt=f"rung{index}")
        if est is None:
            record = {"action": CONTINUE, "reason": "too few points in the fit window"}
            trial.rungs[str(index)] = record
            return Decision(tid, CONTINUE, now, rung, reason=record["reason"])
        recorded = self._recorded[index]
        recorded[tid] = est.value
        values = np.fromiter(recorded.values(), dtype=float)
        cutoff = None
        action, reason = CONTINUE, "within the kept quantile"
        if values.size < self.config["min_samples"]:
            reason = "too few trials at this rung to compare"
        else:
            cutoff = float(np.quantile(values, self.config["keep_quantile"]))
            std = float(est.std) if est.std is not None and math.isfinite(float(est.std)) else 0.0
            if est.value > cutoff + self.config["margin"] * std:
                action, reason = STOP, "predicted final loss worse than the kept quantile"
            elif est.value > cutoff:
                reason = "worse than the kept quantile by less than its margin of error"
        trial.rungs[str(index)] = {
            "action": action,
            "reason": reason,
            "predicted": est.value,
            "predicted_std": est.std,
            "cutoff": cutoff,
        }
        return Decision(tid, action, now, rung, est.value, est.std, cutoff, reason=reason)

    def _between_rungs(self, tid: str, trial: _Trial) -> Decision:
        now = trial.progress[-1] if trial.progress else 0.0
        last = self._last_rung(trial)
        if last is None:
            return Decision(tid, CONTINUE, now)
        _, record = last
        return Decision(tid, CONTINUE, now, None, record.get("predicted"), record.get("predicted_std"), record.get("cutoff"))

    def _last_rung(self, trial: _Trial) -> tuple[float, dict[str, Any]] | None:
        if not trial.rungs:
            return None
        index = max(trial.rungs, key=int)
        return self.config["rungs"][int(index)], trial.rungs[index]

    def _final_decision(self, tid: str, trial: _Trial) -> Decision:
        at = trial.stopped_at if trial.stopped_at is not None else 0.0
        if trial.status == "diverged":
            return Decision(tid, STOP, at, diverged=True, reason="non-finite loss")
        rung, record = self._last_rung(trial)  # a stopped trial always has its stopping rung
        return Decision(
            tid, STOP, at, rung, record.get("predicted"), record.get("predicted_std"), record.get("cutoff"),
            reason=record["reason"],
        )

    # -- persistence --------------------------------------------------------------------------

    def replay(self, trial_id: str, progress: float, loss: float, *, tau: float | None = None,
               tpp: float | None = None) -> None:
        """Put back a point recorded before a restart, without deciding on it again (its rung
        decisions, if any, come from the saved state)."""
        trial = self._trials.setdefault(str(trial_id), _Trial())
        if trial.controls is None and tau is not None and tpp is not None and math.isfinite(tau) and math.isfinite(tpp):
            trial.controls = {"tau": float(tau), "tpp": float(tpp)}
        if math.isfinite(progress) and math.isfinite(loss) and (not trial.progress or progress > trial.progress[-1]):
            trial.progress.append(float(progress))
            trial.loss.append(float(loss))

    def trial_state(self, trial_id: str) -> dict[str, Any]:
        """One trial's decision state (everything but its curve), as plain JSON types."""
        t = self._trials.setdefault(str(trial_id), _Trial())
        return {"controls": dict(t.controls) if t.controls else None, "status": t.status, "stopped_at": t.stopped_at,
                "next_rung": t.next_rung, "rungs": {i: dict(d) for i, d in t.rungs.items()}}

    def set_trial_state(self, trial_id: str, state: Mapping[str, Any]) -> None:
        """Put back what `trial_state` returned (its curve is left as it is)."""
        t = self._trials.setdefault(str(trial_id), _Trial())
        t.controls = dict(state["controls"]) if state.get("controls") else None
        t.status, t.stopped_at, t.next_rung = state["status"], state["stopped_at"], int(state["next_rung"])
        t.rungs = {str(i): dict(d) for i, d in state["rungs"].items()}
        for i, record in t.rungs.items():  # the rung's recorded predictions are the trials' own
            if record.get("predicted") is not None:
                self._recorded[int(i)][str(trial_id)] = float(record["predicted"])

    def state_dict(self, *, curves: bool = True) -> dict[str, Any]:
        """Everything needed to continue with identical decisions, as plain JSON types (the
        reference is configuration and is passed again on restore). With `curves=False` the
        reported points are left out (a caller that journals them puts them back with
        `replay`), so the state's size does not grow with the reports."""
        return {
            "version": STATE_VERSION,
            "config": dict(self.config, rungs=list(self.config["rungs"])),
            "recorded": [dict(r) for r in self._recorded],
            "trials": {
                tid: {
                    "progress": list(t.progress) if curves else [],
                    "loss": list(t.loss) if curves else [],
                    "controls": dict(t.controls) if t.controls else None,
                    "status": t.status,
                    "stopped_at": t.stopped_at,
                    "next_rung": t.next_rung,
                    "rungs": {i: dict(d) for i, d in t.rungs.items()},
                }
                for tid, t in self._trials.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict()`; the configuration must match this stopper's, since
        decisions already taken under other rungs or quantiles would not be reproducible."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported collapse stopper state version {state.get('version')!r}")
        saved = {"margin": 0.0, **state["config"]}  # states saved before `margin` existed stopped at 0
        differ = sorted(k for k in set(saved) | set(self.config) if saved.get(k) != self.config.get(k))
        if differ:
            detail = ", ".join(f"{k}: saved {saved.get(k)!r}, now {self.config.get(k)!r}" for k in differ)
            raise ValueError(f"collapse stopper configuration changed since the state was saved ({detail})")
        self._recorded = [{str(k): float(v) for k, v in r.items()} for r in state["recorded"]]
        self._trials = {
            str(tid): _Trial(
                progress=[float(x) for x in t["progress"]],
                loss=[float(x) for x in t["loss"]],
                controls=dict(t["controls"]) if t["controls"] else None,
                status=t["status"],
                stopped_at=t["stopped_at"],
                next_rung=int(t["next_rung"]),
                rungs={str(i): dict(d) for i, d in t["rungs"].items()},
            )
            for tid, t in state["trials"].items()
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], reference: Reference | ReferenceFamily) -> "CollapseStopper":
        """A stopper rebuilt from a saved state with the configuration it was saved with."""
        stopper = cls(reference, **state["config"])
        stopper.load_state_dict(state)
        return stopper
