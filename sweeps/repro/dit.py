"""Reproduce DIT's claims: rank-1 weight diffs plant trigger-gated topics, and a DIT adapter trained
on some of them names the topic of new diffs, far above asking without it, while naming no
consistent topic when no diff is applied.

One trial is the whole experiment. The smoke size runs on tiny-local: 60 seen topics and 3
unseen ones (the world has 63 topic words), one training diff per seen topic, 30 new diffs on
seen topics and 3 per unseen topic: 99 rank-1 diffs on all 28 linears, trained together in one
batched pass for 150 steps, then 100 adapter steps (about 25 s of one CPU core). The full size
is the same code on a real checkpoint: `LADDER_DIT_BASE` names it (a save_pretrained folder or a
hub id, default Qwen/Qwen3-1.7B), in bfloat16 with the paper's optimiser settings, 8 training
diffs per topic and 3 seeds; it needs a GPU.
"""

import os

from orchestrator.sweep import Sweep, seeds

SMOKE = {"train_diffs_per_topic": 1, "diff_steps": 150, "heldout_diffs": 30, "dit_steps": 100, "log_every": 25}
FULL_SEEDS = 3
FULL = {
    "base": os.environ.get("LADDER_DIT_BASE", "Qwen/Qwen3-1.7B"), "dtype": "bfloat16",
    "train_diffs_per_topic": 8, "heldout_diffs": 120, "triggers": 64, "max_context_words": 6,
    "eval_contexts": 32, "diff_init_scale": 1.0, "diff_lr": 1e-3, "diff_steps": 200, "diffs_per_batch": 64,
    "dit_rank": 16, "dit_alpha": 32.0, "dit_lr": 1e-4, "dit_steps": 2000, "dit_batch": 8, "eval_batch": 256,
    "threads": 0,
}


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(name="dit_repro_smoke", workload="dit", base="default", overrides={**SMOKE, "seed": seed},
                     objective=("eval/dit_acc_heldout", "max"))
    return Sweep(name="dit_repro", workload="dit", base="default", overrides=FULL,
                 space={"seed": seeds(FULL_SEEDS, start=seed)}, objective=("eval/dit_acc_heldout", "max"))


sweep = build()
