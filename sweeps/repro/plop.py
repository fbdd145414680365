"""Reproduce plop's claims: NFN scores on the pretrained base vs a random init of the same
architecture, their stability over two disjoint samples, and PLoP's placement against
the usual placements (attention-only, MLP-only and all modules) at exactly equal trainable
parameters.

Smoke: tiny-local, every built-in task (mul_mod and sub_mod, new arithmetic operations, the analogue
of the paper's math fine-tuning; attr_query and fact_query, a new question form over knowledge the
base holds, the analogue of its commonsense QA), the four placements at one seed: 16 trials of
about 5 s each on an idle 2-core machine (each task adds 4 trials, the all-modules arm one per
task); the workload's test runs one task of one seed to stay within CI's time. Full: a real checkpoint (`PLOP_BASE`, a local
save_pretrained folder or a hub id already in the local cache; default Qwen/Qwen3-0.6B, one of
the paper's models) through the same code, every task, PLoP^-1 as well, five seeds. The paper's
own SFT data (MetaMathQA -> GSM8K, CommonsenseQA) on its models: sweeps/repro/plop_real.py.
"""

import os

from orchestrator.sweep import Sweep, grid, seeds

SMOKE_PLACEMENTS = ("plop", "attention", "mlp", "all")
"""PLoP against the three usual placements the headline compares it with."""
FULL_PLACEMENTS = ("plop", "plop_inverse", "attention", "mlp", "all")
FULL_TASKS = ("mul_mod", "attr_query", "fact_query", "sub_mod")
FULL_SEEDS = 5


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(
            name="plop_repro_smoke", workload="plop", base="smoke",
            overrides={"seed": seed, "matched": SMOKE_PLACEMENTS},
            space={"task": grid(*FULL_TASKS), "placement": grid(*SMOKE_PLACEMENTS)}, objective=("eval/acc", "max"),
        )
    return Sweep(
        name="plop_repro", workload="plop", base="default",
        overrides={"base": os.environ.get("PLOP_BASE", "Qwen/Qwen3-0.6B"), "dtype": "bfloat16", "rank": 16,
                   "lr": 2e-4, "batch": 16, "steps": 1000, "matched": FULL_PLACEMENTS},
        space={"task": grid(*FULL_TASKS), "placement": grid(*FULL_PLACEMENTS), "seed": seeds(FULL_SEEDS, start=seed)},
        objective=("eval/acc", "max"),
    )


sweep = build()
