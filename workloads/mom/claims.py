"""The paper's claims and the reproduction's checks over a reproduction sweep (mixer x seeds on
MQAR), and its plot.

Recall is compared as the mean over seeds per evaluation length; within a seed every mixer sees the
same training batches and the same evaluation sets, so the comparison is paired.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim

RECALL_PREFIX = "eval/recall_T"
STATE_PREFIX = "eval/state_bytes_T"

RECALL_MARGIN = 0.17
"""MoM's recall, averaged over the evaluation lengths, must exceed single memory's by this much: the
seed noise of single memory's recall (its mean change between adjacent seeds) on calibration seeds
100-104, which no reproduction judges by default."""
PARAM_TOLERANCE = 0.01
"""Parameter counts of MoM and the single-memory baseline may differ by this fraction of MoM's."""
KV_GROWTH = 0.5
"""Softmax state at the longest over the shortest prefix must reach this fraction of the length ratio."""
SAME_STATE_FIELDS = ("update", "heads", "head_dim", "expand_v", "d_model", "layers", "vocab", "seq_len", "mqar_order")
"""Fields MoM and its single-memory baseline must share: the same memory per head, model and task."""


def _of(trials: list[dict[str, Any]], mixer: str, task: str = "mqar") -> list[dict[str, Any]]:
    return [t for t in trials if t.get("mixer") == mixer and t.get("task", "mqar") == task]


def by_length(trials: list[dict[str, Any]], prefix: str) -> dict[int, float]:
    """Length -> mean over the trials (seeds) of the metric `<prefix><length>`, ascending in length."""
    groups: dict[int, list[float]] = defaultdict(list)
    for t in trials:
        for key, value in t.items():
            if key.startswith(prefix):
                groups[int(key[len(prefix):])].append(float(value))
    return {n: sum(v) / len(v) for n, v in sorted(groups.items())}


def _mean(trials: list[dict[str, Any]], key: str) -> float:
    return sum(float(t[key]) for t in trials) / len(trials)


def _recall(trials: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, float]]:
    """MoM's and single memory's MQAR trials (checked to share the memory, model and task) and
    their recall per evaluation length, the gap at each, its mean and the gap's growth."""
    mom, single = _of(trials, "mom"), _of(trials, "single")
    if not mom or not single:
        raise ValueError(f"needs MQAR trials of mixer 'mom' and 'single' (have {len(mom)} and {len(single)})")
    for name in SAME_STATE_FIELDS:
        values = {t[name] for t in mom + single}
        if len(values) != 1:
            raise ValueError(f"MoM and single memory differ in {name} ({sorted(map(str, values))}): not the same memory")
    rec_mom, rec_single = by_length(mom, RECALL_PREFIX), by_length(single, RECALL_PREFIX)
    lengths = sorted(set(rec_mom) & set(rec_single))
    if not lengths:
        raise ValueError("no evaluation length common to the MoM and single-memory trials")
    gaps = [rec_mom[n] - rec_single[n] for n in lengths]
    measured = {"mean_gap": sum(gaps) / len(gaps), "gap_shortest": gaps[0], "gap_longest": gaps[-1],
                "gap_growth": gaps[-1] - gaps[0]}
    for n in lengths:
        measured[f"mom_T{n}"], measured[f"single_T{n}"] = rec_mom[n], rec_single[n]
    return mom, single, measured


@claim("mean_gap", at_least=RECALL_MARGIN,
       paper="recall-intensive average (Table 2): MoM 28.16 vs Gated DeltaNet 24.78 at 380M, 36.04 vs 32.30 at 1.3B",
       threshold_from="ours: the seed noise of single memory's recall on calibration seeds 100-104 (0.17)")
