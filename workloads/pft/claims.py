"""The paper's claims over a reproduction sweep (target subjects x seeds, per setting), and its plot.

Every trial is one target subject; it carries all arms of the comparison, trained from the same
source model on the same neutral frames, so the comparisons are paired. A setting is everything
in a trial's config but its seed and target subject; each claim is judged per setting, on the
mean over that setting's trials (the paper's own per-dataset average over target subjects), and
must hold in every setting. Each claim declares one scalar effect (`orchestrator.claims.claim`):
the smallest gain (or drop) over the settings.

That the adaptation changes nothing but the translator is a check, not a claim: it holds by
construction of the adaptation step (only the translator's parameters are given to the
optimizer), whatever training learns.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.claims import claim
from workloads.pft.workload import ARMS

SFDA_ARMS = ("shot", "aad")
"""The SFDA baselines (`sfda.py`), run on the same neutral frames as PFT; the headline beats the best."""
SFDA_MARGIN = 0.067
"""PFT's mean target accuracy must exceed the best SFDA baseline's (the higher of SHOT's and AaD's
setting means) by this much. Rule, written before any seed was run: the seed noise of the beaten
measure, as for the margins below: the mean absolute change of the best SFDA baseline's mean
target accuracy between adjacent replicates of the smoke reproduction at calibration seeds
100-108 (`ladder report pft --smoke --seeds 5 --seed 100`; replicate r runs worlds r and r + 1,
so these use worlds 100-109 and never those of the judged seeds 0-9), rounded up to 3 decimals.
Calibration: best SFDA accuracy 0.7253 0.6644 0.7244 0.6322 0.6838 (SHOT each time; AaD 0.434-0.588),
adjacent changes 0.0609 0.0600 0.0922 0.0516, mean 0.0662 -> 0.067. PFT's gain over it there:
0.016 0.037 0.039 0.111 -0.035 (mean 0.034)."""
SOURCE_MARGIN = 0.028
"""PFT's mean target accuracy must exceed the unadapted source model's by this much: the seed noise
of the source model's accuracy (its mean change between adjacent replicates) on calibration seeds
100-109, which no reproduction judges by default."""
FINETUNE_MARGIN = 0.070
"""PFT's mean target accuracy must exceed the plain neutral fine-tune's by this much: the seed noise
of the fine-tune's accuracy on calibration seeds 100-109."""
COLLAPSE_MARGIN = 0.041
"""Without L_exp the non-neutral recall must fall at least this far below PFT's: the seed noise of
the ablated arm's non-neutral recall on calibration seeds 100-109."""

CALIBRATED = "ours: the seed noise of the beaten arm's measure on calibration seeds 100-109 ({:g})"

_PER_TRIAL = {"seed", "target", "trial_id"}


