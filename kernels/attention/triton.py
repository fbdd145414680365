"""Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention (Qiu & Yao, 2025) — https://arxiv.org/abs/2510.04212

FlashAttention-2 forward and backward in Triton, with the paper's rounding-bias fix behind
``stable_rounding``. The arithmetic is the "kernel" precision of `reference.py`: scores, running
max, row sum and accumulators in fp32; P rounded to the input dtype right before the P V
product, dS right before the dQ and dK products; O, dQ, dK, dV rounded once when stored. The
fix is one compare and one row reduction per tile (see `reference.py` for the rule); the
backward is unchanged, as it only reads the LSE, which the fix leaves as it is.

Scores are kept in log2 units (scale * log2 e folded into one multiply) so that the exponential
is a bare exp2; the fix is homogeneous in the score, so only its tolerance needs converting.

Under TRITON_INTERPRET=1 (CPU), the interpreter truncates fp32 -> bf16 casts instead of rounding
to nearest even, and multiplies bf16 matrices as raw 16-bit integers. So, interpreted, bf16
rounding is done with integer bit arithmetic and the products are taken in fp32 on operands
already rounded to bf16, which is exact for the products and accumulates in fp32 like a tensor
core. On a GPU the plain casts and bf16 `tl.dot` are used.
"""

from __future__ import annotations

import math
import os

import torch

from kernels.attention.reference import STABLE_BETA, TIE_TOL

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised by a subprocess test
    triton = None
    tl = None
    HAS_TRITON = False

