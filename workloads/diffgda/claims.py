"""The paper's claims over a reproduction sweep (arms: source-only, three graph domain adaptation
baselines (DANN, an MMD-aligned GCN, a discrete intermediate-graph path), unguided evolution,
guided evolution at one or more guidance scales; per task, i.e. per domain shift, and per seed),
and the claim plot.

Within a seed every arm sees the same source and target graphs, and the two evolution arms train
the same score model and draw the same reverse-SDE noise, so the comparisons are paired; the
claims compare means over seeds per task and must hold on every task. Where several guidance
scales ran, the one the claims judge is chosen without target labels, by the lowest mean MMD of
its evolved graphs to the target graphs; the others must still land closer than unguided.

Each claim declares one scalar effect (`orchestrator.claims.claim`), the worst over tasks (and, for
the distance, over conditions) of its margin, so it passes exactly when the claim holds on every
task. The thresholds are set at smoke size from calibration seeds 100-104, which no reproduction
judges by default: each margin is the seed noise of the baseline arm's measure (its mean change
between adjacent seeds), the distance ratio 1 minus the seed noise of the ratio itself.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim

CALIBRATION = "ours: seed noise on calibration seeds 100-104 at smoke size"

DISTANCE_RATIO = 0.88
"""Guided over unguided MMD^2 to the target must be at most this: 1 minus the seed noise of the
ratio (calibration seeds 100-104)."""
DOMAIN_ACC_MARGIN = 0.026
"""A fresh domain classifier's accuracy on guided samples must be lower than on unguided ones by
this: the seed noise of the unguided arm's domain accuracy (calibration seeds 100-104)."""
F1_MARGIN = 0.037
"""Target Macro-F1 of the guided arm over the source-only arm must reach this: the seed noise of the
source-only arm's Macro-F1 (calibration seeds 100-104)."""
GDA_MARGIN = 0.018
"""Target Macro-F1 of the guided arm over the best GDA baseline's must reach this. Rule, written
before calibration: the seed noise of the best baseline arm's Macro-F1, its mean absolute change
between adjacent calibration seeds 100-104 at smoke size (the rule of F1_MARGIN, applied to the
strongest baseline); "best" is the baseline arm with the highest mean target Macro-F1.
Calibration (seeds 100-104, smoke): Macro-F1 DANN 0.442 0.432 0.456 0.440 0.458 (mean 0.446, noise
0.017); MMD 0.491 0.466 0.471 0.460 0.489 (mean 0.475, noise 0.018); gradual 0.434 0.453 0.496
0.443 0.439 (mean 0.453, noise 0.030); DiffGDA 0.627 0.555 0.615 0.634 0.612. Best: MMD, 0.018."""
GDA_BASELINES = ("dann", "mmd", "gradual")
"""The graph domain adaptation baselines the headline compares against (arm names)."""

TASK_FIELDS = ("nodes", "classes", "dim", "feature_sep", "feature_std", "shift", "rotation_deg",
               "source_p_in", "source_p_out", "target_p_in", "target_p_out")
"""Config fields that define the domains: trials that share them are one task."""


def arm(trial: dict[str, Any]) -> str:
    if trial["mode"] != "evolve":  # source_only or a GDA baseline: the mode names the arm
        return str(trial["mode"])
    return "unguided" if float(trial["guidance_scale"]) == 0.0 else f"guided_s{float(trial['guidance_scale']):g}"


def by_task(trials: list[dict[str, Any]]) -> dict[tuple, dict[str, list[dict[str, Any]]]]:
    """task -> arm -> trials (one per seed)."""
    out: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        out[tuple(t[f] for f in TASK_FIELDS)][arm(t)].append(t)
    return out


def _mean(trials: list[dict[str, Any]], key: str) -> float:
    return sum(float(t[key]) for t in trials) / len(trials)


