"""Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention (Qiu & Yao, 2025) — https://arxiv.org/abs/2510.04212

FlashAttention-2 forward and backward in Triton, with the paper's rounding-bias fix behind
``stable_rounding`` ("bounded", the default when True, or "paper"; see `reference.py`). The
arithmetic is the "kernel" precision of `reference.py`: scores, running max, row sum and
accumulators in fp32; P rounded to the input dtype right before the P V product, and the row sum
l adds that same rounded P (so the output's weights sum to 1), while a second fp32 sum of the
unrounded P gives the LSE (one more row reduction per tile, bf16 and fp16 only); dS rounded right
before the dQ and dK products; O, dQ, dK, dV rounded once when stored. The fix is one compare and
one row reduction per tile, its cap passed with the launch (`cap2`, log2 units: 8 log2 e for bf16
and fp32, 4 for fp16, `reference.stable_cap_for`); the backward is unchanged, as it only reads the
LSE, which the fix leaves as it is.

Layout and speed: q, k, v are [B, H, T, D] with any strides but a unit last one, so the usual
[B, T, H, D].transpose(1, 2) is read in place (no copy); offsets are int64. Causal masking is
applied only on the tiles that cross the diagonal or the sequence end (the others run an
unmasked loop). The backward's D = rowsum(dO * O) is one preprocess kernel and the LSE is kept
in log2 units between forward and backward. On a GPU, with block sizes left unset, the forward
and both backward kernels are autotuned over tile sizes, warps and stages (as in the Triton
fused-attention tutorial). fp32 inputs take IEEE fp32 products by default; allow_tf32=True
takes TF32 tensor-core products instead: 10 mantissa bits per operand, so the output's error
grows to about 7e-4 of its scale, gradients alike (random inputs, D = 32; see tests/kernels), against 1e-7.

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

from kernels.attention.reference import STABLE_BETA, TIE_TOL, resolve_cap, stable_rule

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
# "first": autotune over the first candidate only (each candidate compiles once per launch key: a GPU
# test run on a fresh cache spends minutes on them). Read at import, like TRITON_INTERPRET.
AUTOTUNE = os.environ.get("LADDER_KERNELS_AUTOTUNE", "full")


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
    def _widen(x):
        """x loaded from memory as fp32. bf16 is widened by its bits (u16 -> u32 << 16), exact for every
        value: the interpreter's bf16 -> fp32 cast gets subnormals wrong (1.01e-39 -> 4.41e-39)."""
        if x.dtype == tl.bfloat16:
            y = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        else:
            y = x.to(tl.float32)
        return y

    @triton.jit
    def _narrow(x, ROUND: tl.constexpr, DTYPE: tl.constexpr):
        """x (fp32, already rounded to DTYPE) in DTYPE for a store; bf16 by its bits under the
        interpreter, whose fp32 -> bf16 cast flushes subnormals."""
        # one return statement per function: compiled, code after a return in a constexpr branch is still visited
        if ROUND == 1:
            y = (x.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            y = x.to(DTYPE)
        return y

    @triton.jit
    def _operand(x, DOT: tl.constexpr):
        """A loaded tile as a dot operand: as stored for a tensor-core dot of its dtype, else fp32."""
        if DOT == 1:
            y = x
        else:
            y = _widen(x)
        return y

    @triton.jit
    def _tf32(x):
        """x rounded to TF32 (10 mantissa bits, nearest) by bits: the interpreter's TF32 dot is plain fp32."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _mm(a, b, DOT: tl.constexpr, DTYPE: tl.constexpr):
        """a @ b with fp32 accumulation. DOT: 0 IEEE fp32, 1 tensor-core dot in DTYPE (operands already
        representable in it), 2 TF32, 3 TF32 emulated (interpreter)."""
        if DOT == 1:
            c = tl.dot(a.to(DTYPE), b.to(DTYPE))
        elif DOT == 2:
            c = tl.dot(a, b, input_precision="tf32")
        elif DOT == 3:
            c = tl.dot(_tf32(a), _tf32(b), input_precision="ieee")
        else:
            c = tl.dot(a, b, input_precision="ieee")
        return c

    @triton.jit
    def _tied_shift(m_tile, beta, cap2, STABLE: tl.constexpr):
        """The new max of a tied row (log2 units): STABLE 1 the bounded rule, 2 the paper's (see reference.py)."""
        delta = tl.where(m_tile > 0, (beta - 1.0) * m_tile, -m_tile)
        if STABLE == 1:
            half = cap2 * 0.5
            r = delta - half
            delta = tl.where(delta < cap2, delta, half + (r - half * tl.floor(r / half)))
        return m_tile + delta

    @triton.jit
    def _fwd_inner(acc, l_i, l32, m_i, q, k_base, v_base, skt, svt, offs_m, offs_n, offs_d, d_ok, n_lo, n_hi, TK,
                   qk_scale, tie_tol2, beta, cap2, MASK: tl.constexpr, CAUSAL: tl.constexpr, STABLE: tl.constexpr,
                   BLOCK_N: tl.constexpr, ROUND: tl.constexpr, DOT: tl.constexpr, DTYPE: tl.constexpr):
        """The online-softmax loop over key tiles [n_lo, n_hi); MASK: the tiles cross the diagonal or TK."""
        for n0 in range(n_lo, n_hi, BLOCK_N):
            cols = n0 + offs_n
            c64 = cols.to(tl.int64)
            kv_ok = (cols[:, None] < TK) & d_ok[None, :]
            k = tl.load(k_base + c64[:, None] * skt + offs_d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(v_base + c64[:, None] * svt + offs_d[None, :], mask=kv_ok, other=0.0)
            s = _mm(q, tl.trans(_operand(k, DOT)), DOT, DTYPE) * qk_scale  # [BM, BN], log2 units
            if MASK:
                valid = (cols[None, :] < TK) & (offs_m[:, None] >= 0)
                if CAUSAL:
                    valid = valid & (offs_m[:, None] >= cols[None, :])
                s = tl.where(valid, s, float("-inf"))
            m_tile = tl.max(s, 1)
            if STABLE != 0:
                close = s >= m_tile[:, None] - tie_tol2
                if MASK:
                    close = close & valid
                ties = tl.sum(close.to(tl.int32), 1) > 1
                m_tile = tl.where(ties, _tied_shift(m_tile, beta, cap2, STABLE), m_tile)
            m_new = tl.maximum(m_i, m_tile)
            # Rows with no valid key yet keep m = -inf; exponentiate against 0 so they give 0, not NaN.
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_ref[:, None])
            alpha = tl.math.exp2(m_i - m_ref)
            if ROUND != 0:
                l32 = l32 * alpha + tl.sum(p, 1)  # the unrounded P's sum, for the LSE
            p = _round(p, ROUND, DTYPE)  # P as it meets V; l_i sums this same P (the output's weights sum to 1)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _mm(p, _operand(v, DOT), DOT, DTYPE)
            m_i = m_new
        return acc, l_i, l32, m_i

    @triton.jit
    def _fwd_kernel(Q, K, V, O, LSE,
                    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                    H, TQ, TK, D, qk_scale, tie_tol2, beta, cap2,
                    CAUSAL: tl.constexpr, STABLE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, ROUND: tl.constexpr, DOT: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)  # offsets in int64: b * stride passes 2^31 on large tensors
        h = (bh % H).to(tl.int64)
        DTYPE = Q.dtype.element_ty
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        m64 = offs_m.to(tl.int64)
        q_ok = (offs_m[:, None] < TQ) & d_ok[None, :]
        q = _operand(tl.load(Q + b * sqb + h * sqh + m64[:, None] * sqt + offs_d[None, :], mask=q_ok, other=0.0), DOT)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        l32 = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = K + b * skb + h * skh
        v_base = V + b * svb + h * svh
        if CAUSAL:
            hi = tl.minimum(TK, (pid_m + 1) * BLOCK_M)
            full = tl.minimum((pid_m * BLOCK_M + 1) // BLOCK_N, TK // BLOCK_N) * BLOCK_N
        else:
            hi = TK
            full = (TK // BLOCK_N) * BLOCK_N
        acc, l_i, l32, m_i = _fwd_inner(acc, l_i, l32, m_i, q, k_base, v_base, skt, svt, offs_m, offs_n, offs_d, d_ok,
                                        0, full, TK, qk_scale, tie_tol2, beta, cap2, False, CAUSAL, STABLE, BLOCK_N,
                                        ROUND, DOT, DTYPE)
        acc, l_i, l32, m_i = _fwd_inner(acc, l_i, l32, m_i, q, k_base, v_base, skt, svt, offs_m, offs_n, offs_d, d_ok,
                                        full, hi, TK, qk_scale, tie_tol2, beta, cap2, True, CAUSAL, STABLE, BLOCK_N,
                                        ROUND, DOT, DTYPE)
        out = _round(acc / l_i[:, None], ROUND, DTYPE)
        tl.store(O + b * sob + h * soh + m64[:, None] * sot + offs_d[None, :], _narrow(out, ROUND, DTYPE), mask=q_ok)
        if ROUND == 0:
            l32 = l_i  # fp32 inputs: P does not round, the two sums are one
        tl.store(LSE + bh.to(tl.int64) * TQ + offs_m, m_i + tl.math.log2(l32), mask=offs_m < TQ)  # log2 units

    @triton.jit
    def _bwd_preprocess(O, DO, DELTA, sob, soh, sot, sdb, sdh, sdt, H, TQ, D,
                        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        """D = rowsum(dO * O) in fp32, [B * H, TQ]."""
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m64 = offs_m.to(tl.int64)
        ok = (offs_m[:, None] < TQ) & (offs_d[None, :] < D)
        o = tl.load(O + b * sob + h * soh + m64[:, None] * sot + offs_d[None, :], mask=ok, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + m64[:, None] * sdt + offs_d[None, :], mask=ok, other=0.0)
        tl.store(DELTA + bh.to(tl.int64) * TQ + offs_m, tl.sum(_widen(o) * _widen(do), 1), mask=offs_m < TQ)

    @triton.jit
    def _dkdv_inner(dk, dv, k, v, q_base, do_base, sqt, sdt, LSE_row, DELTA_row, offs_n, offs_m, offs_d, d_ok,
                    m_lo, m_hi, TQ, qk_scale, MASK: tl.constexpr, BLOCK_M: tl.constexpr, ROUND: tl.constexpr,
                    DOT: tl.constexpr, DTYPE: tl.constexpr):
        """dK, dV contributions of query tiles [m_lo, m_hi); MASK: the tiles cross the diagonal."""
        for m0 in range(m_lo, m_hi, BLOCK_M):
            rows = m0 + offs_m
            r64 = rows.to(tl.int64)
            q_ok = (rows[:, None] < TQ) & d_ok[None, :]
            q = _operand(tl.load(q_base + r64[:, None] * sqt + offs_d[None, :], mask=q_ok, other=0.0), DOT)
            do = _operand(tl.load(do_base + r64[:, None] * sdt + offs_d[None, :], mask=q_ok, other=0.0), DOT)
            # rows past TQ read LSE = +inf, so their P is 0 without a mask
            lse = tl.load(LSE_row + rows, mask=rows < TQ, other=float("inf"))
            delta = tl.load(DELTA_row + rows, mask=rows < TQ, other=0.0)
            s_t = _mm(k, tl.trans(q), DOT, DTYPE) * qk_scale  # [BN, BM]
            p_t = tl.math.exp2(s_t - lse[None, :])
            if MASK:
                p_t = tl.where(rows[None, :] >= offs_n[:, None], p_t, 0.0)
            dv += _mm(_round(p_t, ROUND, DTYPE), do, DOT, DTYPE)
            dp_t = _mm(v, tl.trans(do), DOT, DTYPE)
            ds_t = _round(p_t * (dp_t - delta[None, :]), ROUND, DTYPE)
            dk += _mm(ds_t, q, DOT, DTYPE)
        return dk, dv

    @triton.jit
    def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                         sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                         sdkb, sdkh, sdkt, sdvb, sdvh, sdvt,
                         H, TQ, TK, D, qk_scale, sm_scale,
                         CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, ROUND: tl.constexpr, DOT: tl.constexpr):
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        DTYPE = Q.dtype.element_ty
        n0 = pid_n * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        n64 = offs_n.to(tl.int64)
        kv_ok = (offs_n[:, None] < TK) & d_ok[None, :]
        k = _operand(tl.load(K + b * skb + h * skh + n64[:, None] * skt + offs_d[None, :], mask=kv_ok, other=0.0), DOT)
        v = _operand(tl.load(V + b * svb + h * svh + n64[:, None] * svt + offs_d[None, :], mask=kv_ok, other=0.0), DOT)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdb + h * sdh
        LSE_row = LSE + bh.to(tl.int64) * TQ
        DELTA_row = DELTA + bh.to(tl.int64) * TQ
        if CAUSAL:
            lo = (n0 // BLOCK_M) * BLOCK_M
            full = tl.maximum(lo, tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M) * BLOCK_M)  # first tile with every row >= every key
            dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, sqt, sdt, LSE_row, DELTA_row, offs_n, offs_m, offs_d,
                                 d_ok, lo, tl.minimum(full, TQ), TQ, qk_scale, True, BLOCK_M, ROUND, DOT, DTYPE)
        else:
            full = 0
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, sqt, sdt, LSE_row, DELTA_row, offs_n, offs_m, offs_d,
                             d_ok, full, TQ, TQ, qk_scale, False, BLOCK_M, ROUND, DOT, DTYPE)
        dk = _round(dk * sm_scale, ROUND, DTYPE)
        dv = _round(dv, ROUND, DTYPE)
        tl.store(DK + b * sdkb + h * sdkh + n64[:, None] * sdkt + offs_d[None, :], _narrow(dk, ROUND, DTYPE), mask=kv_ok)
        tl.store(DV + b * sdvb + h * sdvh + n64[:, None] * sdvt + offs_d[None, :], _narrow(dv, ROUND, DTYPE), mask=kv_ok)

    @triton.jit
    def _dq_inner(dq, q, do, lse, delta, k_base, v_base, skt, svt, offs_m, offs_n, offs_d, d_ok, n_lo, n_hi, TK,
                  qk_scale, MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, ROUND: tl.constexpr,
                  DOT: tl.constexpr, DTYPE: tl.constexpr):
        for n0 in range(n_lo, n_hi, BLOCK_N):
            cols = n0 + offs_n
            c64 = cols.to(tl.int64)
            kv_ok = (cols[:, None] < TK) & d_ok[None, :]
            k = _operand(tl.load(k_base + c64[:, None] * skt + offs_d[None, :], mask=kv_ok, other=0.0), DOT)
            v = _operand(tl.load(v_base + c64[:, None] * svt + offs_d[None, :], mask=kv_ok, other=0.0), DOT)
            s = _mm(q, tl.trans(k), DOT, DTYPE) * qk_scale
            p = tl.math.exp2(s - lse[:, None])
            if MASK:
                valid = cols[None, :] < TK
                if CAUSAL:
                    valid = valid & (offs_m[:, None] >= cols[None, :])
                p = tl.where(valid, p, 0.0)
            dp = _mm(do, tl.trans(v), DOT, DTYPE)
            ds = _round(p * (dp - delta[:, None]), ROUND, DTYPE)
            dq += _mm(ds, k, DOT, DTYPE)
        return dq

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                       sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, sdqb, sdqh, sdqt,
                       H, TQ, TK, D, qk_scale, sm_scale,
                       CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, ROUND: tl.constexpr, DOT: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        DTYPE = Q.dtype.element_ty
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        m64 = offs_m.to(tl.int64)
        q_ok = (offs_m[:, None] < TQ) & d_ok[None, :]
        q = _operand(tl.load(Q + b * sqb + h * sqh + m64[:, None] * sqt + offs_d[None, :], mask=q_ok, other=0.0), DOT)
        do = _operand(tl.load(DO + b * sdb + h * sdh + m64[:, None] * sdt + offs_d[None, :], mask=q_ok, other=0.0), DOT)
        lse = tl.load(LSE + bh.to(tl.int64) * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        delta = tl.load(DELTA + bh.to(tl.int64) * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = K + b * skb + h * skh
        v_base = V + b * svb + h * svh
        if CAUSAL:
            hi = tl.minimum(TK, (pid_m + 1) * BLOCK_M)
            full = tl.minimum((pid_m * BLOCK_M + 1) // BLOCK_N, TK // BLOCK_N) * BLOCK_N
        else:
            hi = TK
            full = (TK // BLOCK_N) * BLOCK_N
        dq = _dq_inner(dq, q, do, lse, delta, k_base, v_base, skt, svt, offs_m, offs_n, offs_d, d_ok, 0, full, TK,
                       qk_scale, False, CAUSAL, BLOCK_N, ROUND, DOT, DTYPE)
        dq = _dq_inner(dq, q, do, lse, delta, k_base, v_base, skt, svt, offs_m, offs_n, offs_d, d_ok, full, hi, TK,
                       qk_scale, True, CAUSAL, BLOCK_N, ROUND, DOT, DTYPE)
        dq = _round(dq * sm_scale, ROUND, DTYPE)
        tl.store(DQ + b * sdqb + h * sdqh + m64[:, None] * sdqt + offs_d[None, :], _narrow(dq, ROUND, DTYPE), mask=q_ok)

    def _configs(tiles):
        """Autotuning candidates (A, B, warps, stages), A x B tiles: few, as each one compiles per launch key.
        LADDER_KERNELS_AUTOTUNE=first keeps the first only (a test run that checks results, not speed)."""
        tiles = tiles[:1] if AUTOTUNE == "first" else tiles
        return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st) for bm, bn, w, st in tiles]

    _KEY = ["TQ", "TK", "D", "CAUSAL", "ROUND", "DOT"]
    # forward and dQ: long query tiles; dK dV: long key tiles (the Triton fused-attention tutorial's shapes)
    _fwd_tuned = triton.autotune(_configs([(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                                           (64, 128, 4, 3), (128, 32, 4, 4)]), key=_KEY + ["STABLE"])(_fwd_kernel)
    _dkdv_tuned = triton.autotune(_configs([(32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3)]),
                                  key=_KEY)(_bwd_dkdv_kernel)
    _dq_tuned = triton.autotune(_configs([(128, 32, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (64, 64, 4, 3)]),
                                key=_KEY)(_bwd_dq_kernel)


def _launch_opts(dtype: torch.dtype, allow_tf32: bool = False) -> dict:
    """ROUND (how P, dS and outputs round to the input dtype) and DOT (see `_mm`) for inputs of dtype."""
    interp = INTERPRETED
    if dtype == torch.float32:
        rnd = 0
    elif dtype == torch.bfloat16 and interp:
        rnd = 1
    else:
        rnd = 2  # fp16 casts round to nearest even in the interpreter too (numpy astype)
    if dtype == torch.float32:
        dot = (3 if interp else 2) if allow_tf32 else 0
    else:
        dot = 0 if interp else 1  # the interpreter's bf16 dot multiplies raw bits: fp32 on rounded operands
    return dict(ROUND=rnd, DOT=dot)


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


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dimension is contiguous (any other strides are passed to the kernels)."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _tiles(block_m: int | None, block_n: int | None) -> dict | None:
    """Fixed tiles, or None to autotune (on a GPU when neither is given)."""
    if block_m is None and block_n is None and not INTERPRETED:
        return None
    return dict(BLOCK_M=block_m or 64, BLOCK_N=block_n or 64)


def _forward(q, k, v, causal, stable_rounding, block_m, block_n, beta, tie_tol, allow_tf32, stable_cap=None):
    """(O, LSE in log2 units)."""
    _check(q, k, v)
    rule = stable_rule(stable_rounding)
    cap = resolve_cap(stable_cap, q.dtype)
    q, k, v = (_unit_last(x) for x in (q, k, v))
    B, H, TQ, D = q.shape
    TK = k.shape[-2]
    out = torch.empty_like(q)
    lse2 = torch.empty(B, H, TQ, dtype=torch.float32, device=q.device)
    args = (q, k, v, out, lse2, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            H, TQ, TK, D, D ** -0.5 * LOG2E, tie_tol * LOG2E, beta, cap * LOG2E)
    opts = dict(CAUSAL=causal, STABLE={None: 0, "bounded": 1, "paper": 2}[rule],
                BLOCK_D=max(16, triton.next_power_of_2(D)), **_launch_opts(q.dtype, allow_tf32))
    tiles = _tiles(block_m, block_n)
    if tiles is None:
        _fwd_tuned[lambda meta: (triton.cdiv(TQ, meta["BLOCK_M"]), B * H)](*args, **opts)
    else:
        _fwd_kernel[(triton.cdiv(TQ, tiles["BLOCK_M"]), B * H)](*args, **opts, **tiles)
    return out, lse2


def _backward(q, k, v, out, lse2, dout, causal, block_m, block_n, allow_tf32):
    _check(q, k, v)
    q, k, v, out = (_unit_last(x) for x in (q, k, v, out))
    dout = _unit_last(dout.to(q.dtype))
    B, H, TQ, D = q.shape
    TK = k.shape[-2]
    block_d = max(16, triton.next_power_of_2(D))
    delta = torch.empty(B, H, TQ, dtype=torch.float32, device=q.device)
    pre_m = 64
    _bwd_preprocess[(triton.cdiv(TQ, pre_m), B * H)](out, dout, delta, *out.stride()[:3], *dout.stride()[:3], H, TQ,
                                                      D, BLOCK_M=pre_m, BLOCK_D=block_d)
    lse2 = lse2.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    args = (H, TQ, TK, D, D ** -0.5 * LOG2E, D ** -0.5)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3])
    opts = dict(CAUSAL=causal, BLOCK_D=block_d, **_launch_opts(q.dtype, allow_tf32))
    dkdv = (q, k, v, dout, lse2, delta, dk, dv, *strides, *dk.stride()[:3], *dv.stride()[:3], *args)
    dqa = (q, k, v, dout, lse2, delta, dq, *strides, *dq.stride()[:3], *args)
    tiles = _tiles(block_m, block_n)
    if tiles is None:
        _dkdv_tuned[lambda meta: (triton.cdiv(TK, meta["BLOCK_N"]), B * H)](*dkdv, **opts)
        _dq_tuned[lambda meta: (triton.cdiv(TQ, meta["BLOCK_M"]), B * H)](*dqa, **opts)
    else:
        _bwd_dkdv_kernel[(triton.cdiv(TK, tiles["BLOCK_N"]), B * H)](*dkdv, **opts, **tiles)
        _bwd_dq_kernel[(triton.cdiv(TQ, tiles["BLOCK_M"]), B * H)](*dqa, **opts, **tiles)
    return dq, dk, dv


def triton_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   stable_rounding: bool | str = False, block_m: int | None = None, block_n: int | None = None,
                   beta: float = STABLE_BETA, tie_tol: float = TIE_TOL, allow_tf32: bool = False,
                   stable_cap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O in the input dtype, LSE [B, H, Tq] fp32 in natural log) for q, k, v [B, H, T, D] with a unit last stride.

    Tiles: block_m x block_n; unset, autotuned on a GPU and 64 x 64 under the interpreter. stable_cap:
    the bounded rule's largest shift, None for the input dtype's (`reference.stable_cap_for`).
    """
    out, lse2 = _forward(q, k, v, causal, stable_rounding, block_m, block_n, beta, tie_tol, allow_tf32, stable_cap)
    return out, lse2 * math.log(2.0)


def triton_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    dout: torch.Tensor, *, causal: bool = False, block_m: int | None = None,
                    block_n: int | None = None, allow_tf32: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in the input dtype, from the stored O and natural-log LSE of `triton_forward`."""
    return _backward(q, k, v, out, lse.float() * LOG2E, dout, causal, block_m, block_n, allow_tf32)


class FlashAttentionTriton(torch.autograd.Function):
    """`triton_forward` and `triton_backward` as one differentiable op (the LSE stays in log2 units between them)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, stable_rounding, block_m, block_n, beta, tie_tol, allow_tf32, stable_cap=None):
        out, lse2 = _forward(q, k, v, causal, stable_rounding, block_m, block_n, beta, tie_tol, allow_tf32, stable_cap)
        ctx.save_for_backward(q, k, v, out, lse2)
        ctx.opts = (causal, block_m, block_n, allow_tf32)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse2 = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse2, dout, *ctx.opts)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                           stable_rounding: bool | str = False, block_m: int | None = None,
                           block_n: int | None = None, beta: float = STABLE_BETA, tie_tol: float = TIE_TOL,
                           allow_tf32: bool = False, stable_cap: float | None = None) -> torch.Tensor:
    """Differentiable Triton flash attention over [B, H, T, D] (see `triton_forward` for the options)."""
    _check(q, k, v)
    stable_rule(stable_rounding)  # reject a bad rule or cap before any kernel runs
    resolve_cap(stable_cap, q.dtype)
    return FlashAttentionTriton.apply(q, k, v, causal, stable_rounding, block_m, block_n, beta, tie_tol, allow_tf32,
                                      stable_cap)
