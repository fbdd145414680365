"""The paper's claims and the reproduction's checks over a reproduction sweep (mixer x seeds on
MQAR), and its plot.

Recall is compared as the mean over seeds per evaluation length; within a seed every mixer sees the
same training batches and the same evaluation sets, so the comparison is paired.

A trial is named by its mixer, and an equal-state memory ('single_expanded') by its update rule
too: 'expanded_linear', 'expanded_gated', 'expanded_gated_delta' (see `label`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim

RECALL_PREFIX = "eval/recall_T"
STATE_PREFIX = "eval/state_bytes_T"

EQUAL_STATE = "single_expanded"
"""The mixer of the equal-state linear baselines: one memory holding as many numbers as all of MoM's."""
COMPARABLE_MARGIN = 0.11
"""MoM's recall (mean over the evaluation lengths) may fall short of softmax attention's by at most
this much. Rule, written before any seed ran: the paper's larger relative shortfall of MoM to
Transformer++ (Table 2, 380M: 1 - 28.16 / 31.70 = 11.17%) times softmax attention's mean recall
on calibration seeds 100-104, rounded to 0.01. Calibration (6-trial smoke): softmax 1.000, 0.991,
0.987, 1.000, 0.980, mean 0.9916 -> 0.1107 -> 0.11."""
RECALL_MARGIN = 0.29
"""MoM's recall, averaged over the evaluation lengths, must exceed single memory's by this much: the
seed noise of single memory's recall (its mean absolute change between adjacent seeds) on calibration
seeds 100-104, rounded to 0.01. Recalibrated by the same rule when every model was matched to the
largest's parameters (single's MLP 34 -> 50, MoM's 0 -> 16): single 0.714, 0.471, 0.694, 0.414,
0.824; changes 0.243, 0.223, 0.280, 0.410 -> 0.289 -> 0.29 (formerly 0.17)."""
PARAM_TOLERANCE = 0.01
"""Parameter counts of MoM and the single-memory baseline may differ by this fraction of MoM's."""
KV_GROWTH = 0.5
"""Softmax state at the longest over the shortest prefix must reach this fraction of the length ratio."""
SAME_STATE_FIELDS = ("update", "heads", "head_dim", "expand_v", "d_model", "layers", "vocab", "seq_len", "mqar_order")
"""Fields MoM and its single-memory baseline must share: the same memory per head, model and task."""


def label(trial: dict[str, Any]) -> str:
    """The mixer, and for an equal-state memory its update rule: 'expanded_<rule>'."""
    mixer = str(trial.get("mixer"))
    return f"expanded_{trial.get('update')}" if mixer == EQUAL_STATE else mixer


def _of(trials: list[dict[str, Any]], mixer: str, task: str = "mqar") -> list[dict[str, Any]]:
    """The trials of one mixer, or of one equal-state baseline when `mixer` is a label 'expanded_<rule>'."""
    return [t for t in trials if mixer in (t.get("mixer"), label(t)) and t.get("task", "mqar") == task]


def _mean_recall(trials: list[dict[str, Any]]) -> float:
    """Recall averaged over the evaluation lengths (each the mean over the trials' seeds)."""
    per_length = by_length(trials, RECALL_PREFIX)
    if not per_length:
        raise ValueError("no MQAR recall in these trials")
    return sum(per_length.values()) / len(per_length)


