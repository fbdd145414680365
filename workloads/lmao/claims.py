"""LMAO's claims and checks over a reproduction sweep (method x seeds), and its plot.

Within a seed the four methods (LMAO, full first-order fine-tuning, LoRA, MeZO) see the same
bijection, the same batches and (lmao vs mezo) the same perturbation seeds, so every comparison is
paired; with several trial seeds in one replicate it is judged on their mean. The headline (LMAO's
accuracy comparable to full fine-tuning's) comes first; the loss comparison with its halves after it.
The checks, the pass counts, the absence of base gradients and LMAO's training memory below full
fine-tuning's, are measured inside every trial and hold by construction of the loop.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim

METHODS = ("lmao", "lora", "mezo")
"""The arms of the loss claim (LMAO and its halves)."""
ARMS = ("lmao", "full", "lora", "mezo")
"""Every arm of the smoke, in plot order."""

PAPER_EFFECT = 0.9
"""The paper's headline gap, LMAO minus full fine-tuning in accuracy points: RoBERTa-large k = 16 SST-2, LMAO
92.8 vs FT 91.9 (TREC: 87.0 vs 85.0, +2.0). The implementation notes take it from a summary of the paper, not
checked against the PDF. The paper's peak memory of full fine-tuning: not in our notes (they give LMAO's as
never above LoRA's, e.g. BoolQ 23.08 vs 38.48 GB)."""

ACC_TOLERANCE = 4 / 63
"""LMAO's accuracy may fall below full fine-tuning's by at most this and still be 'comparable'. Rule, written
before any run of the full fine-tuning arm: the seed noise of the two arms' accuracy at smoke size, the larger
of the mean absolute change between adjacent calibration seeds 100-104 of full fine-tuning's accuracy and of
LMAO's, rounded up to a whole number of items (a multiple of 1/63), and at least one item (1/63). Measured:
full fine-tuning 1.0 at every seed (change 0), LMAO 0.460, 0.540, 0.476, 0.413, 0.429 (mean change 0.056, 3.5
items), so 4 items, 0.063 (6.3 points). Set before any of seeds 0-4 was run; see HEADLINE_CALIBRATION."""

RESOLUTION_RULE = 0.5
"""Written before any run with the full fine-tuning arm: the smoke resolves the paper's effect when the
half-width of the 95% t-interval of `acc_gap_vs_full` over calibration replicates (seeds 100-104) is at most
RESOLUTION_RULE x PAPER_EFFECT (0.45 points); otherwise the verdict can only tell a gap of about that
half-width or more from none, and the record's notes say the smoke cannot resolve an effect of the paper's
size. Measured: see HEADLINE_CALIBRATION."""

HEADLINE_CALIBRATION = """Calibration seeds 100-104 (one trial seed a replicate, the 63 pairs, accuracy in steps of 1/63):
acc_gap_vs_full -0.540, -0.460, -0.524, -0.587, -0.571 (full fine-tuning 1.0 at every seed, LMAO 0.41-0.54, LoRA
0.44-0.51, MeZO 0.03-0.10), mean -0.537, SD 0.049, 95% half-width 0.061 = 6.1 points, over RESOLUTION_RULE x
PAPER_EFFECT (0.45 points): the smoke cannot resolve an effect of the paper's size (+0.9 points); it can tell a
gap of about 6 points or more from none, and the gap it measures is about 54 points. Counted peak training
memory (the same at every seed): LMAO 5.35 MB, full fine-tuning 9.97 MB (ratio 0.54), LoRA 5.20 MB, MeZO 1.18 MB."""


