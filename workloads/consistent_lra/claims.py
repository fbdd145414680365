"""The claims and checks of the reproduction sweep, and its plot.

Each trial is one (stream, algorithm, eps) run; trials that share a stream (every field that
shapes the rows, seed included) are compared with that stream's `every` trial, the baseline, and
its `fd` trial (Frequent Directions). Measured numbers are the worst case over the streams a claim
covers, labelled by stream, k and eps, with the one number each claim is judged on.

Recourse is measured two ways. The paper defines it as sum_t ||P_V(t) - P_V(t-1)||_F^2 (the
projector metric, `eval/recourse`); its experiments count k per recomputation of the output, as
its released code does (`eval/recourse_count`), and the ">400-fold" of its Section 4 is in that
count. On the paper's kind of input (random integers, real rows) the best subspace of the prefix
converges, so recomputing every row moves it little in the projector metric: there the two metrics
tell different stories, and the headline is judged in the paper's experimental count, with the
projector ratios beside it.

The checks are guarantees that hold by construction: the additive rule's (Theorem 1.1: cost within
OPT_t + eps ||A^(t)||_F^2, the count of recomputations and the recourse each may spend), the
multiplicative rules' (1 + eps) bound, which their trigger enforces on the sketch, and the additive
rule's cost/OPT passing 1 + eps on a stream built so that OPT_t is a sliver of ||A^(t)||_F^2.
They test the code rather than the paper.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from orchestrator.claims import claim
from workloads.consistent_lra.streams import BUNDLED
from workloads.consistent_lra.workload import curve_steps

Trial = dict[str, Any]

STREAM_FIELDS = ("stream", "n", "d", "k", "noise", "gap", "tail", "weak", "onset", "normalize", "dataset", "shuffle",
                 "standardize", "data_path", "columns", "seed")
PAPER_STREAMS = ("randint", "bundled", "file")  # the paper's kind of input: its random integers, real rows
PAPER_EPS = 4.0
"""The headline's accuracy: the paper's threshold c = 5 (eps = c - 1), the median of its
c in {1.1, 2.5, 5, 10, 100}, chosen as the paper's middle setting before calibration (an earlier
exploratory run on the random integers of seed 0 and a digits order had shown the recomputation
counts at c = 1.1, 2.5 and 5: docs/reproductions/consistent_lra.notes.md)."""
FINEST_EPS = 0.1
"""The paper's finest threshold c = 1.1: where the additive rule's cost is nearest OPT, as FD's is."""
LEVELS = (400.0, 100.0, 10.0)
"""The rule for the count-ratio thresholds, written after calibration seeds 100-104 and before
seeds 0-4 were run: the threshold is the largest of these levels (400: the paper's ">400-fold";
100: two orders of magnitude, the paper's "orders of magnitude"; 10: one order) that lies below the
lower end of the effect's 95% t-interval over the calibration seeds (smoke size,
`ladder report consistent_lra --smoke --seeds 5 --seed 100 --local`)."""
HEADLINE_RATIO = 400.0
"""Random integers (the paper's 3000 x 4, entries 0..99, k = 1), c = 5: recomputing's recourse count
over the additive rule's was 600, 500, 600, 600, 500 at seeds 100-104 (mean 560, 95% interval
[492, 628]): by the rule in LEVELS, 400, which is the paper's own number."""
REAL_RATIO = 100.0
"""Real rows (digits 600 x 64 and breast cancer 569 x 30, the worse of the two), c = 5: 113.8,
113.8, 113.8, 142.2, 142.2 at seeds 100-104 (the 569-row breast-cancer stream each time; digits
150; mean 125.2, 95% interval [105.8, 144.5]): by the rule in LEVELS, 100. Fewer rows than the
paper's 3,000 and 5,000 cap the ratio, which is n over the number of recomputations."""
FD_RATIO = 1.0
"""FD's projector recourse over the additive rule's (c = 1.1) on the real rows, the worse of the
two: 1.338, 2.085, 1.612, 1.518, 1.474 at seeds 100-104 (mean 1.61, 95% interval [1.26, 1.95]).
Rule, written then: the largest of the levels {2, 1} below the interval's lower end (2: FD moves
twice as much; 1: FD moves more), so 1. On the 4-column random integers FD's sketch of 2k = 2 rows
keeps nearly all of A and moves as little as recomputing (ratio 1.05 to 1.26 at those seeds,
measured beside, not judged): the comparison is judged only where the sketch is lossy."""
RECOURSE_SEPARATION = 10.0  # flip stream: "at least 10x below the baseline", set with the claim before any run
TOL = 1e-9  # rounding slack on bounds that hold exactly in exact arithmetic


