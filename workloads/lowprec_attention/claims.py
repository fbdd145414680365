"""The paper's claims, measured on the trials of `sweeps/repro/lowprec_attention.py`, its check,
and its plot.

The claims are the bias of bf16 flash attention's error on tied row maxima and its removal by the
fix, each declared with one scalar effect (`orchestrator.claims.claim`): |r|, the mean error over
its standard deviation, averaged over the input sets. That training with the fix reaches the
same loss is a check: at the smoke size neither arm diverges, so it is a sanity check of the fix
(the same maths), not the paper's stabilisation effect. The bench size judges that effect,
`BENCH_CLAIMS` (headline: the baseline's bf16 training diverges and the paper's fix's does not),
then the same two bias claims; `BENCH_CHECKS` checks its three arms ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.claims import claim

BIASED = 1.0  # the baseline's mean error lies beyond one standard deviation of it
FIXED = 0.25  # the fix leaves less than a quarter of one
SAME_LOSS = 0.02  # the fix is the same maths: the trained loss may differ by rounding, not by 2%


def _trials(trials: list[dict[str, Any]], stable_rounding: bool, precision: str = "paper") -> list[dict[str, Any]]:
    """Every trial of one variant (several when the sweep has a seed axis)."""
    found = [t for t in trials if bool(t["stable_rounding"]) == stable_rounding and t["precision"] == precision]
    if not found:
        raise LookupError(f"no trial with stable_rounding={stable_rounding}, precision={precision!r} among "
                          f"{[(t['stable_rounding'], t['precision']) for t in trials]}")
    return sorted(found, key=lambda t: t["seed"])


def _trial(trials: list[dict[str, Any]], stable_rounding: bool, precision: str = "paper") -> dict[str, Any]:
    return _trials(trials, stable_rounding, precision)[0]


def _rs(found: dict[str, Any] | list[dict[str, Any]]) -> list[float]:
    """The bias statistic of every input set of one trial or of several, pooled."""
    found = [found] if isinstance(found, dict) else found
    return [t[f"eval/bias_r/seed{i}"] for t in found for i in range(int(t["bias_seeds"]))]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@claim("r_abs", at_least=BIASED,
       paper="biased rounding errors of BF16 arithmetic in flash attention (with similar low-rank representations) "
             "make low-precision training fail (no bias number from the paper in the notes)",
       threshold_from="ours: the implementation notes' CPU assertion |r_base| > 1, set before any run (their numpy "
                      "prototype measured |r| 1.28-1.54 over 5 seeds)")
def baseline_is_biased(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Without the fix, bf16 flash attention's error on tied row maxima is biased: its mean lies at least one standard deviation from zero."""
    rs = _rs(_trials(trials, False))
    # One statistic, as the paper states it: the bias averaged over the input sets (each set's own
    # estimate is noisy: it ranges over about +-0.2 around the mean).
    return abs(_mean(rs)) >= BIASED, {"r_mean": _mean(rs), "r_abs": abs(_mean(rs)), "r_abs_min": min(abs(r) for r in rs),
                                      "r_abs_max": max(abs(r) for r in rs), "input_sets": float(len(rs))}


@claim("r_abs", at_most=FIXED,
       paper="a minimal modification to flash attention mitigates the rounding bias, which stabilizes training "
             "(no bias number from the paper in the notes)",
       threshold_from="ours: set when the workload was written, before any run; tighter than the implementation "
                      "notes' CPU assertion |r_fix| < 0.3")
