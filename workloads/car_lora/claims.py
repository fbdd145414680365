"""The paper's claims over a reproduction sweep (plain LoRA, CAR-LoRA and one adapter per in-set
scheme, each a trial; seeds optional), and its plot.

Every accuracy is the held-out task accuracy, averaged over the trials (seeds) of one adapter;
within a seed every adapter sees the same task split, so the comparisons are paired. Accuracies
are fractions; "points" are hundredths.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim
from workloads.car_lora.compress import QUANTISERS

PER_SCHEME_TOLERANCE = 0.11
"""CAR may trail the per-scheme adapter by at most this much on any in-set scheme. Rule, written
before seeds 100-104 ran: the 5 points of the implementation notes, loosened only if the calibration
seeds 100-104 need it: max(5 points, whole points rounded up of -(mean - 2 x 95% half-width) of
worst_gap over seeds 100-104). Calibration (smoke, seeds 100-104, with 2-bit groups of 16 in the
set): worst_gap -7.0, -5.2, -5.2, -7.8, -8.7 points, mean -6.78, 95% interval [-8.71, -4.85]
(half-width 1.93); -(mean - 2 x 1.93) = 10.64 -> 11 points. The worst scheme is int2g16 at 4 of 5
seeds (its gaps -7.0, +0.9, -3.5, -7.8, -8.7); the paper's own gaps are 0.1-0.4 GSM8K points, so
at smoke size "matches" is 11 points loose, set by the harsh quantiser."""
MIN_GAIN = 0.10
"""CAR's margin over plain LoRA on the most damaging in-set scheme."""
MIN_QUANT_GAIN = 0.10
"""CAR's margin over plain LoRA under the in-set quantiser that costs plain LoRA most. Rule, written
before seeds 100-104 ran: min(10 points, whole points rounded down of (mean - 2 x 95% half-width)
of that gain over seeds 100-104), the 10 points of MIN_GAIN at most. Calibration (smoke, seeds
100-104; the quantiser was int2g16 at every seed): gain +20.9, +17.4, +19.1, +16.5, +24.3 points,
mean 19.65, 95% interval [15.79, 23.52] (half-width 3.87); 19.65 - 7.73 = 11.92 -> 11, capped at
10 points. Plain LoRA's drop there: 35.7, 26.1, 31.3, 27.0, 39.1 points (int8, nf4, mxfp4: at most 1.7)."""


def _setting(trials: list[dict[str, Any]]) -> tuple[tuple[str, ...], str]:
    schemes = {tuple(t["schemes"]) if not isinstance(t["schemes"], str) else tuple(t["schemes"].split(",")) for t in trials}
    held = {t["heldout_scheme"] for t in trials}
    if len(schemes) != 1 or len(held) != 1:
        raise ValueError(f"the trials mix scheme sets {sorted(schemes)} / held-out schemes {sorted(held)}; a claim compares one setting")
    return schemes.pop(), held.pop()


def mean_acc(trials: list[dict[str, Any]], adapter: str, key: str) -> float:
    """Mean of metric `key` over the trials of `adapter`; raises when there are none."""
    values = [float(t[key]) for t in trials if t["adapter"] == adapter and key in t]
    if not values:
        raise ValueError(f"no {adapter!r} trial reports {key!r}: the sweep must include adapter={adapter!r}")
    return sum(values) / len(values)


def plain_drops(trials: list[dict[str, Any]]) -> dict[str, float]:
    """In-set scheme -> plain LoRA's accuracy on the uncompressed base minus under the scheme."""
    schemes, _ = _setting(trials)
    full = mean_acc(trials, "plain", "eval/acc/none")
    return {s: full - mean_acc(trials, "plain", f"eval/acc/{s}") for s in schemes}


@claim("worst_gap", at_least=-PER_SCHEME_TOLERANCE,
       paper="CAR-LoRA within 0.1-0.4 GSM8K points of the adapter retrained per format (INT8 38.4 vs 38.5, "
             "FP4 38.5 vs 38.5; Llama-3.1-8B)",
       threshold_from="calibrated on seeds 100-104 by the rule in PER_SCHEME_TOLERANCE's docstring")
