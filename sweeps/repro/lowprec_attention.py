"""Reproduction of "Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention":
the error bias of bf16 flash attention on tied row maxima, with and without the paper's fix, and
a low-precision training run of each.

The smoke size measures the bias with the emulating reference and trains a tiny decoder. The
full size is the paper's setting a GPU cluster runs: a GPT-2-small-shaped decoder (width 768,
12 blocks, 1024-byte context) trained 20k steps in bf16 with the Triton kernel (`impl="auto"`
picks it on CUDA), baseline against fix, three seeds; point `data` at a real corpus. The Triton
kernel keeps its row statistics in fp32, as FA-2 does, and the bias statistic measured here
needs them in bf16 (precision="paper"): whether FA-2-style training still diverges is what
that run answers, not something this file assumes.
"""

from orchestrator.sweep import Sweep, grid, seeds

VARIANTS = ({"stable_rounding": False}, {"stable_rounding": True})


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(name="lowprec_attention", workload="lowprec_attention", base="smoke",
                     overrides={"seed": seed, "bias_seeds": 8, "steps": 80, "eval_every": 40, "checkpoint_every": 40},
                     points=VARIANTS, objective=("eval/loss", "min"))
    return Sweep(name="lowprec_attention", workload="lowprec_attention", base="default",
                 points=VARIANTS, space={"seed": seeds(3, start=seed)}, objective=("eval/loss", "min"))


sweep = build()
