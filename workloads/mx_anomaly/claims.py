"""The paper's claims, measured on the trials of `sweeps/repro/mx_anomaly.py`, its check, and its plot.

The headline is the paper's observation where it stands: trained LMs' own weights, as trained
(tiny-local, the project's tiny Llama from components.basemodel, and the GPT-2-style LM
components.lm.pretrain trains), quantized with UE4M3 block scales and no global scale, their
held-out loss against the block size. The other claims are constructed cases that make the
anomaly appear on purpose: synthetic Gaussians of std 0.005, and the LM with its qkv and fc weights
rescaled to std 0.005 (the function kept by the LayerNorms); they show the mechanism and the fix,
not that the anomaly occurs in a trained model.

Each claim declares one scalar effect (`orchestrator.claims.claim`); where a claim is a conjunction
(a rise here and none there), the effect is the smaller of the conditions' margins, each a ratio to
its threshold, so it reaches 1 exactly when every condition holds. The LM narrowing keeping the
model's function is a check: it holds by construction whatever the quantizer does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.claims import claim
from workloads.mx_anomaly.workload import sigma_key

NARROW = 0.005  # a narrow weight distribution: its UE4M3 block scales are subnormal below B ~ 32
WIDE = 1.0  # far inside UE4M3's normal range at every block size
NO_RISE_TOL = 1.02  # halving the block may raise the error by 2% (sampling noise) and still count as "no rise"
ANOMALY_RISE = 2.0  # the notes' CPU test: UE4M3's error at the smallest block at least twice its best
MATCH_GAP = 0.05  # UE5M3 alone within 5% of UE4M3 + global scale at every block size


def _trial(trials: list[dict[str, Any]], scale_format: str, global_scale: bool) -> dict[str, Any]:
    for t in trials:
        if t["scale_format"] == scale_format and bool(t["global_scale"]) == global_scale:
            return t
    raise LookupError(f"no trial with scale_format={scale_format!r}, global_scale={global_scale} among "
                      f"{[(t['scale_format'], t['global_scale']) for t in trials]}")


def curve(trial: dict[str, Any], what: str) -> list[tuple[int, float]]:
    """(block size, relative MSE) of `what` (a sigma key such as 's0.005', or 'lm_weights'), largest block first."""
    blocks = sorted(trial["block_sizes"], reverse=True)
    return [(b, trial[f"eval/rel_mse/{what}/b{b}"]) for b in blocks]


def _need_sigma(trial: dict[str, Any], sigma: float) -> str:
    if sigma not in [float(s) for s in trial["sigmas"]]:
        raise LookupError(f"the claim needs sigma={sigma} among the trial's sigmas {trial['sigmas']}")
    return sigma_key(sigma)


LOSS_FLOOR = 0.002  # nats: loss changes below this are within the held-out estimate's resolution
UNSCALED = {"base": "tiny-local", "lm": "GPT-2-style LM"}  # metric name -> the trained LM it measures
UNSCALED_EXCESS = 0.002
"""Nats by which UE4M3's held-out loss increase at the smallest block must exceed its increase at
the best block, on both unscaled LMs. Rule, written before any seed was run: the larger of
LOSS_FLOOR and the effect's seed noise (its mean change between adjacent seeds) on calibration
seeds 100-104. Calibration (seeds 100-104, before seeds 0-4 ran): the effect was 0.00049, 0.00035,
0.00016, 0, 0 nats (the GPT-2-style LM's, the smaller; tiny-local, one build for every seed, lost
0.0127 nats more at block 8 than at its best block, 64); its changes between adjacent seeds 0.00014,
0.00019, 0.00016, 0: seed noise 0.00012 < LOSS_FLOOR, so the threshold is the floor, 0.002."""


def max_halving_ratio(points: list[tuple[int, float]]) -> float:
    """The largest error ratio between a block size and the next larger one measured."""
    return max(small / large for (_, large), (_, small) in zip(points, points[1:]))


def _dloss_curve(trial: dict[str, Any], name: str) -> list[tuple[int, float]]:
    return [(b, trial[f"eval/{name}_dloss_w4/b{b}"]) for b in sorted(trial["block_sizes"], reverse=True)]


@claim("min_excess_nats", at_least=UNSCALED_EXCESS,
       paper="below a threshold block size the output (perplexity) of an MX-quantized LLM gets worse with UE4M3 "
             "scales and no global scale, on the LLMs' own weights (abstract; the notes could not read the model "
             "list, perplexity tables or threshold block sizes)",
       threshold_from="ours: the larger of the 0.002-nat loss resolution and the effect's seed noise on calibration "
                      "seeds 100-104 (UNSCALED_EXCESS)")
def unscaled_anomaly(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """On trained LMs' own, unscaled weights (tiny-local and the GPT-2-style LM), UE4M3 scales without a global scale lose more held-out loss at the smallest block than at their best block."""
    a = _trial(trials, "ue4m3", False)
    measured: dict[str, float] = {}
    excesses = []
    for name in UNSCALED:
        if f"eval/{name}_dloss_w4/b{min(a['block_sizes'])}" not in a:
            raise LookupError(f"the trials did not measure {UNSCALED[name]} ('{name}'): set base_model='tiny-local'")
        loss = _dloss_curve(a, name)
        weights = curve(a, f"{name}_weights")
        (small, at_small), (large, _) = loss[-1], loss[0]
        best_block, best = min(loss, key=lambda p: p[1])
        excesses.append(at_small - best)  # 0 when the smallest block is the best: no anomaly
        measured.update({
            f"{name}_excess_nats": at_small - best,
            f"{name}_dloss_b{small}": at_small,
            f"{name}_best_block": float(best_block),
            # the mechanism, measured: the weight error's rise and the share of blocks whose UE4M3 scale is subnormal
            f"{name}_weight_mse_rise": weights[-1][1] / min(v for _, v in weights),
            f"{name}_subnormal_share_b{small}": a[f"eval/ue4m3_subnormal/{name}_weights/b{small}"],
            f"{name}_subnormal_share_b{large}": a[f"eval/ue4m3_subnormal/{name}_weights/b{large}"],
            f"{name}_weight_std": a[f"eval/{name}_weight_std"],
        })
    measured["min_excess_nats"] = min(excesses)
    return measured["min_excess_nats"] >= UNSCALED_EXCESS, measured


