"""PALC's claims and checks over a reproduction sweep (one trial per seed), and its plot.

A seed is a different entity split, different pairs and a different calibrator init. The claims
(the paper's effects: preference accuracy, the gentle-word share over gamma, latency) are judged
across seeds by ladder; the checks (gamma 0 is the base, the base is untouched) hold by
construction and must hold at every seed. The thresholds are the implementation notes' CPU
assertions, set before any run. What was measured at smoke size, seed by seed, is in the report's notes,
`docs/reproductions/palc.notes.md`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.claims import claim

BASE_ACC_BAND = (0.35, 0.65)
"""'About 50%': the base's held-out preference accuracy lies in this band."""
PALC_ACC_MIN = 0.90
"""PALC's held-out preference accuracy at gamma_eval."""
GAMMA0_TOL = 1e-5
"""Largest |logit difference| between gamma 0 and the base (float32 arithmetic)."""
LATENCY_MAX = 1.3
"""PALC's per-token decoding time over the base's."""
STRICT = 1e-12
"""Makes 'ends above where it starts' strict under the margin's >= 0: a flat share curve does not rise."""


def _need(trials: list[dict[str, Any]]) -> None:
    if not trials:
        raise ValueError("no finished trials")


def by_gamma(trial: dict[str, Any], prefix: str) -> list[tuple[float, float]]:
    """(gamma, value) of the metrics `<prefix>/gamma_<g>` of one trial, ascending in gamma."""
    out = []
    for key, value in trial.items():
        if key.startswith(prefix + "/gamma_"):
            out.append((float(key[len(prefix) + 7:]), float(value)))
    return sorted(out)


@claim("margin", at_least=0.0,
       paper="PALC lifts the base's preference to a 58.17% pairwise win rate over the base (GPT-5 judge, HH-RLHF); "
             "the implementation notes' CPU version: held-out preference accuracy rises from about 50% to >= 90%",
       threshold_from="ours: the implementation notes' CPU assertion (>= 90%; 'about 50%' read as 0.35-0.65), "
                      "set before any run")
def preference_accuracy_rises(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Held-out preference accuracy rises from about 50% (the base, gamma 0) to at least 90% (PALC)."""
    _need(trials)
    base = [float(t["eval/pref_acc_base"]) for t in trials]
    palc = [float(t["eval/pref_acc"]) for t in trials]
    measured = {"base_min": min(base), "base_max": max(base), "palc_min": min(palc), "palc_mean": sum(palc) / len(palc)}
    # The smallest of the three distances to a bound: PALC above 90%, the base inside the band.
    measured["margin"] = min(min(palc) - PALC_ACC_MIN, min(base) - BASE_ACC_BAND[0], BASE_ACC_BAND[1] - max(base))
    return measured["margin"] >= 0, measured


def _margin(values: list[float]) -> float:
    """The smallest step of a curve, or (when smaller) its total rise less STRICT: >= 0 exactly
    when the curve never falls and ends above where it starts."""
    return min(min(b - a for a, b in zip(values, values[1:])), values[-1] - values[0] - STRICT)


@claim("margin", at_least=0.0,
       paper="gamma scales the calibration at decoding time: 0 gives the base, larger gamma steers further toward "
             "the preferred style (gamma < 0 steers the other way); the notes' CPU version: the preferred-token share "
             "of generations rises monotonically over gamma",
       threshold_from="ours: 'monotone' read as no step below 0, set in the implementation notes before any run")
def share_rises_with_gamma(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The gentle-word share of greedy and sampled generations never falls as gamma grows over the grid, and ends above where it starts."""
    _need(trials)
    measured: dict[str, float] = {}
    margins = []
    for kind in ("greedy", "sampled"):
        for t in trials:
            curve = by_gamma(t, f"eval/share_{kind}")
            if not curve:
                continue
            values = [v for _, v in curve]
            margins.append(_margin(values))
            measured[f"{kind}_worst_step"] = min(measured.get(f"{kind}_worst_step", 1.0),
                                                 min(b - a for a, b in zip(values, values[1:])))
        curves = [by_gamma(t, f"eval/share_{kind}") for t in trials]
        for i, (g, _) in enumerate(curves[0]):
            measured[f"{kind}_{g:g}"] = sum(c[i][1] for c in curves) / len(curves)
    if not margins:
        raise ValueError("no eval/share_*/gamma_* metrics in the trials")
    measured["margin"] = min(margins)
    return measured["margin"] >= 0, measured


def gamma_zero_is_base(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """gamma = 0 reproduces the base model's logits (max |difference| at most 1e-5) and its preference accuracy."""
    _need(trials)
    diff = max(float(t["eval/gamma0_max_abs_logit_diff"]) for t in trials)
    return diff <= GAMMA0_TOL, {"max_abs_logit_diff": diff}


@claim("ratio_max", at_most=LATENCY_MAX, paper="per-token latency 1.08x the base's (reward-guided decoding: 3-5x)",
       threshold_from="ours: the implementation notes' loose CPU bound, set before any run")
def latency_within_budget(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Per-token decoding latency with PALC is at most 1.3x the base's (median over interleaved repetitions, same run)."""
    _need(trials)
    ratios = [float(t["perf/latency_ratio"]) for t in trials]
    return max(ratios) <= LATENCY_MAX, {"ratio_max": max(ratios), "ratio_min": min(ratios),
                                        "base_ms_per_token": 1e3 * float(trials[0]["perf/base_s_per_token"])}


def base_untouched(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The base's parameters hash the same after training, none takes a gradient, and only B(H + V) parameters train."""
    _need(trials)
    unchanged = min(float(t["eval/base_unchanged"]) for t in trials)
    trainable_base = max(float(t["eval/base_trainable_params"]) for t in trials)
    grads = max(float(t["eval/base_grads"]) for t in trials)
    extra = max(abs(float(t["eval/trainable_params"]) - float(t["eval/expected_params"])) for t in trials)
    measured = {"hash_unchanged": unchanged, "base_trainable": trainable_base, "base_grads": grads,
                "trainable_over_expected": extra, "trainable": float(trials[0]["eval/trainable_params"])}
    return unchanged == 1.0 and trainable_base == 0 and grads == 0 and extra == 0, measured


CLAIMS = [preference_accuracy_rises, share_rises_with_gamma, latency_within_budget]
CHECKS = [gamma_zero_is_base, base_untouched]
"""Exact by construction: gamma 0 adds nothing to the base's logits, and the base is frozen (its hash,
its gradients, and a trainable count of B(H + V) are what the code builds, whatever training does)."""


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Left: held-out preference accuracy vs gamma; right: gentle-word share of generations vs gamma."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for t in trials:
        label = f"seed {int(t['seed'])}"
        acc = by_gamma(t, "eval/pref_acc")
        axes[0].plot([g for g, _ in acc], [v for _, v in acc], "o-", label=label)
        for kind, style in (("greedy", "o-"), ("sampled", "s--")):
            share = by_gamma(t, f"eval/share_{kind}")
            if share:
                axes[1].plot([g for g, _ in share], [v for _, v in share], style, label=f"{label} {kind}")
    axes[0].axhline(PALC_ACC_MIN, color="grey", ls=":")
    axes[0].set(xlabel=r"$\gamma$", ylabel="held-out preference accuracy", ylim=(0, 1.02))
    axes[1].set(xlabel=r"$\gamma$", ylabel="gentle-word share of generations", ylim=(0, 1.02))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
