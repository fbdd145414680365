"""The paper's claims over a reproduction sweep (vanilla and WASI fine-tuning, paired by seed),
and the memory-vs-rank plot.

A WASI arm is one (threshold, act_ranks, r_from). The claims judge every arm that ran at every
seed the vanilla baseline ran at, each seed against the vanilla trial of the same seed (same
split, pretrained model, head and batch order). An arm run at fewer seeds is plotted, not judged.

Memory, two accountings, both measured on one training step of the same batch:
- whole step (the headline): the peak of everything a training step holds at once: weights,
  optimizer state, gradients, saved activations and temporaries (`measure.PeakMemoryMeter`).
  WASI keeps the dense W as a parameter receiving grad_W, as the paper's released code does, so
  weights, gradients and optimizer state are no smaller than vanilla's;
- the paper's accounting: the bytes autograd saves inside the linear layers, activations plus
  weights (for vanilla the layer inputs and weights, for WASI the Tucker cores and factors and
  L, R). The paper's 62x counts these (analytically).

Each claim declares one scalar effect (`orchestrator.claims.claim`), the worst over the judged
WASI arms; a reproduction builds one seed (`sweeps/repro/wasi.py`, smoke size) and ladder judges
that effect across the seeds of `--seeds K` with an interval. Where one build holds several seeds
(the full size), the accuracy gap is the mean of the paired per-seed gaps, memory and flops the
worst seed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim

PEAK_FACTOR = 1.20
"""Vanilla's whole-step peak bytes over WASI's must reach this. Rule, written before the peak was
first measured: 0.95 x the smallest per-seed ratio on calibration seeds 100-104 (smoke size),
rounded down to 0.05 (a 5% margin: the ratio moves only with the ranks k each seed's weights give).
Seeds 100-104: 1.2826, 1.2829, 1.2828, 1.2827, 1.2810 (vanilla 17.62 MB, WASI 13.73-13.75 MB):
0.95 x 1.2810 = 1.217 -> 1.20."""
MEMORY_FACTOR = 10.0
"""Vanilla's saved linear activation+weight bytes over WASI's must reach this (set when the
workload was written, before any run)."""
ACCURACY_POINTS = 1.0
"""WASI's test accuracy may trail vanilla's by at most this many points (the paired gap of a seed;
ours, set when the workload was written, before any run: the paper says 'comparable')."""
FLOPS_FACTOR = 1.0
"""Vanilla's step flops over WASI's (forward, backward and refresh) must reach this: WASI costs no
more flops than vanilla (the null; set when the workload was written, before any run)."""
TRAIN_SPEEDUP = 1.0
"""Vanilla's training-step time over WASI's (timed in the WASI trial against its dense twin). Rule,
written before any time was measured: judged only if stable on seeds 100-104 (sd / mean <= 0.15);
then min(1.4, max(1.0, 0.9 x the smallest per-seed speed-up rounded down to 0.05)): never below
1 (the paper's direction, WASI not slower), never above the paper's 1.4. Seeds 100-104: 0.670,
0.689, 0.691, 0.668, 0.725 (sd / mean 0.033: stable); 0.9 x 0.668 = 0.60 -> 1.0."""
INFER_SPEEDUP = 1.0
"""Vanilla's inference-step time over WASI's: by the same rule as TRAIN_SPEEDUP, NOT judged at smoke
size. Seeds 100-104: 1.009, 1.043, 0.974, 1.026, 0.679 (sd / mean 0.160 > 0.15: unstable), so the
claim returns holds=None (ladder: 'not judged') with its numbers; 1.0 is what it would be judged at."""
INFER_JUDGED = False
"""Whether inference_faster is judged (the rule above: False at smoke size)."""
PROBE_PREFIX = "perf/probe/"
SET_BEFORE_ANY_RUN = "ours: set when the workload was written, before any run"
CALIBRATED = "ours: by a written rule (its docstring in workloads/wasi/claims.py) on seeds 100-104, smoke size"
MACHINE = ("wall-clock on the machine that runs the reproduction (2 shared CPU cores, 1 thread, for the "
           "recorded smoke): machine-dependent; the paper times a Raspberry Pi 5")


def arm_key(t: dict[str, Any]) -> tuple:
    return (float(t["threshold"]), tuple(int(r) for r in t["act_ranks"]), str(t["r_from"]))


def arm_name(key: tuple) -> str:
    eps, ranks, r_from = key
    return f"eps{eps:g}_r{'x'.join(map(str, ranks))}" + ("" if r_from == "new" else f"_{r_from}")


def paired(trials: list[dict[str, Any]]) -> tuple[dict[int, dict], dict[tuple, dict[int, dict]]]:
    """(vanilla trial by seed, judged WASI arms: arm -> seed -> trial)."""
    vanilla = {int(t["seed"]): t for t in trials if t["method"] == "vanilla"}
    if not vanilla:
        raise ValueError("no vanilla trials: every claim compares WASI with vanilla fine-tuning")
    arms: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for t in trials:
        if t["method"] == "wasi":
            arms[arm_key(t)][int(t["seed"])] = t
    judged = {k: v for k, v in arms.items() if set(vanilla) <= set(v)}
    if not judged:
        raise ValueError(f"no WASI configuration ran at every vanilla seed {sorted(vanilla)}")
    return vanilla, judged


def _worst_ratio(trials: list[dict[str, Any]], metric: str) -> tuple[float, dict[str, float]]:
    """min over judged arms and seeds of vanilla[metric] / wasi[metric], with the per-arm means."""
    vanilla, arms = paired(trials)
    measured: dict[str, float] = {}
    worst = math.inf
    for key, by_seed in sorted(arms.items()):
        ratios = [vanilla[s][metric] / by_seed[s][metric] for s in vanilla]
        worst = min(worst, min(ratios))
        measured[f"{arm_name(key)}/min_ratio"] = min(ratios)
    return worst, measured


@claim("worst_ratio", at_least=PEAK_FACTOR,
       paper="WASI cuts training memory up to 62x against vanilla training (ViT-B/32, Swin-T; the paper counts the "
             "linear layers' activations and weights analytically, not the whole step's peak)",
       threshold_from=CALIBRATED)
def peak_memory_lower(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """A whole WASI training step (weights, optimizer state, gradients, saved activations,
    temporaries) peaks at fewer bytes than vanilla's, by the calibrated factor."""
    vanilla, arms = paired(trials)
    worst, measured = _worst_ratio(trials, "perf/peak_step_bytes")
    for key, by_seed in sorted(arms.items()):
        measured[f"{arm_name(key)}/wasi_peak_MB"] = sum(t["perf/peak_step_bytes"] for t in by_seed.values()) / len(by_seed) / 1e6
        measured[f"{arm_name(key)}/wasi_resident_MB"] = sum(t["perf/resident_bytes"] for t in by_seed.values()) / len(by_seed) / 1e6
    measured["vanilla_peak_MB"] = sum(t["perf/peak_step_bytes"] for t in vanilla.values()) / len(vanilla) / 1e6
    measured["vanilla_resident_MB"] = sum(t["perf/resident_bytes"] for t in vanilla.values()) / len(vanilla) / 1e6
    measured["worst_ratio"] = worst
    return worst >= PEAK_FACTOR, measured


@claim("worst_ratio", at_least=MEMORY_FACTOR,
       paper="WASI cuts training memory up to 62x against vanilla training (ViT-B/32, Swin-T), counting the linear "
             "layers' activations and weights",
       threshold_from=SET_BEFORE_ANY_RUN + ", well below the paper's 62x for a 2-block ViT")
def memory_ten_times_lower(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """WASI keeps at least 10x fewer bytes for the linear layers' backward (activations + weights) than vanilla."""
    vanilla, arms = paired(trials)
    measured: dict[str, float] = {}
    worst = math.inf
    for key, by_seed in sorted(arms.items()):
        name = arm_name(key)
        ratio = {s: vanilla[s]["perf/saved_linear_bytes"] / by_seed[s]["perf/saved_linear_bytes"] for s in vanilla}
        worst = min(worst, min(ratio.values()))
        measured[f"{name}/min_ratio"] = min(ratio.values())
        for part, metric in (("act", "perf/saved_linear_act_bytes"), ("weight", "perf/saved_linear_weight_bytes"),
                             ("whole_step", "perf/saved_total_bytes")):
            measured[f"{name}/{part}_ratio"] = min(vanilla[s][metric] / by_seed[s][metric] for s in vanilla)
        measured[f"{name}/wasi_MB"] = sum(t["perf/saved_linear_bytes"] for t in by_seed.values()) / len(by_seed) / 1e6
    measured["vanilla_MB"] = sum(t["perf/saved_linear_bytes"] for t in vanilla.values()) / len(vanilla) / 1e6
    measured["worst_ratio"] = worst
    return worst >= MEMORY_FACTOR, measured


@claim("worst_gap_pts", at_most=ACCURACY_POINTS,
       paper="WASI keeps accuracy comparable to vanilla fine-tuning (per-dataset numbers not verified in the notes)",
       threshold_from=SET_BEFORE_ANY_RUN + " (the notes' CPU plan says within about 3 points); the smoke's 800 "
                      "fine-tuning steps set by a written rule on seeds 100-104 (sweeps/repro/wasi.py)")
def accuracy_within_one_point(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """WASI's fine-tuned test accuracy is within 1 point of vanilla's (the paired gap; its mean over the seeds of one build)."""
    vanilla, arms = paired(trials)
    measured: dict[str, float] = {}
    worst = -math.inf
    seeds = sorted(vanilla)
    for key, by_seed in sorted(arms.items()):
        name = arm_name(key)
        gaps = [100 * (vanilla[s]["eval/acc"] - by_seed[s]["eval/acc"]) for s in seeds]
        mean = sum(gaps) / len(gaps)
        worst = max(worst, mean)
        measured[f"{name}/gap_pts"] = mean
        if len(gaps) > 1:
            measured[f"{name}/gap_sd_pts"] = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1))
        for s, g in zip(seeds, gaps):
            measured[f"{name}/gap_pts_seed{s}"] = g
        measured[f"{name}/acc"] = sum(by_seed[s]["eval/acc"] for s in seeds) / len(seeds)
    measured["vanilla_acc"] = sum(vanilla[s]["eval/acc"] for s in seeds) / len(seeds)
    measured["test_size"] = min(float(vanilla[s]["eval/test_size"]) for s in seeds)
    measured["worst_gap_pts"] = worst
    return worst <= ACCURACY_POINTS, measured


@claim("worst_factor", at_least=FLOPS_FACTOR,
       paper="WASI needs up to 2x fewer training FLOPs than vanilla training",
       threshold_from=SET_BEFORE_ANY_RUN + ": no more flops than vanilla (factor 1), weaker than the paper's up to 2x")
def flops_fewer(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """A WASI training step (forward with compression, backward, subspace refresh) costs fewer flops
    than vanilla's: vanilla's step flops over WASI's, the worst seed."""
    vanilla, arms = paired(trials)
    measured: dict[str, float] = {}
    worst = math.inf
    for key, by_seed in sorted(arms.items()):
        name = arm_name(key)
        factor = min(vanilla[s]["perf/flops_step"] / by_seed[s]["perf/flops_step"] for s in vanilla)
        worst = min(worst, factor)
        measured[f"{name}/min_factor"] = factor
        for part in ("forward", "backward"):
            measured[f"{name}/{part}_factor"] = min(
                vanilla[s][f"perf/flops_{part}"] / by_seed[s][f"perf/flops_{part}"] for s in vanilla)
    measured["vanilla_GFLOP"] = sum(t["perf/flops_step"] for t in vanilla.values()) / len(vanilla) / 1e9
    measured["worst_factor"] = worst
    return worst >= FLOPS_FACTOR, measured


def _speedup(trials: list[dict[str, Any]], kind: str, threshold: float) -> tuple[bool, dict[str, float]]:
    """The worst judged arm's speed-up over its dense twin (timed in the WASI trial), mean over the build's seeds."""
    vanilla, arms = paired(trials)
    measured: dict[str, float] = {}
    worst = math.inf
    for key, by_seed in sorted(arms.items()):
        name = arm_name(key)
        ups = [by_seed[s][f"perf/{kind}_speedup"] for s in vanilla]
        worst = min(worst, sum(ups) / len(ups))
        measured[f"{name}/speedup"] = sum(ups) / len(ups)
        measured[f"{name}/wasi_ms"] = 1e3 * sum(by_seed[s][f"perf/{kind}_step_s"] for s in vanilla) / len(vanilla)
        measured[f"{name}/dense_ms"] = 1e3 * sum(by_seed[s][f"perf/dense_{kind}_step_s"] for s in vanilla) / len(vanilla)
    measured["worst_speedup"] = worst
    return worst >= threshold, measured


@claim("worst_speedup", at_least=TRAIN_SPEEDUP,
       paper="WASI trains about 1.4x faster than vanilla training (Raspberry Pi 5; some abstract versions say 1.5x)",
       threshold_from=CALIBRATED + "; " + MACHINE)
def training_faster(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """A WASI training step (forward, backward, clip, optimizer step, refresh) takes less wall-clock
    time than the same step of the dense model at the same weights, same batch, timed interleaved in
    one process (machine-dependent)."""
    return _speedup(trials, "train", TRAIN_SPEEDUP)


@claim("worst_speedup", at_least=INFER_SPEEDUP,
       paper="WASI's model infers about 1.4x faster than vanilla's (Raspberry Pi 5; the low-rank forward)",
       threshold_from=CALIBRATED + "; " + MACHINE)
def inference_faster(trials: list[dict[str, Any]]) -> tuple[bool | None, dict[str, float]]:
    """A WASI inference forward (the low-rank x R^T L^T) takes less wall-clock time than the dense
    model's at the same weights, same batch, timed interleaved in one process (machine-dependent)."""
    holds, measured = _speedup(trials, "infer", INFER_SPEEDUP)
    return (holds if INFER_JUDGED else None), measured


CLAIMS = [peak_memory_lower, memory_ten_times_lower, accuracy_within_one_point, flops_fewer, training_faster,
          inference_faster]
CHECKS: list = []  # the ranks follow the pretrained weights' spectrum and accuracy follows training: none by construction


def probes(trial: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """A WASI trial's measurement-only probes: kind ('eps' or 'act') -> label -> metric -> value."""
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for key, value in trial.items():
        if key.startswith(PROBE_PREFIX):
            kind_label, metric = key[len(PROBE_PREFIX):].rsplit("/", 1)
            kind, label = kind_label.split("=", 1)
            out[kind][label][metric] = float(value)
    return out


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Saved linear bytes against the weight rank and the activation rank (probes of each WASI trial;
    dashed: vanilla; dotted: the weights alone), every WASI trial's accuracy gap to vanilla, and
    the whole-step peak bytes of every trial by seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    vanilla = [t for t in trials if t["method"] == "vanilla"]
    wasi = [t for t in trials if t["method"] == "wasi"]
    for ax in axes[:2]:
        for t in vanilla:
            ax.axhline(t["perf/saved_linear_bytes"] / 1e6, color="k", ls="--", lw=1)
        if vanilla:
            top = max(t["perf/saved_linear_bytes"] for t in vanilla) / 1e6
            ax.axhline(top / MEMORY_FACTOR, color="tab:red", ls=":", lw=1)
            ax.text(0.02, top / MEMORY_FACTOR, "vanilla / 10", color="tab:red", fontsize=8, va="bottom",
                    transform=ax.get_yaxis_transform())
    colors = plt.cm.viridis
    for i, t in enumerate(wasi):
        c = colors(i / max(1, len(wasi) - 1))
        p = probes(t)
        for kind, ax, xkey in (("eps", axes[0], "rank_mean"), ("act", axes[1], "act_rank_sum")):
            pts = sorted((v[xkey], v["saved_linear_bytes"] / 1e6, v["saved_linear_weight_bytes"] / 1e6)
                         for v in p.get(kind, {}).values())
            if pts:
                ax.plot([q[0] for q in pts], [q[1] for q in pts], "o-", color=c, ms=3,
                        label=f"{arm_name(arm_key(t))} s{int(t['seed'])}")
                ax.plot([q[0] for q in pts], [q[2] for q in pts], "x:", color=c, ms=3)
        axes[0].plot(t["diag/rank_mean"], t["perf/saved_linear_bytes"] / 1e6, "*", color=c, ms=10)
    axes[0].set(xlabel="mean weight rank k (probes over the threshold)", ylabel="saved linear bytes (MB)",
                yscale="log", title="memory vs weight rank (x: weights only)")
    axes[1].set(xlabel="activation ranks r1 + r2 + r3 (probes)", yscale="log", title="memory vs activation rank")
    for ax in axes[:2]:
        ax.grid(True, which="both", alpha=0.3)
    if wasi:
        axes[0].legend(fontsize=6)
    acc = {int(t["seed"]): t["eval/acc"] for t in vanilla}
    for t in wasi:
        if int(t["seed"]) in acc:  # the paired gap of every WASI trial against its seed's vanilla
            gap = 100 * (acc[int(t["seed"])] - t["eval/acc"])
            axes[2].plot(t["diag/rank_mean"], gap, "o", color="tab:blue")
            axes[2].annotate(f"s{int(t['seed'])} eps{t['threshold']:g}", (t["diag/rank_mean"], gap), fontsize=6)
    axes[2].axhline(ACCURACY_POINTS, color="tab:red", ls=":", lw=1)
    axes[2].axhline(0, color="k", lw=0.8)
    axes[2].set(xlabel="mean weight rank k (trained)", ylabel="vanilla - WASI test accuracy (points)",
                title="accuracy gap per seed (red: the 1-point claim)")
    axes[2].grid(True, alpha=0.3)
    for group, marker, color in ((vanilla, "s", "k"), (wasi, "o", "tab:blue")):
        if group:
            axes[3].plot([int(t["seed"]) for t in group], [t["perf/peak_step_bytes"] / 1e6 for t in group], marker,
                         color=color, label=group[0]["method"])
    axes[3].set(xlabel="seed", ylabel="whole-step peak (MB)", ylim=(0, None),
                title="whole training step's peak memory (the headline)")
    axes[3].legend(fontsize=8)
    axes[3].grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
