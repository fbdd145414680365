"""The paper's claims over a reproduction sweep (init x over-estimated rank R x seeds), and its plot.

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
from workloads.tubal_fgd.workload import CURVE_PREFIX

FLAT_TOLERANCE = 1.15
"""Small init: largest over smallest error across R (within 15%, the reproduction's spec)."""
SPECTRAL_GROWTH = 2.0
"""Spectral init: error at R = 8r over error at R = r must reach this."""
ES_TOLERANCE = 1.10
"""Early-stopped error over the best iterate's error."""
OVERFIT_FACTOR = 1.5
"""Small init, R = 8r: the last iterate's error over the best iterate's must reach this."""


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


@claim("ratio_8r_to_r", at_least=SPECTRAL_GROWTH,
       paper="spectral initialisation's error grows with R (linearly in R, by its bound), while small initialisation's does not",
       threshold_from="ours: 2x, set with the claim in the first implementation (the implementation notes' check said 2.5)")
def spectral_grows_with_rank(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Spectral init: the best error grows with R, at R = 8r at least 2x its error at R = r."""
    r = _true_rank(trials)
    best = mean_by_rank(trials, "spectral", "eval/best_rse")
    small = mean_by_rank(trials, "small", "eval/best_rse")
    _need(best, [r, 8 * r], "spectral_grows_with_rank")
    measured = {"ratio_8r_to_r": best[8 * r] / best[r]}
    measured.update({f"best_R{R}": v for R, v in best.items()})
    if 8 * r in small:
        measured["vs_small_at_8r"] = best[8 * r] / small[8 * r]
    return measured["ratio_8r_to_r"] >= SPECTRAL_GROWTH, measured


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


CLAIMS = [small_init_flat_in_rank, spectral_grows_with_rank, early_stopping_near_best, small_init_overfits_late]
CHECKS: list = []
"""No invariant of this workload is judged on the reproduction's trials (the t-product, the
measurement operator and the initialisations are unit-tested)."""


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
    """Error vs iteration per init (panels) and R (lines); dots: early-stopped iterates, crosses: best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inits = [i for i in ("small", "spectral") if any(t["init"] == i for t in trials)]
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
        ax.set(xscale="log", yscale="log", xlabel="iteration + 1", title=f"{init} initialisation")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(r"$\|UU^\top - X_\star\|_F^2 / \|X_\star\|_F^2$")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
