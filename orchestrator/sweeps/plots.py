"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

Plots as PNG files, for MLflow artifacts: normalized curves collapsed against their reference,
collapse residuals over training fraction with the seed-noise threshold band, and the audit's
compute-vs-regret chart. Also the family collapse measurement: whether a model family's
normalized curves, after 20% of training, spread across widths no more than across seeds.

matplotlib is imported only when a plot is drawn, and only its object-oriented API is used
(`Figure` with the Agg canvas), so no global backend is switched and nothing opens a window.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.sweep import SweepError

Curves = Mapping[str, tuple[ArrayLike, ArrayLike]]


def _figure(width: float = 7.0, height: float = 4.5) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _save(fig: Any, path: str | os.PathLike) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return str(path)


def _colors(keys: Sequence[Any]) -> dict[Any, Any]:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    n = max(1, len(keys) - 1)
    return {k: cmap(0.9 * i / n) for i, k in enumerate(keys)}


def _sort_key(x: Any) -> tuple[int, Any]:
    try:
        return (0, float(x))
    except (TypeError, ValueError):
        return (1, str(x))


# -- collapsed curves ---------------------------------------------------------------------------


def plot_collapse(
    curves: Curves,
    path: str | os.PathLike,
    *,
    references: Any = None,
    groups: Mapping[str, Any] | None = None,
    title: str = "normalized loss curves",
    smooth_window: float = 0.0,
    after: float | None = None,
) -> str:
    """Each curve divided by its own final loss over training fraction, colored by `groups`
    (e.g. width), against `references`: one reference curve, or a mapping from curve to its own
    (dashed, in the curve's color, when they differ). Returns the PNG's path."""
    from orchestrator.sweeps.collapse import normalize

    fig = _figure()
    ax = fig.add_subplot()
    ids = sorted(curves)
    group_of = {tid: (groups or {}).get(tid, tid) for tid in ids}
    keys = sorted(set(group_of.values()), key=_sort_key)
    color = _colors(keys)
    labelled: set[Any] = set()
    lows, highs = [], []
    for tid in ids:
        p, y = (np.asarray(a, dtype=float) for a in curves[tid])
        if not np.all(np.isfinite(y)):
            continue  # a diverged curve has no final loss to normalize by
        ell = normalize(p, y, smooth_window=smooth_window)
        g = group_of[tid]
        ax.plot(p, ell, color=color[g], lw=1.2, alpha=0.85, label=str(g) if g not in labelled else None)
        labelled.add(g)
        tail = ell[p >= (after if after is not None else 0.2)]
        if tail.size:
            lows.append(tail.min())
            highs.append(tail.max())
    t = np.linspace(0.0, 1.0, 401)
    if references is not None and not isinstance(references, Mapping):
        ax.plot(t, references(t), color="black", ls="--", lw=1.5, label="reference")
    elif references:
        drawn: set[int] = set()
        for tid in ids:
            ref = references.get(tid)
            if ref is None or id(ref) in drawn:
                continue
            ax.plot(t, ref(t), color=color[group_of[tid]], ls="--", lw=1.0, alpha=0.9,
                    label=None if drawn else "reference (per trial)")
            drawn.add(id(ref))
    if after is not None:
        ax.axvline(after, color="grey", lw=0.8, ls=":")
    if lows:
        lo, hi = min(lows), max(highs)
        pad = 0.15 * (hi - lo) + 0.01
        ax.set_ylim(lo - pad, hi + 4 * pad)  # the early transient would squash the part that matters
    ax.set_xlim(0, 1)
    ax.set_xlabel("training fraction t / T")
    ax.set_ylabel("L(t) / L(T)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if len(keys) <= 12:
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


# -- residuals ----------------------------------------------------------------------------------


def residuals(
    curves: Curves, references: Any, *, align: tuple[float, float] | None = None, smooth_window: float | None = None
) -> dict[str, Any]:
    """The collapse residual of each curve (divisor frozen from `align`, default the paper's
    25-50%) against its reference (one, or a mapping per curve); curves without points in the
    align window are skipped."""
    from orchestrator.sweeps.collapse import ALIGN, collapse_residual

    out = {}
    for tid, (p, y) in curves.items():
        ref = references.get(tid) if isinstance(references, Mapping) else references
        if ref is None:
            continue
        try:
            out[tid] = collapse_residual(p, y, ref, align=align or ALIGN, smooth_window=smooth_window)
        except ValueError:
            continue
    return out


def threshold_for(references: Sequence[Any]) -> Callable[[np.ndarray], np.ndarray] | float:
    """The residual threshold the diagnostic would apply: calibrated from seed noise when the
    references are empirical with >= 2 runs (the widest of them, when trials have different
    references), else the 1% floor."""
    from orchestrator.sweeps.collapse import EmpiricalReference, calibrate_threshold

    unique = {id(r): r for r in references}.values()
    empirical = [r for r in unique if isinstance(r, EmpiricalReference) and r.n_runs >= 2]
    if not empirical or len(empirical) != len(unique):
        return 0.01
    thresholds = [calibrate_threshold(r) for r in empirical]
    return lambda t: np.max([th(t) for th in thresholds], axis=0)


def plot_residuals(
    residuals: Mapping[str, Any],
    path: str | os.PathLike,
    *,
    threshold: Callable[[np.ndarray], np.ndarray] | float | None = 0.01,
    title: str = "collapse residuals",
    mark_onsets: bool = True,
    window: int = 3,
    consecutive: int = 2,
) -> str | None:
    """Residuals r(t) = L(t)/c - l_ref(t) over training fraction with the band +-theta(t), and
    where a sustained deviation began (as the live diagnostic dates it). `residuals` maps a
    label to a `Residual` or a (progress, residual) pair. Returns None when there is nothing."""
    from orchestrator.sweeps.collapse import ALIGN, detect_deviation

    items = {}
    for tid, r in residuals.items():
        p, v = (r.progress, r.residual) if hasattr(r, "residual") else r
        items[tid] = (np.asarray(p, dtype=float), np.asarray(v, dtype=float))
    if not items:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    t = np.linspace(0.0, 1.0, 401)
    if threshold is not None:
        theta = threshold(t) if callable(threshold) else np.full_like(t, float(threshold))
        ax.fill_between(t, -theta, theta, color="tab:green", alpha=0.12, lw=0, label="threshold band")
    ax.axvspan(*ALIGN, color="grey", alpha=0.08, lw=0, label="align window")
    ax.axhline(0.0, color="black", lw=0.8)
    color = _colors(sorted(items, key=_sort_key))
    spread = []
    for tid in sorted(items, key=_sort_key):
        p, v = items[tid]
        ax.plot(p, v, color=color[tid], lw=1.1, label=str(tid) if len(items) <= 12 else None)
        spread.append(np.nanmax(np.abs(v[p >= 0.1])) if np.any(p >= 0.1) else 0.0)
        if mark_onsets and threshold is not None:
            onset = detect_deviation(p, v, threshold, window=window, consecutive=consecutive, start=ALIGN[1])
            if onset is not None:
                ax.axvline(onset, color=color[tid], ls=":", lw=1.0)
                ax.annotate(f"{tid}: {onset:.0%}", (onset, float(np.interp(onset, p, v))), fontsize=7,
                            color=color[tid])
    if spread and math.isfinite(max(spread)):
        lim = max(max(spread), float(np.max(theta)) if threshold is not None else 0.0) * 1.3 + 1e-3
        ax.set_ylim(-lim, lim)
    ax.set_xlim(0, 1)
    ax.set_xlabel("training fraction t / T")
    ax.set_ylabel("residual L(t)/c - l_ref(t)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


# -- the audit's chart --------------------------------------------------------------------------

_STYLE = {
    "collapse": ("tab:blue", "o"),
    "asha": ("tab:orange", "s"),
    "predicted-best": ("tab:cyan", "^"),
    "current-best": ("tab:red", "v"),
    "median": ("tab:purple", "D"),
    "random": ("grey", "x"),
}


def plot_audit(result: Any, path: str | os.PathLike, *, target: tuple[float, float] | None = None) -> str:
    """Regret against compute per policy, one point per stop point (an `AuditResult`).
    `target` = (max compute, max regret) draws the acceptable corner."""
    fig = _figure()
    ax = fig.add_subplot()
    policies: dict[str, list[Any]] = defaultdict(list)
    for row in result.rows:
        policies[row.policy].append(row)
    finite = [r.regret for r in result.rows if math.isfinite(r.regret)]
    cap = max(finite) * 1.15 + 1e-4 if finite else 1.0
    for policy, rows in policies.items():
        rows = sorted(rows, key=lambda r: r.compute_fraction)
        color, marker = _STYLE.get(policy, ("black", "."))
        x = [100 * r.compute_fraction for r in rows]
        y = [100 * (r.regret if math.isfinite(r.regret) else cap) for r in rows]
        ax.plot(x, y, color=color, marker=marker, lw=1.2, ms=5, label=policy)
        for r, xi, yi in zip(rows, x, y):
            if r.budget is not None:
                ax.annotate(f"{r.budget:g}", (xi, yi), fontsize=6, color=color, xytext=(3, 3), textcoords="offset points")
    if target is not None:
        ax.axvspan(0, 100 * target[0], ymax=1, color="tab:green", alpha=0.05, lw=0)
        ax.axhline(100 * target[1], color="tab:green", lw=0.8, ls="--", label=f"target: regret <= {100 * target[1]:g}%")
        ax.axvline(100 * target[0], color="tab:green", lw=0.8, ls=":", label=f"compute <= {100 * target[0]:g}%")
    ax.set_xlim(0, 100)
    ax.set_ylim(bottom=-0.05 * 100 * cap)
    ax.set_xlabel("compute (% of running every trial to the end)")
    ax.set_ylabel("regret (% over the best final loss)")
    ax.set_title(f"{result.experiment}: {result.n_trials} trials, {result.metric} (labels: stop point)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


_TRIAL_MARK = {"stopped": ("x", "stopped"), "diverged": ("X", "diverged"), "failed": ("s", "failed")}


def plot_sweep_curves(
    curves: Curves,
    path: str | os.PathLike,
    *,
    states: Mapping[str, str],
    metric: str,
    labels: Mapping[str, str] | None = None,
    best: str | None = None,
    title: str = "",
) -> str:
    """Every trial's objective over training fraction: trials that trained to the end in solid
    lines, the best one thicker; a trial that was stopped, diverged or failed ends in a marker
    (x, X, square) where it ended. Returns the PNG's path."""
    fig = _figure(8.0, 4.8)
    ax = fig.add_subplot()
    ids = sorted(curves)
    color = _colors(ids)
    named = len(ids) <= 12 and labels is not None
    marked: set[str] = set()
    tail: list[float] = []
    for tid in ids:
        p, y = (np.asarray(a, dtype=float) for a in curves[tid])
        ok = np.isfinite(p) & np.isfinite(y)
        p, y = p[ok], y[ok]
        if not p.size:
            continue
        state = states.get(tid, "finished")
        ended = state in _TRIAL_MARK
        ax.plot(p, y, color=color[tid], lw=2.6 if tid == best else (1.0 if ended else 1.5), ls="--" if ended else "-",
                alpha=0.9, label=((labels or {}).get(tid, tid) + (" (best)" if tid == best else "")) if named else None)
        if ended:
            marker, name = _TRIAL_MARK[state]
            ax.plot(p[-1:], y[-1:], marker=marker, ms=8, mew=2, ls="none", color="black" if state != "diverged" else "red",
                    label=name if name not in marked else None)
            marked.add(name)
        tail.extend(y[p >= 0.1 * p.max()].tolist())
    if tail:
        lo, hi = min(tail), max(tail)
        pad = 0.08 * (hi - lo) + 1e-6
        ax.set_ylim(lo - pad, hi + pad)  # the first reports' transient would squash the rest
    ax.set_xlim(0, 1)
    ax.set_xlabel("training fraction")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{len(ids)} trials: {metric} (dashed: ended early)", fontsize=10)
    ax.grid(alpha=0.3)
    if named or marked:
        ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def log_figure(path: str | os.PathLike, run_id: str, *, artifact_path: str | None = None, uri: str | None = None) -> str:
    """Attach a PNG to an MLflow run; returns its artifact path in the run."""
    from orchestrator.tracking import sink as tracking

    tracking.client(uri).log_artifact(run_id, str(path), artifact_path)
    name = Path(path).name
    return f"{artifact_path}/{name}" if artifact_path else name


# -- does a family collapse? --------------------------------------------------------------------


@dataclass
class FamilyCollapse:
    """Spread of normalized curves across a family's widths vs across seeds, for t >= after."""

    experiment: str
    metric: str
    group_by: str
    after: float
    width_spread: float
    """max over t >= after of (max - min over widths of the seed-mean normalized curve)."""
    seed_spread: float
    """max over t >= after of the seed range (max - min over seeds) of one width, averaged over widths."""
    at: list[float]
    width_range: list[float]
    """The width spread at each fraction of `at`."""
    seed_range: list[float]
    """The seed spread at each fraction of `at`."""
    groups: dict[str, list[str]]
    """width -> trial ids."""
    plot: str | None = None
    artifacts: list[str] = field(default_factory=list)

    @property
    def collapses(self) -> bool:
        return self.width_spread <= self.seed_spread

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "collapses": self.collapses}


def family_spreads(
    curves: Mapping[str, tuple[ArrayLike, ArrayLike]],
    groups: Mapping[str, Any],
    *,
    after: float = 0.2,
    smooth_window: float = 0.0,
    grid_points: int = 81,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, width range(t), seed range(t)) over t in [after, 1] for self-normalized curves: the
    range across groups of their seed means, and the within-group range averaged over groups.

    Ranges, as in the small-scale measurements the family is compared with. The range of a few
    seed means and the range of a pair of seeds are of the same size under pure seed noise, so a
    family whose widths differ no more than that has collapsed."""
    from orchestrator.sweeps.collapse import normalize

    t = np.linspace(after, 1.0, grid_points)
    by_group: dict[Any, list[np.ndarray]] = defaultdict(list)
    for tid, (p, y) in curves.items():
        p, y = np.asarray(p, dtype=float), np.asarray(y, dtype=float)
        by_group[groups[tid]].append(np.interp(t, p, normalize(p, y, smooth_window=smooth_window)))
    if len(by_group) < 2 or any(len(v) < 2 for v in by_group.values()):
        raise ValueError("the family spread needs at least two groups with at least two seeds each")
    means = np.vstack([np.mean(v, axis=0) for v in by_group.values()])  # [groups, t]
    seed_range = np.mean([np.ptp(np.vstack(v), axis=0) for v in by_group.values()], axis=0)
    return t, np.ptp(means, axis=0), seed_range


def family_collapse_report(
    experiment: str,
    group_by: str = "width",
    metric: str = "eval/loss",
    after: float = 0.2,
    *,
    uri: str | None = None,
    seed_key: str = "seed",
    sweep_id: str | None = None,
    smooth_window: float | None = None,
    plot: bool = True,
    log: bool = True,
    path: str | os.PathLike | None = None,
) -> FamilyCollapse:
    """Measure whether a family sweep (several `group_by` values x seeds, run to the end)
    collapses: the spread of normalized curves across widths after `after` of training against
    the seed-to-seed spread (see `family_spreads`). Plots the collapsed curves against the
    smallest width's seed mean (the paper aligns with its smallest-scale curve) and, with `log`,
    attaches the plot and the numbers to the sweep's parent run."""
    from orchestrator.sweeps.curves import load_sweep

    sweep = load_sweep(experiment, metric, uri=uri, sweep_id=sweep_id)
    trials = [t for t in sweep.trials if not t.diverged]
    missing = [t.trial_id for t in trials if group_by not in t.params or seed_key not in t.params]
    if missing:
        raise SweepError(f"trials {', '.join(missing)} of {experiment!r} have no {group_by!r} or {seed_key!r} param: "
                         f"choose group_by among {', '.join(sorted(trials[0].params)) if trials else 'their params'}")
    groups: dict[str, list[str]] = defaultdict(list)
    for t in trials:
        groups[t.params[group_by]].append(t.trial_id)
    seeds = {g: {next(t.params[seed_key] for t in trials if t.trial_id == tid) for tid in ids} for g, ids in groups.items()}
    if len(groups) < 2 or any(len(s) < 2 for s in seeds.values()):
        shape = ", ".join(f"{group_by}={g}: {len(s)} seed(s)" for g, s in sorted(seeds.items(), key=lambda kv: _sort_key(kv[0])))
        raise SweepError(
            f"{experiment!r} is not a family with seeds ({shape or 'no finished trials'}): measuring collapse needs "
            f"at least two {group_by} values with at least two finished seeds each (add `seed: seeds(2)` to the space)"
        )
    if smooth_window is None:
        smooth_window = 0.0 if metric.startswith("eval/") else 0.02
    curves = {t.trial_id: (t.progress, t.loss) for t in trials}
    group_of = {t.trial_id: t.params[group_by] for t in trials}
    at, width_range, seed_range = family_spreads(curves, group_of, after=after, smooth_window=smooth_window)
    report = FamilyCollapse(
        experiment, metric, group_by, after, float(width_range.max()), float(seed_range.max()),
        at.tolist(), width_range.tolist(), seed_range.tolist(),
        {g: sorted(ids) for g, ids in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))},
    )
    if plot:
        from orchestrator.sweeps.collapse import EmpiricalReference

        smallest = min(groups, key=_sort_key)
        ref = EmpiricalReference([curves[tid] for tid in groups[smallest]], smooth_window=smooth_window)
        tmp = None
        if path is None:
            tmp = tempfile.mkdtemp(prefix="ladder-family-")
            path = os.path.join(tmp, "family_collapse.png")
        report.plot = plot_collapse(
            curves, path, references=ref, groups={tid: f"{group_by}={g}" for tid, g in group_of.items()},
            smooth_window=smooth_window, after=after,
            title=(f"{experiment}: {group_by} spread {report.width_spread:.4f} vs seed spread "
                   f"{report.seed_spread:.4f} after {after:.0%} (reference: {group_by}={smallest})"),
        )
    if log and sweep.parent_run_id:
        from orchestrator.tracking import sink as tracking

        tracking.log_text(sweep.parent_run_id, json.dumps(report.to_dict(), indent=2), "family/collapse.json", uri=uri)
        report.artifacts.append("family/collapse.json")
        if report.plot:
            report.artifacts.append(log_figure(report.plot, sweep.parent_run_id, artifact_path="family", uri=uri))
    return report


def format_family(report: FamilyCollapse) -> str:
    """Both numbers, the verdict, and the spreads at a few fractions."""
    marks = [x for x in (0.2, 0.4, 0.6, 0.8) if x >= report.after - 1e-9]
    at = np.asarray(report.at)
    w = [float(np.interp(x, at, report.width_range)) for x in marks]
    s = [float(np.interp(x, at, report.seed_range)) for x in marks]
    verdict = "collapses" if report.collapses else "does NOT collapse"
    return "\n".join([
        f"family {report.experiment!r} ({len(report.groups)} {report.group_by} values, {report.metric}): {verdict}",
        f"  spread across {report.group_by} after {report.after:.0%}: {report.width_spread:.4f}   "
        f"seed-to-seed spread: {report.seed_spread:.4f}",
        "  at t/T " + "/".join(f"{x:g}" for x in marks) + ": "
        f"{report.group_by} " + "/".join(f"{v:.3f}" for v in w) + ", seeds " + "/".join(f"{v:.3f}" for v in s),
    ])
