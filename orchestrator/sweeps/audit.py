"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

The early-stopping audit: replay stopping policies on the finished full curves of a sweep (run
with scheduler "fifo", every trial to the end) and report, per policy, the compute it would have
spent and its regret: the final loss of its pick over the best final loss, minus 1. It is the
safety check to run before trusting early stopping on a new family, and what
`benchmarks/early_stopping.py` measures. `ladder audit EXPERIMENT` calls `main_audit`.

Policies, each replayed at every stop point x of `budgets` (the paper's Fig. 9 axis):

* `collapse` — successive halving on the collapse-predicted final loss at rungs x/3, 2x/3, x,
  keeping half at each rung (the `CollapseScheduler`'s rule, replayed synchronously);
* `asha` — the same rungs and quantile on the current loss, so at equal compute by construction;
* `predicted-best` / `current-best` — the paper's policies: every trial to x, then only the one
  with the best predicted (or current) loss is finished;
* `median` — Ray's median stopping rule with its grace period at the first rung;
* `random` — one trial picked uniformly and trained: its expected regret over the pick.

Rungs before the trials' first common report are dropped (no scheduler could decide there). Every
policy sees the same smoothing, so a baseline is not handicapped by noisier scores. Compute is
weighted by each trial's cost, N * D (parameters times tokens), when the runs record both.

Which reference the collapse policies align prefixes with (`reference=`):

* a spec like `scheduler_options["reference"]` (`{"experiment": NAME, "kind": "empirical" |
  "parametric"}`), i.e. the reference the collapse scheduler would use: the audit that matters;
* a built reference or reference family (`EmpiricalReference`, `ReferenceTable`, `ParametricFit`);
* None: leave-one-out from the sweep itself. A trial's reference is the mean normalized curve of
  the *other* trials that share its controls (tau, tpp) when there are any (seeds, or a learning-
  rate sweep at fixed tau), else the paper's parametric curve fitted over the other trials, whose
  shape follows tau and TPP. A trial never sees its own curve, but its reference is at full size,
  so this is an optimistic audit of the *ranking*; a real collapse sweep aligns with small runs.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from orchestrator.sweep import SweepError
from orchestrator.sweeps.curves import SweepCurves, TrialCurve, load_sweep

DEFAULT_BUDGETS = (0.15, 0.3, 0.45, 0.6)
"""Stop points x; x = 0.3 gives the collapse scheduler's default rungs 0.1, 0.2, 0.3."""


# -- references ---------------------------------------------------------------------------------


class _PerTrial:
    """A reference family indexed by trial position: `replay_collapse` asks a family for each
    trial's controls, so keying the controls by position hands each trial its own reference."""

    def __init__(self, refs: Sequence[Any]) -> None:
        self.refs = list(refs)
        windows = {float(getattr(r, "smooth_window", 0.0)) for r in self.refs}
        self.smooth_window = windows.pop() if len(windows) == 1 else 0.0

    def for_controls(self, tau: float, tpp: float) -> Any:
        return self.refs[int(tau)]


def _same_controls(a: TrialCurve, b: TrialCurve, rtol: float = 0.05) -> bool:
    limit = math.log1p(rtol)
    return all(
        math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0 and abs(math.log(x / y)) <= limit
        for x, y in ((a.tau, b.tau), (a.tpp, b.tpp))
    )


def schedule_of(trials: Sequence[TrialCurve]) -> Any:
    """The LR schedule of the runs (their common warmup), for fitting the parametric curve."""
    from orchestrator.sweeps.collapse import LinearDecaySchedule

    # the parametric curve's LR term must follow the runs' own warmup
    warmups = {t.params.get("warmup_frac") for t in trials}
    if len(warmups) == 1 and (w := warmups.pop()) is not None:
        try:
            return LinearDecaySchedule(warmup_frac=float(w))
        except ValueError:
            pass
    return LinearDecaySchedule()


def leave_one_out(trials: Sequence[TrialCurve], smooth_window: float = 0.0) -> tuple[list[Any], str]:
    """Each trial's reference built from the other trials (see the module docstring)."""
    from orchestrator.sweeps.collapse import ControlledCurve, EmpiricalReference, fit_parametric

    usable = [t for t in trials if not t.diverged]
    refs, kinds = [], set()
    schedule = schedule_of(usable)
    controlled = all(math.isfinite(t.tau) and math.isfinite(t.tpp) for t in usable)
    for trial in trials:
        others = [t for t in usable if t.trial_id != trial.trial_id]
        peers = [t for t in others if _same_controls(t, trial)]
        if not others:
            raise SweepError("a leave-one-out reference needs at least two trials that did not diverge")
        if peers:
            refs.append(EmpiricalReference([(t.progress, t.loss) for t in peers], smooth_window=smooth_window))
            kinds.add("empirical")
        else:
            if not controlled:
                raise SweepError(
                    "trials report no tau/tpp, so no reference can follow their controls: pass "
                    "reference={'experiment': NAME} (--reference) naming a finished reference sweep"
                )
            fit = fit_parametric(
                [ControlledCurve(t.progress, t.loss, t.tau, t.tpp) for t in others], schedule=schedule,
                smooth_window=smooth_window,
            )
            refs.append(fit.for_controls(trial.tau, trial.tpp))
            kinds.add("parametric")
    label = "leave-one-out: " + " / ".join(
        {"empirical": "other trials at the same tau and tpp", "parametric": "parametric fit over the other trials"}[k]
        for k in sorted(kinds)
    )
    return refs, label


def _resolve(reference: Any, sweep: SweepCurves, uri: str | None, smooth_window: float) -> tuple[list[Any], str]:
    """One reference per trial (in `sweep.trials` order) and a description of where they came from."""
    from orchestrator.sweeps.collapse import resolve_reference

    if reference is None:
        return leave_one_out(sweep.trials, smooth_window)
    label = type(reference).__name__
    if isinstance(reference, Mapping):
        from orchestrator.sweeps.references import load_reference

        spec = dict(reference)
        if "experiment" not in spec:
            raise SweepError("a reference spec needs an 'experiment' naming a finished reference sweep, e.g. "
                             "{'experiment': 'celerity_reference', 'kind': 'empirical'}")
        spec.setdefault("smooth_window", smooth_window)
        try:
            reference = load_reference(spec, metric=spec.get("metric", sweep.metric), uri=spec.get("uri", uri))
        except ValueError as exc:
            raise SweepError(f"reference experiment {spec['experiment']!r}: {exc}; the reference sweep must run "
                             "every trial to the end (scheduler='fifo')") from None
        label = f"{spec.get('kind', 'empirical')} reference from experiment {spec['experiment']!r}"
    refs = []
    for t in sweep.trials:
        try:
            refs.append(resolve_reference(reference, t.tau, t.tpp))
        except KeyError as exc:
            raise SweepError(
                f"trial {t.trial_id}: {exc.args[0] if exc.args else exc}. Curves of another tau have another shape: "
                "add this tau to the reference sweep, or use a parametric reference ('kind': 'parametric')"
            ) from None
        except ValueError as exc:
            raise SweepError(f"trial {t.trial_id}: {exc} (the trials must report tau and tpp)") from None
    return refs, label


# -- the audit ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditRow:
    policy: str
    budget: float | None
    """The stop point x the policy was replayed at (None for random)."""
    setting: str
    compute_fraction: float
    regret: float
    chosen: str | None
    chosen_final: float | None


@dataclass
class AuditResult:
    experiment: str
    sweep_id: str
    parent_run_id: str | None
    metric: str
    reference: str
    n_trials: int
    best_trial: str
    best_final: float
    rows: list[AuditRow]
    finals: dict[str, float]
    left_out: dict[str, str] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    """trial id -> its point of the search space."""

    def policy(self, name: str) -> list[AuditRow]:
        return [r for r in self.rows if r.policy == name]

    def row(self, name: str, budget: float | None) -> AuditRow:
        for r in self.rows:
            if r.policy == name and (budget is None or (r.budget is not None and abs(r.budget - budget) < 1e-9)):
                return r
        raise KeyError(f"no row for policy {name!r} at budget {budget}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rows"] = [asdict(r) for r in self.rows]
        return out


def rungs_for(budget: float, first_report: float = 0.0) -> tuple[float, ...]:
    """The successive-halving rungs of stop point x: x/3, 2x/3, x, without rungs before the
    first report."""
    rungs = tuple(round(budget * k / 3, 6) for k in (1, 2, 3))
    kept = tuple(r for r in rungs if r >= first_report - 1e-9)
    return kept or (budget,)


def audit(
    experiment: str,
    *,
    metric: str = "eval/loss",
    reference: Any = None,
    uri: str | None = None,
    budgets: Sequence[float] = DEFAULT_BUDGETS,
    keep_quantile: float = 0.5,
    smooth_window: float | None = None,
    sweep_id: str | None = None,
    log: bool = True,
    plot: bool = True,
) -> AuditResult:
    """Replay the stopping policies on the finished curves of `experiment` (see the module
    docstring). `smooth_window=None` is 0 for held-out metrics (`eval/...`, one point per eval)
    and 0.02 of training otherwise. With `log`, the table (audit.txt, audit.json) and, with
    `plot`, the charts go to the sweep's parent run as artifacts."""
    from orchestrator.sweeps.collapse import replay_asha, replay_collapse, replay_current_best, replay_median

    budgets = sorted({float(b) for b in budgets})
    if not budgets or any(not 0 < b < 1 for b in budgets):
        raise SweepError(f"budgets are stop points in (0, 1), got {list(budgets)}")
    if smooth_window is None:
        smooth_window = 0.0 if metric.startswith("eval/") else 0.02
    sweep = load_sweep(experiment, metric, uri=uri, sweep_id=sweep_id)
    refs, ref_label = _resolve(reference, sweep, uri, smooth_window)
    ids = [t.trial_id for t in sweep.trials]
    curves = {t.trial_id: (t.progress, t.loss) for t in sweep.trials}
    costs = {t.trial_id: t.cost for t in sweep.trials}
    family = _PerTrial(refs)
    controls = {tid: (float(i), 1.0) for i, tid in enumerate(ids)}
    first = max(float(t.progress[0]) for t in sweep.trials)
    common = dict(smooth_window=smooth_window, costs=costs)

    rows: list[AuditRow] = []
    replays = []
    for x in budgets:
        rungs = rungs_for(x, first)
        setting = f"rungs {'/'.join(f'{r:g}' for r in rungs)}, keep {keep_quantile:.0%}"
        replays += [
            (x, setting, replay_collapse(curves, family, controls=controls, rungs=rungs, keep_quantile=keep_quantile, **common)),
            (x, setting, replay_asha(curves, rungs=rungs, keep_quantile=keep_quantile, **common)),
        ]
        pb = replay_collapse(curves, family, controls=controls, rungs=(x,), keep_quantile=0.0, **common)
        replays.append((x, f"all to {x:g}, finish 1", _renamed(pb, "predicted-best")))
        replays.append((x, f"all to {x:g}, finish 1", replay_current_best(curves, stop_at=x, **common)))
        grace = rungs[0]
        replays.append((x, f"grace {grace:g}, every 0.05",
                        replay_median(curves, grace=grace, check_every=0.05, min_samples=2, **common)))
    finals = {t.trial_id: (math.inf if t.diverged else float(t.loss[-1])) for t in sweep.trials}
    for x, setting, res in replays:
        pick = finals.get(res.chosen) if res.chosen else None
        rows.append(AuditRow(res.policy, x, setting, res.compute_fraction, res.regret, res.chosen, pick))
    best_id = min(finals, key=lambda t: finals[t])
    best = finals[best_id]
    healthy = [v for v in finals.values() if math.isfinite(v)]
    total = sum(costs.values())
    rows.append(AuditRow("random", None, "one uniform pick (expected)",
                         float(np.mean([costs[t] for t in ids])) / total, float(np.mean(healthy)) / best - 1, None, None))
    order = {p: i for i, p in enumerate(("collapse", "asha", "predicted-best", "current-best", "median", "random"))}
    rows.sort(key=lambda r: (order.get(r.policy, 99), r.budget if r.budget is not None else 0.0))
    result = AuditResult(experiment, sweep.sweep_id, sweep.parent_run_id, metric, ref_label, len(ids), best_id, best,
                         rows, finals, dict(sweep.left_out), labels={t.trial_id: t.label for t in sweep.trials if t.label})
    if log and sweep.parent_run_id:
        _log(result, sweep, refs, uri, plot)
    return result


def _renamed(res: Any, policy: str) -> Any:
    from dataclasses import replace

    return replace(res, policy=policy)


def _log(result: AuditResult, sweep: SweepCurves, refs: Sequence[Any], uri: str | None, plot: bool) -> None:
    from orchestrator.tracking import sink as tracking

    run_id = sweep.parent_run_id
    tracking.log_text(run_id, format_audit(result), "audit/audit.txt", uri=uri)
    tracking.log_text(run_id, json.dumps(_strict(result.to_dict()), indent=2, default=_json_default), "audit/audit.json",
                      uri=uri)
    result.artifacts += ["audit/audit.txt", "audit/audit.json"]
    if not plot:
        return
    from orchestrator.sweeps import plots

    with tempfile.TemporaryDirectory(prefix="ladder-audit-") as tmp:
        charts = [
            plots.plot_audit(result, os.path.join(tmp, "compute_vs_regret.png")),
            plots.plot_collapse(
                {t.trial_id: (t.progress, t.loss) for t in sweep.trials},
                os.path.join(tmp, "collapsed_curves.png"),
                references={t.trial_id: r for t, r in zip(sweep.trials, refs)},
                title=f"{result.experiment}: normalized {result.metric} against the reference",
            ),
            plots.plot_residuals(
                plots.residuals({t.trial_id: (t.progress, t.loss) for t in sweep.trials if not t.diverged},
                                {t.trial_id: r for t, r in zip(sweep.trials, refs)}),
                os.path.join(tmp, "residuals.png"),
                threshold=plots.threshold_for(refs),
                title=f"{result.experiment}: collapse residuals (divisor frozen from 25-50%)",
            ),
        ]
        for path in charts:
            if path is not None:
                plots.log_figure(path, run_id, artifact_path="audit", uri=uri)
                result.artifacts.append(f"audit/{Path(path).name}")


def _strict(x: Any) -> Any:
    """inf and nan as strings, so audit.json stays strict JSON (a diverged pick has regret inf)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{100 * x:.2f}%"


def format_audit(result: AuditResult) -> str:
    """The audit as a plain-text table, one row per policy and stop point."""
    lines = [
        f"audit of {result.experiment!r} (sweep {result.sweep_id}): {result.n_trials} full curves of {result.metric}",
        f"best final {result.metric}: {result.best_final:.4f} (trial {result.best_trial}"
        + (f", {result.labels[result.best_trial]}" if result.best_trial in result.labels else "")
        + f"); reference: {result.reference}",
    ]
    if result.left_out:
        lines.append(f"left out (not full curves): {len(result.left_out)} trial(s): "
                     + ", ".join(f"{t} {why}" for t, why in sorted(result.left_out.items())))
    head = ("policy", "stop at", "setting", "compute", "regret", "pick", "pick final")
    table = [head]
    for r in result.rows:
        table.append((
            r.policy,
            "-" if r.budget is None else f"{r.budget:g}",
            r.setting,
            _pct(r.compute_fraction),
            _pct(r.regret),
            "-" if r.chosen is None else (f"{r.chosen} ({result.labels[r.chosen]})" if r.chosen in result.labels else r.chosen),
            "-" if r.chosen_final is None else f"{r.chosen_final:.4f}",
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    right = {3, 4, 6}
    for k, row in enumerate(table):
        lines.append("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("compute: share of running every trial to the end; regret: final loss of the pick / best - 1")
    return "\n".join(lines)


def _family_axis(sweep: SweepCurves, group_by: str = "width", seed_key: str = "seed") -> bool:
    groups: dict[str, set[str]] = defaultdict(set)
    for t in sweep.trials:
        if group_by not in t.params or seed_key not in t.params:
            return False
        groups[t.params[group_by]].add(t.params[seed_key])
    return len(groups) >= 2 and all(len(s) >= 2 for s in groups.values())


def main_audit(args: Any) -> int:
    """`ladder audit EXPERIMENT [--metric M] [--reference EXP] [--no-plot]`.

    Reads `args.experiment`, `args.metric` (default eval/loss), `args.reference_experiment`
    (None: leave-one-out), `args.plot`; optionally `args.reference_kind` ('empirical' or
    'parametric') and `args.budgets`. Prints the table; a family sweep (several widths, several
    seeds each) also gets its collapse numbers. Raises SweepError on bad input.
    """
    from orchestrator.tracking import sink as tracking

    metric = getattr(args, "metric", None) or "eval/loss"
    ref_exp = getattr(args, "reference_experiment", None)
    reference = None
    if ref_exp:
        reference = {"experiment": ref_exp, "kind": getattr(args, "reference_kind", None) or "empirical"}
    budgets = getattr(args, "budgets", None) or DEFAULT_BUDGETS
    plot = bool(getattr(args, "plot", True))
    result = audit(args.experiment, metric=metric, reference=reference, budgets=budgets, plot=plot)
    print(format_audit(result))
    sweep = load_sweep(args.experiment, metric, sweep_id=result.sweep_id)
    if _family_axis(sweep):
        from orchestrator.sweeps.plots import family_collapse_report, format_family

        print()
        print(format_family(family_collapse_report(args.experiment, metric=metric, plot=plot, sweep_id=result.sweep_id)))
    if result.artifacts and result.parent_run_id:
        print(f"artifacts ({', '.join(Path(a).name for a in result.artifacts)}) on the sweep's parent run: "
              + tracking.run_link(result.parent_run_id))
    return 0