def car_near_per_scheme(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The one CAR-LoRA adapter, applied to each in-set compressed base, is within PER_SCHEME_TOLERANCE of the adapter retrained on that scheme alone (same rank, data, steps per adapter as the paper's 5 vs 20 epochs, seeds); worst scheme judged."""
    schemes, _ = _setting(trials)
    measured = {}
    for s in schemes:
        car, own = mean_acc(trials, "car", f"eval/acc/{s}"), mean_acc(trials, s, f"eval/acc/{s}")
        measured[f"car_{s}"], measured[f"per_scheme_{s}"] = car, own
        measured[f"gap_{s}"] = car - own
    measured["worst_gap"] = min(measured[f"gap_{s}"] for s in schemes)
    quant = [s for s in schemes if s in QUANTISERS]
    if quant:  # the paper's numbers are quantisers': reported apart
        measured["worst_quant_gap"] = min(measured[f"gap_{s}"] for s in quant)
    return measured["worst_gap"] >= -PER_SCHEME_TOLERANCE - 1e-9, measured


def quant_drops(trials: list[dict[str, Any]]) -> dict[str, float]:
    """`plain_drops` restricted to the in-set quantisers (INT / NF4 / MX FP4, not pruning or skipping)."""
    drops = {s: d for s, d in plain_drops(trials).items() if s in QUANTISERS}
    if not drops:
        raise ValueError(f"no in-set scheme quantises (the quantisers: {QUANTISERS})")
    return drops


@claim("gain", at_least=MIN_QUANT_GAIN,
       paper="a LoRA trained on the BF16 base falls from 38.9 to 16.3 GSM8K under naive INT4 (-22.6 points); CAR-LoRA "
             "keeps 38.1-38.5 under INT8 / FP4 / NF4, as adapters retrained per format (38.5)",
       threshold_from="calibrated on seeds 100-104 by the rule in MIN_QUANT_GAIN's docstring")
def car_beats_plain_under_quant(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Under the in-set quantiser that costs plain LoRA the most accuracy (measured; at smoke size 2-bit groups of 16), CAR-LoRA is at least MIN_QUANT_GAIN above plain LoRA; plain LoRA's drop there is reported."""
    worst, measured = _on_most_damaging(trials, quant_drops(trials), "most_damaging_quant_is")
    own = mean_acc(trials, worst, f"eval/acc/{worst}") if any(t["adapter"] == worst for t in trials) else float("nan")
    measured.update({"plain_none": mean_acc(trials, "plain", "eval/acc/none"), "per_scheme": own})
    return measured["gain"] >= MIN_QUANT_GAIN - 1e-9, measured


def _on_most_damaging(trials: list[dict[str, Any]], drops: dict[str, float], tag: str) -> tuple[str, dict[str, float]]:
    """The scheme of `drops` that costs plain LoRA the most, and CAR-LoRA's and plain LoRA's accuracy
    under it with every scheme's drop: what the two 'beats plain LoRA where it hurts most' claims report."""
    worst = max(drops, key=drops.get)
    car, plain = mean_acc(trials, "car", f"eval/acc/{worst}"), mean_acc(trials, "plain", f"eval/acc/{worst}")
    measured = {f"plain_drop_{s}": d for s, d in drops.items()}
    measured.update({f"{tag}_{worst}": 1.0, "plain_drop": drops[worst], "car": car, "plain": plain, "gain": car - plain})
    return worst, measured


@claim("gain", at_least=MIN_GAIN,
       paper="a LoRA trained on the BF16 base falls from 38.9 to 16.3 on GSM8K under naive INT4; CAR-LoRA keeps "
             "31.1-38.5 under every in-set operator",
       threshold_from="ours: 10 points at CPU size, set in the implementation notes before any run")
def car_beats_plain_on_most_damaging(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """On the in-set scheme that costs plain LoRA the most accuracy (measured; at smoke size row pruning), CAR-LoRA is at least 10 points above plain LoRA."""
    _, measured = _on_most_damaging(trials, plain_drops(trials), "most_damaging_is")
    return measured["gain"] >= MIN_GAIN - 1e-9, measured


@claim("gain", at_least=0.0, paper="with FP4 held out of training, CAR-LoRA is within about 1% of qLoRA on it")
def car_not_below_plain_heldout(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Under the held-out scheme (never trained on) CAR-LoRA is not below plain LoRA."""
    _, held = _setting(trials)
    car, plain = mean_acc(trials, "car", f"eval/acc/{held}"), mean_acc(trials, "plain", f"eval/acc/{held}")
    full = mean_acc(trials, "plain", "eval/acc/none")
    return car >= plain, {f"heldout_is_{held}": 1.0, "car": car, "plain": plain, "gain": car - plain,
                          "plain_drop": full - plain}


@claim("gain", at_least=0.0,
       paper="robustness to a drifted base is emergent: CAR-LoRA is not below plain LoRA after continued pre-training")
def car_not_below_plain_drift(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """On the drifted base (uncompressed), CAR-LoRA's adapter is not below plain LoRA's."""
    car, plain = mean_acc(trials, "car", "eval/drift_acc/none"), mean_acc(trials, "plain", "eval/drift_acc/none")
    measured = {"car": car, "plain": plain, "gain": car - plain,
                "plain_drop": mean_acc(trials, "plain", "eval/acc/none") - plain}
    schemes, _ = _setting(trials)
    keys = [f"eval/drift_acc/{s}" for s in schemes]
    if all(any(k in t for t in trials if t["adapter"] == a) for k in keys for a in ("car", "plain")):
        # The drifted base compressed too: the mean over in-set schemes, reported, not judged.
        measured["car_compressed_mean"] = sum(mean_acc(trials, "car", k) for k in keys) / len(keys)
        measured["plain_compressed_mean"] = sum(mean_acc(trials, "plain", k) for k in keys) / len(keys)
    return car >= plain, measured


CLAIMS = [car_near_per_scheme, car_beats_plain_under_quant, car_beats_plain_on_most_damaging, car_not_below_plain_heldout, car_not_below_plain_drift]


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Held-out accuracy per evaluation scheme: plain LoRA, CAR-LoRA and each per-scheme adapter
    on its own scheme, on the base and (hatched) on the drifted base."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemes, held = _setting(trials)
    names = ["none", *schemes, held]
    series: dict[str, list[float]] = defaultdict(list)
    for prefix in ("acc", "drift_acc"):
        for adapter in ("plain", "car"):
            series[f"{adapter} {prefix}"] = [_maybe(trials, adapter, f"eval/{prefix}/{s}") for s in names]
    per_scheme = [_maybe(trials, s, f"eval/acc/{s}") if s in schemes else float("nan") for s in names]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(names)), 4.2))
    width = 0.16
    xs = range(len(names))
    bars = [("plain acc", "tab:gray", None), ("car acc", "tab:blue", None), ("plain drift_acc", "tab:gray", "//"),
            ("car drift_acc", "tab:blue", "//")]
    for i, (key, color, hatch) in enumerate(bars):
        ax.bar([x + (i - 2) * width for x in xs], series[key], width, color=color, hatch=hatch, alpha=0.9,
               label=key.replace("acc", "base").replace("drift_base", "drifted base"))
    ax.bar([x + 2 * width for x in xs], per_scheme, width, color="tab:orange", label="per-scheme adapter, own scheme")
    ax.set_xticks(list(xs), [n + (" (held out)" if n == held else "") for n in names], rotation=20)
    ax.set(ylabel="held-out task accuracy", ylim=(0, 1))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _maybe(trials: list[dict[str, Any]], adapter: str, key: str) -> float:
    try:
        return mean_acc(trials, adapter, key)
    except ValueError:
        return float("nan")