def fix_removes_bias(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """With the fix, the bias is at most a quarter of one standard deviation."""
    base, fixed = _rs(_trials(trials, False)), _rs(_trials(trials, True))
    return abs(_mean(fixed)) <= FIXED, {"r_mean": _mean(fixed), "r_abs": abs(_mean(fixed)),
                                        "r_abs_max": max(abs(r) for r in fixed),
                                        "removed_fraction": 1 - abs(_mean(fixed)) / abs(_mean(base))}


def fix_keeps_training(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """Training with the fix reaches the same held-out loss, no step non-finite in either arm (it changes the rounding, not the maths).

    A sanity check where neither arm diverges (the smoke size). Where the baseline itself has
    non-finite steps (the paper's failure regime) the two losses are not comparable: not judged
    then, but the fixed arm must still be finite."""
    base, fixed = _trials(trials, False), _trials(trials, True)
    a = sum(t["eval/loss"] for t in base) / len(base)
    b = sum(t["eval/loss"] for t in fixed) / len(fixed)
    rel = abs(b - a) / a
    measured = {"loss_baseline": a, "loss_fixed": b, "relative_gap": rel}
    if not all(t["train/nonfinite_steps"] == 0 for t in fixed):
        return False, measured
    if not all(t["train/nonfinite_steps"] == 0 for t in base):
        return None, measured
    return rel < SAME_LOSS, measured


CLAIMS = [baseline_is_biased, fix_removes_bias]
CHECKS = [fix_keeps_training]


# -- the bench size: the paper's stabilisation claim ---------------------------------------------

STABILIZED = 0.5
"""The bench claims' threshold on `stabilized`, the per-seed difference baseline-diverged minus
fix-diverged (1: the baseline diverged and the fix did not; 0: both or neither; -1: the reverse).

Rule, written before any bench run: the paper's claim is categorical (BF16 training explodes, the
fix trains), so the claim holds when the mean of that 0/1 difference is above one half with its
whole 95% interval, i.e. the baseline diverges and the fix does not at (nearly) every seed; it is
a share of seeds, not a scalar whose noise needs calibrating. What counts as diverged is
`diverged`, whose one number (SPIKE_RATIO = 1.5, the issue's "loss > 1.5x its running min") was
also fixed before any run. Seeds 100-101 of the exploration, run after the rule was written
(docs/reproductions/lowprec_attention.bench.notes.md), measured no divergence of the baseline at
any setting a CPU runs in minutes, and the paper's fix diverging (non-finite) at lr >= 3e-2 and,
at the bench setting (seed 100), at lr 1e-2."""


def diverged(t: dict[str, Any]) -> bool:
    """A run diverged: a non-finite loss at some step, or its last logged loss ended more than
    SPIKE_RATIO (1.5x) above the lowest step loss it had reached (a loss that left its running
    minimum and did not come back: the paper's explosion, not noise around the minimum)."""
    from workloads.lowprec_attention.workload import SPIKE_RATIO

    loss, low = t["train/loss"], t["train/loss_min"]
    finite = t["train/nonfinite_steps"] == 0 and loss == loss and abs(loss) != float("inf")
    return not finite or loss > SPIKE_RATIO * low


def _arm(trials: list[dict[str, Any]], rule: str | None) -> dict[str, Any]:
    """The bench trial of one arm: rule None is the baseline, else the fix with that shift rule."""
    found = [t for t in trials if (not t["stable_rounding"] if rule is None
                                   else bool(t["stable_rounding"]) and t["stable_rule"] == rule)]
    if len(found) != 1:
        raise LookupError(f"expected one trial with fix rule {rule!r}, found {len(found)} among "
                          f"{[(t['stable_rounding'], t['stable_rule']) for t in trials]}")
    return found[0]


def _stability(base: dict[str, Any], fix: dict[str, Any]) -> tuple[bool, dict[str, float]]:
    d_base, d_fix = diverged(base), diverged(fix)
    measured = {"stabilized": float(d_base) - float(d_fix), "baseline_diverged": float(d_base),
                "fix_diverged": float(d_fix)}
    for name, t in (("baseline", base), ("fix", fix)):
        measured.update({f"{name}_loss": t["train/loss"], f"{name}_loss_min": t["train/loss_min"],
                         f"{name}_eval_loss": t["eval/loss"], f"{name}_nonfinite_steps": t["train/nonfinite_steps"],
                         f"{name}_loss_spikes": t["train/loss_spikes"], f"{name}_loss_jump": t["train/loss_jump"],
                         f"{name}_weight_norm_growth": t["train/weight_norm_growth"],
                         f"{name}_qk_spectral_growth": t["train/qk_spectral_growth"],
                         f"{name}_attn_logit_max": t["train/attn_logit_max"]})
    return d_base and not d_fix, measured


@claim("stabilized", at_least=STABILIZED,
       paper="BF16 flash-attention training of GPT-2 small explodes (loss blows up after tens of thousands of steps) "
             "and the paper's minimal modification (beta = 2 shift of a tied row max) stabilizes it; no loss number "
             "in the notes",
       threshold_from="ours: a share of seeds above 1/2 of a 0/1 per-seed difference (rule in STABILIZED's "
                      "docstring), set before any bench run")
def fix_stabilizes_training(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """In bf16 with bf16 row statistics, the baseline's training diverges and the paper's fix (beta*m / 0) does not."""
    return _stability(_arm(trials, None), _arm(trials, "paper"))


@claim("stabilized", at_least=STABILIZED,
       paper="the same claim for the kernels' bounded shift, a variant of the paper's fix that cannot underflow "
             "(the paper's README: NaN -> decrease beta)",
       threshold_from="ours: as fix_stabilizes_training (STABILIZED), set before any bench run")
def bounded_fix_stabilizes_training(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """In bf16 with bf16 row statistics, the baseline's training diverges and the bounded fix's does not."""
    return _stability(_arm(trials, None), _arm(trials, "bounded"))


def bench_arms_ran(trials: list[dict[str, Any]]) -> tuple[bool, dict[str, float]]:
    """The bench ran its three arms at one seed in bf16 with bf16 row statistics, each reporting its stability metrics."""
    arms = [_arm(trials, rule) for rule in (None, "paper", "bounded")]
    keys = ("train/loss_min", "train/loss_spikes", "train/weight_norm_growth", "train/qk_spectral_growth",
            "train/attn_logit_max")
    ok = all(t["dtype"] == "bf16" and t["precision"] == "paper" and all(k in t for k in keys) for t in arms)
    return ok, {"arms": float(len(arms))}


# The bias claims judge the same statistic at the bench size (8 input sets a seed, as at smoke);
# the stabilisation claim, the paper's headline, comes first.
BENCH_CLAIMS = [fix_stabilizes_training, bounded_fix_stabilizes_training, baseline_is_biased, fix_removes_bias]
BENCH_CHECKS = [bench_arms_ran]


def plot(trials: list[dict[str, Any]], path: str | Path) -> None:
    """The error-bias statistic per input set, a bar group per variant, with the claim's thresholds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    order = sorted(trials, key=lambda t: (t["precision"], bool(t["stable_rounding"])))
    width = 0.8 / max(1, len(order))
    for j, t in enumerate(order):
        rs = _rs(t)
        label = f"{t['precision']} {t['dtype']}" + (", fix" if t["stable_rounding"] else "")
        ax.bar([i + j * width for i in range(len(rs))], rs, width=width, label=label)
    for y in (BIASED, -BIASED):
        ax.axhline(y, color="grey", lw=0.8, ls="--")
    for y in (FIXED, -FIXED):
        ax.axhline(y, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="input set (seed)", ylabel="mean(err) / std(err)", title="flash attention error bias, tied maxima")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