def _task_name(task: tuple) -> str:
    d = dict(zip(TASK_FIELDS, task))
    return f"shift{d['shift']:g}_rot{d['rotation_deg']:g}_pin{d['target_p_in']:g}_pout{d['target_p_out']:g}"


def _guided(arms: dict[str, list[dict[str, Any]]]) -> list[str]:
    return sorted(a for a in arms if a.startswith("guided_s"))


def _need(arms: dict[str, list[dict[str, Any]]], names: list[str], task: tuple, what: str) -> None:
    missing = [n for n in names if not arms.get(n)]
    if missing:
        raise ValueError(f"{what}: task {_task_name(task)} has no {missing} trials (has {sorted(arms)})")


def selected_scale(arms: dict[str, list[dict[str, Any]]]) -> str:
    """The guided arm with the lowest mean MMD^2 to the target: a label-free choice."""
    return min(_guided(arms), key=lambda a: _mean(arms[a], "eval/evolved_mmd"))


@claim("worst_gap", at_least=GDA_MARGIN,
       paper="DiffGDA beats state-of-the-art graph domain adaptation methods in target Micro-/Macro-F1 on 14 "
             "transfer tasks over 8 datasets (which baselines and the per-task numbers are not verified in the notes)",
       threshold_from=CALIBRATION + f" ({GDA_MARGIN:.3f}): the seed noise of the best baseline's (MMD's) Macro-F1")