def _stream_key(t: Trial) -> tuple:
    return tuple(t.get(f) for f in STREAM_FIELDS)


def _select(trials: Iterable[Trial], **match: Any) -> list[Trial]:
    return [t for t in trials if all(t.get(k) == v for k, v in match.items())]


def _baselines(trials: list[Trial]) -> dict[tuple, Trial]:
    return {_stream_key(t): t for t in _select(trials, algorithm="every")}


def _name(t: Trial) -> str:
    """The stream's name: its dataset for a bundled table."""
    return t["dataset"] if t["stream"] == "bundled" else t["stream"]


def _label(t: Trial, *, stream: bool = False) -> str:
    base = f"k{t['k']}_eps{t['eps']:g}"
    if t["algorithm"] in ("multiplicative", "heavy_light") and t.get("sketch") == "exact":
        base += "_exact"  # the check-and-recluster arm, apart from the sampled one
    if t["algorithm"] == "heavy_light":
        base += "_alg2"
    return f"{_name(t)}_{base}" if stream else base


def _paired(trials: list[Trial], baseline: str, eps: float | None = None) -> list[tuple[Trial, Trial]]:
    """(additive trial, its stream's `baseline` trial) on the paper's inputs, at `eps` if given."""
    base = {_stream_key(t): t for t in _select(trials, algorithm=baseline)}
    pairs = []
    for t in _select(trials, algorithm="additive"):
        if t["stream"] in PAPER_STREAMS and (eps is None or t["eps"] == eps) and _stream_key(t) in base:
            pairs.append((t, base[_stream_key(t)]))
    if not pairs:
        raise ValueError(f"no additive trial on the paper's inputs ({', '.join(PAPER_STREAMS)}) has its stream's "
                         f"{baseline!r} trial to compare with")
    return pairs


def _ratio(num: float, den: float) -> float:
    return float(num) / max(float(den), 1e-12)


REAL_STREAMS = ("bundled", "file")  # the real tables


def _count_ratios(trials: list[Trial], streams: tuple[str, ...]) -> tuple[list[float], dict[str, float]]:
    """Recomputing's recourse count over the additive rule's at the headline's c = 5 (judged), with the
    count ratio at c = 1.1 and the projector-metric ratios (the paper's definition) beside it."""
    measured: dict[str, float] = {}
    judged = []
    for lazy, every in _paired([t for t in trials if t["stream"] in streams], "every"):
        lab = f"{_name(lazy)}_k{lazy['k']}_eps{lazy['eps']:g}"
        count = _ratio(every["eval/recourse_count"], lazy["eval/recourse_count"])
        measured[f"{lab}_count_ratio"] = count
        measured[f"{lab}_projector_ratio"] = _ratio(every["eval/recourse"], lazy["eval/recourse"])
        if lazy["eps"] == PAPER_EPS:
            judged.append(count)
    if not judged:
        raise ValueError(f"no additive trial at the headline's eps={PAPER_EPS:g} (c = {PAPER_EPS + 1:g})")
    return judged, dict(sorted(measured.items()))


