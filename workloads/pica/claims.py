"""PiCa's claims and checks over a reproduction sweep (arms x seeds: PiCa on the column space, on a
random subspace, LoRA and PiSSA at the matched rank), and its plot.

The four checks are exact properties of the method, measured inside every trial on its trained
model: they hold by construction when the code is right, so they must hold in every trial (the
worst trial is reported; they read PiCa's trials only). The claims compare mean held-out losses over
the trial seeds of one replicate: the paper's ablation (column vs random subspace) and PiCa against
LoRA at (nearly) equal trainable parameters; within a seed every arm sees the same batches.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim
from workloads.pica.workload import DEPTH_PREFIX, UNSHARED_PREFIX

MERGE_TOL = 1e-5
"""Merged weight vs W0 + M P (float64 reference), relative to the update's largest entry; and the
merged model's logits vs the adapter's, relative to the largest logit."""
SPAN_TOL = 1e-5
"""||dW - dW P^T P||_F / ||dW||_F of the merged update."""
GRAD_TOL = 1e-4
"""||dL/dM - sum_l dL/dW_l P_l^T|| / ||sum_l ...|| (two float32 backward passes, summed in a different order)."""


LORA_TOLERANCE = 0.20
"""PiCa's held-out answer loss may exceed LoRA's by at most this (not worse by more than t): the seed
noise of LoRA's held-out loss, its mean absolute change between adjacent calibration seeds 100-104 at
smoke size (LoRA r = 1, 3200 trainable, against PiCa r = 8, 2944): losses 3.771, 3.880, 3.627, 3.575,
3.941, mean change 0.195, to 2 significant digits 0.20. Set before any of seeds 0-4 was judged; the
measure (held-out loss, not accuracy: 50 held-out answers move accuracy in steps of 0.02) was chosen
before the calibration ran. PiCa's own loss at those seeds: 3.782, 3.868, 3.795, 3.879, 3.914."""


def _need(trials: list[dict[str, Any]], key: str, what: str) -> list[dict[str, Any]]:
    have = [t for t in trials if key in t]
    if not have:
        raise ValueError(f"{what}: no trial measured {key!r} (run with exact_checks=True)")
    return have


