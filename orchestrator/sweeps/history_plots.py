"""Optuna (Akiba et al., 2019), its dashboard's study plots for a ladder sweep — https://arxiv.org/abs/1907.10902

The three plots optuna-dashboard shows for a study, drawn from a finished sweep's trials (the
dicts `tune_run._fit` builds: trial_id, params, objective, state, progress, why) and logged as PNG
artifacts of the sweep's MLflow parent run by `summary.log_sweep_summary`:

- `optimization_history.png`: the objective of each trial in the order the trials ended, and the
  best so far among those that trained to the end, in the sweep's direction;
- `param_importances.png`: each swept parameter's share of the objective's variance over the
  finished trials, by Optuna's fANOVA evaluator on an in-memory study built from them;
- `parallel_coordinate.png`: one axis per swept parameter and one for the objective, one line
  per finished trial coloured by its objective.

A plot that has too little to show (no finished trial, too few for importances, a single swept
parameter) says so in the image instead of failing; one that cannot be drawn at all is a warning,
and the others are logged all the same: nothing here fails a sweep.

matplotlib is used through its object-oriented API on the Agg canvas, as in `plots`; optuna and
scikit-learn are imported only when importances are computed.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

HISTORY_NAME = "optimization_history.png"
IMPORTANCE_NAME = "param_importances.png"
PARALLEL_NAME = "parallel_coordinate.png"
MIN_IMPORTANCE_TRIALS = 4
"""Finished trials below which importances are not computed: a forest fitted to three points
ranks parameters by chance."""
LOG_SPAN = 100.0
"""A positive numeric parameter whose values span this factor or more (two decades) is drawn and
modelled on a log scale, when the sweep's space does not say (a `loguniform` domain does)."""

Trial = Mapping[str, Any]


class NoImportance(ValueError):
    """Why parameter importances cannot be computed for these trials; the plot shows it."""