@claim("margin", at_least=1.0,
       paper="constructed case (synthetic Gaussian, std 0.005): the error rises below a threshold block size, "
             "caused by narrow distributions and the limited dynamic range of UE4M3 scales (no numbers in the notes)",
       threshold_from="ours: the 2x rise is the implementation notes' CPU test, set before any run; margin 1 means "
                      "rise/2 and the wide tensor's b_large/b_small error ratio both reach 1")
def ue4m3_anomaly(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Constructed: UE4M3 scales without a global scale, a synthetic narrow tensor's (std 0.005) error rises as blocks shrink below a threshold (a wide one's does not)."""
    t = _trial(trials, "ue4m3", False)
    narrow = curve(t, _need_sigma(t, NARROW))
    wide = curve(t, _need_sigma(t, WIDE))
    best_block, best = min(narrow, key=lambda p: p[1])
    smallest_block, at_smallest = narrow[-1]
    rise = at_smallest / best  # > 1 only when the best block is not the smallest: a threshold exists
    wide_ratio = wide[-1][1] / wide[0][1]
    measured = {
        f"narrow_mse_b{smallest_block}": at_smallest,
        "narrow_best_mse": best,
        "threshold_block": float(best_block),
        "narrow_rise": rise,
        f"wide_mse_b{smallest_block}_over_b{wide[0][0]}": wide_ratio,
        # >= 1 exactly when the narrow rise reaches 2x and the wide error does not rise
        "margin": min(rise / ANOMALY_RISE, 1.0 / wide_ratio),
    }
    return measured["margin"] >= 1.0, measured


@claim("worst_halving_ratio", at_most=NO_RISE_TOL,
       paper="the proposed fix, FP8 unsigned E5M3 (UE5M3) block scales for FP4, removes the anomaly (no numbers "
             "in the notes)",
       threshold_from="ours: 2% sampling-noise allowance on 'no rise', set when the workload was written, before any run")
def ue5m3_no_rise(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """UE5M3 scales without a global scale: no tensor's error rises as blocks shrink, narrow ones included."""
    t = _trial(trials, "ue5m3", False)
    _need_sigma(t, NARROW)
    ratios = {sigma_key(float(s)): max_halving_ratio(curve(t, sigma_key(float(s)))) for s in t["sigmas"]}
    narrow = curve(t, sigma_key(NARROW))
    measured = {f"max_halving_ratio_{k}": v for k, v in ratios.items()}
    measured[f"narrow_mse_b{narrow[-1][0]}_over_b{narrow[0][0]}"] = narrow[-1][1] / narrow[0][1]
    measured["worst_halving_ratio"] = max(ratios.values())
    return measured["worst_halving_ratio"] <= NO_RISE_TOL, measured


