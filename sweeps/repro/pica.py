"""Reproduce pica's claims: PiCa with the column space of each weight vs a random subspace of the
same rank (the same parameter count), and PiCa vs LoRA at the LoRA rank whose trainable count is
nearest PiCa's (PiSSA, the SVD-initialised LoRA, as well at full size), over three trial seeds, each
PiCa trial also measuring the exact properties (merge, span, shared gradient, count vs depth) on its
trained model.

Smoke: tiny-local (built once, reused), r = 8 of 64 (the paper's r / d = 256 / 2048) on q, k, v, up,
down, the paper's lr 1e-3 with its warm-up and cosine decay, 200 steps, the `qa` task (a question
format pre-training never used, about attributes it learnt, held out by entity). Full: a real
checkpoint through the same code, the paper's recipe (r = 32, lr 1e-3, cosine with 10% warm-up,
batch 64); point `FULL_BASE` (or $LADDER_PICA_BASE) at a hub id or a local save_pretrained folder.
"""

import os

from orchestrator.sweep import Sweep, seeds

SEEDS = 3
"""Trial seeds per subspace (the quality claim is a mean over them); the base model's seed stays fixed."""
FULL_BASE = os.environ.get("LADDER_PICA_BASE", "meta-llama/Llama-3.1-8B")
"""The full-size base model."""
SMOKE = {"rank": 8, "steps": 200, "batch": 32, "lr": 1e-3, "warmup_frac": 0.1, "eval_every": 100, "log_every": 50,
         "check_examples": 64, "count_depths": (1, 2, 4, 16)}
"""The smoke reproduction on top of pica's smoke(): more steps than the contract's smoke."""


SMOKE_ARMS = ({"method": "pica", "subspace": "column"}, {"method": "pica", "subspace": "random"}, {"method": "lora"})
"""The smoke's arms: PiCa on the column space, on a random subspace (the ablation), and LoRA at the
matched rank (r = 1: 3200 trainable against PiCa's 2944 at r = 8 on tiny-local). PiSSA only at full
size, keeping the smoke at about a minute."""
FULL_ARMS = SMOKE_ARMS + ({"method": "pissa"},)


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    space = {"seed": seeds(SEEDS, start=seed)}
    if smoke:
        return Sweep(name="pica_repro_smoke", workload="pica", base="smoke", overrides=SMOKE,
                     points=SMOKE_ARMS, space=space, objective=("eval/loss", "min"))
    return Sweep(
        name="pica_repro", workload="pica", base="default",
        overrides={"base": FULL_BASE, "task": "mul", "modulus": 97, "dtype": "bfloat16", "threads": 0,
                   "count_depths": (1, 2, 8, 32, 64)},
        points=FULL_ARMS, space=space, objective=("eval/loss", "min"),
    )


sweep = build()
