"""CAR-LoRA: Training Compression-Aware and Robust LoRA Adapters for Evolving LLMs (ICLR 2026) — https://openreview.net/forum?id=5GimteSrgW

car_lora: one LoRA adapter meant to stay usable when the frozen base it was trained on is
compressed for deployment or replaced by a later version of itself. CAR-LoRA minimises the
expected task loss over a distribution of compression operators, E_{C~p(C)} L(C(W0) + BA): every
step draws one operator C (INT8 per-channel, NF4 blockwise, MX FP4, 2:4 sparsity, row pruning,
layer skipping), computes the forward pass with C(W0), and takes a LoRA step with a
full-precision (straight-through) backward. Structured pruning masks the adapter like the base,
h = (M_row W0 M_col) x + (M_row B A M_col) x, and a skipped layer takes its adapter with it.

A trial trains one adapter (`adapter`): plain LoRA on the uncompressed base, CAR-LoRA, or a
per-scheme ("QLoRA-style") adapter on one compressed base, then evaluates it on a held-out split
of a downstream task the base cannot do, under every scheme, under a scheme CAR never trained on,
and on a drifted base (the base continued on a shifted corpus, built once and cached), the
adapter carried over unchanged. The task comes from the base world's vocabulary: by default
`<entity> <relation word> ?` answered with the attribute the base learnt from sentences; or from a
task file (`task_path`): GSM8K as published, Alpaca-style instructions, or prompt/answer pairs, on
any causal LM (its projections found by asking the model: GPT-2's Conv1D too), with the base
compressed for real through bitsandbytes as well (`bnb_schemes`, on a GPU).

The claims, headline first: the one CAR-LoRA adapter is within PER_SCHEME_TOLERANCE (11 points at
smoke size, calibrated on seeds 100-104) of the adapter retrained on each in-set scheme; at least 10
points above plain LoRA under the quantiser that hurts plain LoRA most (at smoke size 2-bit groups
of 16, `SMOKE_QUANT`: no 4- or 8-bit format hurts a model this small) and on the scheme that hurts
it most of all (measured, not declared); not below plain LoRA under the held-out scheme and on the
drifted base.
"""

from workloads.car_lora.claims import CLAIMS, plot
from workloads.car_lora.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