def merged_equals_w0_plus_mp(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The merged weight equals W0 + M P and the merged model computes the adapter's logits; W0 is untouched."""
    have = _need(trials, "diag/merge_weight_err", "merged_equals_w0_plus_mp")
    measured = {
        "worst_weight_err": max(t["diag/merge_weight_err"] for t in have),
        "worst_logit_err": max(t["diag/merge_logit_err"] for t in have),
        "base_changed": max(t["diag/base_changed"] for t in have),
    }
    holds = measured["worst_weight_err"] <= MERGE_TOL and measured["worst_logit_err"] <= MERGE_TOL and measured["base_changed"] == 0
    return holds, measured


def update_in_span_of_p(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The trained update dW = W_merged - W0 lies in span(P): relative residual outside it <= 1e-5."""
    have = _need(trials, "diag/span_residual", "update_in_span_of_p")
    return max(t["diag/span_residual"] for t in have) <= SPAN_TOL, {"worst_residual": max(t["diag/span_residual"] for t in have)}


def shared_gradient_aggregates_layers(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """dL/dM of a shared M equals the sum over its layers of dL/dW_l P_l^T."""
    have = _need(trials, "diag/shared_grad_err", "shared_gradient_aggregates_layers")
    worst = max(t["diag/shared_grad_err"] for t in have)
    return worst <= GRAD_TOL, {"worst_rel_err": worst}


def _depth_counts(trial: dict[str, Any], prefix: str) -> dict[int, float]:
    return {int(k[len(prefix):]): float(v) for k, v in trial.items() if k.startswith(prefix)}


def trainable_count_independent_of_depth(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The trainable count is r * sum(d_out) at every depth (shared M), where one M per layer grows with depth."""
    have = [t for t in _pica(trials) if t.get("share", True) and _depth_counts(t, DEPTH_PREFIX)]
    if not have:
        raise ValueError("trainable_count_independent_of_depth: no shared-M trial measured counts at depths")
    holds, measured = True, {}
    for t in have:
        shared = _depth_counts(t, DEPTH_PREFIX)
        if len(shared) < 2:
            raise ValueError("trainable_count_independent_of_depth: counts at two depths at least are needed")
        holds &= len(set(shared.values())) == 1 and set(shared.values()) == {t["diag/expected_trainable"]}
        holds &= t["diag/trainable"] == t["diag/expected_trainable"]
    t = have[0]
    measured.update({f"shared_L{d}": c for d, c in sorted(_depth_counts(t, DEPTH_PREFIX).items())})
    measured.update({f"unshared_L{d}": c for d, c in sorted(_depth_counts(t, UNSHARED_PREFIX).items())})
    measured["trained_model"] = t["diag/trainable"]
    measured["r_times_sum_dout"] = t["diag/expected_trainable"]
    return holds, measured


def _pica(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """PiCa's trials (a trial of a config before the baseline arms has no `method`: PiCa)."""
    return [t for t in trials if t.get("method", "pica") == "pica"]


def mean_by(trials: list[dict[str, Any]], field: str, key: str) -> dict[Any, float]:
    groups: dict[Any, list[float]] = defaultdict(list)
    for t in trials:
        groups[t[field]].append(float(t[key]))
    return {k: sum(v) / len(v) for k, v in groups.items()}


@claim("loss_gap", at_least=0.0,
       paper="column space 67.60 vs a random subspace 63.18 (accuracy) at equal parameters, the paper's ablation",
       threshold_from="ours: no margin (column not worse than random in held-out loss), the implementation notes' "
                      "CPU assertion, set before any run")
def column_beats_random(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The column space beats a random subspace of the same rank: held-out loss no higher, mean over seeds."""
    shared = [t for t in _pica(trials) if t.get("share", True)]
    loss = mean_by(shared, "subspace", "eval/loss")
    if not {"column", "random"} <= set(loss):
        raise ValueError(f"column_beats_random: needs column and random trials, got {sorted(loss)}")
    seeds = sorted({t["seed"] for t in shared})
    measured = {"column_loss": loss["column"], "random_loss": loss["random"], "seeds": float(len(seeds))}
    acc = mean_by(shared, "subspace", "eval/acc")
    measured.update({"column_acc": acc["column"], "random_acc": acc["random"]})
    fit = mean_by(shared, "subspace", "eval/train_loss")
    measured.update({"column_train_loss": fit["column"], "random_train_loss": fit["random"]})
    if all("diag/grad_energy_in_span" in t for t in shared):  # the mechanism: share of dL/dW0 each subspace holds
        energy = mean_by(shared, "subspace", "diag/grad_energy_in_span")
        measured.update({"column_grad_energy": energy["column"], "random_grad_energy": energy["random"]})
    by_seed = {(t["subspace"], t["seed"]): float(t["eval/loss"]) for t in shared}
    measured["seeds_column_wins"] = float(sum(by_seed.get(("column", s), 1e9) < by_seed.get(("random", s), -1e9) for s in seeds))
    measured["loss_gap"] = loss["random"] - loss["column"]
    return measured["loss_gap"] >= 0, measured


@claim("loss_margin_vs_lora", at_least=-LORA_TOLERANCE,
       paper="PiCa above LoRA at equal or fewer parameters on commonsense (Gemma-7B: 84.47 average with 13x fewer "
             "parameters than LoRA) and math (Gemma-2B GSM8K 52.77 vs SVFT 50.03); here: not worse by more than the "
             "seed noise",
       threshold_from="ours: -(seed noise of LoRA's held-out loss), calibration seeds 100-104 at smoke size")
def pica_not_worse_than_lora(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """PiCa (column space, shared M) is not worse than LoRA at (nearly) equal trainable parameters:
    LoRA's mean held-out answer loss minus PiCa's, over the trial seeds of one replicate (paired: the
    same seed, the same batches), is at least -LORA_TOLERANCE. PiSSA, the SVD-initialised LoRA, is
    measured alongside (not judged). Both arms' trainable counts are reported."""
    arms: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for t in trials:
        method = t.get("method", "pica")
        if method == "pica" and (t.get("subspace", "column") != "column" or not t.get("share", True)):
            continue
        arms[method][t["seed"]] = t
    seeds = sorted(set(arms["pica"]) & set(arms["lora"]))
    if not seeds:
        raise ValueError(f"pica_not_worse_than_lora: needs pica (column, shared) and lora trials at the same seeds, "
                         f"got {sorted(arms)}")
    measured: dict[str, float] = {"seeds": float(len(seeds))}
    for method, ts in arms.items():
        paired = [ts[s] for s in seeds if s in ts]
        if len(paired) != len(seeds):
            continue
        for key, name in (("eval/loss", "loss"), ("eval/acc", "acc"), ("diag/trainable", "trainable")):
            measured[f"{method}_{name}"] = sum(float(t[key]) for t in paired) / len(paired)
        if method != "pica":
            measured[f"{method}_rank"] = float(paired[0].get("diag/lora_rank", math.nan))
    measured["loss_margin_vs_lora"] = measured["lora_loss"] - measured["pica_loss"]
    measured["acc_margin_vs_lora"] = measured["pica_acc"] - measured["lora_acc"]
    if "pissa_loss" in measured:
        measured["loss_margin_vs_pissa"] = measured["pissa_loss"] - measured["pica_loss"]
    measured["seeds_pica_wins"] = float(sum(float(arms["pica"][s]["eval/loss"]) < float(arms["lora"][s]["eval/loss"])
                                            for s in seeds))
    return measured["loss_margin_vs_lora"] >= -LORA_TOLERANCE, measured


CLAIMS = [column_beats_random, pica_not_worse_than_lora]
CHECKS = [merged_equals_w0_plus_mp, update_in_span_of_p, shared_gradient_aggregates_layers,
          trainable_count_independent_of_depth]
"""Exact by construction: the merge is W0 + M P, an update M P lies in span(P), autograd sums a shared
M's gradient over its layers, and one M per type makes the count independent of depth."""


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Left: held-out loss per seed and arm (PiCa column / random subspace, LoRA, PiSSA). Right: trainable count vs depth, shared vs per-layer M."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    def arm(t: dict[str, Any]) -> str:
        method = t.get("method", "pica")
        return f"PiCa, {t['subspace']} subspace" if method == "pica" else ("LoRA" if method == "lora" else "PiSSA")

    shared = [t for t in trials if t.get("share", True)]
    arms = [a for a in ("PiCa, column subspace", "PiCa, random subspace", "LoRA", "PiSSA") if any(arm(t) == a for t in shared)]
    seeds = sorted({t["seed"] for t in shared})
    width = 0.8 / max(len(arms), 1)
    for j, label in enumerate(arms):
        vals = [next((t["eval/loss"] for t in shared if arm(t) == label and t["seed"] == s), float("nan")) for s in seeds]
        ax.bar([i + (j - (len(arms) - 1) / 2) * width for i in range(len(seeds))], vals, width, color=f"C{j}", label=label)
    ax.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
    ax.set(ylabel="held-out answer loss", title="PiCa's rank; LoRA / PiSSA at the nearest count")
    ax.legend(fontsize=8)
    trials = _pica(trials)  # the counts: PiCa's trials
    t = next((t for t in trials if _depth_counts(t, DEPTH_PREFIX)), None)
    if t is not None:
        for prefix, label, style in ((DEPTH_PREFIX, "shared M (PiCa)", "o-"), (UNSHARED_PREFIX, "one M per layer", "s--")):
            counts = sorted(_depth_counts(t, prefix).items())
            bx.plot([d for d, _ in counts], [c for _, c in counts], style, label=label)
        bx.set(xscale="log", yscale="log", xlabel="decoder layers", ylabel="trainable parameters", title="trainable count vs depth")
        bx.legend(fontsize=8)
        bx.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
