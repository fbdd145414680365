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
NOMINAL = 0.90
"""The intervals' nominal level (the empirical 5% and 95% quantiles), the paper's "about 90%"."""
MIN_REPETITIONS = 200
"""Repetitions a coverage claim needs at n = CLAIM_N (binomial sd of a 90% coverage: 0.021)."""
NEAR_NOMINAL_MIN_COVERAGE = 0.85
""""Near the nominal level": the exact draw's pooled coverage at n = 20 must reach this.

Rule (written before calibration): the nominal 0.90 less 3 binomial sd of a 90% coverage at the
repetitions one seed pools for a coverage claim (two priors x 200 = 400: sd 0.015), 0.855, rounded
down to 0.85. Calibration, seeds 100-104 (`ladder report martingale_uq --smoke --seeds 5 --seed 100`):
the tiny GPT-2's NLL, both
priors pooled, exact coverage 0.935, 0.943, 0.932, 0.905, 0.897 (mean 0.923, 95% interval
0.898-0.947; its bootstrap 0.890, 0.905, 0.917, 0.877, 0.895); the rare alert rate, both shifts
pooled, 0.762, 0.738, 0.757, 0.752, 0.745 (mean 0.751, 0.739-0.763: under the threshold, which is
not moved to meet it; shift +0.3 alone 0.955-0.970, shift -0.3 alone 0.510-0.560)."""
BOOTSTRAP_MAX_COVERAGE = 0.63
"""The bootstrap "fails" on the rare alert rate: its coverage at n = 20 is at most this.

Rule (written before calibration): halfway between the paper's bootstrap coverage (0.37) and the
nominal 0.90, 0.635, rounded down to 0.63. Calibration, seeds 100-104: 0.527, 0.505, 0.530, 0.515,
0.520 (mean 0.520, 95% interval 0.507-0.532)."""
VARIANTS = ("exact", "shortcut", "bootstrap", "horizon")
TEXT_GENERATORS = ("tiny_gpt2", "causal_lm")
"""Generators of the paper's text setting (a GPT-2 scoring texts by NLL per token)."""


def _ns(trial: dict[str, Any]) -> list[int]:
    return sorted(int(k.rsplit("/n", 1)[1]) for k in trial if k.startswith("eval/coverage/exact/n"))


def pooled(trials: list[dict[str, Any]], key: str, n: int) -> tuple[float, float]:
    """(repetition-weighted mean of `key`/n{n} over the trials, total repetitions)."""
    reps = [(float(t[f"{key}/n{n}"]), float(t[f"eval/reps/n{n}"])) for t in trials if f"{key}/n{n}" in t]
    total = sum(r for _, r in reps)
    if not total:
        return math.nan, 0.0
    return sum(v * r for v, r in reps) / total, total


def _at_claim_n(trials: list[dict[str, Any]], keep, what: str, which: str) -> list[dict[str, Any]]:
    """The trials `keep` selects that measured n = CLAIM_N, every prior among them, with enough repetitions."""
    chosen = [t for t in trials if keep(t) and CLAIM_N in _ns(t)]
    if not chosen:
        raise ValueError(f"{what}: no {which} trial measured n = {CLAIM_N}")
    _, reps = pooled(chosen, "eval/coverage/exact", CLAIM_N)
    if reps < MIN_REPETITIONS:
        raise ValueError(f"{what}: {reps:.0f} repetitions at n = {CLAIM_N}; the claim needs >= {MIN_REPETITIONS}")
    return chosen