@claim("worst_ratio", at_least=HEADLINE_RATIO,
       paper="'orders of magnitude' less recourse than recomputing: a more than 400-fold separation (Section 4), "
             "recourse counted as its code counts it (k per recomputation), on its random 3000x4 integers in [0, 100)",
       threshold_from="calibrated on seeds 100-104 by the rule in LEVELS (it gives the paper's 400)")
def lazy_recourse_400x_below_recomputing(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """On the paper's random integer matrix (3000 x 4, entries 0..99) the lazy (additive) rule at the paper's c = 5 spends more than 400x less recourse than recomputing every row, counted as the paper counts it (k per recomputation).

    The count ratio at c = 1.1 and the projector-metric ratios (the paper's definition of recourse)
    are measured beside it, unjudged: in that metric recomputing every row spends about as little.
    """
    judged, measured = _count_ratios(trials, ("randint",))
    worst = min(judged)
    return worst >= HEADLINE_RATIO, {**measured, "worst_ratio": worst}


@claim("worst_ratio", at_least=REAL_RATIO,
       paper="'orders of magnitude' less recourse than recomputing on real tables (UCI Rice, Skin, SuiteSparse "
             "Landmark; 400-fold in Section 4); ours: scikit-learn's UCI digits (600 rows) and breast cancer (569)",
       threshold_from="calibrated on seeds 100-104 by the rule in LEVELS")
def lazy_recourse_orders_below_recomputing_on_real_rows(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """On real rows (UCI digits, integers 0..16; UCI breast cancer, standardised) the lazy rule at c = 5 spends at least 100x less recourse than recomputing every row, counted as the paper counts it; worst over the tables."""
    judged, measured = _count_ratios(trials, REAL_STREAMS)
    worst = min(judged)
    return worst >= REAL_RATIO, {**measured, "worst_ratio": worst}


@claim("worst_ratio", at_least=FD_RATIO,
       paper="the paper's baseline is Frequent Directions (its consistent-fd.py), whose output moves with its "
             "sketch at every row; no number for it in what we could read of the paper",
       threshold_from="calibrated on seeds 100-104 by the rule in FD_RATIO's docstring")
def lazy_recourse_below_frequent_directions(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """On real rows the lazy rule at the paper's finest c = 1.1 moves its subspace less than Frequent Directions (l = 2k rows) does, in the projector metric, the same measure for both; worst over the tables.

    The random integers are measured beside it, unjudged (FD's 2-row sketch of 4 columns is nearly
    exact there). In the paper's count FD, which outputs a new subspace at every row, spends what
    recomputing spends (measured beside it).
    """
    measured: dict[str, float] = {}
    judged = []
    for lazy, fd in _paired(trials, "fd"):
        lab = f"{_name(lazy)}_k{lazy['k']}_eps{lazy['eps']:g}"
        measured[f"{_name(fd)}_k{fd['k']}_fd_recourse"] = float(fd["eval/recourse"])
        measured[f"{_name(fd)}_k{fd['k']}_fd_max_cost_ratio"] = float(fd["eval/max_cost_ratio"])
        measured[f"{lab}_additive_recourse"] = float(lazy["eval/recourse"])
        ratio = _ratio(fd["eval/recourse"], lazy["eval/recourse"])
        measured[f"{lab}_fd_ratio"] = ratio
        measured[f"{lab}_fd_count_ratio"] = _ratio(fd["eval/recourse_count"], lazy["eval/recourse_count"])
        if lazy["eps"] == FINEST_EPS and lazy["stream"] in REAL_STREAMS:
            judged.append(ratio)
    if not judged:
        raise ValueError(f"no additive trial on real rows at eps={FINEST_EPS:g} (c = 1.1) to compare with FD")
    worst = min(judged)
    return worst >= FD_RATIO, {**dict(sorted(measured.items())), "worst_ratio": worst}


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
    paper="a more than 400-fold recourse separation from recomputing at every step (Section 4); ours: the "
          "projector metric on a stream built so that the best subspace changes at every row",
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


def multiplicative_cost_within_1_plus_eps(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """At every step the multiplicative variant's and Algorithm 2's cost is within (1+eps)*OPT_t, on every stream (their trigger enforces it on the sketch)."""
    ratios = defaultdict(list)
    mult = _select(trials, algorithm="multiplicative") + _select(trials, algorithm="heavy_light")
    if not mult:
        raise ValueError("no multiplicative trial")
    for t in mult:
        ratios[f"{_label(t, stream=True)}_max_ratio"].append(t["eval/max_cost_ratio"])
        # shown, not checked: Algorithm 2's recourse beside the simple rule's it refines
        if "eval/recourse" in t:
            ratios[f"{_label(t, stream=True)}_recourse"].append(t["eval/recourse"])
    worst = max(_over_one_plus_eps(t) for t in mult)
    return worst <= TOL, {**_worst(ratios, max), "worst_over_bound": worst}


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


CLAIMS = [
    lazy_recourse_400x_below_recomputing,
    lazy_recourse_orders_below_recomputing_on_real_rows,
    lazy_recourse_below_frequent_directions,
    lazy_recourse_10x_below_baseline,
    multiplicative_recourse_10x_below_baseline,
]
CHECKS = [lazy_cost_within_additive_bound, lazy_refreshes_within_log_bound, multiplicative_cost_within_1_plus_eps,
          lazy_cost_ratio_exceeds_1_plus_eps_when_opt_is_small]

_COLORS = {"every": "tab:red", "additive": "tab:blue", "multiplicative": "tab:green", "heavy_light": "tab:olive",
           "fd": "tab:purple"}
_STYLES = ("-", "--", ":", "-.")


def plot(trials: list[Trial], path: str | Path) -> None:
    """Recourse and worst cost/OPT over t, one row per stream (its first seed and shape)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    order = ("randint", "digits", "breast_cancer", "wine", "diabetes", "flip", "gaussian", "emerging")
    streams = [s for s in order if any(_name(t) == s for t in trials)]
    fig, axes = plt.subplots(len(streams), 2, figsize=(11, 3.2 * len(streams)), squeeze=False)
    for row, stream in zip(axes, streams):
        group = [t for t in trials if _name(t) == stream]
        first = min(group, key=lambda t: (t["seed"], t["k"], t["n"], t["d"]))
        shown = sorted(_select(group, seed=first["seed"], k=first["k"], n=first["n"], d=first["d"]),
                       key=lambda t: (t["algorithm"], t["eps"]))
        eps_values = sorted({t["eps"] for t in shown if t["algorithm"] not in ("every", "fd")})
        for t in shown:
            steps = curve_steps(t["n"], t["curve_points"])
            rec = [t.get(f"eval/curve/recourse/{i:02d}", math.nan) for i in range(len(steps))]
            rat = [t.get(f"eval/curve/ratio/{i:02d}", math.nan) for i in range(len(steps))]
            every = t["algorithm"] in ("every", "fd")
            style = "-" if every else _STYLES[eps_values.index(t["eps"]) % len(_STYLES)]
            label = {"every": "every step", "fd": "Frequent Directions"}.get(t["algorithm"],
                                                                            f"{t['algorithm']} eps={t['eps']:g}")
            if "eval/recourse_count" in t:  # the paper's experimental count, k per recomputation
                label += f" (count {t['eval/recourse_count']:.0f})"
            row[0].plot(steps, [max(r, 1e-3) for r in rec], style, color=_COLORS[t["algorithm"]], label=label)
            row[1].plot(steps, rat, style, color=_COLORS[t["algorithm"]], label=label)
        for eps in eps_values:
            row[1].axhline(1 + eps, color="grey", lw=0.8, ls=_STYLES[eps_values.index(eps) % len(_STYLES)])
        d = BUNDLED[first["dataset"]][1] if first["stream"] == "bundled" else first["d"]
        title = f"{stream} (n={first['n']}, d={d}, k={first['k']}, seed={first['seed']})"
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