def equal_state_baselines(trials: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """label -> MQAR trials of every equal-state linear baseline, checked against MoM's: the same
    memory numbers (when measured), width, depth, heads, task."""
    mom = _of(trials, "mom")
    if not mom:
        raise ValueError("needs MQAR trials of mixer 'mom'")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in _of(trials, EQUAL_STATE):
        groups[label(t)].append(t)
    if not groups:
        raise ValueError(f"needs MQAR trials of mixer {EQUAL_STATE!r} (an equal-state linear baseline)")
    fields = [f for f in SAME_STATE_FIELDS if f not in ("update", "expand_v")] + ["eval/memory_numbers"]
    for name, runs in groups.items():
        for f in fields:
            values = {t[f] for t in mom + runs if f in t}
            if len(values) > 1:
                raise ValueError(f"MoM and {name} differ in {f} ({sorted(map(str, values))}): not of equal state")
    return dict(sorted(groups.items()))


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


@claim("min_gap_equal_state", at_least=0.0,
       paper="recall-intensive average (Table 2): MoM 28.16 vs Gated DeltaNet 24.78 (+3.38) and vs GLA, DeltaNet, "
             "RetNet, HGRN2, GSA at 380M; 36.04 vs 32.30 (+3.74) at 1.3B; MoM (444M) above the expanded "
             "single-memory Gated DeltaNet (550M) (Table 4)",
       threshold_from="paper: above, i.e. a lead over 0 (no fitted number)")
def mom_recalls_more_than_every_equal_state_linear_model(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """MoM's MQAR recall, averaged over the evaluation lengths, is above that of every linear model holding as many memory numbers (one memory with MoM's rule, with a decay gate, with the gated delta rule).

    The effect is MoM's smallest lead over those baselines (`min_gap_equal_state`); each lead is
    reported beside it, as is single memory's (a fifth of the state) for scale.
    """
    baselines = equal_state_baselines(trials)
    mom = _mean_recall(_of(trials, "mom"))
    measured = {"mom_recall": mom}
    for name, runs in baselines.items():
        measured[f"{name}_recall"] = _mean_recall(runs)
        measured[f"gap_{name}"] = mom - measured[f"{name}_recall"]
    measured["min_gap_equal_state"] = min(measured[f"gap_{n}"] for n in baselines)
    if _of(trials, "single"):
        measured["single_recall"] = _mean_recall(_of(trials, "single"))
    return measured["min_gap_equal_state"] >= 0.0, measured


@claim("softmax_lead", at_most=COMPARABLE_MARGIN,
       paper="comparable to a Transformer: recall-intensive average (Table 2) Transformer++ 31.70 vs MoM 28.16 at "
             "380M (MoM 11.2% below), 37.31 vs 36.04 at 1.3B (3.4% below)",
       threshold_from="ours: the paper's larger relative shortfall (11.2%, 380M) times softmax attention's mean "
                      "recall on calibration seeds 100-104 (see COMPARABLE_MARGIN)")
def mom_recall_comparable_to_softmax(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """MoM's MQAR recall, averaged over the evaluation lengths, falls short of softmax attention's by at most COMPARABLE_MARGIN."""
    mom, softmax = _of(trials, "mom"), _of(trials, "softmax")
    if not mom or not softmax:
        raise ValueError(f"needs MQAR trials of mixer 'mom' and 'softmax' (have {len(mom)} and {len(softmax)})")
    measured = {"mom_recall": _mean_recall(mom), "softmax_recall": _mean_recall(softmax)}
    measured["softmax_lead"] = measured["softmax_recall"] - measured["mom_recall"]
    return measured["softmax_lead"] <= COMPARABLE_MARGIN, measured


@claim("mean_gap", at_least=RECALL_MARGIN,
       paper="recall-intensive average (Table 2): MoM 28.16 vs Gated DeltaNet 24.78 at 380M, 36.04 vs 32.30 at 1.3B",
       threshold_from="ours: the seed noise of single memory's recall on calibration seeds 100-104 (0.29)")
def mom_recalls_more_than_single_memory(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """MoM's MQAR recall, averaged over the evaluation lengths, beats single-memory linear attention's by 0.29 at the same state per memory.

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
    """Every baseline's parameter count (single memory, the equal-state memories, softmax attention) is within PARAM_TOLERANCE of MoM's."""
    mom, _, _ = _recall(trials)
    p_mom = _mean(mom, "eval/params")
    measured = {"params_mom": p_mom}
    names = sorted({label(t) for t in trials if t.get("task", "mqar") == "mqar"} - {"mom"})
    for name in names:
        measured[f"params_{name}"] = _mean(_of(trials, name), "eval/params")
    measured["param_gap"] = max(abs(measured[f"params_{n}"] - p_mom) / p_mom for n in names)
    return measured["param_gap"] <= PARAM_TOLERANCE, measured


def equal_state_memory_matched(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Every equal-state baseline's memory matrices hold exactly as many numbers as all of MoM's; single memory's hold one memory's worth (MoM's over num_memories + shared)."""
    mom = _of(trials, "mom")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in _of(trials, EQUAL_STATE):
        groups[label(t)].append(t)
    if not mom or not groups:
        raise ValueError(f"needs MQAR trials of 'mom' and {EQUAL_STATE!r}")
    measured = {"memory_mom": _mean(mom, "eval/memory_numbers")}
    for name, runs in sorted(groups.items()):
        measured[f"memory_{name}"] = _mean(runs, "eval/memory_numbers")
    holds = all(measured[f"memory_{n}"] == measured["memory_mom"] for n in groups)
    single = _of(trials, "single")
    if single:
        memories = int(mom[0]["num_memories"]) + int(bool(mom[0]["shared_memory"]))
        measured["memory_single"] = _mean(single, "eval/memory_numbers")
        holds = holds and measured["memory_single"] * memories == measured["memory_mom"]
    return holds, measured


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
    linear = sorted({label(t) for t in trials} - {"mom", "softmax"})
    for name in linear:  # every other memory model: single and the equal-state ones
        sizes = by_length(_of(trials, name), STATE_PREFIX)
        if sizes:
            measured[f"{name}_growth"] = max(sizes.values()) / min(sizes.values())
    holds = (all(measured.get(f"{n}_growth", 1.0) == 1.0 for n in ["mom", *linear])
             and measured["softmax_growth"] >= KV_GROWTH * measured["length_ratio"])
    return holds, measured


CLAIMS = [mom_recalls_more_than_every_equal_state_linear_model, mom_recall_comparable_to_softmax,
          mom_recalls_more_than_single_memory, mom_gap_grows_with_pairs]
CHECKS = [state_constant_in_length, parameter_counts_matched, equal_state_memory_matched]

COLORS = {"mom": "tab:red", "single": "tab:blue", "expanded_linear": "tab:green", "expanded_gated": "tab:orange",
          "expanded_gated_delta": "tab:purple", "softmax": "tab:gray"}


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
