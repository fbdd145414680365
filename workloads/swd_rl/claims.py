"""The paper's claims over a reproduction sweep (samplers x algorithms x tasks x seeds), and its plot.

Trials are grouped by (env_id, algo, utd); within a group each sampler's numbers are averaged
over its seeds, the paper's own summary. Every sampler of one seed starts from the same
networks and the same warm-up data (both are drawn from the seed alone), so the arms differ
only from the first update on.

What was measured at smoke size and in longer runs, seed by seed, is in the report's notes,
`docs/reproductions/swd_rl.notes.md`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.claims import claim

FULL_MIN_SEEDS = 3
"""The return claim is judged only with at least this many seeds per compared arm ..."""
FULL_MIN_STEPS = 300_000
"""... and at least this many environment steps per trial (smoke runs are far shorter)."""
SEED_NOISE_Z = 2.0
"""'Beyond seed noise': SWD's mean return may fall below uniform's by at most this many standard
errors of the difference of the two means (the seeds' spread, per arm)."""

Group = tuple[str, str, int]


def _groups(trials: list[dict[str, Any]]) -> dict[Group, dict[str, list[dict[str, Any]]]]:
    out: dict[Group, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        out[(str(t["env_id"]), str(t["algo"]), int(t["utd"]))][str(t["sampler"])].append(t)
    return out


def _label(group: Group, multi: bool) -> str:
    env, algo, utd = group
    return f"{env.split('-')[0]}_{algo}_utd{utd}/" if multi else ""


def _mean(trials: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([float(t[key]) for t in trials]))


def _ordered(trials: list[dict[str, Any]], key: str) -> tuple[bool, dict[str, float]]:
    """reverse < uniform < swd on the seed-mean of `key`, in every group that has all three; judged on
    `smallest_ratio`, the smallest of swd/uniform and uniform/reverse over the groups (above 1: ordered)."""
    groups = _groups(trials)
    complete = {g: arms for g, arms in groups.items() if {"reverse", "uniform", "swd"} <= set(arms)}
    if not complete:
        raise ValueError(f"no (env, algo, utd) group has all three samplers; have {sorted(map(str, groups))}")
    measured, steps = {}, []
    for g, arms in sorted(complete.items()):
        label = _label(g, len(complete) > 1)
        rev, uni, swd = (_mean(arms[s], key) for s in ("reverse", "uniform", "swd"))
        measured.update({f"{label}reverse": rev, f"{label}uniform": uni, f"{label}swd": swd,
                         f"{label}swd_over_uniform": swd / uni, f"{label}uniform_over_reverse": uni / rev})
        steps += [swd / uni, uni / rev]
    measured["smallest_ratio"] = min(steps)
    return measured["smallest_ratio"] >= 1.0, measured


@claim("smallest_ratio", at_least=1.0,
       paper="the ordering SWA < uniform < SWD in performance, critic-gradient L1 norm and GraMa",
       threshold_from="paper: its ordering, each neighbour's ratio above 1 (a tie, measure zero, is judged as holding)")
def critic_grad_ordered_late(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Late in training the critic's gradient L1 norm on each arm's own batches is ordered reverse < uniform < SWD."""
    return _ordered(trials, "train/grad_l1_late")


@claim("worst_gap_in_seed_noise", at_least=-SEED_NOISE_Z,
       paper="SWD improves TD3 on MuJoCo (and Double DQN on ALE, SimBa-SAC on DMC); DMC Humanoid-Run IQM "
             "+25.4%, +17.3% and +30.1% at UTD 1, 2 and 5",
       threshold_from="ours: no worse than 2 standard errors of the difference of the seed means, set with the "
                      "claim in the first implementation (the implementation notes' check: SWD >= uniform - 15%)")
def swd_return_not_below_uniform(trials: list[dict[str, Any]]) -> tuple[bool | None, dict[str, float]]:
    """SWD's late return is not below uniform's beyond seed noise (judged on the full configuration only)."""
    groups = {g: arms for g, arms in _groups(trials).items() if {"uniform", "swd"} <= set(arms)}
    if not groups:
        raise ValueError("no (env, algo, utd) group has both the swd and the uniform sampler")
    judged, measured, zs = True, {}, []
    for g, arms in sorted(groups.items()):
        label = _label(g, len(groups) > 1)
        swd = [float(t["eval/return_late"]) for t in arms["swd"]]
        uni = [float(t["eval/return_late"]) for t in arms["uniform"]]
        n = min(len(swd), len(uni))
        gap = float(np.mean(swd) - np.mean(uni))
        noise = math.sqrt(np.var(swd, ddof=1) / len(swd) + np.var(uni, ddof=1) / len(uni)) if n > 1 else math.nan
        measured.update({f"{label}return_swd": float(np.mean(swd)), f"{label}return_uniform": float(np.mean(uni)),
                         f"{label}gap": gap, f"{label}seed_noise": noise, f"{label}seeds": float(n)})
        steps = min(int(t["total_steps"]) for t in arms["swd"] + arms["uniform"])
        judged = judged and n >= FULL_MIN_SEEDS and steps >= FULL_MIN_STEPS
        if not math.isfinite(noise):  # fewer than two seeds: no noise to measure the gap in
            z = math.nan
        elif noise > 0:
            z = gap / noise
        else:
            z = math.inf if gap >= 0 else -math.inf
        measured[f"{label}gap_in_seed_noise"] = z
        zs.append(z)
    measured["worst_gap_in_seed_noise"] = math.nan if any(math.isnan(z) for z in zs) else min(zs)
    return (measured["worst_gap_in_seed_noise"] >= -SEED_NOISE_Z if judged else None), measured


CLAIMS = [critic_grad_ordered_late, swd_return_not_below_uniform]
CHECKS: list = []
"""No invariant of this workload is judged on the reproduction's trials (the sampler's
distribution and the gradient diagnostics are unit-tested)."""

# --- the bench size (sweeps/repro/swd_rl.py BENCH_SIZE: Pendulum-v1, TD3 at UTD 4, one seed a build) ---------
#
# Rules written before any bench-size trial was judged; the calibration numbers are from seeds
# 100-102 (`ladder reproduce swd_rl --size bench --seeds 3 --seed 100`), never the judged seeds 0-2.

BENCH_RETURN_MARGIN = 0.0
"""SWD's late return minus uniform's (per seed, paired: same networks and warm-up data) must be
above this. Rule: 0, the paper's direction, with no margin of our own: the 95% interval over the
seeds carries the seed noise, so the claim holds only when the whole interval is above 0.
Calibration (seeds 100-102) only reports the gap's spread: see BENCH_CALIBRATION."""
RANDOM_RETURN = -1175.5
"""Pendulum-v1's mean return per 200-step episode under uniformly random actions (200 seeded
episodes, sd 285), measured once for the agent-learns check."""
LEARNED_FRACTION = 0.5
"""'The agent learns' (BENCH_CHECKS): uniform's late evaluation return is at least this fraction of
the way from RANDOM_RETURN to 0, the task's ceiling (-587.7), at every seed. Rule written before
any bench run; a trained TD3 reaches about -150 to -200."""
PLASTICITY_JITTER_FACTOR = 2.0
PLASTICITY_RANK_RATIO = 0.2
"""Plasticity loss appears in the uniform arm when its late NTK rank over its early NTK rank is at
most this. Early: the rank at the first evaluation after updates begin; late: the mean over the
evaluations in the late window (the last late_frac of the steps), both on the trial's own probe
batch. Rule, written before the calibration run: 1 - PLASTICITY_JITTER_FACTOR x the largest
relative change of the uniform arm's NTK rank between consecutive late-window evaluations on
calibration seeds 100-102 (the rank's own evaluation-to-evaluation noise), rounded down to 0.05.
Calibration at the bench size (15,000 steps): the late-window ranks were 24, 20, 24, 24 (seed 100),
32, 37, 23, 25 (seed 101) and 27, 27, 24, 20 (seed 102); the largest change 37 -> 23, 0.378, so
1 - 2 x 0.378 = 0.243, rounded down to 0.20. See BENCH_CALIBRATION."""
BENCH_CALIBRATION = """Seeds 100-102 at the bench size (15,000 steps; 9 trials on Ray, two at a time, 50 min of wall time on
a loaded 2-core machine): return_gap (swd - uniform) -4.69, -3.02, 3.71 (mean -1.33, 95% interval
[-12.4, 9.7]); swd_over_uniform 0.912, 0.664, 0.992; smallest ratio of the ordering 0.912, 0.664,
0.988; uniform NTK rank late/early 0.404, 0.513, 0.446 (the rank falls from 55-57 of 64 to 20-37),
its largest late evaluation-to-evaluation change 0.20, 0.378, 0.167; uniform late return -188.5,
-128.7, -124.5 (random: -1,176). An earlier calibration at 5,000 steps (the first bench size,
replaced before any judged seed ran) gave NTK rank late/early 0.71-0.86 with late jitter about
0.21: no fall beyond the rank's noise, so the run was made three times longer."""


def _one_seed(trials: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The bench's trials of one seed by sampler (one trial each)."""
    by = {str(t["sampler"]): t for t in trials}
    if len(by) != len(trials):
        raise ValueError(f"the bench judges one seed a build: got {len(trials)} trials for samplers {sorted(by)}")
    return by


def curve_of(trial: dict[str, Any], name: str) -> dict[int, float]:
    """One trial's curve/<name>/<step> values by step (finite ones)."""
    prefix = f"curve/{name}/"
    return {int(k[len(prefix):]): float(v) for k, v in trial.items()
            if k.startswith(prefix) and math.isfinite(float(v))}


def early_late(trial: dict[str, Any], name: str) -> tuple[float, float, list[float]]:
    """A curve's early value (its first evaluation after updates begin), its late mean (evaluations in
    the late window) and the late values themselves, in step order."""
    curve = curve_of(trial, name)
    total = int(trial["total_steps"])
    late_start = total - round(float(trial["late_frac"]) * total)
    after = sorted(s for s in curve if s > int(trial["learning_starts"]))
    late = [curve[s] for s in after if s > late_start]
    if not after or not late:
        raise ValueError(f"curve {name!r} has no evaluation after learning starts or in the late window: {sorted(curve)}")
    return curve[after[0]], float(np.mean(late)), late


@claim("return_gap", at_least=BENCH_RETURN_MARGIN,
       paper="SWD improves TD3 on MuJoCo (no TD3 number in our notes: not verified); DMC Humanoid-Run IQM "
             "+25.4%, +17.3% and +30.1% at UTD 1, 2 and 5 (SimBa-SAC)",
       threshold_from="ours: 0, the paper's direction, judged with the 95% interval over seeds (no margin)")
def swd_return_above_uniform(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """SWD's late evaluation return is above uniform's (per seed, paired)."""
    by = _one_seed(trials)
    swd, uni = float(by["swd"]["eval/return_late"]), float(by["uniform"]["eval/return_late"])
    gap = swd - uni
    return gap > BENCH_RETURN_MARGIN, {"return_gap": gap, "return_swd": swd, "return_uniform": uni,
                                       "return_reverse": float(by["reverse"]["eval/return_late"])}


@claim("swd_over_uniform", at_least=1.0,
       paper="late critic-gradient L1: SWD above uniform (ordering SWA < uniform < SWD)",
       threshold_from="paper: its direction, a ratio above 1")
def critic_grad_swd_above_uniform_late(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Late in training SWD's critic gradient L1 on its own batches is above uniform's (per seed, paired)."""
    by = _one_seed(trials)
    swd, uni = float(by["swd"]["train/grad_l1_late"]), float(by["uniform"]["train/grad_l1_late"])
    return swd / uni >= 1.0, {"swd_over_uniform": swd / uni, "grad_swd": swd, "grad_uniform": uni,
                              "grad_reverse": float(by["reverse"]["train/grad_l1_late"])}


@claim("uniform_ntk_rank_late_over_early", at_most=PLASTICITY_RANK_RATIO,
       paper="under uniform replay the critic's gradient decays like 1/k and its NTK Gram matrix loses rank "
             "(plasticity loss), the premise of SWD",
       threshold_from="ours: 1 - 2 x the rank's largest late evaluation-to-evaluation change on calibration "
                      "seeds 100-102 (PLASTICITY_RANK_RATIO)")
def plasticity_loss_in_uniform(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The precondition: the uniform arm's NTK rank falls from early to late in training.

    Its gradient L1 late over early and feature rank are reported beside it, not judged."""
    uni = _one_seed(trials)["uniform"]
    early, late, values = early_late(uni, "ntk_rank")
    jitter = max((abs(b - a) / a for a, b in zip(values, values[1:]) if a > 0), default=math.nan)
    g_early, g_late, _ = early_late(uni, "grad_l1")
    f_early, f_late, _ = early_late(uni, "feature_rank")
    ratio = late / early
    return ratio <= PLASTICITY_RANK_RATIO, {
        "uniform_ntk_rank_late_over_early": ratio, "ntk_rank_early": early, "ntk_rank_late": late,
        "ntk_rank_late_jitter": jitter, "grad_l1_late_over_early": g_late / g_early,
        "feature_rank_late_over_early": f_late / f_early}


def every_arm_ran(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Every sampler ran at the seed, with finite late return, late gradient and NTK-rank curve."""
    by = {str(t["sampler"]): t for t in trials}
    measured = {"arms": float(len(by)), "trials": float(len(trials))}
    ok = set(by) == {"reverse", "uniform", "swd"} and len(trials) == 3
    for s, t in by.items():
        finite = all(math.isfinite(float(t.get(k, math.nan))) for k in ("eval/return_late", "train/grad_l1_late"))
        finite = finite and bool(curve_of(t, "ntk_rank"))
        measured[f"{s}_finite"] = float(finite)
        ok = ok and finite
    return ok, measured


def agent_learns(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Uniform's late return is at least LEARNED_FRACTION of the way from the random policy's to 0."""
    uni = float(_one_seed(trials)["uniform"]["eval/return_late"])
    bar = RANDOM_RETURN * (1 - LEARNED_FRACTION)
    return uni >= bar, {"return_uniform": uni, "bar": bar, "random_return": RANDOM_RETURN}


BENCH_CLAIMS = [swd_return_above_uniform, critic_grad_swd_above_uniform_late, critic_grad_ordered_late,
                plasticity_loss_in_uniform]
"""Judged at bench size, one seed a build, over the seeds of `--seeds K`: the headline (return), the
gradient claim (SWD above uniform, then the full ordering), and plasticity loss in the uniform arm,
the precondition of the test (when it does not appear the gradient claim is not tested)."""
BENCH_CHECKS = [every_arm_ran, agent_learns]

COLORS = {"reverse": "tab:blue", "uniform": "tab:gray", "swd": "tab:red"}


def _curve(trials: list[dict[str, Any]], name: str) -> tuple[list[int], list[float]]:
    """Seed-mean of curve/<name>/<step> over the trials, by step."""
    prefix = f"curve/{name}/"
    by_step: dict[int, list[float]] = defaultdict(list)
    for t in trials:
        for k, v in t.items():
            if k.startswith(prefix) and math.isfinite(float(v)):
                by_step[int(k[len(prefix):])].append(float(v))
    steps = sorted(by_step)
    return steps, [float(np.mean(by_step[s])) for s in steps]


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """Per (task, algorithm, UTD): critic-gradient L1 norm, evaluation return and NTK rank over steps, per sampler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(trials)
    panels = (("grad_l1", "critic gradient L1 (own batches)"), ("return", "evaluation return"),
              ("ntk_rank", "NTK rank (srank)"))
    fig, axes = plt.subplots(len(groups), len(panels), figsize=(4.2 * len(panels), 3.2 * len(groups)), squeeze=False)
    for row, (g, arms) in enumerate(sorted(groups.items())):
        for col, (name, title) in enumerate(panels):
            ax = axes[row][col]
            for sampler, ts in sorted(arms.items()):
                steps, values = _curve(ts, name)
                ax.plot(steps, values, marker="o", ms=3, color=COLORS.get(sampler), label=f"{sampler} ({len(ts)} seeds)")
            ax.set_title(f"{g[0]} {g[1]} UTD {g[2]}: {title}", fontsize=9)
            ax.set_xlabel("environment step")
            if name == "grad_l1":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
