"""PALC's claims and checks over a reproduction sweep (one trial per seed), and its plot.

A seed is a different entity split, different pairs and a different calibrator init. The trial
also runs the test-time alignment baselines on the same base, pairs and held-out prompts
(`workloads.palc.baselines`: a Bradley-Terry reward head on the frozen base, best-of-N scored by
it, ARGS reward-guided decoding). The claims (the headline: PALC's gentle-word share of generations
above the best test-time baseline's; then its latency below theirs, preference accuracy, the
gentle-word share over gamma, latency against the base) are judged
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
TEST_TIME_BASELINES = ("bon", "args")
"""The test-time baselines of the headline, in the order `best_baseline` indexes them."""

PAPER_EFFECT = None
"""Not in our notes in this metric: the paper reports pairwise GPT-5 win rates (Win + 1/2 Tie) of PALC
on llama-7b-sft, HH-RLHF: 58.17% against the base, 77.17% against CAA, 61.67% against RE-Control,
49.0% against BiPO, 44.33% against GenARM (reward-guided decoding) and 41.17% against DPO; neither
best-of-N nor ARGS is in its table, and no gentle-word share exists there."""

RESOLUTION_RULE = 0.05
"""Written before any run with the baselines: with no paper effect in the smoke's metric, the smoke
resolves the headline when the half-width of the 95% t-interval of `share_margin_vs_best` over
calibration seeds 100-104 is at most RESOLUTION_RULE (0.05 of the gentle-word share: one word in
twenty); otherwise the verdict can only tell a large gap from none, and the notes say so. Measured:
see HEADLINE_CALIBRATION."""

HEADLINE_CALIBRATION = """Calibration seeds 100-104 (one trial a seed; 36 held-out prompts, one response each per arm):
share_margin_vs_best 0.259, 0.206, 0.319, 0.260, 0.207 (best baseline best-of-N at every seed: shares 0.241, 0.294,
0.181, 0.220, 0.273 against PALC's 0.500, 0.500, 0.500, 0.479, 0.479; ARGS 0.032-0.085; the base's greedy
0.114-0.215), mean 0.250, SD 0.047, 95% half-width 0.058, just over RESOLUTION_RULE (0.05): the smoke cannot resolve
a gap of one word in twenty; it tells a gap of about 0.06 or more from none, and the measured gap is four times that.
The reward head ranks 0.967-0.973 of its training pairs and 0.947-0.983 of the held-out pairs correctly. The
threshold (0) and the rule were fixed before this run; nothing was changed after it."""

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


@claim("share_margin_vs_best", at_least=0.0,
       paper="PALC beats most test-time alignment methods at near-base speed: Win + 1/2 Tie 61.67% vs RE-Control, "
             "77.17% vs CAA, 49.0% vs BiPO, 44.33% vs GenARM (GPT-5 judge, llama-7b-sft, HH-RLHF); no best-of-N or "
             "ARGS in its table",
       threshold_from="ours: 0, set before any run (holds when the whole 95% interval of PALC minus the best "
                      "test-time baseline is above 0)")
def palc_beats_best_test_time_baseline(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """PALC's alignment of generations is above the best test-time baseline's: the gentle-word share of
    PALC's greedy responses at gamma_eval on the held-out entities' prompts minus the higher of
    best-of-N's and ARGS's shares on the same prompts (both guided by a Bradley-Terry reward head
    fitted on PALC's training pairs; the best chosen per replicate, so the choice favours the
    baselines). Mean over the replicate's trials."""
    _need(trials)
    have = [t for t in trials if all(f"eval/share_{b}" in t for b in TEST_TIME_BASELINES)]
    if not have:
        raise ValueError("palc_beats_best_test_time_baseline: no trial ran the baselines (baselines=True)")
    mean = lambda key: sum(float(t[key]) for t in have) / len(have)  # noqa: E731
    gammas = {float(t.get("eval/gamma_eval", t.get("gamma_eval", 1.0))) for t in have}
    if len(gammas) != 1:
        raise ValueError(f"palc_beats_best_test_time_baseline: trials at different gamma_eval {sorted(gammas)}")
    g = gammas.pop()
    measured: dict[str, float] = {"trials": float(len(have)), "palc_share": mean(f"eval/share_greedy/gamma_{g:g}"),
                                  "base_share": mean("eval/share_greedy/gamma_0")}
    for b in TEST_TIME_BASELINES:
        measured[f"{b}_share"] = mean(f"eval/share_{b}")
        measured[f"share_margin_vs_{b}"] = measured["palc_share"] - measured[f"{b}_share"]
    # reported beside, not in the decision: the reward head's accuracy, the latencies, DPO on a head of PALC's shape
    for key in ("eval/rm_train_acc", "eval/rm_heldout_acc", "perf/palc_latency_ratio_rot", "perf/bon_latency_ratio_rot",
                "perf/args_latency_ratio_rot", "eval/share_dpo_head", "eval/pref_acc_dpo_head"):
        if all(key in t for t in have):
            measured[key.split("/")[1]] = mean(key)
    best = max(range(len(TEST_TIME_BASELINES)), key=lambda i: measured[f"{TEST_TIME_BASELINES[i]}_share"])
    measured["best_baseline"] = float(best)
    measured["best_baseline_share"] = measured[f"{TEST_TIME_BASELINES[best]}_share"]
    measured["share_margin_vs_best"] = measured["palc_share"] - measured["best_baseline_share"]
    return measured["share_margin_vs_best"] > 0, measured


