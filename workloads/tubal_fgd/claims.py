"""The paper's claims over a reproduction sweep (init x over-estimated rank R x seeds), its checks,
and its plot.

Every claim compares the per-(init, R) mean over seeds, the paper's own summary of its 20 trials;
with one seed the mean is that trial. Within a seed every R and init sees the same target and
measurements, so the comparisons across R are paired.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim
from workloads.tubal_fgd.problem import minimax_level
from workloads.tubal_fgd.workload import CURVE_PREFIX, Config, measurements

FLAT_TOLERANCE = 1.15
"""Small init: largest over smallest error across R (within 15%, the reproduction's spec, set
before any run). Calibration seeds 100-104 (smoke, 2026-12-06): per-seed 1.005, 1.000, 1.049,
1.041, 1.141; mean 1.047, 95% interval [0.977, 1.118]."""
MINIMAX_FACTOR = 2.0
"""Small init: its worst (over R) early-stopped error over the minimax level n r k sigma^2 / m
(`problem.minimax_level`) must stay at most this. Rule, written before the calibration run: the
largest per-seed value on seeds 100-104 times 1.25 (room for seed-to-seed spread), rounded up to
a multiple of 0.25. Calibration seeds 100-104 (smoke, 2026-12-06; minimax level 1/600): per-seed
1.225, 1.474, 1.012, 1.178, 1.045 (mean 1.187, 95% interval [0.959, 1.414]); 1.474 x 1.25 = 1.84,
up to 2.0. Least squares on the true rank would sit near 1.13 (`problem.minimax_level`); large
random and spectral init's best errors at R = 8r were 4.2-5.3x and 3.8-4.6x the level."""
LARGE_GROWTH = 2.75
"""Large random init: best error at R = 8r over its error at R = r must reach this. Rule, written
before the calibration run: the smallest per-seed ratio on seeds 100-104 divided by 1.25, rounded
down to a multiple of 0.25, and never below 1.5 (so that 'grows' stays well apart from small
init's flat tolerance 1.15). Calibration seeds 100-104 (smoke, 2026-12-06): per-seed 3.683,
3.585, 4.538, 4.153, 4.446 (mean 4.08, 95% interval [3.54, 4.62]); 3.585 / 1.25 = 2.87, down to
2.75."""
SPECTRAL_GROWTH = 2.0
"""Spectral init: error at R = 8r over error at R = r must reach this (set with the claim in the
first implementation, before any run). Calibration seeds 100-104 (smoke, 2026-12-06): per-seed
3.119, 3.086, 4.060, 4.218, 4.233; mean 3.74, 95% interval [3.01, 4.47]."""
ES_TOLERANCE = 1.10
"""Early-stopped error over the best iterate's error (set with the claim, before any run).
Calibration seeds 100-104 (smoke, 2026-12-06): per-seed 1.005, 1.001, 1.016, 1.042, 1.094."""
OVERFIT_FACTOR = 1.5
"""Small init, R = 8r: the last iterate's error over the best iterate's must reach this (set with
the claim, before any run). Calibration seeds 100-104 (smoke, 2026-12-06): per-seed 3.04, 2.42,
3.22, 3.28, 3.26."""


def _true_rank(trials: list[dict[str, Any]]) -> int:
    ranks = {int(t["rank"]) for t in trials}
    if len(ranks) != 1:
        raise ValueError(f"the trials mix true tubal ranks {sorted(ranks)}; a claim compares one problem size")
    return ranks.pop()


def mean_by_rank(trials: list[dict[str, Any]], init: str, key: str) -> dict[int, float]:
    """factor_rank -> mean of `key` over the trials (seeds) with this init, ascending in R."""
    groups: dict[int, list[float]] = defaultdict(list)
    for t in trials:
        if t["init"] == init:
            groups[int(t["factor_rank"])].append(float(t[key]))
    return {R: sum(v) / len(v) for R, v in sorted(groups.items())}


def _need(values: dict[int, float], ranks: list[int], what: str) -> None:
    missing = [R for R in ranks if R not in values]
    if missing:
        raise ValueError(f"{what}: no trials at R = {missing} (have R = {sorted(values)})")


def _spread(values: dict[int, float]) -> float:
    return max(values.values()) / min(values.values())


@claim("worst_spread", at_most=FLAT_TOLERANCE,
       paper="small initialisation (best or early-stopped iterate) matches the exact-rank error at every R; "
             "its bound does not depend on R",
       threshold_from="ours: 15%, set with the claim before any run (the implementation notes' check said 1.2)")
