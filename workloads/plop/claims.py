"""The paper's claims and the checks over a reproduction sweep (placement x task x seed), and its plot.

Every trial reports the NFN scores of its (base, task, seed) on sample 'a', on the disjoint
sample 'b' and on the random-init control, so the score claims read one trial per (base, task,
seed); the placement claim averages held-out accuracy over the trial seeds of one replicate per
(base, task) and placement. The checks hold by construction, whatever training does: the score's
calibration on a random init, the same scores in every trial of a seed, and equal trainable
parameters across placements.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim

CONTROL_TOLERANCE = 0.10
"""Random init: every module type's NFN within this of 1 (the notes' +-0.1). Over 40 control
inits on tiny-local the largest deviation was 0.087, the median 0.033."""
PRETRAINED_MIN_MAX = 1.3
"""Pretrained: the highest type's NFN must reach this (the notes' threshold; tiny-local: ~1.95)."""
SEPARATION = 3.0
"""Pretrained spread of type scores (max - min) over the control's spread must reach this."""
TAU_MIN = 0.8
"""Kendall tau between the type rankings of two disjoint samples (the notes' threshold)."""
USUAL = ("attention", "mlp", "all")
"""The usual placements the headline compares PLoP with: attention-only, MLP-only, all modules."""
ACC_MARGIN = 0.22
"""How far PLoP's held-out accuracy may trail the best usual placement's (absolute) and still
"match" it: the paper's "beats or at worst matches" at the smoke's resolution.

Rule, written before the calibration run: twice the seed noise sigma of one usual placement's
held-out accuracy, sigma = the pooled standard deviation over seeds 100-104 of the 12 (task,
usual placement) cells, rounded up to 0.01. Why twice: two equally good placements differ at one
seed by sqrt(2) sigma (SD), and the claim takes the worst of four tasks. The rule reads only the
usual placements, never PLoP's own numbers. Calibration (seeds 100-104, smoke, 16 trials a seed),
mean (SD) held-out accuracy: attr_query attention 0.963 (0.032), MLP 0.323 (0.037), all 0.827
(0.203); fact_query 0.742 (0.136), 0.850 (0.137), 0.842 (0.099); mul_mod 0.220 (0.077), 0.373
(0.064), 0.347 (0.176); sub_mod 0.027 (0.028), 0.047 (0.038), 0.033 (0.024); pooled sigma 0.106,
so 0.212 -> 0.22. (For the record, not used by the rule: PLoP 0.317, 0.792, 0.300, 0.033, and the
per-seed worst margin -0.70, -0.58, -0.62, -0.58, -0.75, every time attr_query.) The paper's gaps
(75.2 vs 75.0, 0.002 of accuracy) are far below this: the smoke can only tell a large loss."""
PARAM_TOLERANCE = 0.02
"""Compared placements' trainable-parameter counts may differ by this fraction of the smallest.
`placement.match_ranks` finds one exact common count whenever the rank window holds one (every
smoke trial so far: 0 difference); when none does each placement takes its nearest count, and 2%
is less than one rank step of the cheapest module type at the smoke's budget."""

NFN = "diag/nfn_{}/"


def _types(trial: dict[str, Any], which: str) -> dict[str, float]:
    prefix = NFN.format(which)
    return {k[len(prefix):]: float(v) for k, v in trial.items() if k.startswith(prefix)}


def task_of(trial: dict[str, Any]) -> str:
    """The task a trial fine-tuned on: its task file's name (`task_path`), else the built-in `task`."""
    path = str(trial.get("task_path") or "")
    return path.rstrip("/").rsplit("/", 1)[-1] if path else trial["task"]