LOG2E = 1.4426950408889634
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# Triton decides interpreter or GPU when a kernel is decorated, i.e. when this module is imported;
# read the setting at the same moment so the launch options agree with that decision.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if HAS_TRITON:

    @triton.jit
    def _round(x, ROUND: tl.constexpr, DTYPE: tl.constexpr):
        """x (fp32) rounded to DTYPE and returned as fp32. ROUND: 0 none, 1 bf16 by bits, 2 cast."""
        if ROUND == 1:
            bits = x.to(tl.uint32, bitcast=True)
            bits = bits + 0x7FFF + ((bits >> 16) & 1)  # round to nearest, ties to even
            x = ((bits >> 16) << 16).to(tl.float32, bitcast=True)
        elif ROUND == 2:
            x = x.to(DTYPE).to(tl.float32)
        return x

    @triton.jit
    def _mm(a, b, DOT_FP32: tl.constexpr, DTYPE: tl.constexpr):
        """a @ b with fp32 accumulation; a and b hold values already representable in DTYPE."""
        if DOT_FP32:
            return tl.dot(a, b, input_precision="ieee")
        return tl.dot(a.to(DTYPE), b.to(DTYPE))

    @triton.jit
    def _fwd_kernel(Q, K, V, O, LSE,
                    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                    H, TQ, TK, D, qk_scale, tie_tol2, beta,
                    CAUSAL: tl.constexpr, STABLE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, ROUND: tl.constexpr, DOT_FP32: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        DTYPE = Q.dtype.element_ty
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q_ptrs = Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :]
        q = tl.load(q_ptrs, mask=(offs_m[:, None] < TQ) & d_ok[None, :], other=0.0).to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        hi = TK
        if CAUSAL:
            hi = tl.minimum(TK, (pid_m + 1) * BLOCK_M)
        for n0 in range(0, hi, BLOCK_N):
            cols = n0 + offs_n
            kv_ok = (cols[:, None] < TK) & d_ok[None, :]
            k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + offs_d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + offs_d[None, :], mask=kv_ok, other=0.0)
            s = _mm(q, tl.trans(k.to(tl.float32)), DOT_FP32, DTYPE) * qk_scale  # [BM, BN], log2 units
            valid = (cols[None, :] < TK) & (offs_m[:, None] >= 0)
            if CAUSAL:
                valid = valid & (offs_m[:, None] >= cols[None, :])
            s = tl.where(valid, s, float("-inf"))
            m_tile = tl.max(s, 1)
            if STABLE:
                ties = tl.sum((valid & (s >= m_tile[:, None] - tie_tol2)).to(tl.int32), 1) > 1
                shifted = tl.where(m_tile > 0, beta * m_tile, tl.where(m_tile < 0, 0.0, m_tile))
                m_tile = tl.where(ties, shifted, m_tile)
            m_new = tl.maximum(m_i, m_tile)
            # Rows with no valid key yet keep m = -inf; exponentiate against 0 so they give 0, not NaN.
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_ref[:, None])
            alpha = tl.math.exp2(m_i - m_ref)
            l_i = l_i * alpha + tl.sum(p, 1)
            p = _round(p, ROUND, DTYPE)
            acc = acc * alpha[:, None] + _mm(p, v.to(tl.float32), DOT_FP32, DTYPE)
            m_i = m_new
        out = _round(acc / l_i[:, None], ROUND, DTYPE)
        o_ptrs = O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :]
        tl.store(o_ptrs, out.to(DTYPE), mask=(offs_m[:, None] < TQ) & d_ok[None, :])
        tl.store(LSE + bh * TQ + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < TQ)  # log2 units

    @triton.jit
    def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                         sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                         H, TQ, TK, D, qk_scale, sm_scale,
                         CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, ROUND: tl.constexpr, DOT_FP32: tl.constexpr):
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        DTYPE = Q.dtype.element_ty
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        kv_ok = (offs_n[:, None] < TK) & d_ok[None, :]
        k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svt + offs_d[None, :], mask=kv_ok, other=0.0)
        k = k.to(tl.float32)
        v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        lo = 0
        if CAUSAL:
            lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
        for m0 in range(lo, TQ, BLOCK_M):
            rows = m0 + offs_m
            q_ok = (rows[:, None] < TQ) & d_ok[None, :]
            q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + offs_d[None, :], mask=q_ok, other=0.0)
            do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + offs_d[None, :], mask=q_ok, other=0.0)
            q = q.to(tl.float32)
            do = do.to(tl.float32)
            lse = tl.load(LSE + bh * TQ + rows, mask=rows < TQ, other=0.0)
            delta = tl.load(DELTA + bh * TQ + rows, mask=rows < TQ, other=0.0)
            s_t = _mm(k, tl.trans(q), DOT_FP32, DTYPE) * qk_scale  # [BN, BM]
            valid = (offs_n[:, None] < TK) & (rows[None, :] < TQ)
            if CAUSAL:
                valid = valid & (rows[None, :] >= offs_n[:, None])
            p_t = tl.where(valid, tl.math.exp2(s_t - lse[None, :]), 0.0)
            dv += _mm(_round(p_t, ROUND, DTYPE), do, DOT_FP32, DTYPE)
            dp_t = _mm(v, tl.trans(do), DOT_FP32, DTYPE)
            ds_t = _round(p_t * (dp_t - delta[None, :]), ROUND, DTYPE)
            dk += _mm(ds_t, q, DOT_FP32, DTYPE)
        dk = _round(dk * sm_scale, ROUND, DTYPE)
        dv = _round(dv, ROUND, DTYPE)
        tl.store(DK + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :], dk.to(DTYPE), mask=kv_ok)
        tl.store(DV + b * svb + h * svh + offs_n[:, None] * svt + offs_d[None, :], dv.to(DTYPE), mask=kv_ok)

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                       sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                       H, TQ, TK, D, qk_scale, sm_scale,
                       CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, ROUND: tl.constexpr, DOT_FP32: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        DTYPE = Q.dtype.element_ty
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q_ok = (offs_m[:, None] < TQ) & d_ok[None, :]
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=q_ok, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=q_ok, other=0.0)
        q = q.to(tl.float32)
        do = do.to(tl.float32)
        lse = tl.load(LSE + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        delta = tl.load(DELTA + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        hi = TK
        if CAUSAL:
            hi = tl.minimum(TK, (pid_m + 1) * BLOCK_M)
        for n0 in range(0, hi, BLOCK_N):
            cols = n0 + offs_n
            kv_ok = (cols[:, None] < TK) & d_ok[None, :]
            k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + offs_d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + offs_d[None, :], mask=kv_ok, other=0.0)
            k = k.to(tl.float32)
            s = _mm(q, tl.trans(k), DOT_FP32, DTYPE) * qk_scale
            valid = (cols[None, :] < TK) & (offs_m[:, None] < TQ)
            if CAUSAL:
                valid = valid & (offs_m[:, None] >= cols[None, :])
            p = tl.where(valid, tl.math.exp2(s - lse[:, None]), 0.0)
            dp = _mm(do, tl.trans(v.to(tl.float32)), DOT_FP32, DTYPE)
            ds = _round(p * (dp - delta[:, None]), ROUND, DTYPE)
            dq += _mm(ds, k, DOT_FP32, DTYPE)
        dq = _round(dq * sm_scale, ROUND, DTYPE)
        tl.store(DQ + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], dq.to(DTYPE), mask=q_ok)