def settings(trials: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Trials grouped by their config minus seed and target (metric keys hold a '/', config fields do not)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for t in trials:
        key = tuple(sorted((k, repr(v)) for k, v in t.items() if "/" not in k and k not in _PER_TRIAL))
        groups[key].append(t)
    if not groups:
        raise ValueError("no trials to judge")
    return dict(groups)


def _label(key: tuple, groups: dict[tuple, list]) -> str:
    """A short name for a setting: the fields that differ between settings (empty with one setting)."""
    if len(groups) == 1:
        return ""
    varying = [k for k, v in key if len({dict(g)[k] for g in groups}) > 1]
    return "[" + ",".join(f"{k}={dict(key)[k]}" for k in varying) + "]"


def _mean(trials: list[dict[str, Any]], key: str) -> float:
    missing = [t.get("trial_id", "?") for t in trials if key not in t]
    if missing:
        raise ValueError(f"trials {missing} have no {key!r}: the arm did not run (check the *_arm fields)")
    return sum(float(t[key]) for t in trials) / len(trials)


def _sfda_gain(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    groups = settings(trials)
    measured: dict[str, float] = {}
    gains = []
    for key, group in groups.items():
        name = _label(key, groups)
        pft = _mean(group, "eval/acc/pft")
        means = {arm: _mean(group, f"eval/acc/{arm}") for arm in SFDA_ARMS}
        best = max(means.values())
        gains.append(pft - best)
        measured[f"pft{name}"] = pft
        measured.update({f"{arm}{name}": v for arm, v in means.items()})
        measured[f"best_sfda{name}"] = best
        measured[f"gain{name}"] = pft - best
        # Per target subject, against the better of the baselines on that subject (a stricter pairing).
        measured[f"wins{name}"] = sum(
            float(t["eval/acc/pft"]) > max(float(t[f"eval/acc/{a}"]) for a in SFDA_ARMS) for t in group) / len(group)
        measured[f"recall_neutral_pft{name}"] = _mean(group, "eval/recall_neutral/pft")
        for arm in SFDA_ARMS:
            measured[f"recall_neutral_{arm}{name}"] = _mean(group, f"eval/recall_neutral/{arm}")
    measured["min_gain"] = min(gains)
    return measured["min_gain"] >= SFDA_MARGIN, measured


def _compare(trials: list[dict[str, Any]], arm: str, margin: float) -> tuple[bool, dict[str, float]]:
    groups = settings(trials)
    measured: dict[str, float] = {}
    gains = []
    for key, group in groups.items():
        name = _label(key, groups)
        pft, other = _mean(group, "eval/acc/pft"), _mean(group, f"eval/acc/{arm}")
        gains.append(pft - other)
        measured[f"pft{name}"] = pft
        measured[f"{arm}{name}"] = other
        measured[f"gain{name}"] = pft - other
        measured[f"wins{name}"] = sum(float(t["eval/acc/pft"]) > float(t[f"eval/acc/{arm}"]) for t in group) / len(group)
        measured[f"recall_expr_pft{name}"] = _mean(group, "eval/recall_expr/pft")
        measured[f"recall_expr_{arm}{name}"] = _mean(group, f"eval/recall_expr/{arm}")
    measured["min_gain"] = min(gains)
    return measured["min_gain"] >= margin, measured


@claim("min_gain", at_least=SFDA_MARGIN,
       paper="PFT outperforms state-of-the-art source-free domain adaptation methods, which were not built "
             "for target data of one class, when all adapt on the target subject's neutral frames only; the "
             "paper's metric is the accuracy averaged over target subjects (no verified numbers in the notes; "
             "one aggregator lists PFT at 60.83% on an Aff-Wild2 subject, low trust)",
       threshold_from="ours: the seed noise of the best SFDA baseline's mean accuracy on calibration seeds 100-108 "
                      f"(worlds 100-109) ({SFDA_MARGIN:g})")
def pft_beats_sfda(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """PFT's mean target accuracy beats the best SFDA baseline's (SHOT, AaD), all adapted on the same neutral frames, by >= 0.067."""
    return _sfda_gain(trials)


@claim("min_gain", at_least=SOURCE_MARGIN,
       paper="adapting only the latent translator on the target subject's unlabelled neutral frames improves "
             "expression recognition on that subject over the source model (no verified numbers in the notes)",
       threshold_from=CALIBRATED.format(SOURCE_MARGIN))
def pft_beats_source(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """After adaptation on neutral frames, PFT's mean target accuracy beats the unadapted source model's by >= 0.028."""
    return _compare(trials, "source", SOURCE_MARGIN)


@claim("min_gain", at_least=FINETUNE_MARGIN,
       paper="PFT is an efficient source-free adaptation from neutral target frames only (no verified numbers in "
             "the notes); the plain neutral fine-tune is the notes' negative control, not a baseline of the paper",
       threshold_from=CALIBRATED.format(FINETUNE_MARGIN) + "; it was 0.02, then 0.03 after runs of seeds 0-1")
def pft_beats_finetune(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Control: PFT's mean target accuracy beats a plain fine-tune towards 'neutral' on the same frames and budget by >= 0.07."""
    return _compare(trials, "finetune", FINETUNE_MARGIN)


@claim("min_drop", at_least=COLLAPSE_MARGIN,
       paper="the expression-consistency loss L_exp keeps the expression while the translator adapts on neutral "
             "frames (the ablation is the notes' CPU plan; no number in the notes)",
       threshold_from=CALIBRATED.format(COLLAPSE_MARGIN))
def exp_loss_prevents_collapse(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Without L_exp in the target phase the translator collapses towards 'neutral': non-neutral recall falls >= 0.041 below PFT's."""
    groups = settings(trials)
    measured: dict[str, float] = {}
    drops = []
    for key, group in groups.items():
        name = _label(key, groups)
        pft, ablated = _mean(group, "eval/recall_expr/pft"), _mean(group, "eval/recall_expr/no_exp")
        drops.append(pft - ablated)
        measured[f"recall_expr_pft{name}"] = pft
        measured[f"recall_expr_no_exp{name}"] = ablated
    measured["min_drop"] = min(drops)
    return measured["min_drop"] >= COLLAPSE_MARGIN, measured


def only_translator_adapted(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """PFT's adaptation changes the translator and leaves every other parameter and buffer bit-identical."""
    frozen = [float(t["diag/frozen_changed_by_pft"]) for t in trials]
    moved = [float(t["diag/translator_changed_by_pft"]) for t in trials]
    measured = {"max_frozen_tensors_changed": max(frozen), "min_translator_tensors_changed": min(moved)}
    return measured["max_frozen_tensors_changed"] == 0 and measured["min_translator_tensors_changed"] > 0, measured


CLAIMS = [pft_beats_sfda, pft_beats_source, pft_beats_finetune, exp_loss_prevents_collapse]
CHECKS = [only_translator_adapted]


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Target accuracy and non-neutral recall per arm: bars are means, dots single target subjects."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if any(f"eval/acc/{a}" in t for t in trials)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (metric, title) in zip(axes, (("acc", "target accuracy"), ("recall_expr", "non-neutral recall"))):
        for i, arm in enumerate(arms):
            values = [float(t[f"eval/{metric}/{arm}"]) for t in trials if f"eval/{metric}/{arm}" in t]
            ax.bar(i, sum(values) / len(values), color="tab:orange" if arm == "pft" else "tab:gray", alpha=0.7)
            ax.plot([i] * len(values), values, "k.", markersize=4)
        ax.set_xticks(range(len(arms)), arms, rotation=20)
        ax.set(title=title, ylim=(0, 1))
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"PFT on {len(trials)} target subjects")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