def _by_run(trials: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """(base, task, seed) -> its trials (one per placement)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for t in trials:
        groups[(t["base"], task_of(t), int(t["seed"]))].append(t)
    if not groups:
        raise ValueError("no trials")
    return groups


def _spread(scores: dict[str, float]) -> float:
    return max(scores.values()) - min(scores.values())


def scores_one_at_random_init(trials: list[dict[str, Any]]) -> tuple[bool | None, dict[str, float]]:
    """On a freshly initialised model of the same architecture every type's NFN is within 0.1 of 1."""
    controls = [c for c in (_types(g[0], "control") for g in _by_run(trials).values()) if c]
    if not controls:
        return None, {}  # the sweep ran without the control (nfn_control=False)
    devs = [abs(v - 1) for c in controls for v in c.values()]
    measured = {"max_abs_dev": max(devs), "mean_abs_dev": sum(devs) / len(devs),
                "max_spread": max(_spread(c) for c in controls)}
    return measured["max_abs_dev"] <= CONTROL_TOLERANCE, measured


@claim("margin", at_least=0.0,
       paper="pretrained modules are aligned with task data (NFN > 1): e.g. Llama-3.2-1B on GSM8K q 2.58, k 2.63, "
             "gate 1.40 against v 0.97, o 0.90",
       threshold_from="ours: the top score's 1.3 from the implementation notes, the 3x spread over the random-init "
                      "control set with the first implementation; both before any run")
def scores_separate_when_pretrained(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """On the pretrained model the type scores separate: the highest reaches 1.3 and their spread is 3x the control's."""
    tops, spreads, ratios = [], [], []
    for g in _by_run(trials).values():
        a = _types(g[0], "a")
        if not a:
            raise ValueError("trials carry no NFN scores (diag/nfn_a/*)")
        tops.append(max(a.values()))
        spreads.append(_spread(a))
        control = _types(g[0], "control")
        if control:
            ratios.append(_spread(a) / max(_spread(control), 1e-12))
    measured = {"min_top_score": min(tops), "min_spread": min(spreads)}
    # The smaller relative margin (the two are on different scales): >= 0 exactly when both hold.
    margins = [measured["min_top_score"] / PRETRAINED_MIN_MAX - 1.0]
    if ratios:
        measured["min_spread_over_control"] = min(ratios)
        margins.append(measured["min_spread_over_control"] / SEPARATION - 1.0)
    measured["margin"] = min(margins)
    return measured["margin"] >= 0, measured


@claim("margin", at_least=0.0,
       paper="about 200 prompts suffice: for 64 samples or more the type ranking is stable (Kendall tau about 1)",
       threshold_from="ours: tau >= 0.8 from the implementation notes, set before any run")
def choice_stable_across_samples(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The chosen types are the same on two disjoint samples, whose type rankings agree (Kendall tau >= 0.8)."""
    taus, same = [], []
    for g in _by_run(trials).values():
        taus.append(float(g[0]["diag/kendall_tau_ab"]))
        same.append(float(g[0]["diag/same_choice_ab"]))
    measured = {"min_tau": min(taus), "same_choice_frac": sum(same) / len(same)}
    # tau's distance to its bound, or -1 when some run chose other types on sample b.
    measured["margin"] = min(measured["min_tau"] - TAU_MIN, min(same) - 1.0)
    return measured["margin"] >= 0, measured


def scores_same_in_every_trial_of_a_seed(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Every trial of a (base, task, seed) scores the types identically (up to 1e-6): the choice is deterministic."""
    drift = 0.0
    for g in _by_run(trials).values():
        first = _types(g[0], "a")
        for t in g[1:]:
            other = _types(t, "a")
            drift = max(drift, max(abs(other[k] - first[k]) for k in first))
    return drift <= 1e-6, {"max_score_drift": drift}


def mean_acc(trials: list[dict[str, Any]]) -> dict[tuple, dict[str, float]]:
    """(base, task) -> placement -> held-out accuracy averaged over seeds."""
    acc: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        acc[(t["base"], task_of(t))][t["placement"]].append(float(t["eval/acc"]))
    return {k: {p: sum(v) / len(v) for p, v in by_p.items()} for k, by_p in acc.items()}


@claim("worst_margin", at_least=-ACC_MARGIN,
       paper="held-out accuracy, PLoP against the best usual placement of each setting: SFT Qwen3-1.7B GSM8K "
             "(r = 64) 75.2 vs MLP-only 75.0, attention-only 69.5; GRPO Qwen3-1.7B 74.52 vs 73.61 / 71.49; "
             "Qwen2.5-7B CommonsenseQA 88.6 vs MLP-only 87.3; the one exception Qwen3-0.6B, MLP-only 63.3 vs 62.0 "
             "(with more parameters); the notes give no all-modules number",
       threshold_from="ours: twice the seed noise (pooled SD 0.106) of a usual placement's held-out accuracy "
                      "on calibration seeds 100-104, rounded up: 0.22 (ACC_MARGIN's docstring)")
def plop_at_least_best_usual_placement(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """On every task, PLoP's held-out accuracy is at least the best of attention-only, MLP-only and all-modules LoRA at equal trainable parameters (within the calibrated margin)."""
    measured: dict[str, float] = {}
    margins = []
    for (_, task), accs in sorted(mean_acc(trials).items()):
        missing = [p for p in ("plop", *USUAL) if p not in accs]
        if missing:
            raise ValueError(f"task {task!r}: no trials with placement {missing}")
        margin = accs["plop"] - max(accs[p] for p in USUAL)
        margins.append(margin)
        measured.update({f"{task}/{p}": v for p, v in sorted(accs.items())})
        base = [float(t["eval/base_acc"]) for t in trials if task_of(t) == task and "eval/base_acc" in t]
        if base:  # what the base model does on the held-out set before fine-tuning
            measured[f"{task}/base"] = sum(base) / len(base)
        measured[f"{task}/margin"] = margin
        # training accuracy, to tell a placement that did not learn the task from one that did not generalise
        train = [float(t["eval/train_acc"]) for t in trials if task_of(t) == task and "eval/train_acc" in t]
        if train:
            measured[f"{task}/min_train_acc"] = min(train)
    measured["mean_margin"] = sum(margins) / len(margins)  # over tasks: reported, not judged
    measured["worst_margin"] = min(margins)  # the paper claims it per setting: the worst task decides
    return min(margins) >= -ACC_MARGIN, measured


def equal_trainable_params(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Every placement of a comparison trains the same number of parameters (within 2%; exact when the rank match finds a common count)."""
    worst, measured = 0.0, {}
    for g in _by_run(trials).values():
        counts = {t["placement"]: float(t["diag/trainable_params"]) for t in g}
        planned = {k.rsplit("/", 1)[-1]: float(v) for k, v in g[0].items() if k.startswith("diag/params/")}
        for p, n in counts.items():
            if planned.get(p) != n:
                raise ValueError(f"trial with placement {p!r} trained {n} parameters, the match planned {planned.get(p)}")
        every = list(planned.values())
        worst = max(worst, (max(every) - min(every)) / min(every))
        measured.update({f"params/{p}": n for p, n in planned.items()})
    measured["max_rel_diff"] = worst
    return worst <= PARAM_TOLERANCE, measured


CLAIMS = [plop_at_least_best_usual_placement, scores_separate_when_pretrained, choice_stable_across_samples]
CHECKS = [scores_one_at_random_init, scores_same_in_every_trial_of_a_seed, equal_trainable_params]
"""Whatever training does: NFN is about 1 on a random init (the score's calibration: no alignment
without pretraining), scoring is deterministic within a seed, and the rank match equalises counts."""


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Left: NFN per module type (pretrained samples a and b, random-init control), mean over
    runs. Right: held-out accuracy per placement and task, mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [g[0] for g in _by_run(trials).values()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    types = list(_types(runs[0], "a"))
    width = 0.27
    for i, (which, label) in enumerate((("a", "pretrained, sample a"), ("b", "pretrained, sample b"),
                                        ("control", "random init"))):
        vals = [[_types(r, which).get(t, math.nan) for r in runs] for t in types]
        means = [sum(v) / len(v) for v in vals]
        left.bar([x + (i - 1) * width for x in range(len(types))], means, width, label=label)
    left.axhline(1.0, color="k", lw=0.8, ls="--")
    left.set(xticks=range(len(types)), xticklabels=[t.replace("_proj", "") for t in types], ylabel="NFN",
             title="Normalized feature norm by module type")
    left.legend(fontsize=8)
    accs = mean_acc(trials)
    placements = [p for p in ("plop", "plop_inverse", *USUAL) if any(p in a for a in accs.values())]
    keys = sorted(accs)
    w2 = 0.8 / max(1, len(placements))
    for i, p in enumerate(placements):
        right.bar([x + (i - (len(placements) - 1) / 2) * w2 for x in range(len(keys))],
                  [accs[k].get(p, math.nan) for k in keys], w2, label=p)
    right.set(xticks=range(len(keys)), xticklabels=[k[1] for k in keys], ylabel="held-out accuracy",
              title="Equal trainable parameters", ylim=(0, 1))
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
