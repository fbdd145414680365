"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

celerity_lm: a GPT-style byte-level decoder in the Celerity family's shape (pre-LN, untied
readout, fixed head dimension), parameterized for hyperparameter transfer across width (muP) and
depth (CompleteP), trained with AdamW, linear warmup then linear decay to zero, for a token
budget of `tpp` tokens per non-embedding parameter. It reports `train/loss`, `eval/loss` on a
fixed held-out set, `progress` (tokens seen over the budget), the AdamW timescale `tau` =
B/(eta * lambda * D) and `tpp`: the controls under which loss curves of a family collapse.
Under Ray Train its workers train with DDP, or with a DeepSpeed ZeRO engine (`zero_stage`).
The returned metrics carry the held-out curve as `curve/eval_loss/<fraction>`.

The claims: tau, not size, sets the normalized curve's shape; a recipe family at matched tau and
TPP collapses onto one normalized curve; a member's final loss is predicted from a prefix of its
curve and the others' collapsed curve.
"""

from workloads.celerity_lm.claims import BENCH_CHECKS, BENCH_CLAIMS, CHECKS, CLAIMS, plot
from workloads.celerity_lm.workload import (
    CURVE_PREFIX, Budget, Config, budget, build, preflight, smoke, train, validate,
)

__all__ = ["BENCH_CHECKS", "BENCH_CLAIMS", "CHECKS", "CLAIMS", "CURVE_PREFIX", "Budget", "Config", "budget", "build", "plot", "preflight", "smoke",
           "train", "validate"]
