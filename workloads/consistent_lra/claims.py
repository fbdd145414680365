"""The claims and checks of the reproduction sweep, and its plot.

Each trial is one (stream, algorithm, eps) run; trials that share a stream (every field that
shapes the rows, seed included) are compared with that stream's `every` trial, the baseline.
Measured numbers are the worst case over the seeds and streams a claim covers, labelled by k and
eps (and the stream where a claim spans several), with the one number each claim is judged on.

The checks are the additive rule's own guarantees (Theorem 1.1: cost within OPT_t + eps
||A^(t)||_F^2, and the count of recomputations and the recourse each may spend): the rule meets
them by construction, whatever the stream, so they test the code rather than the paper.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from orchestrator.claims import claim
from workloads.consistent_lra.workload import curve_steps

Trial = dict[str, Any]

STREAM_FIELDS = ("stream", "n", "d", "k", "noise", "gap", "tail", "weak", "onset", "normalize", "seed")
RECOURSE_SEPARATION = 10.0  # "at least 10x below the baseline", set with the claim
IID_SIMILAR = 5.0  # "barely differ": the baseline within this factor of the lazy algorithm
TOL = 1e-9  # rounding slack on bounds that hold exactly in exact arithmetic


def _stream_key(t: Trial) -> tuple:
    return tuple(t.get(f) for f in STREAM_FIELDS)


def _select(trials: Iterable[Trial], **match: Any) -> list[Trial]:
    return [t for t in trials if all(t.get(k) == v for k, v in match.items())]


def _baselines(trials: list[Trial]) -> dict[tuple, Trial]:
    return {_stream_key(t): t for t in _select(trials, algorithm="every")}


def _label(t: Trial, *, stream: bool = False) -> str:
    base = f"k{t['k']}_eps{t['eps']:g}"
    if t["algorithm"] == "multiplicative" and t.get("sketch") == "exact":
        base += "_exact"  # the check-and-recluster arm, apart from the sampled one
    return f"{t['stream']}_{base}" if stream else base


def _worst(values: dict[str, list[float]], pick: Any) -> dict[str, float]:
    return {k: float(pick(v)) for k, v in sorted(values.items())}


def _recourse_separation(trials: list[Trial], algorithm: str) -> tuple[bool, dict[str, float]]:
    base = _baselines(trials)
    ratios, every, lazy = defaultdict(list), defaultdict(list), defaultdict(list)
    for t in _select(trials, stream="flip", algorithm=algorithm):
        b = base.get(_stream_key(t))
        if b is None:
            continue
        lab = _label(t)
        every[f"{lab}_every"].append(b["eval/recourse"])
        lazy[f"{lab}_{algorithm}"].append(t["eval/recourse"])
        ratios[f"{lab}_ratio"].append(b["eval/recourse"] / max(t["eval/recourse"], 1e-12))
    if not ratios:
        raise ValueError(f"no {algorithm!r} trial on the flip stream has its stream's 'every' trial to compare with")
    worst = min(r for rs in ratios.values() for r in rs)
    return worst >= RECOURSE_SEPARATION, {**_worst(every, min), **_worst(lazy, max), **_worst(ratios, min),
                                          "worst_ratio": worst}


_SEPARATION = dict(
    at_least=RECOURSE_SEPARATION,
    paper="a more than 400-fold recourse separation from recomputing at every step (Section 4)",
    threshold_from="ours: 10x, set with the claim before any run",
)


@claim("worst_ratio", **_SEPARATION)
def lazy_recourse_10x_below_baseline(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """On the flip stream the lazy (additive) algorithm's recourse is at least 10x below recomputing every step."""
    return _recourse_separation(trials, "additive")