@claim("max_halving_ratio", at_most=NO_RISE_TOL,
       paper="a per-tensor global scale also resolves it: UE5M3 obviates the need of global scaling (abstract; "
             "no numbers in the notes)",
       threshold_from="ours: 2% sampling-noise allowance on 'no rise', set when the workload was written, before any run")
def global_scale_also_removes_it(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """UE4M3 with NVFP4's per-tensor FP32 global scale shows no rise on the narrow tensor either."""
    g = _trial(trials, "ue4m3", True)
    ratio = max_halving_ratio(curve(g, _need_sigma(g, NARROW)))
    return ratio <= NO_RISE_TOL, {"max_halving_ratio": ratio}


@claim("ue5m3_vs_global_max_gap", at_most=MATCH_GAP,
       paper="UE5M3 scales match UE4M3 scales while obviating the need of global scaling (abstract; no numbers "
             "in the notes)",
       threshold_from="ours: 5%, set when the workload was written, before any run")
def ue5m3_matches_global_scale(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """On the narrow tensor, UE5M3 alone is within 5% of UE4M3 with the global scale at every block size."""
    g = _trial(trials, "ue4m3", True)
    u = _trial(trials, "ue5m3", False)
    key = _need_sigma(g, NARROW)
    gap = max(abs(a[1] / b[1] - 1) for a, b in zip(curve(u, key), curve(g, key)))
    return gap <= MATCH_GAP, {"ue5m3_vs_global_max_gap": gap}


WEIGHT_RISE = 1.3
"""UE4M3's error on the narrowed LM weights at the smallest block over its best block must reach
this: 1 plus the seed noise of that ratio (its mean change between adjacent seeds) on calibration
seeds 100-104, which no reproduction judges by default."""


def _dloss(trial: dict[str, Any], block: int) -> float:
    return trial[f"eval/lm_narrow_dloss_w4/b{block}"]


def _narrowed(trials: list[dict[str, Any]]) -> dict[str, Any]:
    a = _trial(trials, "ue4m3", False)
    if f"eval/lm_narrow_dloss_w4/b{min(a['block_sizes'])}" not in a:
        raise LookupError("the trials measured no narrowed LM: set lm_narrow_std > 0")
    return a


@claim("ue4m3_weight_mse_rise", at_least=WEIGHT_RISE,
       paper="constructed case (the LM's weights rescaled to std 0.005, as large LLMs' are): the block-size "
             "anomaly appears on LLM weights, whose std (about 0.01-0.03) puts UE4M3 block scales in the subnormal "
             "range (per-model numbers not verified in the notes)",
       threshold_from="ours: 1 plus the ratio's seed noise on calibration seeds 100-104 (1.3)")
def lm_weight_anomaly(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Constructed: on the trained LM with its weights rescaled to std 0.005, UE4M3 without a global scale errs at least 1.3x more on its weights at the smallest block than at its best block."""
    a = _narrowed(trials)
    weights = curve(a, "lm_narrow_weights")
    best_block, best = min(weights, key=lambda p: p[1])
    rise = weights[-1][1] / best
    return rise >= WEIGHT_RISE, {"ue4m3_weight_mse_rise": rise, "threshold_block": float(best_block)}


@claim("margin_nats", at_least=0.0,
       paper="constructed case (the LM's weights rescaled to std 0.005): perplexity of an MX-quantized LLM gets "
             "worse below a threshold block size with UE4M3 scales and no global scale, not with UE5M3 (model list "
             "and perplexity numbers not verified in the notes)",
       threshold_from="ours: a 0.002-nat resolution of the held-out loss, set when the workload was written, before "
                      "any run; margin 0 means both loss conditions hold")
def lm_loss_anomaly(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Constructed: on the trained LM with its weights rescaled to std 0.005 (same function), UE4M3 without a global scale loses more held-out loss at the smallest block than at its best one; UE5M3 does not lose more at the smallest block than at the largest."""
    a = _narrowed(trials)
    u = _trial(trials, "ue5m3", False)
    blocks = sorted(a["block_sizes"])
    small, large = blocks[0], blocks[-1]
    best = min(_dloss(a, b) for b in blocks)
    # How much loss a given weight error costs varies with the trained model (0.004-0.06 nats at
    # B=8 over seeds 0-2), so the loss part asks for a rise beyond the estimate's resolution.
    ue4m3_excess = _dloss(a, small) - best - LOSS_FLOOR  # >= 0: UE4M3 loses more at the smallest block
    ue5m3_slack = _dloss(u, large) + LOSS_FLOOR - _dloss(u, small)  # >= 0: UE5M3 does not
    measured = {
        f"ue4m3_dloss_b{small}": _dloss(a, small),
        "ue4m3_dloss_best": best,
        f"ue5m3_dloss_b{small}": _dloss(u, small),
        f"ue5m3_dloss_b{large}": _dloss(u, large),
        "margin_nats": min(ue4m3_excess, ue5m3_slack),
    }
    return measured["margin_nats"] >= 0.0, measured


def narrowing_keeps_the_function(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Narrowing the LM's weights (LayerNorm gains compensate) leaves its held-out loss unchanged within 1e-4 nats."""
    change = _narrowed(trials)["eval/lm_narrow_loss_change"]
    return abs(change) < 1e-4, {"narrowing_loss_change": change}


CLAIMS = [unscaled_anomaly, ue4m3_anomaly, ue5m3_no_rise, global_scale_also_removes_it, ue5m3_matches_global_scale, lm_weight_anomaly,
          lm_loss_anomaly]
CHECKS = [narrowing_keeps_the_function]


def _label(t: dict[str, Any]) -> str:
    return t["scale_format"].upper() + (" + global" if t["global_scale"] else "")


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Relative quantization MSE against block size, a panel per tensor, a line per scale format."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [sigma_key(float(s)) for s in trials[0]["sigmas"]] + ["lm_weights"]
    if f"eval/rel_mse/base_weights/b{trials[0]['block_sizes'][0]}" in trials[0]:
        panels.append("base_weights")
    if f"eval/rel_mse/lm_narrow_weights/b{trials[0]['block_sizes'][0]}" in trials[0]:
        panels.append("lm_narrow_weights")
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), squeeze=False)
    for ax, what in zip(axes[0], panels):
        for t in sorted(trials, key=_label):
            pts = curve(t, what)
            ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", label=_label(t))
        title = {"lm_weights": "GPT-2-style LM, own weights", "base_weights": "tiny-local, own weights",
                 "lm_narrow_weights": "LM rescaled to 0.005 (constructed)"}.get(
            what, f"Gaussian σ={what[1:]}")
        ax.set(xscale="log", yscale="log", xlabel="block size", title=title)
        ax.set_xticks([8, 16, 32, 64, 128, 256], labels=["8", "16", "32", "64", "128", "256"])
    axes[0][0].set_ylabel("relative MSE")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