def mom_recalls_more_than_single_memory(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """MoM's MQAR recall, averaged over the evaluation lengths, beats single-memory linear attention's by 0.17 at the same state per memory.

    The parameter counts are matched by construction of the sweep (the check
    `parameter_counts_matched`); the softmax model's recall and, when the sweep trained language
    models, every mixer's held-out loss are reported beside it.
    """
    _, _, measured = _recall(trials)
    softmax = by_length(_of(trials, "softmax"), RECALL_PREFIX)
    measured.update({f"softmax_T{n}": v for n, v in softmax.items() if f"mom_T{n}" in measured})
    for task_mixer in ("mom", "single", "softmax"):  # the LM loss, when the sweep trained LMs too
        lm = _of(trials, task_mixer, task="lm")
        if lm:
            measured[f"lm_loss_{task_mixer}"] = _mean(lm, "eval/loss")
    return measured["mean_gap"] >= RECALL_MARGIN, measured


@claim("gap_growth", at_least=0.0,
       paper="more memories hold more key-value pairs: MoM gains where one memory's capacity limits bite "
             "(recall-intensive tasks, Table 2; MoM 444M above an expanded single-memory Gated DeltaNet 550M, Table 4)",
       threshold_from="ours: 0 (the gap does not shrink with more pairs), no fitted number; the claim was written "
                      "after the smoke runs of seeds 0-9 and first tested on calibration seeds 100-104 (held: "
                      "growth 0.31 [0.26, 0.36])")
def mom_gap_grows_with_pairs(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """MoM's recall lead over single memory at the longest evaluation length (the most pairs) is at least its lead at the shortest."""
    _, _, measured = _recall(trials)
    return measured["gap_growth"] >= 0.0, measured


def parameter_counts_matched(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """MoM and its single-memory baseline share the memory per head and have parameter counts within PARAM_TOLERANCE."""
    mom, single, _ = _recall(trials)
    p_mom, p_single = _mean(mom, "eval/params"), _mean(single, "eval/params")
    measured = {"params_mom": p_mom, "params_single": p_single, "param_gap": abs(p_mom - p_single) / p_mom}
    return measured["param_gap"] <= PARAM_TOLERANCE, measured


def state_constant_in_length(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """MoM's per-token inference state is the same size at every prefix length; the softmax KV cache grows with it."""
    mom, softmax = by_length(_of(trials, "mom"), STATE_PREFIX), by_length(_of(trials, "softmax"), STATE_PREFIX)
    if len(mom) < 2 or len(softmax) < 2:
        raise ValueError("needs state measurements of 'mom' and 'softmax' at two or more prefix lengths")
    lo, hi = min(softmax), max(softmax)
    measured = {f"mom_bytes_T{n}": b for n, b in mom.items()}
    measured.update({f"softmax_bytes_T{n}": b for n, b in softmax.items()})
    measured["mom_growth"] = max(mom.values()) / min(mom.values())
    measured["softmax_growth"] = softmax[hi] / softmax[lo]
    measured["length_ratio"] = hi / lo
    measured["softmax_bytes_per_token"] = (softmax[hi] - softmax[lo]) / (hi - lo)
    single = by_length(_of(trials, "single"), STATE_PREFIX)
    if single:
        measured["single_growth"] = max(single.values()) / min(single.values())
    holds = (measured["mom_growth"] == 1.0 and measured.get("single_growth", 1.0) == 1.0
             and measured["softmax_growth"] >= KV_GROWTH * measured["length_ratio"])
    return holds, measured


CLAIMS = [mom_recalls_more_than_single_memory, mom_gap_grows_with_pairs]
CHECKS = [state_constant_in_length, parameter_counts_matched]

COLORS = {"mom": "tab:red", "single": "tab:blue", "softmax": "tab:gray"}


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Left: MQAR recall vs sequence length per mixer (lines: mean over seeds, dots: seeds).
    Right: inference state carried between generated tokens vs prefix length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mixer, color in COLORS.items():
        runs = _of(trials, mixer)
        if not runs:
            continue
        mean = by_length(runs, RECALL_PREFIX)
        left.plot(list(mean), list(mean.values()), "o-", color=color, label=mixer)
        for t in runs:
            one = by_length([t], RECALL_PREFIX)
            left.plot(list(one), list(one.values()), ".", color=color, alpha=0.35)
        state = by_length(runs, STATE_PREFIX)
        right.plot(list(state), [b / 1024 for b in state.values()], "o-", color=color, label=mixer)
    lengths = sorted({n for t in _of(trials, "mom") + _of(trials, "single") for n in by_length([t], RECALL_PREFIX)})
    trained = sorted({int(t["seq_len"]) for t in _of(trials, "mom") if "seq_len" in t})
    for n in trained:
        left.axvline(n, color="k", ls=":", lw=1, label="training length" if n == trained[0] else None)
    left.set(xlabel="sequence length (pairs = length / 4)", ylabel="MQAR recall", ylim=(0, 1.02),
             title="associative recall", xticks=lengths)
    right.set(xscale="log", yscale="log", xlabel="prefix length", ylabel="state carried to the next token (KiB)",
              title="inference state")
    states = sorted({n for t in trials for n in by_length([t], STATE_PREFIX)})
    right.set_xticks(states, [str(n) for n in states])
    right.minorticks_off()
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