def lazy_cost_within_additive_bound(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """At every step the lazy algorithm's cost is within OPT_t + eps*||A^(t)||_F^2, on every stream."""
    excess = defaultdict(list)
    for t in _select(trials, algorithm="additive"):
        excess[f"{_label(t, stream=True)}_max_excess"].append(t["eval/max_excess"])
    ok = all(t["eval/max_excess"] <= t["eps"] + TOL for t in _select(trials, algorithm="additive"))
    return bool(excess) and ok, _worst(excess, max)


def lazy_refreshes_within_log_bound(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """The lazy algorithm recomputes at most 1 + ceil(log_{1+eps}(||A_n||^2 / ||A_1||^2)) times and moves at most 2k per recomputation."""
    used, per_refresh, holds = defaultdict(list), [], True
    lazy = _select(trials, algorithm="additive")
    for t in lazy:
        bound = 1 + math.ceil(math.log(t["eval/frob_growth"]) / math.log1p(t["eps"]))
        refreshes = t["eval/refreshes"]
        move = t["eval/recourse"] / (2 * t["k"] * refreshes)
        holds = holds and refreshes <= bound and move <= 1 + TOL
        used[f"{_label(t, stream=True)}_refreshes"].append(refreshes)
        used[f"{_label(t, stream=True)}_bound"].append(bound)
        per_refresh.append(move)
    if not lazy:
        return False, {"trials": 0.0}
    return holds, {**_worst(used, max), "max_recourse_over_2k_refreshes": max(per_refresh)}


def _over_one_plus_eps(t: Trial) -> float:
    """A trial's worst cost/OPT minus 1 + eps (inf when it measured nan: a bound that cannot be read fails)."""
    ratio = float(t["eval/max_cost_ratio"])
    return ratio - (1 + t["eps"]) if math.isfinite(ratio) else math.inf


@claim("worst_over_bound", at_most=TOL,
       paper="the multiplicative algorithm's cost is within (1+eps) OPT_t at every step, with recourse "
             "k^2/eps^2 polylog (k^{3/2}/eps^2 polylog for integer matrices)",
       threshold_from="paper: the bound 1+eps itself, with 1e-9 of rounding slack")
def multiplicative_cost_within_1_plus_eps(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """At every step the multiplicative variant's cost is within (1+eps)*OPT_t, on every stream."""
    ratios = defaultdict(list)
    mult = _select(trials, algorithm="multiplicative")
    if not mult:
        raise ValueError("no multiplicative trial")
    for t in mult:
        ratios[f"{_label(t, stream=True)}_max_ratio"].append(t["eval/max_cost_ratio"])
    worst = max(_over_one_plus_eps(t) for t in mult)
    return worst <= TOL, {**_worst(ratios, max), "worst_over_bound": worst}


@claim("least_over_bound", at_least=0.0,
       paper="the lazy rule's guarantee (Theorem 1.1) is additive only, cost <= OPT_t + eps ||A^(t)||_F^2; "
             "a (1+eps) OPT_t guarantee takes the multiplicative algorithm",
       threshold_from="paper: the multiplicative bound 1+eps the additive rule does not promise")
def lazy_cost_ratio_exceeds_1_plus_eps_when_opt_is_small(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """Where OPT_t is a sliver of ||A^(t)||_F^2 (the emerging stream) the lazy algorithm's cost/OPT reaches past 1+eps: its guarantee is additive only.

    Judged on the smallest excess over 1+eps among the lazy trials (a tie, measure zero, counts as reaching it).
    """
    lazy, mult = defaultdict(list), defaultdict(list)
    additive = _select(trials, stream="emerging", algorithm="additive")
    if not additive:
        raise ValueError("no additive trial on the emerging stream")
    for t in additive:
        lazy[f"{_label(t)}_additive_max_ratio"].append(t["eval/max_cost_ratio"])
    for t in _select(trials, stream="emerging", algorithm="multiplicative"):
        mult[f"{_label(t)}_multiplicative_max_ratio"].append(t["eval/max_cost_ratio"])
    least = min(float(t["eval/max_cost_ratio"]) - (1 + t["eps"]) for t in additive)
    least = least if math.isfinite(least) else -math.inf  # nan: not shown to exceed
    return least >= 0.0, {**_worst(lazy, min), **_worst(mult, max), "least_over_bound": least}


@claim("worst_ratio", **_SEPARATION)
def multiplicative_recourse_10x_below_baseline(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """On the flip stream the multiplicative variant's recourse is at least 10x below recomputing every step."""
    return _recourse_separation(trials, "multiplicative")


@claim("worst_ratio", at_most=IID_SIMILAR,
       paper="none for i.i.d. rows: a control of ours (the paper's separation is on adversarial streams; i.i.d. "
             "subspaces converge, so recomputing every step spends little recourse there)",
       threshold_from="ours: 5x, set with the claim in the first implementation")
def iid_rows_barely_differ(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """On i.i.d. Gaussian rows the algorithms barely differ: recomputing every step has at most 5x the lazy algorithm's recourse."""
    base = _baselines(trials)
    every, ratios = defaultdict(list), defaultdict(list)
    for t in _select(trials, stream="gaussian", algorithm="additive"):
        b = base.get(_stream_key(t))
        if b is None:
            continue
        every[f"k{t['k']}_every"].append(b["eval/recourse"])
        ratios[f"{_label(t)}_ratio"].append(b["eval/recourse"] / max(t["eval/recourse"], 1e-12))
    if not ratios:
        raise ValueError("no additive trial on the gaussian stream has its stream's 'every' trial to compare with")
    worst = max(r for rs in ratios.values() for r in rs)
    return worst <= IID_SIMILAR, {**_worst(every, max), **_worst(ratios, max), "worst_ratio": worst}


CLAIMS = [
    lazy_recourse_10x_below_baseline,
    multiplicative_cost_within_1_plus_eps,
    lazy_cost_ratio_exceeds_1_plus_eps_when_opt_is_small,
    multiplicative_recourse_10x_below_baseline,
    iid_rows_barely_differ,
]
CHECKS = [lazy_cost_within_additive_bound, lazy_refreshes_within_log_bound]

_COLORS = {"every": "tab:red", "additive": "tab:blue", "multiplicative": "tab:green"}
_STYLES = ("-", "--", ":", "-.")


def plot(trials: list[Trial], path: str | Path) -> None:
    """Recourse and worst cost/OPT over t, one row per stream (its first seed and shape)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    order = ("flip", "gaussian", "emerging", "randint")
    streams = [s for s in order if _select(trials, stream=s)]
    fig, axes = plt.subplots(len(streams), 2, figsize=(11, 3.2 * len(streams)), squeeze=False)
    for row, stream in zip(axes, streams):
        group = _select(trials, stream=stream)
        first = min(group, key=lambda t: (t["seed"], t["k"], t["n"], t["d"]))
        shown = sorted(_select(group, seed=first["seed"], k=first["k"], n=first["n"], d=first["d"]),
                       key=lambda t: (t["algorithm"], t["eps"]))
        eps_values = sorted({t["eps"] for t in shown if t["algorithm"] != "every"})
        for t in shown:
            steps = curve_steps(t["n"], t["curve_points"])
            rec = [t.get(f"eval/curve/recourse/{i:02d}", math.nan) for i in range(len(steps))]
            rat = [t.get(f"eval/curve/ratio/{i:02d}", math.nan) for i in range(len(steps))]
            every = t["algorithm"] == "every"
            style = "-" if every else _STYLES[eps_values.index(t["eps"]) % len(_STYLES)]
            label = "every step" if every else f"{t['algorithm']} eps={t['eps']:g}"
            row[0].plot(steps, [max(r, 1e-3) for r in rec], style, color=_COLORS[t["algorithm"]], label=label)
            row[1].plot(steps, rat, style, color=_COLORS[t["algorithm"]], label=label)
        for eps in eps_values:
            row[1].axhline(1 + eps, color="grey", lw=0.8, ls=_STYLES[eps_values.index(eps) % len(_STYLES)])
        title = f"{stream} (n={first['n']}, d={first['d']}, k={first['k']}, seed={first['seed']})"
        row[0].set(xscale="log", yscale="log", xlabel="row t", ylabel="recourse sum ||P_t - P_t-1||_F^2", title=title)
        worst = max((y for line in row[1].get_lines() for y in line.get_ydata() if math.isfinite(y)), default=1.0)
        row[1].set(xscale="log", yscale="log" if worst > 3 else "linear", xlabel="row t",
                   ylabel="worst cost/OPT since previous point", title=f"{stream}: grey lines at 1 + eps")
        row[1].yaxis.set_major_formatter(FormatStrFormatter("%g"))
        row[1].yaxis.set_minor_formatter(NullFormatter())
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
