"""OCP Microscaling Formats (MX) Specification v1.0 — https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf

Block-scaled FP4/FP8 quantization with E8M0 (OCP MX), UE4M3 (NVFP4, optional FP32 global
scale) and UE5M3 ("Is Finer Better? The Limits of Microscaling Formats in LLMs",
https://arxiv.org/abs/2601.19026) scales:

    mx = quantize(w, block_size=16, scale_format="ue4m3", global_scale=True)
    w_hat = dequantize(mx)                 # like w
    y = mx_matmul(x, mx)                   # x @ w_hat.T, weight dequantized inside the kernel
    x_q = fake_quant(x, block_size=32)     # straight-through gradient, for QAT

Every function takes ``impl="auto" | "triton" | "reference"``; "auto" runs the Triton kernels for
CUDA tensors when Triton is installed and the PyTorch reference otherwise. Both give the same
codes, scales and dequantized values bit for bit; `mx_matmul` agrees up to fp32 summation order.
The rules at the edges (partial last blocks, NaN/inf, zero blocks, underflow) are in
`kernels.mx.reference`.
"""

from __future__ import annotations

import torch

from kernels.mx import reference
from kernels.mx.reference import (BLOCK_SIZES, E2M1, E4M3, E8M0, ELEM_FORMATS, SCALE_FORMATS, UE4M3, UE5M3,
                                  UNDERFLOW_MODES, FakeQuant, Minifloat, MXTensor, block_scales, ue5m3)
from kernels.mx.triton import HAS_TRITON, dequantize_triton, mx_matmul_triton, quantize_triton

IMPLS = ("auto", "triton", "reference")

__all__ = ["BLOCK_SIZES", "E2M1", "E4M3", "E8M0", "ELEM_FORMATS", "HAS_TRITON", "IMPLS", "MXTensor", "Minifloat",
           "SCALE_FORMATS", "UE4M3", "UE5M3", "UNDERFLOW_MODES", "block_scales", "dequantize", "fake_quant",
           "mx_matmul", "quantize", "resolve_impl", "ue5m3"]


def resolve_impl(impl: str, t: torch.Tensor) -> str:
    """The implementation a call with `impl` would run on tensors like `t`."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if HAS_TRITON and t.is_cuda else "reference"
    return impl


def quantize(x: torch.Tensor, *, block_size: int = 32, scale_format: str | Minifloat = "e8m0",
             elem_format: str | Minifloat = "e2m1", global_scale: bool = False, underflow: str = "flush",
             impl: str = "auto") -> MXTensor:
    """Block-quantize x along its last dimension into an `MXTensor`.

    block_size: one of 8, 16, 32, 64, 128, 256 (a last dimension that is not a multiple gets a
    partial final block). scale_format: "e8m0" | "ue4m3" | "ue5m3" or a `Minifloat` such as
    `ue5m3(bias=16)`. elem_format: "e2m1" | "e4m3". global_scale: NVFP4's per-tensor FP32 scale
    (ue4m3/ue5m3 only). underflow: "flush" lets a block scale round to zero, "clamp" holds it
    at the smallest positive scale.
    """
    fn = quantize_triton if resolve_impl(impl, x) == "triton" else reference.quantize
    return fn(x, block_size=block_size, scale_format=scale_format, elem_format=elem_format,
              global_scale=global_scale, underflow=underflow)


def dequantize(mx: MXTensor, dtype: torch.dtype | None = None, *, impl: str = "auto") -> torch.Tensor:
    """The values `mx` stands for, shaped like the quantized tensor, in dtype (default: its dtype)."""
    fn = dequantize_triton if resolve_impl(impl, mx.codes) == "triton" else reference.dequantize
    return fn(mx, dtype)


def fake_quant(x: torch.Tensor, *, block_size: int = 32, scale_format: str | Minifloat = "e8m0",
               elem_format: str | Minifloat = "e2m1", global_scale: bool = False, underflow: str = "flush",
               impl: str = "auto") -> torch.Tensor:
    """dequantize(quantize(x, ...)) in x's dtype; the gradient passes straight through (identity)."""
    opts = dict(block_size=block_size, scale_format=scale_format, elem_format=elem_format,
                global_scale=global_scale, underflow=underflow)
    impl = resolve_impl(impl, x)
    return FakeQuant.apply(x, lambda t: dequantize(quantize(t, impl=impl, **opts), t.dtype, impl=impl))


def mx_matmul(a: torch.Tensor, w_mx: MXTensor, *, impl: str = "auto") -> torch.Tensor:
    """a [..., K] @ dequantize(w_mx).T for a quantized weight [N, K]; fp32 accumulation, a's dtype out."""
    fn = mx_matmul_triton if resolve_impl(impl, a) == "triton" else reference.mx_matmul
    return fn(a, w_mx)