def _text_nll(trials: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    return _at_claim_n(trials, lambda t: t.get("generator") in TEXT_GENERATORS and t.get("metric") == "nll", what,
                       "GPT-2 NLL-per-token")


def _rare_alert(trials: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    return _at_claim_n(trials, lambda t: t.get("generator") == "gmm" and t.get("metric") == "alert_rate", what,
                       "GMM alert-rate")


def _by_prior_sign(trials: list[dict[str, Any]], key: str, measured: dict[str, float], name: str) -> None:
    """Reported beside a pooled claim: the coverage where the prior over-states the metric and where it under-states it."""
    for side, keep in (("above", lambda g: g >= 0), ("below", lambda g: g < 0)):
        group = [t for t in trials if keep(t["eval/prior_gap"])]
        if group:
            measured[f"{name}_prior_{side}"] = pooled(group, key, CLAIM_N)[0]


@claim("exact_coverage", at_least=NEAR_NOMINAL_MIN_COVERAGE,
       paper="about 90% coverage of 90% intervals at n = 20 (GPT-2 scoring WikiText-2, NLL per token), against 37% for the bootstrap",
       threshold_from="ours: nominal 0.90 less 3 binomial sd at 400 pooled repetitions, rounded down (rule and calibration "
                      "on seeds 100-104 in NEAR_NOMINAL_MIN_COVERAGE's docstring)")
def exact_covers_nll(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The paper's headline at smoke size: a frozen tiny GPT-2's NLL per token of held-out texts at n = 20, pooled over every prior the smoke draws (its own samples at each temperature): the exact draw's 90% intervals cover the deployed mean NLL in >= 85% of repetitions."""
    text = _text_nll(trials, "exact_covers_nll")
    cov, reps = pooled(text, "eval/coverage/exact", CLAIM_N)
    boot = pooled(text, "eval/coverage/bootstrap", CLAIM_N)[0]
    measured = {"exact_coverage": cov, "bootstrap_coverage": boot, "exact_minus_bootstrap": cov - boot,
                "repetitions": reps, "shortcut_coverage": pooled(text, "eval/coverage/shortcut", CLAIM_N)[0],
                "horizon_coverage": pooled(text, "eval/coverage/horizon", CLAIM_N)[0],
                "exact_width": pooled(text, "eval/width/exact", CLAIM_N)[0],
                "bootstrap_width": pooled(text, "eval/width/bootstrap", CLAIM_N)[0],
                "mean_alpha": pooled(text, "eval/alpha", CLAIM_N)[0]}
    for t in text:  # each prior's gap in deployed sd units, and its own coverage
        tag = f"T{float(t.get('temperature', 1.0)):g}"
        measured[f"{tag}_prior_gap_sd"] = t["eval/prior_gap"] / max(t.get("eval/real_sd", math.nan), 1e-12)
        measured[f"{tag}_exact_coverage"] = float(t[f"eval/coverage/exact/n{CLAIM_N}"])
    _by_prior_sign(text, "eval/coverage/exact", measured, "exact_coverage")
    return cov >= NEAR_NOMINAL_MIN_COVERAGE, measured


@claim("exact_minus_bootstrap", at_least=0.0,
       paper="the martingale posterior's 90% intervals cover more often than the bootstrap's: about 90% against 37% "
             "at n = 20 (GPT-2, WikiText-2), +53 points",
       threshold_from="paper: its direction (above the bootstrap), no margin of ours (calibration, seeds 100-104: "
                      "+0.112, +0.113, +0.102, +0.104, +0.094; the NLL alone +0.045, +0.037, +0.015, +0.028, +0.002)")
def exact_above_bootstrap(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """At n = 20, pooled over every prior and metric the smoke draws (GPT-2 NLL at each temperature, the GMM alert rate at both shifts, the mean score): the exact draw's coverage minus the bootstrap's is >= 0."""
    every = _at_claim_n(trials, lambda t: True, "exact_above_bootstrap", "")
    exact, reps = pooled(every, "eval/coverage/exact", CLAIM_N)
    boot = pooled(every, "eval/coverage/bootstrap", CLAIM_N)[0]
    measured = {"exact_minus_bootstrap": exact - boot, "exact_coverage": exact, "bootstrap_coverage": boot,
                "repetitions": reps}
    text = [t for t in every if t.get("generator") in TEXT_GENERATORS and t.get("metric") == "nll"]
    if text:  # the paper's own metric alone
        measured["nll_exact_minus_bootstrap"] = (pooled(text, "eval/coverage/exact", CLAIM_N)[0]
                                                 - pooled(text, "eval/coverage/bootstrap", CLAIM_N)[0])
    return exact - boot >= 0.0, measured


@claim("exact_coverage", at_least=NEAR_NOMINAL_MIN_COVERAGE,
       paper="about 90% coverage of 90% intervals at n = 20 (stated for GPT-2 NLL; the notes' alert-rate toy: exact DP "
             "0.86-0.91 at n = 5-10)",
       threshold_from="ours: nominal 0.90 less 3 binomial sd at 400 pooled repetitions, rounded down (rule and calibration "
                      "on seeds 100-104 in NEAR_NOMINAL_MIN_COVERAGE's docstring)")
def exact_covers_rare_alert(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Rare alert rate (3.7%) at n = 20, pooled over both priors the smoke draws (over-stating it, shift +0.3, and under-stating it, shift -0.3): the exact draw's 90% intervals cover the true rate in >= 85% of repetitions."""
    alert = _rare_alert(trials, "exact_covers_rare_alert")
    cov, reps = pooled(alert, "eval/coverage/exact", CLAIM_N)
    measured = {"exact_coverage": cov, "repetitions": reps,
                "shortcut_coverage": pooled(alert, "eval/coverage/shortcut", CLAIM_N)[0],
                "exact_width": pooled(alert, "eval/width/exact", CLAIM_N)[0],
                "true_rate": sum(t["eval/theta_true"] for t in alert) / len(alert)}
    # With k = 0 alerts among the 20 (half the repetitions) the upper end is about the prior's own
    # rate: a prior under the true rate leaves them uncovered. Both sides are shown.
    _by_prior_sign(alert, "eval/coverage/exact", measured, "exact_coverage")
    return cov >= NEAR_NOMINAL_MIN_COVERAGE, measured


@claim("bootstrap_coverage", at_most=BOOTSTRAP_MAX_COVERAGE,
       paper="the bootstrap's 90% intervals cover 37% at n = 20 (GPT-2, WikiText-2), against about 90% for the martingale posterior",
       threshold_from="ours: halfway between the paper's 0.37 and the nominal 0.90, rounded down (rule and calibration "
                      "on seeds 100-104 in BOOTSTRAP_MAX_COVERAGE's docstring)")
def bootstrap_undercovers_rare_alert(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Rare alert rate at n = 20, the same trials (both priors; the bootstrap ignores the prior): the bootstrap's 90% intervals cover the true rate in at most 63% of repetitions."""
    alert = _rare_alert(trials, "bootstrap_undercovers_rare_alert")
    boot, reps = pooled(alert, "eval/coverage/bootstrap", CLAIM_N)
    exact, _ = pooled(alert, "eval/coverage/exact", CLAIM_N)
    return boot <= BOOTSTRAP_MAX_COVERAGE, {"bootstrap_coverage": boot, "exact_minus_bootstrap": exact - boot,
                                          "repetitions": reps,
                                          "bootstrap_width": pooled(alert, "eval/width/bootstrap", CLAIM_N)[0]}


def _scenario(t: dict[str, Any]) -> tuple:
    """(generator, metric, the prior's knob: the GMM's shift or a text generator's temperature)."""
    if t["generator"] == "gmm":
        return t["generator"], t["metric"], "shift", float(t.get("shift", 0.0))
    return t["generator"], t["metric"], "T", float(t.get("temperature", 1.0))


def _tag(key: tuple) -> str:
    gen, metric, knob, value = key
    return f"{gen}_{metric}_{knob}{value:g}"


def shortcut_wider_than_exact(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The single-atom shortcut's posterior is wider than the exact draw's (mean sd ratio > 1) at every n and metric; both coverages reported."""
    by_scenario: dict[tuple, list] = defaultdict(list)
    for t in trials:
        by_scenario[_scenario(t)].append(t)
    if not by_scenario:
        raise ValueError("shortcut_wider_than_exact: no trials")
    measured: dict[str, float] = {}
    ratios = []
    for key, group in sorted(by_scenario.items(), key=lambda kv: str(kv[0])):
        for n in _ns(group[0]):
            ratio = pooled(group, "eval/sd/shortcut", n)[0] / pooled(group, "eval/sd/exact", n)[0]
            ratios.append(ratio)
            if n == CLAIM_N:
                tag = _tag(key)
                measured[f"{tag}_sd_ratio"] = ratio
                measured[f"{tag}_exact_cov"] = pooled(group, "eval/coverage/exact", n)[0]
                measured[f"{tag}_shortcut_cov"] = pooled(group, "eval/coverage/shortcut", n)[0]
    measured["min_sd_ratio"] = min(ratios)
    return measured["min_sd_ratio"] > 1.0, measured


CLAIMS = [exact_covers_nll, exact_above_bootstrap, exact_covers_rare_alert, bootstrap_undercovers_rare_alert]
CHECKS = [shortcut_wider_than_exact]


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Coverage vs n per scenario (panels) and variant (lines), pooled over seeds, with 95% binomial bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list] = defaultdict(list)
    for t in trials:
        groups[_scenario(t)].append(t)
    keys = sorted(groups, key=lambda k: (k[0] == "gmm", k[0], k[1], -k[3]))
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
        gen, metric, knob, value = key
        title = f"{gen}: {metric}, " + (f"shift {value:+g}" if knob == "shift" else f"prior at T = {value:g}")
        ax.set(xscale="log", xlabel="real samples n", title=title, ylim=(0, 1.02))
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel(f"coverage of the true metric ({level:.0%} intervals)")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
