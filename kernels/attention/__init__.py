"""Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention (Qiu & Yao, 2025) — https://arxiv.org/abs/2510.04212

`flash_attention(q, k, v, *, causal, stable_rounding, impl)`: differentiable FlashAttention-2
over [B, H, T, D] with the paper's rounding-bias fix behind ``stable_rounding``. ``impl="auto"``
takes the Triton kernel for CUDA tensors when Triton is installed and the emulating reference
otherwise; both round in the same places (fp32 statistics, P rounded to the input dtype before
the P V product, the row sum adding that same rounded P). The bf16-everywhere arithmetic of the paper's own code, in which the bias
shows, is `reference.flash_attention_reference(..., precision="paper")`.
"""

from __future__ import annotations

import torch

from kernels.attention.reference import (STABLE_BETA, STABLE_CAP, STABLE_CAP_FP16, STABLE_RULES, TIE_TOL,
                                         attention_fp64, error_bias, flash_attention_reference, graded_tied_inputs,
                                         stable_cap_for, stable_rule, tied_max_inputs)
from kernels.attention.triton import HAS_TRITON, flash_attention_triton

IMPLS = ("auto", "triton", "reference")

__all__ = ["HAS_TRITON", "IMPLS", "STABLE_BETA", "STABLE_CAP", "STABLE_CAP_FP16", "STABLE_RULES", "TIE_TOL",
           "stable_cap_for", "stable_rule", "attention_fp64", "error_bias", "flash_attention",
           "flash_attention_reference", "flash_attention_triton", "graded_tied_inputs", "resolve_impl",
           "tied_max_inputs"]


def resolve_impl(impl: str, q: torch.Tensor) -> str:
    """The implementation `flash_attention` would run for `impl` on tensors like `q`."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if HAS_TRITON and q.is_cuda else "reference"
    return impl


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    stable_rounding: bool | str = False, impl: str = "auto") -> torch.Tensor:
    """softmax(Q K^T / sqrt(D)) V over q [B, H, Tq, D], k and v [B, H, Tk, D]; output like q.

    causal masks key j > query i (top-left aligned). stable_rounding shifts a tile's row max
    when it is attained more than once, so that no probability is exactly 1 (same maths, no
    coherent bf16 rounding): True or "bounded" with a shift below `STABLE_CAP` (8; fp16:
    `STABLE_CAP_FP16` = 4 ln 2, so that probabilities within 2^-10 of a row's maximum stay fp16
    normals), "paper" with the paper's unbounded beta * m / 0 (NaN for tied maxima beyond ~|17| in
    fp16, ~|93| in bf16 and ~|104| in fp32; see `reference`). impl: "auto" | "triton" | "reference".
    """
    if resolve_impl(impl, q) == "triton":
        return flash_attention_triton(q, k, v, causal=causal, stable_rounding=stable_rounding)
    return flash_attention_reference(q, k, v, causal=causal, stable_rounding=stable_rounding)