def _by_method(trials: list[dict[str, Any]], key: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for t in trials:
        out[t["method"]][int(t["seed"])] = float(t[key])
    return out


def _mean_over(arms: dict[str, dict[int, dict[str, Any]]], method: str, seeds: list[int], key: str) -> float:
    return sum(float(arms[method][s][key]) for s in seeds) / len(seeds)


def _arms(trials: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """method -> seed -> trial."""
    arms: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for t in trials:
        arms[t["method"]][int(t["seed"])] = t
    return arms


@claim("acc_gap_vs_full", at_least=-ACC_TOLERANCE,
       paper="comparable to first-order methods under a tight memory budget: RoBERTa-large k = 16 SST-2 LMAO 92.8 "
             "vs full FT 91.9 (+0.9 points), TREC 87.0 vs 85.0 (+2.0); full FT's peak memory: not in our notes",
       threshold_from="ours: -4/63 (4 items), the seed noise of LMAO's and full FT's accuracy in whole items, "
                      "calibration seeds 100-104 at smoke size")
def lmao_comparable_to_full_ft(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """LMAO's accuracy is comparable to full first-order fine-tuning's: LMAO's mean exact next-token accuracy over
    the task's items minus full fine-tuning's (AdamW on every base parameter), over the replicate's trial seeds
    (paired: same pairs, same batches), is at least -ACC_TOLERANCE; both arms' counted peak training memory is
    reported beside it (judged by the check `lmao_memory_below_full_ft`)."""
    arms = _arms(trials)
    missing = [m for m in ("lmao", "full") if m not in arms]
    if missing:
        raise ValueError(f"lmao_comparable_to_full_ft: no trials of {missing}; got {sorted(arms)}")
    seeds = sorted(set(arms["lmao"]) & set(arms["full"]))
    if not seeds:
        raise ValueError("lmao_comparable_to_full_ft: lmao and full share no seed")
    measured: dict[str, float] = {"seeds": float(len(seeds))}
    for m in ARMS:
        if m in arms and all(s in arms[m] for s in seeds):
            measured[f"{m}_acc"] = _mean_over(arms, m, seeds, "eval/acc")
            measured[f"{m}_loss"] = _mean_over(arms, m, seeds, "eval/loss")
            if all("mem/peak_train_bytes" in arms[m][s] for s in seeds):
                measured[f"{m}_peak_bytes"] = _mean_over(arms, m, seeds, "mem/peak_train_bytes")
    measured["acc_gap_vs_full"] = measured["lmao_acc"] - measured["full_acc"]
    if "lmao_peak_bytes" in measured and "full_peak_bytes" in measured:
        measured["peak_ratio_lmao_to_full"] = measured["lmao_peak_bytes"] / measured["full_peak_bytes"]
    measured["items"] = float(arms["lmao"][seeds[0]].get("diag/eval_items", math.nan))
    measured["seeds_lmao_at_least_full"] = float(sum(float(arms["lmao"][s]["eval/acc"]) >= float(arms["full"][s]["eval/acc"])
                                                     for s in seeds))
    return measured["acc_gap_vs_full"] >= -ACC_TOLERANCE, measured


def lmao_memory_below_full_ft(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """At every seed LMAO's counted peak training memory (parameters + gradients + optimizer state + saved
    activations + one parameter's zeroth-order noise, from the tensors held) is below full fine-tuning's."""
    arms = _arms(trials)
    seeds = sorted(set(arms.get("lmao", {})) & set(arms.get("full", {})))
    if not seeds:
        raise ValueError(f"lmao_memory_below_full_ft: needs lmao and full trials at the same seeds, got {sorted(arms)}")
    measured: dict[str, float] = {}
    for m in ARMS:
        have = [arms[m][s] for s in seeds if s in arms.get(m, {})]
        if len(have) == len(seeds):
            measured[f"{m}_peak_bytes"] = max(float(t["mem/peak_train_bytes"]) for t in have)
            for part in ("params", "grads", "optimizer", "activations", "zo_noise"):
                key = f"mem/{part}_bytes"
                if all(key in t for t in have):
                    measured[f"{m}_{part}_bytes"] = max(float(t[key]) for t in have)
    measured["peak_ratio_lmao_to_full"] = measured["lmao_peak_bytes"] / measured["full_peak_bytes"]
    holds = all(float(arms["lmao"][s]["mem/peak_train_bytes"]) < float(arms["full"][s]["mem/peak_train_bytes"]) for s in seeds)
    return holds, measured


@claim("margin", at_least=0.0,
       paper="LMAO above both halves, e.g. RoBERTa-large k=16 SST-2: 92.8 vs LoRA 91.4 and MeZO 90.5; OPT-1.3B: "
             "above LoRA on 8 of 9 tasks",
       threshold_from="ours: no margin (LMAO's loss not above either half's), the implementation notes' CPU "
                      "assertion, set before any run")
def lmao_beats_lora_and_mezo(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """On the random bijection LMAO's final loss ends below both LoRA of the same rank and MeZO alone (mean over seeds)."""
    loss = _by_method(trials, "eval/loss")
    missing = [m for m in METHODS if m not in loss]
    if missing:
        raise ValueError(f"lmao_beats_lora_and_mezo: no trials of {missing}")
    seeds = sorted(set(loss["lmao"]) & set(loss["lora"]) & set(loss["mezo"]))
    if not seeds:
        raise ValueError("lmao_beats_lora_and_mezo: no seed ran all three methods")
    mean = {m: sum(loss[m][s] for s in seeds) / len(seeds) for m in METHODS}
    acc = _by_method(trials, "eval/acc")
    measured = {f"{m}_loss": mean[m] for m in METHODS}
    measured.update({f"{m}_acc": sum(acc[m][s] for s in seeds) / len(seeds) for m in METHODS})
    measured["lmao_minus_lora"] = mean["lmao"] - mean["lora"]
    measured["seeds_lmao_best"] = float(sum(loss["lmao"][s] < min(loss["lora"][s], loss["mezo"][s]) for s in seeds))
    measured["seeds"] = float(len(seeds))
    # LMAO's lead over the better of its halves (positive: LMAO's loss is the lowest).
    measured["margin"] = min(mean["lora"], mean["mezo"]) - mean["lmao"]
    return measured["margin"] >= 0, measured


def three_forwards_one_backward(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Every LMAO step runs exactly 3 forward passes and 1 backward pass, counted by hooks on the model."""
    lmao = [t for t in trials if t["method"] == "lmao"]
    if not lmao:
        raise ValueError("three_forwards_one_backward: no lmao trial")
    measured = {
        "forwards_min": min(t["diag/forwards_per_step_min"] for t in lmao),
        "forwards_max": max(t["diag/forwards_per_step_max"] for t in lmao),
        "backwards_min": min(t["diag/backwards_per_step_min"] for t in lmao),
        "backwards_max": max(t["diag/backwards_per_step_max"] for t in lmao),
    }
    for method in ("lora", "mezo"):  # the halves, for contrast: 1 + 1 and 2 + 0
        others = [t for t in trials if t["method"] == method]
        if others:
            measured[f"{method}_forwards"] = max(t["diag/forwards_per_step_max"] for t in others)
            measured[f"{method}_backwards"] = max(t["diag/backwards_per_step_max"] for t in others)
    holds = (measured["forwards_min"] == measured["forwards_max"] == 3
             and measured["backwards_min"] == measured["backwards_max"] == 1)
    return holds, measured


def no_base_grad_after_zo(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """After every zeroth-order step no base parameter holds a gradient (lmao and mezo trials)."""
    zo = [t for t in trials if t["method"] in ("lmao", "mezo")]
    if not zo:
        raise ValueError("no_base_grad_after_zo: no lmao or mezo trial")
    measured = {f"{m}_max_params_with_grad": max((t["diag/base_params_with_grad"] for t in zo if t["method"] == m), default=0.0)
                for m in ("lmao", "mezo")}
    measured["zo_params"] = max(t["diag/zo_params"] for t in zo)
    return all(t["diag/base_params_with_grad"] == 0 for t in zo), measured


CLAIMS = [lmao_comparable_to_full_ft, lmao_beats_lora_and_mezo]
CHECKS = [three_forwards_one_backward, no_base_grad_after_zo, lmao_memory_below_full_ft]
"""By construction of the loop: a LoRA step (one forward, one backward) and a MeZO step (two
forwards, no backward) per update, a zeroth-order phase that never calls backward, and no gradient or
optimizer state for the base (LMAO's memory below full fine-tuning's whenever the adapter is smaller
than the base)."""


NAMES = {"lmao": "LMAO", "full": "full FT (AdamW)", "lora": "LoRA", "mezo": "MeZO"}
PARTS = ("params", "grads", "optimizer", "activations", "zo_noise")


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Left: accuracy over the task's items per method and seed, with each method's forward/backward counts.
    Right: each method's counted peak training memory, by part (parameters, gradients, optimizer state,
    saved activations, zeroth-order noise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = _arms(trials)
    present = [m for m in ARMS if m in arms]
    seeds = sorted({int(t["seed"]) for t in trials})
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(len(present), 1)
    for j, m in enumerate(present):
        t = next(iter(arms[m].values()))
        label = (f"{NAMES.get(m, m)} ({t['diag/forwards_per_step_max']:.0f} fwd + "
                 f"{t['diag/backwards_per_step_max']:.0f} bwd / step)")
        vals = [float(arms[m][s]["eval/acc"]) if s in arms[m] else float("nan") for s in seeds]
        ax.bar([i + (j - (len(present) - 1) / 2) * width for i in range(len(seeds))], vals, width, color=f"C{j}", label=label)
    ax.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
    ax.set(ylabel="accuracy over the task's items", ylim=(0, 1.05), title="random bijection: LMAO vs full FT and its halves")
    ax.legend(fontsize=7)
    bottom = [0.0] * len(present)
    for k, part in enumerate(PARTS):
        vals = [max((float(t.get(f"mem/{part}_bytes", 0.0)) for t in arms[m].values()), default=0.0) / 1024**2 for m in present]
        if any(vals):
            bx.bar(range(len(present)), vals, 0.6, bottom=bottom, color=f"C{k + 4}", label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
    bx.set_xticks(range(len(present)), [NAMES.get(m, m) for m in present], fontsize=8)
    bx.set(ylabel="counted peak training memory (MiB)", title="memory held per step, from the tensors")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
