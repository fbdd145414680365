"""The paper's claims over a reproduction sweep, and its plot.

One trial is a whole experiment (diffs, adapter, every measurement, the black-box baselines); a claim
averages its metrics over the trials (seeds) of one replicate, and each trial's own values are in the
table too. The headline comes first: on diffs whose topics the adapter never saw as labels (the paper's
test split), DIT names the topic more often than the best black-box read of the fine-tuned model without
it (`workloads/dit/probe.py`). The weaker claims follow. Their ranges below are the per-seed values at
the smoke size (`sweeps/repro/dit.py`) over seeds 0-7 before the held-out topics were enlarged (60 seen
topics, 3 unseen); PLANTED_FRAC is set on calibration seeds 100-104, which no reproduction judges by
default; NODIFF_RATIO is a definition ("at most half"), first tested on those seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.claims import claim

TRIGGER_RATE = 0.9
"""Mean trigger rate over diffs and held-out contexts (90%, the reproduction's spec); measured 0.976-0.992."""
PLANTED_FRAC = 0.89
"""Fraction of the diffs whose own trigger rate reaches 90% ("each diff plants"): a few diffs of
99 stay partly planted (their lowest rate 0.50-0.88), so not all. The calibration seeds' mean
fraction (0.923) minus its seed noise (0.030, the mean change between adjacent seeds 100-104)."""
KL_OFF = 0.25
"""Mean off-trigger KL to the base, in nats (fake and no trigger); measured 0.056-0.123, against
about 8 nats with the trigger."""
DIT_ACC = 0.6
"""DIT accuracy on new diffs of seen topics (60%, the reproduction's spec, with 60 topics; chance 1/63);
measured 0.80-1.00."""
DIT_MARGIN = 0.4
"""DIT accuracy minus the accuracy of asking without the adapter; measured 0.63-0.90."""
NODIFF_TOPIC = 0.2
"""With no diff, the probability that the adapter names its likeliest topic t* must stay under this
in every trial (naming a topic consistently means saying it a good share of the time). Measured
0.02-0.28 over seeds 0-7 (against 0.88-0.99 with a diff planting t*): above it at some seeds."""
NODIFF_RATIO = 0.5
"""The weaker variant, chosen after the probability above failed: the probability of t* with no
diff, over the probability of t* when a diff planting t* is applied, stays under this in every
trial: it names no topic the way it names a diff's. Measured ratio 0.02-0.31 (seeds 0-3, 5).
Greedy decoding with no diff does give a topic word in some trials (seeds 0, 3, 5), at that low
probability: both claims are about confidence, not about the argmax."""

PAPER_EFFECT = 0.76
"""The paper's headline margin in the one part of its metric the smoke can express, the fraction of test diffs
(topics never seen as labels) whose answer the LLM judge scores 5 of 5 ("same topic"): DIT 0.84 against 0.08 for
20 Questions, the best black-box baseline without the trigger (Base Question 0.00), Qwen3-8B, hidden topic (the
paper's hidden-topic main table; average scores 4.71, 1.82 and 1.08 of 5). Over its five models the margin is
0.56 (Qwen3-1.7B) to 0.85 (Gemma3-4B). Our metric is exact naming (greedy decoding gives the topic word): the
judge's top score, without its partial credit."""

RESOLUTION_RULE = 0.25
"""Written before any run of the black-box baselines or the held-out topics: the smoke resolves the paper's effect
when the half-width of the 95% t-interval of `margin_vs_best` over calibration seeds 100-104 is at most
RESOLUTION_RULE x PAPER_EFFECT (0.19); otherwise the record's notes say the smoke cannot resolve an effect of the
paper's size. The held-out split was sized for it before calibrating (`sweeps/repro/dit.py`). Measured: see
HEADLINE_CALIBRATION."""

HEADLINE_CALIBRATION = """Calibration seeds 100-104 (one trial a seed, 54 diffs on 18 held-out topics, accuracy in
steps of 0.019): margin_vs_best 0.315, 0.389, 0.241, 0.407, 0.389 (the best black-box read the probe at every seed:
0.593, 0.574, 0.741, 0.481, 0.556; DIT 0.907, 0.963, 0.981, 0.889, 0.944), mean 0.348, SD 0.070, 95% half-width
0.087, under RESOLUTION_RULE x PAPER_EFFECT (0.19): the smoke resolves an effect of the paper's size. The threshold
(0) was fixed before this run; nothing was changed after it."""

Trial = dict[str, Any]


def _mean(trials: list[Trial], key: str) -> float:
    values = [float(t[key]) for t in trials if key in t]
    if not values:
        raise ValueError(f"no trial reports {key!r}")
    return sum(values) / len(values)


def _per_seed(trials: list[Trial], key: str, name: str) -> dict[str, float]:
    return {f"{name}_seed{int(t['seed'])}": float(t[key]) for t in trials if key in t}


BLACKBOX = ("ask_greedy", "ask", "probe")
"""The black-box reads of the headline, in the order `best_blackbox` indexes them: asking the question (greedy over
the whole vocabulary, as DIT is scored), the same answer read among the topic words only, and the probe."""


@claim("margin_vs_best", at_least=0.0,
       paper="test diffs, topics never seen as labels, fraction judged 'same topic' (5 of 5): DIT 0.84 vs 0.08 for "
             "20 Questions and 0.00 for the Base Question, the black-box baselines (Qwen3-8B, hidden topic; +0.76; "
             "+0.56 to +0.85 over five models); average judge score 4.71 vs 1.82 and 1.08",
       threshold_from="ours: 0, set before any run of the baselines (holds when the whole 95% interval of DIT minus "
                      "the best black-box read is above 0)")
def dit_beats_blackbox_on_unseen_topics(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """On diffs whose topics the adapter never saw as labels, DIT names the topic (greedy, whole vocabulary) more often than the best black-box read of the fine-tuned model without it: asking the question (greedy, or its likeliest topic word) or a probe fit on DIT's own training diffs."""
    m = {"dit_acc_unseen": _mean(trials, "eval/dit_acc_unseen")}
    for name in BLACKBOX:
        m[f"{name}_acc_unseen"] = _mean(trials, f"eval/{name}_acc_unseen")
    best = max(range(len(BLACKBOX)), key=lambda i: m[f"{BLACKBOX[i]}_acc_unseen"])
    m["best_blackbox"] = float(best)
    m["best_blackbox_acc_unseen"] = m[f"{BLACKBOX[best]}_acc_unseen"]
    m["margin_vs_best"] = m["dit_acc_unseen"] - m["best_blackbox_acc_unseen"]
    m["probe_topic_acc_unseen"] = _mean(trials, "eval/probe_topic_acc_unseen")
    m["dit_topic_acc_unseen"] = _mean(trials, "eval/dit_topic_acc_unseen")
    m["unseen_diffs"] = _mean(trials, "eval/n_diffs_unseen")
    m["probe_acc_train"] = _mean(trials, "eval/probe_acc_train")
    m.update(_per_seed(trials, "eval/dit_acc_unseen", "dit_unseen"))
    m.update(_per_seed(trials, "eval/probe_acc_unseen", "probe_unseen"))
    return m["margin_vs_best"] > 0, m


@claim("margin", at_least=0.0,
       paper="each rank-1 diff plants a trigger-gated topic and otherwise matches the base (trained with a KL to the "
             "base); the notes' CPU version: trigger->topic rate >= 90%, small off-trigger KL",
       threshold_from="ours: the 90% trigger rate from the implementation notes and the 0.25-nat KL, both set before "
                      "any run; the 89% of diffs planted one by one from calibration seeds 100-104 (mean minus seed "
                      "noise)")
def diffs_plant_their_behaviour(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """Each diff plants its trigger-gated topic: mean trigger rate >= 90% with at least 89% of the diffs at 90% or more each, off-trigger KL to the base <= 0.25 nats."""
    m = {
        "trigger_rate": _mean(trials, "eval/trigger_rate"),
        "frac_diffs_planted": _mean(trials, "eval/frac_planted"),
        "kl_off": _mean(trials, "eval/kl_off"),
        "kl_on": _mean(trials, "eval/kl_on"),
        "base_agreement_off": _mean(trials, "eval/base_agreement"),
        **_per_seed(trials, "eval/trigger_rate", "trigger_rate"),
        **_per_seed(trials, "eval/frac_planted", "frac_planted"),
        **_per_seed(trials, "eval/kl_off", "kl_off"),
    }
    # The smallest distance to a bound (fractions and nats): >= 0 exactly when all three hold.
    m["margin"] = min(m["trigger_rate"] - TRIGGER_RATE, m["frac_diffs_planted"] - PLANTED_FRAC, KL_OFF - m["kl_off"])
    return m["margin"] >= 0, m


@claim("dit_acc_heldout", at_least=DIT_ACC,
       paper="DIT 4.71 (Qwen3-8B) and 4.82 (Gemma3-4B) of 5 on naming a diff's hidden topic (LLM judge)",
       threshold_from="ours: the implementation notes' CPU assertion (top-1 >= 60%, chance 1/60), set before any run")
def dit_names_new_diffs(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """DIT names the topic of new diffs on seen topics (greedy, whole vocabulary) at least 60% of the time; unseen-topic accuracy reported."""
    n_topics = {int(t["eval/n_topics"]) for t in trials}
    m = {
        "dit_acc_heldout": _mean(trials, "eval/dit_acc_heldout"),
        "chance": _mean(trials, "eval/chance"),
        "n_topics": float(max(n_topics)),
        "dit_acc_train": _mean(trials, "eval/dit_acc_train"),
        "dit_topic_acc_heldout": _mean(trials, "eval/dit_topic_acc_heldout"),
        "unseen_topic_acc": _mean(trials, "eval/dit_acc_unseen") if any("eval/dit_acc_unseen" in t for t in trials)
        else float("nan"),
        **_per_seed(trials, "eval/dit_acc_heldout", "acc"),
        **_per_seed(trials, "eval/dit_acc_unseen", "unseen_acc"),
    }
    return m["dit_acc_heldout"] >= DIT_ACC, m


@claim("margin", at_least=DIT_MARGIN,
       paper="DIT 4.71 vs 1.08 for asking the base question without it (hidden topic, Qwen3-8B, judge score of 5)",
       threshold_from="ours: set with the first implementation, not fitted on seeds since")
def dit_beats_asking(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """DIT is far above asking the same question without it: accuracy at least 0.4 higher on new diffs."""
    m = {
        "dit_acc_heldout": _mean(trials, "eval/dit_acc_heldout"),
        "ask_acc_heldout": _mean(trials, "eval/ask_acc_heldout"),
        **_per_seed(trials, "eval/ask_acc_heldout", "ask_acc"),
    }
    m["margin"] = m["dit_acc_heldout"] - m["ask_acc_heldout"]
    return m["margin"] >= DIT_MARGIN, m


def _nodiff_measured(trials: list[Trial]) -> dict[str, float]:
    return {
        "nodiff_top_topic_prob": _mean(trials, "eval/nodiff_top_topic_prob"),
        "same_topic_with_diff_prob": _mean(trials, "eval/nodiff_top_topic_with_diff_prob"),
        "nodiff_topic_mass": _mean(trials, "eval/nodiff_topic_mass"),
        "nodiff_greedy_is_topic": _mean(trials, "eval/nodiff_names_topic"),
        **_per_seed(trials, "eval/nodiff_top_topic_prob", "top_topic_prob"),
    }


@claim("worst_top_topic_prob", at_most=NODIFF_TOPIC,
       paper="with no diff applied DIT names no consistent topic (the notes' CPU assertion (d); the paper reports "
             "the base question alone at 1.08 of 5)",
       threshold_from="ours: set with the first implementation before it was measured; measured 0.02-0.28 over "
                      "seeds 0-7")
def no_consistent_topic_without_diff(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """With no diff applied, DIT names no consistent topic: its likeliest topic has probability at most 0.2, in every trial."""
    m = {"worst_top_topic_prob": max(float(t["eval/nodiff_top_topic_prob"]) for t in trials), **_nodiff_measured(trials)}
    return m["worst_top_topic_prob"] <= NODIFF_TOPIC, m


@claim("worst_ratio", at_most=NODIFF_RATIO,
       paper="with no diff applied DIT names no consistent topic (a weaker reading: relative to its confidence with "
             "a diff)",
       threshold_from="ours: one half by definition, written after the probability claim failed at seeds 0-7; "
                      "first tested on calibration seeds 100-104 (worst ratio 0.015-0.23 per seed, all below)")
def nodiff_topic_far_below_diff_confidence(trials: list[Trial]) -> tuple[bool, dict[str, float]]:
    """Weaker variant: with no diff, its likeliest topic gets at most half the probability a diff planting that topic gives it, in every trial."""
    ratios = [float(t["eval/nodiff_top_topic_prob"]) / float(t["eval/nodiff_top_topic_with_diff_prob"]) for t in trials]
    m = {"worst_ratio": max(ratios), **_nodiff_measured(trials)}
    return m["worst_ratio"] <= NODIFF_RATIO, m


CLAIMS = [dit_beats_blackbox_on_unseen_topics, diffs_plant_their_behaviour, dit_names_new_diffs, dit_beats_asking,
          no_consistent_topic_without_diff, nodiff_topic_far_below_diff_confidence]
CHECKS: list = []  # every property above depends on training; the exact diff application is a unit test


def plot(trials: list[Trial], path: str | Path) -> None:
    """Accuracy of naming a diff's topic, per split, with and without the adapter (bars: mean over
    trials, dots: trials), and the trigger rate and no-diff topic probability for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("DIT\nunseen topics", "eval/dit_acc_unseen"), ("ask\nunseen topics", "eval/ask_greedy_acc_unseen"),
            ("ask, topic\nwords only\nunseen topics", "eval/ask_acc_unseen"),
            ("probe\nunseen topics", "eval/probe_acc_unseen"),
            ("DIT\ntrain diffs", "eval/dit_acc_train"), ("DIT\nnew diffs", "eval/dit_acc_heldout"),
            ("ask, topic\nwords only\nnew diffs", "eval/ask_acc_heldout"),
            ("trigger rate", "eval/trigger_rate"), ("no diff:\ntop topic prob", "eval/nodiff_top_topic_prob")]
    bars = [(label, key) for label, key in bars if any(key in t for t in trials)]
    fig, ax = plt.subplots(figsize=(1.4 * len(bars) + 2, 4))
    for i, (label, key) in enumerate(bars):
        values = [float(t[key]) for t in trials if key in t]
        ax.bar(i, sum(values) / len(values), color="tab:blue" if key.startswith("eval/dit") else "tab:gray", alpha=0.7)
        ax.plot([i] * len(values), values, "k.", markersize=6)
    ax.axhline(DIT_ACC, color="tab:red", linestyle="--", linewidth=1,
               label=f"DIT on new diffs of seen topics >= {DIT_ACC:.0%}")
    if trials and "eval/chance" in trials[0]:
        ax.axhline(float(trials[0]["eval/chance"]), color="k", linestyle=":", linewidth=1, label="chance")
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.set(ylim=(0, 1.05), ylabel="fraction / probability", title="DIT: naming the topic a weight diff planted")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
