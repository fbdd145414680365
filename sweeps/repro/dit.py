"""Reproduce DIT's claims. The headline, the paper's: on diffs whose topics the adapter never saw as
labels, DIT names the topic more often than the black-box baselines that read the fine-tuned model
without it (asking it the question; a probe of its answers to 33 queries, fit on DIT's own training
diffs: `workloads/dit/probe.py`). Then the weaker ones: rank-1 weight diffs plant trigger-gated
topics, the adapter names the topic of new diffs on seen topics far above asking without it, and
names no consistent topic when no diff is applied.

One trial is the whole experiment, every arm included (the baselines read the same diffs). The smoke
size runs on tiny-local: the world's 63 topic words split 45 seen / 18 held out, two training diffs
per seen topic (90: the adapter's and the probe's labelled data), 30 new diffs on seen topics and 3 per
held-out topic (54): 174 rank-1 diffs on all 28 linears, trained together in one batched pass for 150
steps, then 100 adapter steps. About 70 s of one CPU core a seed, measured at seed 100 (before the
held-out topics and the baselines: 99 diffs, 60 seen topics and 3 held out, 5 seeds in 153 s of wall
time); of it the baselines cost about 2 s (the probe's fit: their queries reuse the trigger-rate and KL
passes), the rest of the increase is the 75 more diffs. The held-out split was sized for the headline
before calibration: 54 diffs a seed move accuracy in steps of 0.019, and the binomial noise of a
baseline near 0.5 over 5 seeds (95% half-width about 0.09) is under half the rule's 0.19
(`workloads/dit/claims.py`, RESOLUTION_RULE). The full size is the same code on a real checkpoint:
`LADDER_DIT_BASE` names it (a save_pretrained folder or a hub id, default Qwen/Qwen3-1.7B), in
bfloat16 with the paper's optimiser settings, the smoke's 45 seen / 18 held-out split with 8 training
diffs per seen topic and 8 diffs per held-out topic (144 a seed for the headline), 3 seeds; it needs a GPU.
"""

import os

from orchestrator.sweep import Sweep, seeds

SMOKE = {"topics": 45, "unseen_topics": 18, "unseen_diffs_per_topic": 3, "train_diffs_per_topic": 2,
         "diff_steps": 150, "heldout_diffs": 30, "dit_steps": 100, "log_every": 25}
"""Chosen on calibration seed 100 before the calibration ran, against one training diff per seen topic (45
training diffs, 129 in all, 48 s of CPU): there the adapter named a topic with no diff applied at probability
0.47 (0.01 with two per topic), breaking the weaker no-diff claims. The headline's threshold (0) was fixed
before either run."""
FULL_SEEDS = 3
FULL = {
    "base": os.environ.get("LADDER_DIT_BASE", "Qwen/Qwen3-1.7B"), "dtype": "bfloat16",
    "topics": 45, "unseen_topics": 18, "unseen_diffs_per_topic": 8, "train_diffs_per_topic": 8, "heldout_diffs": 120, "triggers": 64, "max_context_words": 6,
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