def _launch_opts(dtype: torch.dtype) -> dict:
    interp = INTERPRETED
    if dtype == torch.float32:
        rnd = 0
    elif dtype == torch.bfloat16 and interp:
        rnd = 1
    else:
        rnd = 2  # fp16 casts round to nearest even in the interpreter too (numpy astype)
    # fp32 inputs need IEEE fp32 products (TF32 would round them); the interpreter needs them for bf16.
    return dict(ROUND=rnd, DOT_FP32=interp or dtype == torch.float32)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if not HAS_TRITON:
        raise RuntimeError("kernels.attention: Triton is not installed; use impl='reference' or install triton")
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k, v must be [B, H, T, D] and agree: {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES:
        raise ValueError(f"q, k, v must share one dtype of {DTYPES}; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError("kernels.attention: the Triton path needs CUDA tensors, or TRITON_INTERPRET=1 set before "
                           "kernels.attention is first imported (CPU interpreter)")


def triton_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   stable_rounding: bool = False, block_m: int = 64, block_n: int = 64, beta: float = STABLE_BETA,
                   tie_tol: float = TIE_TOL) -> tuple[torch.Tensor, torch.Tensor]:
    """(O in the input dtype, LSE [B, H, Tq] fp32 in natural log) for contiguous-last-dim q, k, v [B, H, T, D]."""
    _check(q, k, v)
    q, k, v = (x.contiguous() for x in (q, k, v))
    B, H, TQ, D = q.shape
    TK = k.shape[-2]
    out = torch.empty_like(q)
    lse2 = torch.empty(B, H, TQ, dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(D))
    grid = (triton.cdiv(TQ, block_m), B * H)
    _fwd_kernel[grid](q, k, v, out, lse2, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
                      H, TQ, TK, D, D ** -0.5 * LOG2E, tie_tol * LOG2E, beta,
                      CAUSAL=causal, STABLE=stable_rounding, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                      **_launch_opts(q.dtype))
    return out, lse2 * math.log(2.0)


def triton_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    dout: torch.Tensor, *, causal: bool = False, block_m: int = 64, block_n: int = 64
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in the input dtype, from the stored O and natural-log LSE of `triton_forward`."""
    _check(q, k, v)
    q, k, v = (x.contiguous() for x in (q, k, v))
    dout = dout.to(q.dtype).contiguous()
    B, H, TQ, D = q.shape
    TK = k.shape[-2]
    delta = (dout.float() * out.float()).sum(-1).contiguous()  # [B, H, TQ], FA-2's D = rowsum(dO * O)
    lse2 = (lse.float() * LOG2E).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    block_d = max(16, triton.next_power_of_2(D))
    args = (H, TQ, TK, D, D ** -0.5 * LOG2E, D ** -0.5)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3])
    opts = dict(CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, **_launch_opts(q.dtype))
    _bwd_dkdv_kernel[(triton.cdiv(TK, block_n), B * H)](q, k, v, dout, lse2, delta, dk, dv, *strides, *args, **opts)
    _bwd_dq_kernel[(triton.cdiv(TQ, block_m), B * H)](q, k, v, dout, lse2, delta, dq, *strides, *args, **opts)
    return dq, dk, dv


class FlashAttentionTriton(torch.autograd.Function):
    """`triton_forward` and `triton_backward` as one differentiable op."""

    @staticmethod
    def forward(ctx, q, k, v, causal, stable_rounding, block_m, block_n, beta, tie_tol):
        out, lse = triton_forward(q, k, v, causal=causal, stable_rounding=stable_rounding, block_m=block_m,
                                  block_n=block_n, beta=beta, tie_tol=tie_tol)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = dict(causal=causal, block_m=block_m, block_n=block_n)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = triton_backward(q, k, v, out, lse, dout, **ctx.opts)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                           stable_rounding: bool = False, block_m: int = 64, block_n: int = 64,
                           beta: float = STABLE_BETA, tie_tol: float = TIE_TOL) -> torch.Tensor:
    """Differentiable Triton flash attention over [B, H, T, D]."""
    _check(q, k, v)
    return FlashAttentionTriton.apply(q, k, v, causal, stable_rounding, block_m, block_n, beta, tie_tol)
