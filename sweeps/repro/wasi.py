"""Reproduce WASI's claims: vanilla fine-tuning against WASI of the same pretrained ViT, paired by
seed (same split, pretrained model, head and batch order), on scikit-learn's digits.

Every trial measures, on one training step, the peak memory of the whole step, the bytes autograd
saves for the backward and the step's flops; a WASI trial also times its training and inference
steps against its dense twin (same weights, same batch, interleaved in one process) and probes
(measures without training) the same step at other weight thresholds and activation ranks, the
memory-vs-rank curve of the claim plot. The claims judge the WASI configurations run at every
seed; `RANK_POINTS` (full size only) are trained at one seed each to show accuracy against rank
and are plotted, not judged.

`ladder reproduce wasi --smoke --seed N` runs seed N: the seed pretrains its own model and
fine-tunes it vanilla and with WASI, so the claims compare the two paired within the seed. One
seed of a ~450-image test set is too noisy to judge the 1-point accuracy claim on: run
`--seeds K` (K builds, seeds N to N+K-1), and ladder judges each claim's per-seed effect across
them with a 95% interval. Seeds that share one pretrained model (`pretrain_seed`) have strongly
correlated gaps, so each seed pretrains its own. The full size is the larger model on 16x16
digits with ten seeds in one build (the accuracy gap is then their mean).
"""

from __future__ import annotations

from orchestrator.sweep import Sweep

SMOKE_SEEDS = 1
FULL_SEEDS = 10
CLAIMED = {"method": "wasi"}
"""The judged WASI configuration: the base config's threshold and activation ranks."""
SMOKE_SIZE = {"pretrain_steps": 300, "finetune_steps": 800, "time_rounds": 12}
"""The reproduction's smoke trials train longer than smoke(), which only has to exercise the loop.

finetune_steps by a rule written before the 800-step results were seen, on seeds 100-104 only
(never the judged seeds 0-4): of {400, 800} (1600 would break the ~1 minute per seed budget),
800 if WASI's mean test accuracy rises by >= 0.5 points from 400 to 800 steps (WASI not yet
converged at 400), else 400. Measured (smoke config, AdamW, test accuracy %, seeds 100-104):

    steps  WASI mean  vanilla mean  paired gaps (vanilla - WASI), points        mean gap
    400    96.19      96.70         0.92, 0.95, 0.17, 0.75, -0.22               0.51
    800    96.88      97.46         0.75, 1.26, 0.39, 0.36, 0.11                0.57

WASI gains 0.69 points from 400 to 800 (vanilla 0.75): 800. The gap does not close with more
steps, as vanilla improves as much: see docs/reproductions/wasi.notes.md. (The former 400 steps
were chosen on seeds 0-9, which include the judged seeds 0-4.)"""
RANK_POINTS = tuple({"method": "wasi", "threshold": t} for t in (0.5, 0.6, 0.7, 0.9, 0.95))
"""Full size: WASI trained at other thresholds (first seed only)."""


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    arms = ({"method": "vanilla"}, CLAIMED)
    n = SMOKE_SEEDS if smoke else FULL_SEEDS
    points = tuple({**arm, "seed": s} for s in range(seed, seed + n) for arm in arms)
    if not smoke:
        points += tuple({**p, "seed": seed} for p in RANK_POINTS)
    return Sweep(
        name="wasi_repro_smoke" if smoke else "wasi_repro",
        workload="wasi",
        base="smoke" if smoke else "default",
        overrides=SMOKE_SIZE if smoke else {},
        points=points,
        objective=("eval/acc", "max"),
    )


sweep = build()
