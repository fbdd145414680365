"""The claims and the check over a reproduction sweep (generator x metric x shift x seeds, each trial
every n), and the plot.

A trial holds, per n, the coverage of every variant over its repetitions; a claim pools
trials by repetition count (the coverage over all their repetitions together). The check
(`CHECKS`) is the shortcut's width: it puts one draw h(Z_0), of variance Var_Q(h), where the exact
draw has theta(G_0), of variance Var_Q(h) / (alpha + 1), so its posterior is wider by construction.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim

CLAIM_N = 20
"""The sample size the paper's headline is stated at."""
MIN_REPETITIONS = 200
"""Repetitions a coverage claim needs at n = CLAIM_N (binomial sd of a 90% coverage: 0.021)."""
EXACT_MIN_COVERAGE = 0.85
"""The exact draw's 90% intervals must cover at least this often."""
BOOTSTRAP_MAX_COVERAGE = 0.60
"""The bootstrap's may cover at most this often."""
VARIANTS = ("exact", "shortcut", "bootstrap", "horizon")


def _ns(trial: dict[str, Any]) -> list[int]:
    return sorted(int(k.rsplit("/n", 1)[1]) for k in trial if k.startswith("eval/coverage/exact/n"))


def pooled(trials: list[dict[str, Any]], key: str, n: int) -> tuple[float, float]:
    """(repetition-weighted mean of `key`/n{n} over the trials, total repetitions)."""
    reps = [(float(t[f"{key}/n{n}"]), float(t[f"eval/reps/n{n}"])) for t in trials if f"{key}/n{n}" in t]
    total = sum(r for _, r in reps)
    if not total:
        return math.nan, 0.0
    return sum(v * r for v, r in reps) / total, total


def _rare_alert_trials(trials: list[dict[str, Any]], what: str) -> tuple[list, list]:
    """(GMM alert-rate trials whose prior does not under-state the rate, those whose prior does)."""
    alert = [t for t in trials if t.get("generator") == "gmm" and t.get("metric") == "alert_rate"
             and CLAIM_N in _ns(t)]
    if not alert:
        raise ValueError(f"{what}: no GMM alert-rate trial measured n = {CLAIM_N}")
    at_or_above = [t for t in alert if t["eval/prior_gap"] >= 0]
    below = [t for t in alert if t["eval/prior_gap"] < 0]
    if not at_or_above:
        raise ValueError(f"{what}: every alert-rate trial's prior under-states the rate (shift < 0); the claim is stated for a prior at or above it")
    _, reps = pooled(at_or_above, "eval/coverage/exact", CLAIM_N)
    if reps < MIN_REPETITIONS:
        raise ValueError(f"{what}: {reps:.0f} repetitions at n = {CLAIM_N}; the claim needs >= {MIN_REPETITIONS}")
    return at_or_above, below


@claim("exact_coverage", at_least=EXACT_MIN_COVERAGE,
       paper="about 90% coverage of 90% intervals at n = 20 (GPT-2, WikiText-2 NLL per token), against 37% for the bootstrap",
       threshold_from="ours: 0.85 for 90% intervals at >= 200 repetitions, set with the claim in the first implementation")