@claim("latency_gap", at_least=0.0,
       paper="PALC's per-token latency 1.08x the base's, reward-guided decoding 3-5x",
       threshold_from="ours: 0, set before any run (PALC faster than the faster test-time baseline)")
def palc_faster_than_test_time_baselines(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """PALC decodes faster per token than either test-time baseline: the lower of best-of-N's and ARGS's
    per-token latency ratios to the base minus PALC's, all measured in one rotation on the same prompts
    (the worst trial; the ratios reported are means)."""
    _need(trials)
    keys = [f"perf/{a}_latency_ratio_rot" for a in ("palc",) + TEST_TIME_BASELINES]
    have = [t for t in trials if all(k in t for k in keys)]
    if not have:
        raise ValueError("palc_faster_than_test_time_baselines: no trial ran the baselines (baselines=True)")
    measured = {f"{a}_ratio": sum(float(t[k]) for t in have) / len(have)
                for a, k in zip(("palc",) + TEST_TIME_BASELINES, keys)}
    measured["latency_gap"] = min(min(float(t[k]) for k in keys[1:]) - float(t[keys[0]]) for t in have)
    return measured["latency_gap"] > 0, measured


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


CLAIMS = [palc_beats_best_test_time_baseline, palc_faster_than_test_time_baselines, preference_accuracy_rises, share_rises_with_gamma, latency_within_budget]
CHECKS = [gamma_zero_is_base, base_untouched]
"""Exact by construction: gamma 0 adds nothing to the base's logits, and the base is frozen (its hash,
its gradients, and a trainable count of B(H + V) are what the code builds, whatever training does)."""


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Left: held-out preference accuracy vs gamma; right: gentle-word share of generations vs gamma,
    with best-of-N's and ARGS's shares (triangles) at gamma_eval."""
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
        for b, marker in (("bon", "^"), ("args", "v")):
            if f"eval/share_{b}" in t:  # the test-time baselines, drawn at gamma_eval for comparison
                axes[1].plot([float(t.get("eval/gamma_eval", 1.0))], [float(t[f"eval/share_{b}"])], marker, ms=8,
                             label=f"{label} {'best-of-N' if b == 'bon' else 'ARGS'}")
    axes[0].axhline(PALC_ACC_MIN, color="grey", ls=":")
    axes[0].set(xlabel=r"$\gamma$", ylabel="held-out preference accuracy", ylim=(0, 1.02))
    axes[1].set(xlabel=r"$\gamma$", ylabel="gentle-word share of generations", ylim=(0, 1.02))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