def small_init_flat_in_rank(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Small init: the best and the early-stopped error stay flat in R (largest/smallest over R <= 1.15, the worse of the two judged)."""
    r = _true_rank(trials)
    best = mean_by_rank(trials, "small", "eval/best_rse")
    es = mean_by_rank(trials, "small", "eval/es_rse")
    _need(best, [r, 8 * r], "small_init_flat_in_rank")
    measured = {"best_spread": _spread(best), "es_spread": _spread(es)}
    measured.update({f"best_R{R}": v for R, v in best.items()})
    measured["worst_spread"] = max(measured["best_spread"], measured["es_spread"])
    return measured["worst_spread"] <= FLAT_TOLERANCE, measured


def minimax_of(trials: list[dict[str, Any]]) -> float:
    """The minimax level n r k sigma^2 / m_train of the trials' problem (one problem per seed)."""
    fields = ("n", "k", "rank", "noise_std", "oversample", "val_frac")
    problems = {tuple(float(t[f]) for f in fields) for t in trials}
    if len(problems) != 1:
        raise ValueError(f"the trials mix problem sizes {sorted(problems)}; the minimax level is one problem's")
    n, k, r, sigma, oversample, val_frac = problems.pop()
    train_m, _ = measurements(Config(n=int(n), k=int(k), rank=int(r), oversample=oversample, val_frac=val_frac))
    return minimax_level(int(n), int(r), int(k), sigma, train_m)


@claim("worst_over_minimax", at_most=MINIMAX_FACTOR,
       paper="small initialisation is near minimax at every R: its error is <~ n k r kappa^4 sigma^2 / m against the "
             "minimax lower bound n r k sigma^2 / ((1 + delta) m) (order-optimal up to kappa^4 and a constant)",
       threshold_from="calibrated on seeds 100-104: largest per-seed value (1.474) x 1.25, rounded up to 0.25")
def small_init_near_minimax(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Small init: the early-stopped error at every R stays within 2x the minimax level n r k sigma^2 / m."""
    r = _true_rank(trials)
    es = mean_by_rank(trials, "small", "eval/es_rse")
    _need(es, [r, 8 * r], "small_init_near_minimax")
    level = minimax_of(trials)
    measured = {"worst_over_minimax": max(es.values()) / level, "minimax_level": level}
    measured.update({f"es_over_minimax_R{R}": v / level for R, v in es.items()})
    for init in ("large", "spectral"):  # the contrast: the baselines' best error at R = 8r
        best = mean_by_rank(trials, init, "eval/best_rse")
        if 8 * r in best:
            measured[f"{init}_best_over_minimax_8r"] = best[8 * r] / level
    return measured["worst_over_minimax"] <= MINIMAX_FACTOR, measured


@claim("ratio_8r_to_r", at_least=LARGE_GROWTH,
       paper="large random initialisation's error grows with R (the paper's simulations: spectral and large random "
             "initialisation grow with R, small initialisation does not)",
       threshold_from="calibrated on seeds 100-104: smallest per-seed ratio (3.585) / 1.25, rounded down to 0.25, "
                      "floor 1.5")
def large_init_grows_with_rank(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Large random init: the best error grows with R, at R = 8r at least 2.75x its error at R = r."""
    return _grows(trials, "large", LARGE_GROWTH, "large_init_grows_with_rank")


def _grows(trials: list[dict[str, Any]], init: str, threshold: float, what: str) -> tuple[bool, dict[str, float]]:
    r = _true_rank(trials)
    best = mean_by_rank(trials, init, "eval/best_rse")
    small = mean_by_rank(trials, "small", "eval/best_rse")
    _need(best, [r, 8 * r], what)
    measured = {"ratio_8r_to_r": best[8 * r] / best[r]}
    measured.update({f"best_R{R}": v for R, v in best.items()})
    if 8 * r in small:
        measured["vs_small_at_8r"] = best[8 * r] / small[8 * r]
    return measured["ratio_8r_to_r"] >= threshold, measured


@claim("ratio_8r_to_r", at_least=SPECTRAL_GROWTH,
       paper="spectral initialisation's error grows with R (linearly in R, by its bound), while small initialisation's does not",
       threshold_from="ours: 2x, set with the claim in the first implementation (the implementation notes' check said 2.5)")
def spectral_grows_with_rank(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Spectral init: the best error grows with R, at R = 8r at least 2x its error at R = r."""
    return _grows(trials, "spectral", SPECTRAL_GROWTH, "spectral_grows_with_rank")


@claim("worst_es_over_best", at_most=ES_TOLERANCE,
       paper="validation early stopping is near the best iterate: colour-image PSNR 23.66 (FGD-ES) vs 23.84 "
             "(FGD-best) at sigma 0.07, 22.72 vs 22.86 at sigma 0.10",
       threshold_from="ours: 10%, the implementation notes' check (1.1x the best), set with the claim in the first implementation")
def early_stopping_near_best(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Small init: validation-based early stopping lands within 10% of the best iterate's error at every R."""
    best = mean_by_rank(trials, "small", "eval/best_rse")
    es = mean_by_rank(trials, "small", "eval/es_rse")
    if not best:
        raise ValueError("early_stopping_near_best: no small-init trials")
    ratios = {R: es[R] / best[R] for R in best}
    measured = {"worst_es_over_best": max(ratios.values())}
    measured.update({f"es_over_best_R{R}": v for R, v in ratios.items()})
    return measured["worst_es_over_best"] <= ES_TOLERANCE, measured


@claim("last_over_best_8r", at_least=OVERFIT_FACTOR,
       paper="four phases, the last over-fitting the noise: run on past its minimum, small-init FGD's error rises again",
       threshold_from="ours: 1.5x, set with the claim in the first implementation (the implementation notes' check said 2x for R >= 4)")
def small_init_overfits_late(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Small init at R = 8r over-fits the noise if run on: the last iterate's error is at least 1.5x the best's."""
    r = _true_rank(trials)
    best = mean_by_rank(trials, "small", "eval/best_rse")
    last = mean_by_rank(trials, "small", "eval/rse")
    _need(best, [8 * r], "small_init_overfits_late")
    measured = {"last_over_best_8r": last[8 * r] / best[8 * r]}
    if r in best:  # exact rank has no spare directions to fit noise with: the contrast
        measured["last_over_best_r"] = last[r] / best[r]
    return measured["last_over_best_8r"] >= OVERFIT_FACTOR, measured


# --- checks: true by construction whatever training does ------------------------------------


def best_is_least_error(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Every trial's best error is at most its early-stopped and its last error (the best is the minimum over the evaluated iterates, which include those two)."""
    gaps = [min(float(t["eval/es_rse"]), float(t["eval/rse"])) - float(t["eval/best_rse"]) for t in trials]
    measured = {"min_gap": min(gaps)}
    return measured["min_gap"] >= 0.0, measured


def small_init_starts_at_zero(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Every small-init trial starts at error 1 within 1e-6: U_0 * U_0^T is of order alpha^2, i.e. X = 0."""
    starts = [float(t[f"{CURVE_PREFIX}0"]) for t in trials if t["init"] == "small"]
    if not starts:
        raise ValueError("small_init_starts_at_zero: no small-init trials")
    measured = {"max_start_gap": max(abs(s - 1.0) for s in starts)}
    return measured["max_start_gap"] <= 1e-6, measured


def no_trial_diverged(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """No trial's iterate overflowed (the step size and large_init_scale are set to converge at every R)."""
    measured = {"diverged": float(sum(float(t["eval/diverged"]) for t in trials))}
    return measured["diverged"] == 0.0, measured


CLAIMS = [small_init_flat_in_rank, small_init_near_minimax, large_init_grows_with_rank, spectral_grows_with_rank,
          early_stopping_near_best, small_init_overfits_late]
CHECKS = [best_is_least_error, small_init_starts_at_zero, no_trial_diverged]


def mean_curves(trials: list[dict[str, Any]], init: str) -> dict[int, tuple[list[int], list[float]]]:
    """factor_rank -> (steps, mean error over seeds) of the kept log-spaced error curve."""
    sums: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t["init"] != init:
            continue
        for key, value in t.items():
            if key.startswith(CURVE_PREFIX) and math.isfinite(float(value)):
                sums[int(t["factor_rank"])][int(key[len(CURVE_PREFIX):])].append(float(value))
    out = {}
    for R, by_step in sorted(sums.items()):
        steps = sorted(by_step)
        out[R] = (steps, [sum(by_step[s]) / len(by_step[s]) for s in steps])
    return out


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Error vs iteration per init (panels) and R (lines); dots: early-stopped iterates, crosses: best;
    dashed: the minimax level n r k sigma^2 / m (`problem.minimax_level`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inits = [i for i in ("small", "large", "spectral") if any(t["init"] == i for t in trials)]
    try:
        level = minimax_of(trials)
    except (KeyError, ValueError):  # trials without the problem's fields, or of several sizes: no line
        level = math.nan
    fig, axes = plt.subplots(1, len(inits), figsize=(5.5 * len(inits), 4.2), sharey=True, squeeze=False)
    ranks = sorted({int(t["factor_rank"]) for t in trials})
    colors = {R: plt.cm.viridis(i / max(1, len(ranks) - 1)) for i, R in enumerate(ranks)}
    for ax, init in zip(axes[0], inits):
        for R, (steps, errs) in mean_curves(trials, init).items():
            ax.plot([s + 1 for s in steps], errs, color=colors[R], label=f"R = {R}")
        for t in trials:
            if t["init"] != init:
                continue
            c = colors[int(t["factor_rank"])]
            ax.plot(t["eval/es_step"] + 1, t["eval/es_rse"], "o", color=c, markersize=5)
            ax.plot(t["eval/best_step"] + 1, t["eval/best_rse"], "x", color=c, markersize=6)
        if math.isfinite(level):
            ax.axhline(level, color="black", linestyle="--", linewidth=1, label=r"minimax $nrk\sigma^2/m$")
        ax.set(xscale="log", yscale="log", xlabel="iteration + 1", title=f"{init} initialisation")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(r"$\|UU^\top - X_\star\|_F^2 / \|X_\star\|_F^2$")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