def exact_covers_rare_alert(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Rare alert rate at n = 20 (prior not under-stating it): the exact draw's 90% intervals cover the true rate in >= 85% of >= 200 repetitions."""
    trials_ok, below = _rare_alert_trials(trials, "exact_covers_rare_alert")
    cov, reps = pooled(trials_ok, "eval/coverage/exact", CLAIM_N)
    measured = {"exact_coverage": cov, "repetitions": reps,
                "shortcut_coverage": pooled(trials_ok, "eval/coverage/shortcut", CLAIM_N)[0],
                "exact_width": pooled(trials_ok, "eval/width/exact", CLAIM_N)[0],
                "true_rate": sum(t["eval/theta_true"] for t in trials_ok) / len(trials_ok),
                "prior_rate": sum(t["eval/theta_prior"] for t in trials_ok) / len(trials_ok)}
    if below:  # reported, not judged: a prior that under-states a rare rate leaves k = 0 uncovered
        measured["exact_coverage_prior_below"] = pooled(below, "eval/coverage/exact", CLAIM_N)[0]
    return cov >= EXACT_MIN_COVERAGE, measured


@claim("bootstrap_coverage", at_most=BOOTSTRAP_MAX_COVERAGE,
       paper="the bootstrap's 90% intervals cover 37% at n = 20 (GPT-2, WikiText-2), against about 90% for the martingale posterior",
       threshold_from="ours: 0.60, set with the claim in the first implementation")
def bootstrap_undercovers_rare_alert(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Rare alert rate at n = 20, same trials: the bootstrap's 90% intervals cover the true rate in at most 60% of repetitions."""
    trials_ok, _ = _rare_alert_trials(trials, "bootstrap_undercovers_rare_alert")
    boot, reps = pooled(trials_ok, "eval/coverage/bootstrap", CLAIM_N)
    exact, _ = pooled(trials_ok, "eval/coverage/exact", CLAIM_N)
    return boot <= BOOTSTRAP_MAX_COVERAGE, {"bootstrap_coverage": boot, "exact_minus_bootstrap": exact - boot,
                                          "repetitions": reps,
                                          "bootstrap_width": pooled(trials_ok, "eval/width/bootstrap", CLAIM_N)[0]}


def shortcut_wider_than_exact(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The single-atom shortcut's posterior is wider than the exact draw's (mean sd ratio > 1) at every n and metric; both coverages reported."""
    by_scenario: dict[tuple, list] = defaultdict(list)
    for t in trials:
        by_scenario[(t["generator"], t["metric"], float(t.get("shift", 0.0)))].append(t)
    if not by_scenario:
        raise ValueError("shortcut_wider_than_exact: no trials")
    measured: dict[str, float] = {}
    ratios = []
    for (gen, metric, shift), group in sorted(by_scenario.items()):
        for n in _ns(group[0]):
            ratio = pooled(group, "eval/sd/shortcut", n)[0] / pooled(group, "eval/sd/exact", n)[0]
            ratios.append(ratio)
            if n == CLAIM_N:
                tag = f"{gen}_{metric}" + (f"_shift{shift:g}" if gen == "gmm" else "")
                measured[f"{tag}_sd_ratio"] = ratio
                measured[f"{tag}_exact_cov"] = pooled(group, "eval/coverage/exact", n)[0]
                measured[f"{tag}_shortcut_cov"] = pooled(group, "eval/coverage/shortcut", n)[0]
    measured["min_sd_ratio"] = min(ratios)
    return measured["min_sd_ratio"] > 1.0, measured


CLAIMS = [exact_covers_rare_alert, bootstrap_undercovers_rare_alert]
CHECKS = [shortcut_wider_than_exact]


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Coverage vs n per scenario (panels) and variant (lines), pooled over seeds, with 95% binomial bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list] = defaultdict(list)
    for t in trials:
        groups[(t["generator"], t["metric"], float(t.get("shift", 0.0)) if t["generator"] == "gmm" else None)].append(t)
    keys = sorted(groups, key=lambda k: (k[0] != "gmm", k[1], -(k[2] or 0.0)))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.8), squeeze=False, sharey=True)
    styles = {"exact": ("C0", "o"), "shortcut": ("C1", "s"), "bootstrap": ("C3", "^"), "horizon": ("C2", "d")}
    for ax, key in zip(axes[0], keys):
        group = groups[key]
        level = float(group[0].get("level", 0.9))
        ns = _ns(group[0])
        for variant in VARIANTS:
            pts = [(n, *pooled(group, f"eval/coverage/{variant}", n)) for n in ns]
            pts = [(n, c, r) for n, c, r in pts if r]
            if not pts:
                continue
            xs, cs, rs = zip(*pts)
            err = [1.96 * math.sqrt(max(c * (1 - c), 1e-12) / r) for c, r in zip(cs, rs)]
            color, marker = styles[variant]
            label = {"exact": "exact long-run draw", "shortcut": "single-atom shortcut",
                     "horizon": "forward urn (vs the horizon metric)"}.get(variant, variant)
            ax.errorbar(xs, cs, yerr=err, color=color, marker=marker, capsize=3, label=label)
        ax.axhline(level, color="k", ls="--", lw=1)
        gen, metric, shift = key
        title = f"{gen}: {metric}" + (f", shift {shift:+g}" if shift is not None else "")
        ax.set(xscale="log", xlabel="real samples n", title=title, ylim=(0, 1.02))
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel(f"coverage of the true metric ({level:.0%} intervals)")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
