"""One chunk of coverage repetitions: draw n real samples, build every interval, record it.

A repetition draws n deployed samples (plus the `horizon` deployed samples that follow them, for
the horizon metric's truth, and `alpha_holdout` more when alpha comes from a held-out set),
chooses alpha, and builds the 90% (`level`) intervals of the exact long-run draw, the
single-atom shortcut, the bootstrap and, when horizon > 0, the forward urn. One row of
`COLUMNS` per repetition; coverage is judged afterwards, against the true metric of the deployed
distribution (or, for the urn, the realized metric over the n + horizon deployed samples).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from workloads.martingale_uq.posterior import (
    bootstrap, exact_long_run, forward_urn, interval, minimax_alpha, single_atom_shortcut,
)

COLUMNS = (
    "alpha", "zbar",
    "exact_lo", "exact_hi", "exact_sd",
    "shortcut_lo", "shortcut_hi", "shortcut_sd",
    "bootstrap_lo", "bootstrap_hi", "bootstrap_sd",
    "horizon_lo", "horizon_hi", "horizon_truth",
)
COL = {name: i for i, name in enumerate(COLUMNS)}
VARIANTS = ("exact", "shortcut", "bootstrap", "horizon")

RealSampler = Callable[[np.random.Generator, int, int], np.ndarray]
"""(rng, repetitions, count) -> metric values [repetitions, count] of deployed samples."""


def choose_alpha(cfg: Any, z: np.ndarray, theta_q: float) -> np.ndarray:
    """alpha per repetition: fixed, or the minimax plug-in on the rows of z."""
    if cfg.alpha_rule == "fixed":
        return np.full(z.shape[0], float(cfg.alpha))
    return minimax_alpha(z, theta_q, c=cfg.alpha_c, alpha_min=cfg.alpha_min, alpha_max=cfg.alpha_max)


def evaluate_chunk(cfg: Any, rng: np.random.Generator, sample_real: RealSampler, prior: np.ndarray, n: int, reps: int) -> np.ndarray:
    """Rows [reps, len(COLUMNS)] for `reps` repetitions at sample size n."""
    values = sample_real(rng, reps, n + cfg.horizon + cfg.alpha_holdout)
    z = values[:, :n]
    theta_q = float(prior.mean())
    alpha = choose_alpha(cfg, values[:, n + cfg.horizon :] if cfg.alpha_holdout else z, theta_q)
    out = np.full((reps, len(COLUMNS)), np.nan)
    out[:, COL["alpha"]] = alpha
    out[:, COL["zbar"]] = z.mean(-1)
    draws = {
        "exact": exact_long_run(rng, z, alpha, prior, cfg.draws, tol=cfg.dp_tol),
        "shortcut": single_atom_shortcut(rng, z, alpha, prior, cfg.draws),
        "bootstrap": bootstrap(rng, z, cfg.draws),
    }
    for name, d in draws.items():
        lo, hi = interval(d, cfg.level)
        out[:, COL[f"{name}_lo"]], out[:, COL[f"{name}_hi"]] = lo, hi
        out[:, COL[f"{name}_sd"]] = d.std(-1, ddof=1)
    if cfg.horizon:
        lo, hi = interval(forward_urn(rng, z, alpha, prior, cfg.draws, cfg.horizon), cfg.level)
        out[:, COL["horizon_lo"]], out[:, COL["horizon_hi"]] = lo, hi
        out[:, COL["horizon_truth"]] = values[:, : n + cfg.horizon].mean(-1)
    return out


def covered(records: np.ndarray, variant: str, theta_true: float) -> np.ndarray:
    """Per repetition: does the variant's interval contain its target? (bool [R])"""
    target = records[:, COL["horizon_truth"]] if variant == "horizon" else theta_true
    return (records[:, COL[f"{variant}_lo"]] <= target) & (target <= records[:, COL[f"{variant}_hi"]])


def summarize(records: np.ndarray, n: int, theta_true: float) -> dict[str, float]:
    """Coverage, mean width and mean posterior sd per variant, mean alpha: the final metrics at one n."""
    out = {f"eval/reps/n{n}": float(len(records)), f"eval/alpha/n{n}": float(records[:, COL["alpha"]].mean())}
    for variant in VARIANTS:
        if np.isnan(records[:, COL[f"{variant}_lo"]]).all():
            continue
        out[f"eval/coverage/{variant}/n{n}"] = float(covered(records, variant, theta_true).mean())
        out[f"eval/width/{variant}/n{n}"] = float((records[:, COL[f"{variant}_hi"]] - records[:, COL[f"{variant}_lo"]]).mean())
        if variant != "horizon":
            out[f"eval/sd/{variant}/n{n}"] = float(records[:, COL[f"{variant}_sd"]].mean())
    return out
