"""Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention (Qiu & Yao, 2025) — https://arxiv.org/abs/2510.04212

The specification of `kernels.attention`, in readable PyTorch:

- `attention_fp64`: softmax(Q K^T / sqrt(D)) V in float64, the ground truth.
- `flash_attention_forward` / `flash_attention_backward`: a tile-by-tile emulation of a
  FlashAttention-2 forward and backward, rounding exactly where a kernel rounds. Two precisions:
  - ``"kernel"`` (default) is what `kernels/attention/triton.py` and FA-2 kernels do: the scores,
    the running max m, the row sum l and the output accumulator stay in fp32; the probabilities
    P are rounded to the input dtype just before the P V product (l sums the unrounded P), dS is
    rounded before the dQ and dK products, and each output is rounded once at the end.
  - ``"paper"`` is the arithmetic of the paper's released PyTorch flash attention: every
    intermediate (scores, m, l, exp weights, the accumulator, the LSE, the gradients) is a tensor
    of the input dtype, rounded after each operation; matrix products accumulate in fp32 and
    round their result, as BLAS does.
- `FlashAttentionReference` / `flash_attention_reference`: the two above as a differentiable op.
- `tied_max_inputs` and `error_bias`: the paper's failure case as a measurement.

The fix (``stable_rounding``). Per KV tile, after the tile's row max m~ = rowmax(S):
count the valid entries with S >= m~ - tie_tol; where that count exceeds one (the maximum is
attained more than once), raise m~ by a shift delta > 0; then m_new = max(m_old, m~) as usual.
Every exponent exp(S - m_new) of a tied row is then exp(-delta), strictly below 1. Softmax is
shift-invariant and the LSE m + log l stays exact, so the output and the backward are
mathematically unchanged. What this removes, measured here (see `tied_max_inputs`): with ties,
each P of a tied entry is exactly 1, so a row sum is an integer shared by every row with the
same ties, and in bf16 that integer rounds the same way for every row: one coherent error,
a bias. After the shift the row sums are n * exp(-delta_i), different per row, and their
rounding errors no longer line up. In the fp32-statistics ("kernel") precision the row sum does
not round, and the same inputs show no bias with or without the fix.

Two shift rules (``stable_rounding="paper"`` or ``"bounded"``; ``True`` means "bounded"):

- ``"paper"``, the released code's: m~ -> beta * m~ for m~ > 0 and 0 for m~ < 0, i.e.
  delta = (beta - 1) m~ or |m~| (with beta = 2, delta = |m~| either way). delta grows without
  bound: at m~ = 16 a tied probability exp(-16) = 1.1e-7 is an fp16 subnormal (output error
  1.9e-2 where the unfixed kernel has 1e-4), and at |m~| >= ~104 exp(-delta) underflows fp32:
  l = 0 and the output and gradients are NaN (bf16 and fp32 alike).
- ``"bounded"`` (the default of every public entry point): the same delta while it is below
  `STABLE_CAP` (c = 8), and beyond it delta wrapped into [c/2, c) with slope one,
  delta = c/2 + ((delta - c/2) mod c/2). Why this form: the mechanism needs two things, a
  tied P strictly below 1 and a delta that differs from row to row (the per-row m~ carries it,
  with slope one in the paper's rule); a constant shift (m~ + c, or a plain clamp
  min(delta, c) for large m~) gives every row the same P = exp(-c) and the same row-sum
  rounding again, which is the coherent error the fix exists to remove (a clamp at 8 leaves
  |r| up to 0.5 on `tied_max_inputs`, whose m~ is about 8). The wrap keeps slope one and
  bounds delta by c, so a tied P is at least exp(-8) = 3.4e-4, 5.5 times fp16's smallest
  normal: every dtype keeps a tied probability at full precision, nothing underflows.
  Measured on the bias inputs (bf16, "paper" precision, 512-wide tiles, seeds 0-7) the bias
  statistic with this rule is |r| <= 0.22, the same band as the paper rule's |r| <= 0.14.

Reconstructed, not read in the paper (only its opening was available): beta = 2 and
tie_tol = 1e-3 (in units of the scaled score) are the released code's final defaults; m~ == 0
is left unchanged, as there (a tie at exactly 0 still gives exponents of 1); masked entries are
not counted as ties (the released code fills them with a finite minimum, so a fully masked tile
row counts as tied and its max is set to 0, which changes nothing but the rounding); the
rounding sites of the "paper" precision follow that code's bf16 tensors, including its bf16 LSE
in the backward; the "kernel" precision follows the Triton FA-2 tutorial and FA-2 (l from the
unrounded P, as noted in Dao-AILab/flash-attention#2721). The tied-input construction is ours.
Shapes are [B, H, T, D]; causal masking is top-left aligned, as in
`torch.nn.functional.scaled_dot_product_attention(is_causal=True)`.
"""

