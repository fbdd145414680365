"""PiCa's claims and checks over a reproduction sweep (arms x seeds: PiCa on the column space, on a
random subspace, and the baselines its paper beats: LoRA, DoRA, PiSSA at the matched LoRA rank, SVFT at
the matched band count), and its plot.

The four checks are exact properties of the method, measured inside every trial on its trained
model: they hold by construction when the code is right, so they must hold in every trial (the
worst trial is reported; they read PiCa's trials only). The claims compare mean held-out losses over
the trial seeds of one replicate: the headline (PiCa's held-out accuracy above the best baseline's),
the paper's ablation (column vs random subspace) and PiCa against LoRA in held-out loss at (nearly) equal
trainable parameters; within a seed every arm sees the same batches.
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


BASELINES = ("lora", "dora", "pissa", "svft")
"""The baselines of the headline, in the order `best_baseline` indexes them."""

BUDGET_RATIO = 1.6
"""Each baseline's trainable count lies within [1, BUDGET_RATIO] x PiCa's on tiny-local at the smoke's r = 8
(2944): the paper compares PiCa with baselines at equal or larger counts (Gemma-2B: PiCa 5.37M against
SVFT^R 6.35M, 1.18x; LoRA and DoRA at several times PiCa's). Here SVFT^B_1 3032 (1.03x), LoRA and PiSSA
r = 1 3200 (1.09x), DoRA r = 1 4672 (1.59x: LoRA's count plus one magnitude per output, its smallest rank)."""

PAPER_EFFECT = 2.74
"""The paper's headline margin, in accuracy points: Gemma-2B GSM8K, PiCa r = 256 52.77 vs SVFT^R 50.03."""

RESOLUTION_RULE = 0.5
"""Written before any run with the baselines: the smoke resolves the paper's effect when the half-width of
the 95% t-interval of `acc_margin_vs_best` over calibration replicates (seeds 100-104, i.e. trial seeds
100-114) is at most RESOLUTION_RULE x PAPER_EFFECT (1.37 points); otherwise the claim's verdict can only
tell a large effect from none, and the record's notes say the smoke cannot resolve an effect of the paper's
size. Measured: see HEADLINE_CALIBRATION."""

HEADLINE_CALIBRATION = """Calibration seeds 100-104 (one trial seed a replicate, 50 held-out answers, accuracy in steps of 0.02):
acc_margin_vs_best -0.18, -0.12, -0.14, -0.16, -0.06 (best baseline DoRA at 100-103, PiSSA at 104), mean -0.132,
SD 0.046, 95% half-width 0.057 = 5.7 points, over RESOLUTION_RULE x PAPER_EFFECT (1.37 points): the smoke cannot
resolve an effect of the paper's size (+2.74 points); it can only tell a gap of about 6 points or more from none.
The threshold (0) was fixed before this run; nothing was changed after it."""


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


def _arms(trials: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """method -> seed -> trial, PiCa's entry its column-space shared-M trials only."""
    arms: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for t in trials:
        method = t.get("method", "pica")
        if method == "pica" and (t.get("subspace", "column") != "column" or not t.get("share", True)):
            continue
        arms[method][t["seed"]] = t
    return arms


@claim("acc_margin_vs_best", at_least=0.0,
       paper="Gemma-2B GSM8K: PiCa r = 256 52.77 vs SVFT^R 50.03 (+2.74 points) with 5.37M vs 6.35M parameters, the "
             "best of LoRA, DoRA, PiSSA and SVFT in that table; LLaMA-3-8B r = 32 73.54 with 1.38M",
       threshold_from="ours: 0, set before any run (holds when the whole 95% interval of PiCa minus the best "
                      "baseline is above 0)")
def pica_beats_best_baseline(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """PiCa's held-out accuracy is above the best baseline's: PiCa's mean held-out exact-answer accuracy over the
    replicate's trial seeds minus the highest of LoRA's, DoRA's, PiSSA's and SVFT's means over the same seeds
    (the best chosen per replicate, so the choice favours the baselines), at equal or larger baseline budgets."""
    arms = _arms(trials)
    missing = [m for m in ("pica",) + BASELINES if m not in arms]
    if missing:
        raise ValueError(f"pica_beats_best_baseline: no trials of {missing}; got {sorted(arms)}")
    seeds = sorted(set.intersection(*(set(arms[m]) for m in ("pica",) + BASELINES)))
    if not seeds:
        raise ValueError("pica_beats_best_baseline: the arms share no seed")
    mean = lambda m, key: sum(float(arms[m][s][key]) for s in seeds) / len(seeds)  # noqa: E731
    measured: dict[str, float] = {"seeds": float(len(seeds))}
    pica_count = float(arms["pica"][seeds[0]]["diag/trainable"])
    for m in ("pica",) + BASELINES:
        measured[f"{m}_acc"] = mean(m, "eval/acc")
        measured[f"{m}_loss"] = mean(m, "eval/loss")
        measured[f"{m}_trainable"] = float(arms[m][seeds[0]]["diag/trainable"])
        if m != "pica":
            measured[f"{m}_budget_ratio"] = measured[f"{m}_trainable"] / pica_count
            measured[f"acc_margin_vs_{m}"] = measured["pica_acc"] - measured[f"{m}_acc"]
    best = max(range(len(BASELINES)), key=lambda i: measured[f"{BASELINES[i]}_acc"])
    measured["best_baseline"] = float(best)
    measured["best_baseline_acc"] = measured[f"{BASELINES[best]}_acc"]
    measured["acc_margin_vs_best"] = measured["pica_acc"] - measured["best_baseline_acc"]
    measured["held_out_items"] = float(arms["pica"][seeds[0]].get("diag/heldout_items", math.nan))
    return measured["acc_margin_vs_best"] > 0, measured


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
    arms = _arms(trials)
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


CLAIMS = [pica_beats_best_baseline, column_beats_random, pica_not_worse_than_lora]
CHECKS = [merged_equals_w0_plus_mp, update_in_span_of_p, shared_gradient_aggregates_layers,
          trainable_count_independent_of_depth]
"""Exact by construction: the merge is W0 + M P, an update M P lies in span(P), autograd sums a shared
M's gradient over its layers, and one M per type makes the count independent of depth."""


NAMES = {"lora": "LoRA", "dora": "DoRA", "pissa": "PiSSA", "svft": "SVFT"}


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Left: held-out accuracy per seed and arm (PiCa column / random subspace, LoRA, DoRA, PiSSA, SVFT). Right:
    trainable count vs depth, shared vs per-layer M."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    def arm(t: dict[str, Any]) -> str:
        method = t.get("method", "pica")
        return f"PiCa, {t['subspace']} subspace" if method == "pica" else NAMES.get(method, method)

    shared = [t for t in trials if t.get("share", True)]
    order = ("PiCa, column subspace", "PiCa, random subspace") + tuple(NAMES.values())
    arms = [a for a in order if any(arm(t) == a for t in shared)]
    seeds = sorted({t["seed"] for t in shared})
    width = 0.8 / max(len(arms), 1)
    for j, label in enumerate(arms):
        vals = [next((t["eval/acc"] for t in shared if arm(t) == label and t["seed"] == s), float("nan")) for s in seeds]
        ax.bar([i + (j - (len(arms) - 1) / 2) * width for i in range(len(seeds))], vals, width, color=f"C{j}", label=label)
    ax.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
    ax.set(ylabel="held-out accuracy", title="PiCa r; baselines at the nearest count (or more)")
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