def beats_gda_baselines(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """DiffGDA's target Macro-F1 is above the best GDA baseline's (DANN, MMD-aligned GCN, discrete intermediate graphs) by GDA_MARGIN."""
    measured: dict[str, float] = {}
    gaps = []
    tasks = by_task(trials)
    for task, arms in tasks.items():
        guided = _guided(arms)
        _need(arms, list(GDA_BASELINES) + (guided or ["guided_s*"]), task, "beats_gda_baselines")
        pre = f"{_task_name(task)}/" if len(tasks) > 1 else ""
        ours = _mean(arms[selected_scale(arms)], "eval/target_macro_f1")
        base = {b: _mean(arms[b], "eval/target_macro_f1") for b in GDA_BASELINES}
        best = max(base, key=base.get)  # the strongest baseline, by the target labels: the comparison's hardest
        for b, f1 in base.items():
            measured[f"{pre}f1_{b}"] = f1
        measured[f"{pre}f1_guided"] = ours
        measured[f"{pre}f1_best_baseline"] = base[best]
        measured[f"{pre}best_baseline"] = float(GDA_BASELINES.index(best))  # index into GDA_BASELINES
        measured[f"{pre}gap"] = ours - base[best]
        gaps.append(ours - base[best])
    measured["worst_gap"] = min(gaps)
    return measured["worst_gap"] >= GDA_MARGIN, measured


@claim("worst_slack", at_least=0.0,
       paper="a domain-aware (density-ratio) guidance network steers the source-to-target evolution towards the "
             "target domain (no numbers in the notes)",
       threshold_from=CALIBRATION + "; slack 0 means every condition holds: MMD^2 ratio <= 0.88 and domain accuracy "
                                    "0.026 lower at the selected scale, both lower at the others")
def guided_closer_to_target(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Guided evolution lands closer to the target than unguided: MMD^2 at most 0.88x and a fresh domain classifier's accuracy 0.026 lower at the selected scale, closer at every scale."""
    measured: dict[str, float] = {}
    slacks = []  # each condition's margin, >= 0 when it holds (an MMD^2 ratio or an accuracy, both fractions)
    for task, arms in by_task(trials).items():
        guided = _guided(arms)
        _need(arms, ["unguided"] + (guided or ["guided_s*"]), task, "guided_closer_to_target")
        pre = f"{_task_name(task)}/" if len(by_task(trials)) > 1 else ""
        un_mmd, un_acc = _mean(arms["unguided"], "eval/evolved_mmd"), _mean(arms["unguided"], "eval/evolved_domain_acc")
        measured[f"{pre}mmd_source"] = _mean(arms["unguided"], "eval/source_mmd")
        measured[f"{pre}mmd_unguided"] = un_mmd
        measured[f"{pre}acc_unguided"] = un_acc
        chosen = selected_scale(arms)
        for g in guided:
            mmd, acc = _mean(arms[g], "eval/evolved_mmd"), _mean(arms[g], "eval/evolved_domain_acc")
            measured[f"{pre}mmd_{g}"] = mmd
            measured[f"{pre}acc_{g}"] = acc
            measured[f"{pre}mmd_ratio_{g}"] = mmd / un_mmd
            if g == chosen:
                slacks += [DISTANCE_RATIO - mmd / un_mmd, un_acc - acc - DOMAIN_ACC_MARGIN]
            else:  # a scale not chosen must still move the samples towards the target
                slacks += [1.0 - mmd / un_mmd, un_acc - acc]
    measured["worst_slack"] = min(slacks)
    return measured["worst_slack"] >= 0.0, measured


@claim("worst_gain", at_least=F1_MARGIN,
       paper="DiffGDA beats graph domain adaptation baselines in target Micro-/Macro-F1 on 14 transfer tasks over "
             "8 datasets (per-task numbers not verified in the notes)",
       threshold_from=CALIBRATION + " (0.037)")
def beats_source_only(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The GCN trained on source plus guided-evolved graphs beats the source-only GCN in target Macro-F1 by 0.037."""
    measured: dict[str, float] = {}
    gains = []
    for task, arms in by_task(trials).items():
        guided = _guided(arms)
        _need(arms, ["source_only"] + (guided or ["guided_s*"]), task, "beats_source_only")
        pre = f"{_task_name(task)}/" if len(by_task(trials)) > 1 else ""
        chosen = selected_scale(arms)
        base = _mean(arms["source_only"], "eval/target_macro_f1")
        ours = _mean(arms[chosen], "eval/target_macro_f1")
        measured[f"{pre}f1_source_only"] = base
        if arms.get("unguided"):
            measured[f"{pre}f1_unguided"] = _mean(arms["unguided"], "eval/target_macro_f1")
        measured[f"{pre}f1_guided"] = ours
        measured[f"{pre}selected_scale"] = float(chosen.split("_s")[1])
        measured[f"{pre}gain"] = ours - base
        gains.append(ours - base)
    measured["worst_gain"] = min(gains)
    return measured["worst_gain"] >= F1_MARGIN, measured


CLAIMS = [beats_gda_baselines, guided_closer_to_target, beats_source_only]
CHECKS: list = []  # both effects depend on what training learns: neither holds by construction


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Per task: target Macro-F1 (left) and MMD^2 to the target (right) of each arm, seeds as dots
    (the arms without evolution show the source graphs' MMD^2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = by_task(trials)
    fig, axes = plt.subplots(len(tasks), 2, figsize=(13, 3.2 * len(tasks)), squeeze=False)
    for row, (task, arms) in zip(axes, tasks.items()):
        names = [a for a in ("source_only",) + GDA_BASELINES + ("unguided",) if a in arms] + _guided(arms)
        for ax, key, label in ((row[0], "eval/target_macro_f1", "target Macro-F1"),
                               (row[1], "eval/evolved_mmd", "MMD$^2$ to target")):
            for i, a in enumerate(names):
                evolved = a == "unguided" or a.startswith("guided_s")
                k = "eval/source_mmd" if not evolved and key == "eval/evolved_mmd" else key
                vals = [float(t[k]) for t in arms[a]]
                ax.bar(i, sum(vals) / len(vals), color=plt.cm.tab10(i), alpha=0.6)
                ax.plot([i] * len(vals), vals, "k.", markersize=5)
            ax.set_xticks(range(len(names)), names, fontsize=8)
            ax.set_title(f"{_task_name(task)}: {label}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