from __future__ import annotations

import math

import torch

STABLE_BETA = 2.0
"""The shift multiple for a positive tied maximum (released code's final value; its first was 7)."""
TIE_TOL = 1e-3
"""Entries within this of the tile max (scaled-score units) count as attaining it."""
STABLE_CAP = 8.0
"""The bounded rule's largest shift (scaled-score units): a tied probability stays >= exp(-8)."""
STABLE_RULES = ("bounded", "paper")
PRECISIONS = ("kernel", "paper")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def attention_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """softmax(Q K^T / sqrt(D)) V computed in float64; returns float64 [B, H, Tq, D]."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # [B, H, Tq, Tk]
    if causal:
        s = s.masked_fill(~_causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    return torch.softmax(s, dim=-1) @ v


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                            stable_rounding: bool | str = False, block_m: int = 64, block_n: int = 64,
                            precision: str = "kernel", beta: float = STABLE_BETA,
                            tie_tol: float = TIE_TOL) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled online-softmax forward. Returns (O in the input dtype, LSE [B, H, Tq] in fp32, natural log).

    stable_rounding: False (off), True or "bounded" (the bounded shift), "paper" (beta * m / 0).
    """
    _check(q, k, v, precision)
    rule = stable_rule(stable_rounding)
    low = q.dtype
    paper = precision == "paper"
    # "paper" keeps every statistic in the input dtype; "kernel" keeps them in fp32.
    rs = _rounder(low) if paper else _identity
    rp = _rounder(low)  # P always meets V in the input dtype
    B, H, Tq, D = q.shape
    Tk = k.shape[-2]
    scale = D ** -0.5
    qf, kf, vf = q.float(), k.float(), v.float()
    out = torch.empty(B, H, Tq, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
    for m0 in range(0, Tq, block_m):
        qi = qf[:, :, m0:m0 + block_m]  # [B, H, bm, D]
        rows = torch.arange(m0, m0 + qi.shape[-2], device=q.device)
        m = torch.full(qi.shape[:-1], -math.inf, device=q.device)
        l = torch.zeros(qi.shape[:-1], device=q.device)
        acc = torch.zeros(qi.shape, device=q.device)
        for n0 in range(0, Tk, block_n):
            kj, vj = kf[:, :, n0:n0 + block_n], vf[:, :, n0:n0 + block_n]
            cols = torch.arange(n0, n0 + kj.shape[-2], device=q.device)
            valid = (rows[:, None] >= cols[None, :]) if causal else torch.ones(len(rows), len(cols), dtype=torch.bool,
                                                                                  device=q.device)
            s = rs(rs(qi @ kj.transpose(-1, -2)) * scale).masked_fill(~valid, -math.inf)  # [B, H, bm, bn]
            m_tile = s.amax(-1)
            if rule:
                m_tile = _shift_tied_max(s, m_tile, valid, beta, tie_tol, rule)
            m_new = torch.maximum(m, m_tile)
            # A row with nothing valid yet keeps m = -inf; exponentiate against 0 so it gives 0, not NaN.
            m_ref = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = rs(torch.exp(rs(s - m_ref[..., None])))
            alpha = rs(torch.exp(rs(m - m_ref)))
            l = rs(rs(alpha * l) + rs(p.sum(-1)))
            acc = rs(rs(acc * alpha[..., None]) + rs(rp(p) @ vj))
            m = m_new
        out[:, :, m0:m0 + block_m] = rs(acc / l[..., None])
        lse[:, :, m0:m0 + block_m] = rs(rs(torch.log(l)) + m)
    return out.to(low), lse


def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, dout: torch.Tensor, *, causal: bool = False, block_m: int = 64,
                             block_n: int = 64, precision: str = "kernel"
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FA-2 backward from the stored O and LSE: P = exp(S - LSE), D = rowsum(dO * O), dS = P (dP - D).

    The fix needs nothing here: it moves m and l together, so the LSE it leaves is the same.
    Returns (dQ, dK, dV) in the input dtype.
    """
    _check(q, k, v, precision)
    low = q.dtype
    paper = precision == "paper"
    rs = _rounder(low) if paper else _identity
    rp = _rounder(low)
    B, H, Tq, D = q.shape
    Tk = k.shape[-2]
    scale = D ** -0.5
    qf, kf, vf, of, dof = q.float(), k.float(), v.float(), out.float(), dout.to(low).float()
    lse = lse.float()
    delta = rs(rs(dof * of).sum(-1))  # [B, H, Tq]
    dq = torch.zeros(B, H, Tq, D, device=q.device)
    dk = torch.zeros(B, H, Tk, D, device=q.device)
    dv = torch.zeros(B, H, Tk, D, device=q.device)
    for n0 in range(0, Tk, block_n):
        nsl = slice(n0, n0 + block_n)
        kj, vj = kf[:, :, nsl], vf[:, :, nsl]
        cols = torch.arange(n0, n0 + kj.shape[-2], device=q.device)
        for m0 in range(0, Tq, block_m):
            msl = slice(m0, m0 + block_m)
            qi, doi = qf[:, :, msl], dof[:, :, msl]
            rows = torch.arange(m0, m0 + qi.shape[-2], device=q.device)
            s = rs(rs(qi @ kj.transpose(-1, -2)) * scale)
            p = rs(torch.exp(rs(s - lse[:, :, msl, None])))
            if causal:
                p = p.masked_fill(rows[:, None] < cols[None, :], 0.0)
            dv[:, :, nsl] = rs(dv[:, :, nsl] + rs(rp(p).transpose(-1, -2) @ doi))
            dp = rs(doi @ vj.transpose(-1, -2))
            if paper:
                # The released code folds the scale into dS before rounding it.
                ds = rs(rs(p * scale) * rs(dp - delta[:, :, msl, None]))
            else:
                ds = p * (dp - delta[:, :, msl, None])
            ds = rp(ds)
            dq[:, :, msl] = rs(dq[:, :, msl] + rs(ds @ kj))
            dk[:, :, nsl] = rs(dk[:, :, nsl] + rs(ds.transpose(-1, -2) @ qi))
    if not paper:
        dq, dk = dq * scale, dk * scale
    return dq.to(low), dk.to(low), dv.to(low)


class FlashAttentionReference(torch.autograd.Function):
    """The emulated forward and backward as one differentiable op (inputs q, k, v [B, H, T, D])."""

    @staticmethod
    def forward(ctx, q, k, v, causal, stable_rounding, block_m, block_n, precision, beta, tie_tol):
        out, lse = flash_attention_forward(q, k, v, causal=causal, stable_rounding=stable_rounding, block_m=block_m,
                                           block_n=block_n, precision=precision, beta=beta, tie_tol=tie_tol)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = dict(causal=causal, block_m=block_m, block_n=block_n, precision=precision)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, **ctx.opts)
        return dq, dk, dv, None, None, None, None, None, None, None


def flash_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                              stable_rounding: bool | str = False, block_m: int = 64, block_n: int = 64,
                              precision: str = "kernel", beta: float = STABLE_BETA,
                              tie_tol: float = TIE_TOL) -> torch.Tensor:
    """Differentiable emulated flash attention; see `flash_attention_forward` for the options."""
    return FlashAttentionReference.apply(q, k, v, causal, stable_rounding, block_m, block_n, precision, beta, tie_tol)


def tied_max_inputs(seed: int, *, queries: int = 128, keys: int = 1024, head_dim: int = 64, v_mean: float = -1.0,
                    v_std: float = 0.5, distinct_every: int = 7, at_max: bool = True, query_noise: float = 0.3,
                    dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs whose row maxima are attained many times: the paper's similar low-rank attention, distilled.

    Every key but one in `distinct_every` is a copy of one direction u, and the queries are
    u plus noise, so the copies share each row's maximum score. V ~ N(v_mean, v_std^2). With
    at_max=False, one extra key scores above the copies, so the ties are no longer at the max
    (the control). Returns q [1, 1, queries, D], k and v [1, 1, keys, D].

    Measured with the defaults in bf16, seeds 0-4, `error_bias` against `attention_fp64`:
    precision="paper" with 512-wide tiles (the released code's) gives +1.21..+1.44 for
    v_mean=-1 and -1.53..-1.39 for v_mean=+1, and |r| <= 0.14 with the fix; with 64-wide tiles
    the baseline is only +0.57..+0.79 (smaller integer row sums per tile round less).
    precision="kernel" gives |r| <= 0.24 with or without the fix; at_max=False |r| <= 0.30.
    """
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(head_dim, generator=g)
    q = u + query_noise * torch.randn(queries, head_dim, generator=g)
    k = torch.randn(keys, head_dim, generator=g)
    tied = torch.arange(keys) % distinct_every != 0
    k[tied] = u
    if not at_max:
        k[0] = 1.5 * u
    v = v_mean + v_std * torch.randn(keys, head_dim, generator=g)
    return tuple(x.to(dtype)[None, None] for x in (q, k, v))


def error_bias(out: torch.Tensor, truth: torch.Tensor) -> float:
    """mean(out - truth) / std(out - truth) over all elements: the error's bias in units of its spread."""
    err = out.double() - truth.double()
    return (err.mean() / err.std()).item()


def stable_rule(stable_rounding: bool | str | None) -> str | None:
    """The shift rule a `stable_rounding` argument names: None (off), "bounded" or "paper"."""
    if isinstance(stable_rounding, str):
        if stable_rounding in STABLE_RULES:
            return stable_rounding
    elif stable_rounding is None or isinstance(stable_rounding, (bool, int)):
        return "bounded" if stable_rounding else None
    raise ValueError(f"stable_rounding must be False, True or one of {STABLE_RULES}, got {stable_rounding!r}")


def tied_max_shift(m_tile: torch.Tensor, beta: float = STABLE_BETA, rule: str = "bounded",
                   cap: float = STABLE_CAP) -> torch.Tensor:
    """The new max of a tied row whose tile max is m_tile (see the module notes for both rules)."""
    delta = torch.where(m_tile > 0, (beta - 1) * m_tile, -m_tile)  # 0 at m_tile == 0: left unchanged
    if rule == "bounded":
        half = cap / 2
        delta = torch.where(delta < cap, delta, half + torch.remainder(delta - half, half))
    return m_tile + delta


def _shift_tied_max(s: torch.Tensor, m_tile: torch.Tensor, valid: torch.Tensor, beta: float,
                    tie_tol: float, rule: str = "bounded") -> torch.Tensor:
    ties = ((s >= (m_tile - tie_tol)[..., None]) & valid).sum(-1) > 1
    return torch.where(ties, tied_max_shift(m_tile, beta, rule), m_tile)


def _causal_mask(tq: int, tk: int, device) -> torch.Tensor:
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril()


def _rounder(dtype: torch.dtype):
    if dtype == torch.float32:
        return _identity
    return lambda x: x.to(dtype).float()


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, H, T, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES:
        raise ValueError(f"q, k, v must share one dtype of {DTYPES}; got {q.dtype}, {k.dtype}, {v.dtype}")