def _finite(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _finished(trials: Sequence[Trial]) -> list[Trial]:
    return [t for t in trials if t.get("state") == "finished" and _finite(t.get("objective"))]


# -- optimisation history ------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """The trials in the order they ended, with what the history plot draws of each."""

    trial_ids: list[str]
    states: list[str]
    objective: list[float]
    """Each trial's objective (NaN when it reported none): a stopped or interrupted trial's is
    the value it had when it ended, not comparable with a finished one's."""
    best: list[float]
    """Best objective so far among finished trials, in the sweep's direction; NaN before the
    first finished one."""


def completion_order(trials: Sequence[Trial], ended: Mapping[str, float | None] | None = None) -> list[Trial]:
    """The trials by when they ended (`ended`: trial id -> time, e.g. the ms timestamp of its
    last report); trials without a time keep their given order, after those with one."""
    ended = ended or {}
    keyed = [(ended.get(t["trial_id"]) is None, ended.get(t["trial_id"]) or 0.0, i, t) for i, t in enumerate(trials)]
    return [k[-1] for k in sorted(keyed, key=lambda k: k[:3])]


def history(trials: Sequence[Trial], mode: str, ended: Mapping[str, float | None] | None = None) -> History:
    """The optimisation history: objectives in completion order and the best-so-far line."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode is 'min' or 'max', got {mode!r}")
    ordered = completion_order(trials, ended)
    best, out = math.nan, []
    for t in ordered:
        obj = t.get("objective")
        if t.get("state") == "finished" and _finite(obj):
            better = obj < best if mode == "min" else obj > best
            best = float(obj) if math.isnan(best) or better else best
        out.append(best)
    return History([str(t["trial_id"]) for t in ordered], [str(t.get("state", "")) for t in ordered],
                   [float(t["objective"]) if _finite(t.get("objective")) else math.nan for t in ordered], out)


_HISTORY_STYLE = {
    "finished": dict(marker="o", color="tab:blue", ms=6, ls="none", label="finished"),
    "stopped": dict(marker="x", color="grey", ms=7, mew=1.5, ls="none", label="stopped early (objective when stopped)"),
    "interrupted": dict(marker="o", mfc="none", color="tab:orange", ms=6, ls="none",
                        label="interrupted (objective when interrupted)"),
    "diverged": dict(marker="X", color="tab:red", ms=7, ls="none", label="diverged (last finite objective)"),
}


def plot_history(trials: Sequence[Trial], path: str | os.PathLike, *, metric: str, mode: str,
                 ended: Mapping[str, float | None] | None = None, title: str = "") -> str:
    """Objective per trial in completion order, marked by how the trial ended, with the best
    so far among finished trials as a step line. Failed trials and those without a finite
    objective are left out, and the legend counts them. Returns the PNG's path."""
    from orchestrator.sweeps.plots import _figure, _save

    h = history(trials, mode, ended)
    fig = _figure(8.0, 4.8)
    ax = fig.add_subplot()
    x = np.arange(1, len(h.trial_ids) + 1)
    obj = np.asarray(h.objective, dtype=float)
    left_out: dict[str, int] = {}
    for state, style in _HISTORY_STYLE.items():
        at = np.array([s == state for s in h.states], dtype=bool) & np.isfinite(obj)
        if at.any():
            ax.plot(x[at], obj[at], **style)
    for s, v in zip(h.states, obj):
        if s not in _HISTORY_STYLE or not math.isfinite(v):
            key = s if s in ("failed", "diverged") else "without an objective" if s in _HISTORY_STYLE else s or "unknown"
            left_out[key] = left_out.get(key, 0) + 1
    best = np.asarray(h.best, dtype=float)
    if np.isfinite(best).any():
        ax.plot(x, best, color="tab:red", lw=1.6, drawstyle="steps-post", label=f"best so far ({mode}, finished trials)")
    if left_out:
        ax.plot([], [], " ", label="not shown: " + ", ".join(f"{n} {k}" for k, n in sorted(left_out.items())))
    if not np.isfinite(obj).any():
        ax.text(0.5, 0.5, f"no trial reported a finite {metric}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlim(0.5, max(len(x), 1) + 0.5)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("trial, in the order the trials ended")
    ax.set_ylabel(metric)
    ax.set_title(title or f"optimisation history: {metric} ({mode}), {len(h.trial_ids)} trials", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")
    return _save(fig, path)


# -- parameter distributions ---------------------------------------------------------------------


def _choice(v: Any) -> Any:
    # Optuna's categorical choices are None, bool, int, float or str; anything else by its repr.
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return repr(v)


def _internal(v: Any, dist: Any) -> Any:
    """`v` as the type its distribution holds (numpy scalars and ints in a float range included)."""
    kind = type(dist).__name__
    return _choice(v) if kind == "CategoricalDistribution" else int(v) if kind == "IntDistribution" else float(v)


def _numeric(values: Sequence[Any]) -> bool:
    return bool(values) and all(_finite(v) for v in values)


def _infer(values: Sequence[Any], log: bool | None = None) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not _numeric(values):
        return CategoricalDistribution(list(dict.fromkeys(_choice(v) for v in values)))
    lo, hi = min(values), max(values)
    if log is None:
        log = lo > 0 and hi / lo >= LOG_SPAN
    if all(isinstance(v, numbers.Integral) for v in values):
        return IntDistribution(int(lo), int(hi), log=bool(log) and lo >= 1)
    return FloatDistribution(float(lo), float(hi), log=bool(log) and lo > 0)


def distributions(trials: Sequence[Trial], space: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An Optuna distribution per swept parameter (every key of the trials' params, in order of
    appearance): `loguniform`/`uniform` domains of the sweep's `space` give a log or linear
    float range (widened to the values seen); lists of values (grid, choice, seeds) and params the
    space does not name are inferred from the values: numbers are an int or float range, on a log
    scale when positive and spanning `LOG_SPAN`; anything else is categorical."""
    from orchestrator.sweep import LogUniform, Uniform

    space = space or {}
    names = list(dict.fromkeys(k for t in trials for k in t.get("params", {})))
    out = {}
    for name in names:
        seen = [t["params"][name] for t in trials if name in t.get("params", {})]
        domain = space.get(name)
        if isinstance(domain, (LogUniform, Uniform)) and _numeric(seen):
            from optuna.distributions import FloatDistribution

            out[name] = FloatDistribution(min(domain.low, *seen), max(domain.high, *seen),
                                          log=isinstance(domain, LogUniform))
            continue
        values = getattr(domain, "values", None)  # a grid's or choice's; a fixed dict's is a method
        listed = list(values) if isinstance(values, (tuple, list)) else []
        out[name] = _infer(listed + seen if _numeric(listed) == _numeric(seen) else seen)
    return out


# -- parameter importance ------------------------------------------------------------------------


def importances(trials: Sequence[Trial], mode: str, space: Mapping[str, Any] | None = None,
                *, seed: int = 0) -> tuple[dict[str, float], str]:
    """Each swept parameter's importance for the objective over the finished trials, most
    important first, normalised to sum to 1, and the method's name. Optuna's fANOVA evaluator
    (a random forest's functional ANOVA, what optuna-dashboard shows) on an in-memory study of
    the finished trials; parameters that do not vary among them are left out. Raises
    `NoImportance` when there are too few finished trials or fewer than two varying parameters."""
    import optuna
    from optuna.trial import create_trial

    done = _finished(trials)
    if len(done) < MIN_IMPORTANCE_TRIALS:
        raise NoImportance(f"{len(done)} finished trial(s) with a finite objective: parameter importance needs "
                           f"at least {MIN_IMPORTANCE_TRIALS}")
    dists = distributions(trials, space)
    varying = [n for n, d in dists.items()
               if len({repr(_choice(t["params"].get(n))) for t in done}) > 1 and all(n in t["params"] for t in done)]
    if len(varying) < 2:
        what = f"only {varying[0]!r} varies" if varying else "no swept parameter varies"
        raise NoImportance(f"{what} across the {len(done)} finished trials: importance compares two or more "
                           "parameters (a single one accounts for all it explains)")
    if importlib.util.find_spec("sklearn") is not None:  # fANOVA's random forest
        evaluator, method = optuna.importance.FanovaImportanceEvaluator(seed=seed), "fANOVA"
    else:  # an install without scikit-learn: PED-ANOVA needs numpy and scipy only
        evaluator, method = optuna.importance.PedAnovaImportanceEvaluator(), "PED-ANOVA"
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in memory" is noise here
    try:
        study = optuna.create_study(direction="minimize" if mode == "min" else "maximize")
        for t in done:
            params = {n: _internal(t["params"][n], dists[n]) for n in varying}
            study.add_trial(create_trial(params=params, distributions={n: dists[n] for n in varying},
                                         value=float(t["objective"])))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PED-ANOVA is experimental in Optuna
            got = optuna.importance.get_param_importances(study, evaluator=evaluator, params=varying, normalize=True)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return dict(sorted(((k, float(v)) for k, v in got.items()), key=lambda kv: -kv[1])), method


def plot_importances(trials: Sequence[Trial], path: str | os.PathLike, *, metric: str, mode: str,
                     space: Mapping[str, Any] | None = None, title: str = "") -> str:
    """A bar per swept parameter, most important on top; or, when importances cannot be
    computed, the reason in place of the bars. Returns the PNG's path."""
    from orchestrator.sweeps.plots import _figure, _save

    fig = _figure(7.0, 4.0)
    ax = fig.add_subplot()
    try:
        imp, method = importances(trials, mode, space)
    except NoImportance as why:
        ax.text(0.5, 0.5, f"no parameter importance:\n{why}", ha="center", va="center", wrap=True,
                transform=ax.transAxes, fontsize=9)
        ax.set_axis_off()
        ax.set_title(title or f"parameter importance for {metric}", fontsize=10)
        return _save(fig, path)
    names = list(imp)[::-1]  # barh draws bottom-up
    values = [imp[n] for n in names]
    ax.barh(names, values, color="tab:blue")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlim(0, max(1.0, max(values) * 1.15))
    ax.set_xlabel(f"importance ({method}, sums to 1)")
    ax.set_title(title or f"parameter importance for {metric} ({mode}), {len(_finished(trials))} finished trials",
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


# -- parallel coordinates ------------------------------------------------------------------------


def axis_positions(values: Sequence[Any], dist: Any) -> tuple[np.ndarray, list[float], list[str]]:
    """Where each value lies on its parallel-coordinate axis, in [0, 1], with the axis's tick
    positions and labels: categories evenly spaced and named, numbers on a linear or log scale."""
    choices = getattr(dist, "choices", None)
    if choices is not None:
        index = {repr(c): i for i, c in enumerate(choices)}
        span = max(len(choices) - 1, 1)
        ticks = [i / span if len(choices) > 1 else 0.5 for i in range(len(choices))]
        pos = np.array([ticks[index[repr(_choice(v))]] for v in values], dtype=float)
        return pos, ticks, [str(c)[:18] for c in choices]
    f = np.log10 if dist.log else (lambda a: np.asarray(a, dtype=float))
    lo, hi = float(f(dist.low)), float(f(dist.high))
    if hi == lo:
        return np.full(len(values), 0.5), [0.5], [f"{dist.low:.3g}"]
    pos = (f(np.asarray(values, dtype=float)) - lo) / (hi - lo)
    if type(dist).__name__ == "IntDistribution" and not dist.log and dist.high - dist.low <= 5:  # seeds: each one
        ints = np.arange(dist.low, dist.high + 1)
        return pos, list((ints - dist.low) / (dist.high - dist.low)), [str(i) for i in ints]
    grid = np.linspace(lo, hi, 5)
    return pos, list(np.linspace(0, 1, 5)), [f"{(10 ** g if dist.log else g):.3g}" for g in grid]


def plot_parallel(trials: Sequence[Trial], path: str | os.PathLike, *, metric: str, mode: str,
                  space: Mapping[str, Any] | None = None, title: str = "") -> str:
    """One vertical axis per swept parameter and one for the objective; one line per finished
    trial, coloured by its objective (the best drawn thickest, on top). Returns the PNG's path."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    from orchestrator.sweeps.plots import _figure, _save

    done = _finished(trials)
    dists = distributions(trials, space)
    names = [n for n in dists if all(n in t["params"] for t in done)]
    fig = _figure(max(6.0, 1.6 * (len(names) + 1) + 1.5), 4.8)
    ax = fig.add_subplot()
    ax.set_title(title or f"parallel coordinates: {len(done)} finished trials, {metric} ({mode})", fontsize=10)
    if not done:
        ax.text(0.5, 0.5, f"no finished trial with a finite {metric}", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return _save(fig, path)
    objective = np.array([float(t["objective"]) for t in done])
    columns = [axis_positions([t["params"][n] for t in done], dists[n]) for n in names]
    lo, hi = float(objective.min()), float(objective.max())
    obj_pos = (objective - lo) / (hi - lo) if hi > lo else np.full(len(done), 0.5)
    obj_ticks = list(np.linspace(0, 1, 5)) if hi > lo else [0.5]
    obj_labels = [f"{v:.4g}" for v in (np.linspace(lo, hi, 5) if hi > lo else [lo])]
    columns.append((obj_pos, obj_ticks, obj_labels))
    ys = np.vstack([c[0] for c in columns])  # [axes, trials]
    xs = np.arange(len(columns))
    cmap = colormaps["viridis_r" if mode == "min" else "viridis"]  # the best trial brightest either way
    norm = Normalize(lo, hi if hi > lo else lo + 1e-12)
    best = int(np.argmin(objective) if mode == "min" else np.argmax(objective))
    for i in sorted(range(len(done)), key=lambda i: i == best):
        ax.plot(xs, ys[:, i], color=cmap(norm(objective[i])), lw=2.6 if i == best else 1.2, alpha=0.85,
                zorder=3 if i == best else 2)
    for x, (_, ticks, labels) in zip(xs, columns):
        ax.axvline(x, color="black", lw=0.8, zorder=1)
        for tick, label in zip(ticks, labels):
            ax.text(x - 0.03, tick, label, ha="right", va="center", fontsize=7)
    ax.set_xticks(xs, [*names, metric], fontsize=8, rotation=20 if len(xs) > 5 else 0)
    ax.set_yticks([])
    ax.set_xlim(-0.5, len(xs) - 0.8)
    ax.set_ylim(-0.05, 1.05)
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=metric, pad=0.01)
    return _save(fig, path)


# -- on the sweep's parent run -------------------------------------------------------------------


def log_history_plots(parent_run_id: str, trials: Sequence[Trial], *, metric: str, mode: str,
                      uri: str | None = None, ended: Mapping[str, float | None] | None = None,
                      space: Mapping[str, Any] | None = None, experiment: str = "") -> list[str]:
    """Draw the three plots and attach them to the sweep's parent run; returns the artifact
    names logged. Never raises: a plot that cannot be drawn or logged is a warning naming it,
    and the others are logged all the same."""
    from orchestrator.sweeps.plots import log_figure
    from orchestrator.tracking import sink as tracking

    prefix = f"{experiment}: " if experiment else ""
    draws = [
        (HISTORY_NAME, lambda p: plot_history(trials, p, metric=metric, mode=mode, ended=ended,
                                              title=f"{prefix}optimisation history, {metric} ({mode})")),
        (IMPORTANCE_NAME, lambda p: plot_importances(trials, p, metric=metric, mode=mode, space=space)),
        (PARALLEL_NAME, lambda p: plot_parallel(trials, p, metric=metric, mode=mode, space=space)),
    ]
    logged = []
    with tempfile.TemporaryDirectory(prefix="ladder-history-") as tmp:
        for name, draw in draws:
            try:
                logged.append(log_figure(draw(Path(tmp) / name), parent_run_id, uri=uri))
            except Exception as exc:  # a summary plot is never worth a failed sweep
                tracking.warn(f"could not draw the sweep's {name}: {type(exc).__name__}: {exc}")
    return logged
