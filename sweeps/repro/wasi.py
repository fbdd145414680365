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
digits with ten seeds in one build (the accuracy gap is then their mean). The bench size is the
smoke's model and data fine-tuned until vanilla has converged (`BENCH_SIZE`), for the accuracy
claim a minute cannot settle: `ladder reproduce wasi --size bench` (3 seeds).
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
BENCH_STEP_CHOICES = (1600, 3200)
BENCH_STEP_RULE = 0.25
"""The bench size: the smoke's model and data, fine-tuned until vanilla has converged, the paper's
setting for its accuracy claim (50 epochs). Its fine-tuning steps by a rule written before any
bench run, on calibration seeds 100-102 only: of BENCH_STEP_CHOICES, the larger if vanilla's mean
test accuracy there rises by at least BENCH_STEP_RULE points from the smaller to the larger (vanilla
has not converged at the smaller), else the smaller. Measured: see BENCH_SIZE."""
BENCH_SIZE = {"pretrain_steps": 300, "finetune_steps": 3200, "time_rounds": 12}
"""The bench size (BENCH_STEP_RULE). Measured on seeds 100-102 (smoke config, AdamW, test accuracy %):

    steps  vanilla per seed        mean    WASI per seed           mean
    1600   97.43, 96.90, 97.82     97.39   97.41, 95.70, 97.55     96.88
    3200   97.99, 97.38, 97.88     97.75   97.10, 96.82, 97.77     97.23

Vanilla rises 0.36 points from 1600 to 3200 (>= 0.25): 3200 steps, four times the smoke's. A
trial takes about 2-3 minutes on one loaded core, so three seeds (six trials) about 10-20 minutes."""
RANK_POINTS = tuple({"method": "wasi", "threshold": t} for t in (0.5, 0.6, 0.7, 0.9, 0.95))
"""Full size: WASI trained at other thresholds (first seed only)."""


def build(*, size: str = "full", seed: int = 0) -> Sweep:
    arms = ({"method": "vanilla"}, CLAIMED)
    n = FULL_SEEDS if size == "full" else SMOKE_SEEDS  # bench: one seed a build, as smoke; --seeds 3 runs three
    points = tuple({**arm, "seed": s} for s in range(seed, seed + n) for arm in arms)
    if size == "full":
        points += tuple({**p, "seed": seed} for p in RANK_POINTS)
    overrides = {"smoke": SMOKE_SIZE, "bench": BENCH_SIZE, "full": {}}[size]
    return Sweep(
        name=f"wasi_repro_{size}",
        workload="wasi",
        base="default" if size == "full" else "smoke",
        overrides=overrides,
        points=points,
        objective=("eval/acc", "max"),
    )


sweep = build()
