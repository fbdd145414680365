"""Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention (Qiu & Yao, 2025) — https://arxiv.org/abs/2510.04212

kernels.attention: the float64 reference against PyTorch's attention, the emulated bf16
flash attention pinned on hand-computed values, the Triton kernel (CPU interpreter) against the
emulation, and the rounding-bias fix: harmless in fp32, removing the bias of bf16 row sums
on inputs whose row maxima are tied, and capped in fp16 so that probabilities near a row's
maximum stay fp16 normals; and the row sum of the rounded P, whose weights sum to 1.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels.attention is imported

from kernels import attention  # noqa: E402
from kernels.attention import reference as ref  # noqa: E402
from kernels.attention import triton as tri  # noqa: E402
from kernel_fixtures import huge_views  # noqa: E402, F401  (a fixture: pytest finds it in the module)

REPO = Path(__file__).resolve().parents[2]
# interpreted, the kernels run on CPU tensors; otherwise on the GPU (inputs moved there and results back, see `on_dev`)
DEVICE = "cpu" if tri.INTERPRETED else "cuda"
needs_triton = pytest.mark.skipif(not tri.HAS_TRITON or (DEVICE == "cuda" and not torch.cuda.is_available()),
                                  reason="needs triton, and TRITON_INTERPRET=1 or a CUDA device")


def on_dev(fn):
    """fn on DEVICE: tensor arguments moved there and results brought back to the CPU, differentiably."""
    def call(*args, **kw):
        out = fn(*(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args), **kw)
        return tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()
    return call
BF16_EPS = 2.0 ** -7  # bf16 spacing at 1: one ulp of x is at most this times |x|
FP16_EPS = 2.0 ** -10  # the same for fp16
FP16_TINY = torch.finfo(torch.float16).tiny  # 2^-14 = 6.1e-5, fp16's smallest normal


def qkv(b, h, t, d, dtype=torch.float32, seed=0, tk=None):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, h, t, d), (b, h, tk or t, d), (b, h, tk or t, d)]
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


def rel(a, b):
    """max |a - b| relative to max |b|."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


# --- the float64 reference and the emulation against PyTorch ---------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_fp64_reference_matches_sdpa_in_fp32(causal):
    q, k, v = qkv(2, 3, 63, 16)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert rel(ref.attention_fp64(q, k, v, causal=causal), want) < 2e-6


def test_references_handle_unequal_lengths():
    q, k, v = qkv(1, 2, 37, 8, tk=70)
    for causal in (False, True):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert rel(ref.attention_fp64(q, k, v, causal=causal), want) < 2e-6
        assert rel(ref.flash_attention_forward(q, k, v, causal=causal, block_m=16, block_n=32)[0], want) < 2e-6


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [63, 200])
def test_emulated_flash_attention_matches_sdpa_in_fp32(causal, t):
    q, k, v = qkv(1, 2, t, 16)
    out, lse = ref.flash_attention_forward(q, k, v, causal=causal, block_m=32, block_n=48)  # ragged, unequal tiles
    assert rel(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal)) < 2e-6
    s = q.double() @ k.double().transpose(-1, -2) * 16 ** -0.5
    if causal:
        s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max() < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_emulated_backward_matches_float64_autograd(causal):
    q, k, v = qkv(1, 2, 63, 16, seed=1)
    out = ref.flash_attention_reference(q, k, v, causal=causal, block_m=16, block_n=32)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = torch.autograd.grad(ref.attention_fp64(q64, k64, v64, causal=causal), (q64, k64, v64), dout.double())
    for g, w in zip(got, want):
        assert rel(g, w) < 1e-5


def test_kernel_precision_rounds_p_before_pv_and_sums_l_from_the_same_p():
    # Two keys scored [0, -d]: P = [1, p], p = exp(-d) rounded to bf16 (r) before the P V product,
    # and l = 1 + r sums that same rounded P; the LSE keeps the unrounded sum, log(1 + p).
    # d = 0.3203125, V = [0, 1]: p = 0.72592 -> r = 0.7265625, O = bf16(r / (1 + r)) = 0.419921875;
    #   an l of the unrounded P (the previous rule, FA-2's) gives bf16(r / (1 + p)) = 0.421875.
    # d = 0.5859375, V = [1, 0]: p = 0.55658 -> r = 0.5546875, O = bf16(1 / (1 + r)) = 0.64453125;
    #   P left unrounded everywhere, or l of the unrounded P, give bf16(1 / (1 + p)) = 0.640625.
    # (Each exact quotient is >= 1e-4 of itself from a bf16 rounding boundary.)
    run = [ref.flash_attention_forward]
    if tri.HAS_TRITON and (DEVICE == "cpu" or torch.cuda.is_available()):
        run.append(on_dev(tri.triton_forward))
    for d, v_keys, want in ((0.3203125, [0.0, 1.0], 0.419921875), (0.5859375, [1.0, 0.0], 0.64453125)):
        q = torch.tensor([1.0]).view(1, 1, 1, 1).bfloat16()
        k = torch.tensor([0.0, -d]).view(1, 1, 2, 1).bfloat16()
        v = torch.tensor(v_keys).view(1, 1, 2, 1).bfloat16()
        p = torch.tensor(-d, dtype=torch.float64).exp()
        for fn in run:
            out, lse = fn(q, k, v)
            assert out.item() == want, (fn, d)
            assert abs(lse.item() - torch.log1p(p).item()) < 1e-6, (fn, d)  # log(1 + r) is >= 3.6e-4 away


def test_paper_precision_rounds_the_row_sum_in_bf16():
    # 257 identical keys: every P is 1 and l = 257, which bf16 rounds (to even) to 256. With V = 2
    # on one key: O = 2/256 = 0.0078125 instead of 2/257. The fix makes P = exp(-1) and l non-integer.
    q = torch.ones(1, 1, 1, 1, dtype=torch.bfloat16)
    k = torch.ones(1, 1, 257, 1, dtype=torch.bfloat16)
    v = torch.zeros(1, 1, 257, 1, dtype=torch.bfloat16)
    v[..., 0, 0] = 2.0
    base, _ = ref.flash_attention_forward(q, k, v, precision="paper", block_n=512)
    fixed, lse = ref.flash_attention_forward(q, k, v, precision="paper", block_n=512, stable_rounding=True)
    kernel, _ = ref.flash_attention_forward(q, k, v, block_n=512)
    truth = 2 / 257
    assert base.item() == 2 / 256
    assert abs(fixed.item() - truth) < 0.1 * abs(base.item() - truth)
    assert abs(kernel.item() - truth) <= BF16_EPS * truth
    assert abs(lse.item() - (1 + torch.tensor(257.0).log().item())) < 0.07  # bf16 LSE, still the same maths


def test_tied_maximum_shift_rule():
    s = torch.tensor([[3.0, 3.0, 1.0], [-2.0, -2.0, -5.0], [4.0, 1.0, 0.0], [0.0, 0.0, -1.0], [3.0, 2.9995, 1.0]])
    valid = torch.ones_like(s, dtype=torch.bool)
    # paper: tied positive -> 2m; tied negative -> 0; single max unchanged; tie at 0 unchanged; within tol counts
    for rule in ("paper", "bounded"):  # shifts below STABLE_CAP are the same under both rules
        shifted = ref._shift_tied_max(s, s.amax(-1), valid, beta=2.0, tie_tol=1e-3, rule=rule)
        assert shifted.tolist() == [6.0, 0.0, 4.0, 0.0, 6.0]
    masked = torch.tensor([[True, False, True]] * 5)
    assert ref._shift_tied_max(s, s.masked_fill(~masked, -1e9).amax(-1), masked, 2.0, 1e-3).tolist() == \
        [3.0, -2.0, 4.0, 0.0, 3.0]  # a masked twin is not a tie
    # bounded: a shift of |m| >= 8 wraps into [4, 8) with slope one, so it still differs from row to row
    m = torch.tensor([7.5, 8.0, 9.5, 20.0, -90.0, -110.0])
    assert ref.tied_max_shift(m, rule="paper").tolist() == [15.0, 16.0, 19.0, 40.0, 0.0, 0.0]
    assert ref.tied_max_shift(m, rule="bounded").tolist() == [15.0, 12.0, 15.0, 24.0, -84.0, -104.0]
    assert ref.stable_rule(True) == "bounded" and ref.stable_rule(False) is None
    with pytest.raises(ValueError, match="stable_rounding must be"):
        ref.stable_rule("bf16")


def identical_keys(m, dtype, queries=8, keys=64, d=16, seed=0):
    """Every key the same vector, scored m by every query: the true output is the mean of V."""
    u = torch.full((d,), d ** -0.5)
    q = (u * m * d ** 0.5).expand(queries, d)
    k = u.expand(keys, d)
    v = torch.randn(keys, d, generator=torch.Generator().manual_seed(seed))
    return [x.to(dtype)[None, None].clone().requires_grad_() for x in (q, k, v)]


LARGE_TIES = [(dtype, m) for dtype in (torch.float16, torch.bfloat16, torch.float32)
              for m in (16.0, 24.0, -24.0, -90.0, -110.0)]


@pytest.mark.parametrize("impl", ["reference", pytest.param("triton", marks=needs_triton)])
def test_stable_rounding_survives_large_tied_maxima(impl):
    # The paper's rule moves a tied max m > 0 to 2m and m < 0 to 0, so every probability is
    # exp(-|m|). Here all keys are one vector, so every P of a row is that one value, and with l
    # summing the rounded P its rounding cancels: measured (these inputs, reference) the paper's
    # rule has the unfixed error (1e-4 in fp16) up to |m| = 17, but where exp(-|m|) rounds to 0 in
    # the input dtype (fp16 from |m| ~ 17.3, exp(-24) = 3.8e-11; bf16 from ~93; fp32 from ~104)
    # l = 0 and the output and gradients are NaN. The bounded rule (shift < 8, fp16 < 4 ln 2)
    # stays within the unfixed error plus half an ulp of max|V|: measured <= 1.0e-4 (fp16),
    # 6.2e-4 (bf16), 3.8e-8 (fp32).
    fn = attention.flash_attention_reference if impl == "reference" else on_dev(tri.flash_attention_triton)
    blocks = dict(block_m=32, block_n=32)
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -23}
    for dtype, m in LARGE_TIES:
        if impl == "triton" and m in (24.0, -24.0):
            continue  # the same regime as 16 and -90; keeps the interpreter's share short
        q, k, v = identical_keys(m, dtype)
        truth = v.detach().double().mean(-2, keepdim=True)
        base = fn(q, k, v, **blocks)
        base_err = (base.double() - truth).abs().max().item()
        bound = base_err + 0.5 * ulp[dtype] * v.detach().double().abs().max().item()
        for rule in (True, "bounded"):
            out = fn(q, k, v, stable_rounding=rule, **blocks)
            err = (out.double() - truth).abs().max().item()
            assert err <= bound, (dtype, m, err, base_err)
            grads = torch.autograd.grad(out.float().sum(), (q, k, v))
            assert all(torch.isfinite(g).all() for g in grads), (dtype, m)
            # dV = P^T dO = queries / keys for every key
            dv = q.shape[-2] / k.shape[-2]
            assert (grads[2].double() - dv).abs().max() <= 4 * ulp[dtype] * dv + 1e-6, (dtype, m)
        # the paper's rule, kept for the reproduction, fails here as published: every P rounds to 0
        if m == -110.0 or (dtype == torch.float16 and abs(m) >= 24.0):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's 0 / 0
                assert torch.isnan(fn(q, k, v, stable_rounding="paper", **blocks)).all(), (dtype, m)


# --- the fp16 cap and the row sum of the rounded P ---------------------------------------------

def test_shift_cap_follows_the_dtype():
    # fp16's cap keeps every P within 2^-10 of its row's maximum an fp16 normal after the shift:
    # exp(-c) * 2^-10 >= 2^-14, c = ln(2^-10 / 2^-14) = 4 ln 2. bf16 and fp32 have fp32's exponent range.
    assert ref.STABLE_CAP_FP16 == pytest.approx(4 * math.log(2), rel=1e-12)
    assert ref.FP16_TINY == FP16_TINY and ref.STABLE_CAP_FP16 == pytest.approx(math.log(ref.FP16_KEEP / FP16_TINY))
    assert ref.stable_cap_for(torch.float16) == ref.STABLE_CAP_FP16
    assert ref.stable_cap_for(torch.bfloat16) == ref.stable_cap_for(torch.float32) == ref.STABLE_CAP == 8.0
    q, k, v = ref.graded_tied_inputs(0, 24.0, queries=16, keys=64, head_dim=16, tied_every=4)
    fixed = ref.flash_attention_forward(q, k, v, stable_rounding=True)[0]
    assert torch.equal(fixed, ref.flash_attention_forward(q, k, v, stable_rounding=True,
                                                          stable_cap=ref.STABLE_CAP_FP16)[0])
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="stable_cap must be"):
            ref.flash_attention_forward(q, k, v, stable_rounding=True, stable_cap=bad)


@pytest.mark.parametrize("m", [24.0, -90.0])
def test_fp16_cap_keeps_tied_and_near_max_probabilities_normal(m):
    # The mechanism, on constructed rows (each one tile): a maximum near m tied 128 times, the
    # other keys spread 0..12 below it. After the shift every tied P is exp(-delta) and a key r
    # below the maximum has P = exp(-delta - r). With the fp16 cap the smallest tied P is >= 1/16
    # and no P within 2^-10 of the maximum is an fp16 subnormal; with the cap of 8 (the bf16 one)
    # 38% of those are (measured, seeds 0-7, either m).
    q, k, _ = ref.graded_tied_inputs(0, m)
    s = (q.float() @ k.float().transpose(-1, -2))[0, 0] * q.shape[-1] ** -0.5
    m_tile = s.amax(-1)
    tied = s >= (m_tile - ref.TIE_TOL)[:, None]
    near = s - m_tile[:, None] >= math.log(ref.FP16_KEEP)
    assert (tied.sum(-1) >= 128).all()  # a few keys just below the maximum round onto it in fp16
    valid = torch.ones_like(tied)
    subnormal = {}
    for cap in (ref.stable_cap_for(torch.float16), ref.STABLE_CAP):
        m_new = ref._shift_tied_max(s, m_tile, valid, ref.STABLE_BETA, ref.TIE_TOL, "bounded", cap)
        delta = m_new - m_tile
        assert (delta >= cap / 2 - 1e-4).all() and (delta < cap).all()  # every row's shift has wrapped
        p = torch.exp(s - m_new[:, None]).half().float()
        assert (p[tied] < 1).all()
        subnormal[cap] = ((p < FP16_TINY) & near).sum().item() / near.sum().item()
        if cap == ref.STABLE_CAP_FP16:
            assert p[tied].min() >= max(FP16_TINY, 2.0 ** -4)
            assert (p[near] >= FP16_TINY).all()
    assert subnormal[ref.STABLE_CAP_FP16] == 0 and subnormal[ref.STABLE_CAP] > 0.25, subnormal


def test_bounded_wrap_varies_the_shift_per_row_under_either_cap():
    # The wrap keeps slope one: beyond the cap, delta = paper's delta minus a multiple of c/2, in
    # [c/2, c). So rows whose tied maxima differ get different shifts and different tied P (the
    # fix's point), under the fp16 cap as under 8.
    m = torch.linspace(-200.0, 200.0, 4001)
    m = m[m != 0]
    q, k, _ = ref.graded_tied_inputs(3, 40.0)
    s = (q.float() @ k.float().transpose(-1, -2))[0, 0] * q.shape[-1] ** -0.5
    rows = s.amax(-1)
    for cap in (ref.STABLE_CAP_FP16, ref.STABLE_CAP):
        paper = ref.tied_max_shift(m, rule="paper") - m
        delta = ref.tied_max_shift(m, cap=cap) - m
        wrapped = paper >= cap
        assert torch.equal(delta[~wrapped], paper[~wrapped])
        assert (delta[wrapped] >= cap / 2 - 1e-4).all() and (delta[wrapped] < cap).all()
        turns = (paper - delta)[wrapped] / (cap / 2)
        assert (turns - turns.round()).abs().max() < 1e-3  # slope one between the wraps
        # 128 rows with maxima m + N(0, 1) (fp16 inputs: a few coincide): as many different shifts,
        # spread over the interval, and nearly as many different tied P in fp16
        d_rows = ref.tied_max_shift(rows, cap=cap) - rows
        assert d_rows.unique().numel() == rows.unique().numel() > 120
        assert d_rows.max() - d_rows.min() > 0.8 * cap / 2
        assert torch.exp(-d_rows).half().unique().numel() > 100, cap


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_kernel_precision_weights_sum_to_one(dtype):
    # V = 1: the output is the sum of the weights P_j / l. l sums the same rounded P as the
    # numerator, so the sum is 1 up to fp32 rounding: exactly 1 in the output dtype, every row.
    # With l from the unrounded P (the previous rule, FA-2's) 8-20% of these outputs were not 1
    # (tied maxima with the fix: every tied P rounds the same way; measured seeds 0-3, both dtypes).
    fns = [ref.flash_attention_forward]
    if tri.HAS_TRITON and (DEVICE == "cpu" or torch.cuda.is_available()):
        fns.append(on_dev(tri.triton_forward))
    for seed in range(2):
        q, k, v = ref.tied_max_inputs(seed, queries=64, keys=256, head_dim=16, dtype=dtype)
        ones = torch.ones_like(v)
        for fn in fns:
            for stable in (True, False):
                out = fn(q, k, ones, stable_rounding=stable, block_m=32, block_n=32)[0]
                assert (out == 1).all(), (fn, seed, stable)


def test_fp16_paper_shift_makes_subnormals_the_capped_one_does_not():
    # Rows tied at m~ = 16 with keys spread 0..12 below (no per-row jitter, so no row passes
    # |m~| ~ 17.3 where the paper's rule gives NaN in fp16): the paper's shift of 16 puts
    # nearly every P below the maximum among fp16 subnormals; the bounded rule with the fp16 cap
    # keeps the unfixed error. Measured (seed 0): max error 3.4e-2 (paper), 3.0e-5 (bounded),
    # 3.9e-5 (unfixed).
    q, k, v = ref.graded_tied_inputs(0, 16.0, jitter=0.0, v_mean=0.0, v_std=1.0)
    truth = ref.attention_fp64(q, k, v)
    err = {rule: (ref.flash_attention_forward(q, k, v, stable_rounding=rule)[0].double() - truth).abs().max().item()
           for rule in (False, "bounded", "paper")}
    assert err["bounded"] < 1.5 * err[False] and err["paper"] > 100 * err[False], err


# --- the fix: nothing in fp32, the bias in bf16 row sums --------------------------------------

def test_fix_changes_nothing_measurable_in_fp32():
    q, k, v = ref.tied_max_inputs(0, queries=64, keys=256, head_dim=16, dtype=torch.float32)
    truth = ref.attention_fp64(q, k, v)
    for precision in ref.PRECISIONS:
        base, lse_base = ref.flash_attention_forward(q, k, v, precision=precision)
        fixed, lse_fixed = ref.flash_attention_forward(q, k, v, precision=precision, stable_rounding=True)
        assert rel(fixed, base) < 1e-6
        assert (lse_fixed - lse_base).abs().max() < 1e-5
        assert rel(base, truth) < 2e-6 and rel(fixed, truth) < 2e-6
    # The same inputs in bf16 do trigger the rule: there it changes the result.
    qb, kb, vb = (x.bfloat16() for x in (q, k, v))
    assert not torch.equal(ref.flash_attention_forward(qb, kb, vb, precision="paper")[0],
                           ref.flash_attention_forward(qb, kb, vb, precision="paper", stable_rounding=True)[0])


PAPER = dict(precision="paper", block_m=512, block_n=512)  # the released code's bucket size


@pytest.mark.parametrize("v_mean", [-1.0, 1.0])
def test_tied_maxima_bias_in_bf16_row_sums_and_the_fix_removes_it(v_mean):
    # Measured over seeds 0-4: baseline +1.21..+1.44 (v_mean -1) and -1.53..-1.39 (v_mean +1), the
    # sign opposite to V's mean; with the paper's rule |r| <= 0.14, with the bounded rule (default)
    # |r| <= 0.08 (<= 0.22 over seeds 0-7). The thresholds are the claim (beyond one standard
    # deviation; below a quarter of one) with 0.2 and 0.03 of margin.
    base, fixed = [], {"paper": [], "bounded": []}
    for seed in range(5):
        q, k, v = ref.tied_max_inputs(seed, v_mean=v_mean)
        truth = ref.attention_fp64(q, k, v)
        base.append(ref.error_bias(ref.flash_attention_forward(q, k, v, **PAPER)[0], truth))
        for rule in fixed:
            out = ref.flash_attention_forward(q, k, v, stable_rounding=rule, **PAPER)[0]
            fixed[rule].append(ref.error_bias(out, truth))
    assert all(-r * v_mean > 1.0 for r in base), base
    assert all(abs(r) < 0.25 for rs in fixed.values() for r in rs), fixed


def test_no_bias_without_ties_at_the_maximum():
    # Control: the copies are no longer the row max, so P < 1 there and row sums are not integers.
    # Measured |r| <= 0.30 over seeds 0-4 for either sign of V's mean.
    for v_mean in (-1.0, 1.0):
        for seed in range(5):
            q, k, v = ref.tied_max_inputs(seed, v_mean=v_mean, at_max=False)
            r = ref.error_bias(ref.flash_attention_forward(q, k, v, **PAPER)[0], ref.attention_fp64(q, k, v))
            assert abs(r) < 0.5, (v_mean, seed, r)


def test_fp32_statistics_show_no_tied_maxima_bias():
    # With l and the accumulator in fp32 (the kernel precision, as in the Triton kernel and FA-2),
    # the same tied inputs give |r| <= 0.24 (measured, seeds 0-2, both signs), with or without the fix.
    for v_mean in (-1.0, 1.0):
        for seed in range(3):
            q, k, v = ref.tied_max_inputs(seed, v_mean=v_mean)
            truth = ref.attention_fp64(q, k, v)
            for stable in (False, True):
                out, _ = ref.flash_attention_forward(q, k, v, stable_rounding=stable, block_m=128, block_n=128)
                r = ref.error_bias(out, truth)
                assert abs(r) < 0.4, (v_mean, seed, stable, r)


# --- Triton (interpreter on CPU) against the emulation ----------------------------------------

@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("t", [63, 200])
def test_triton_matches_reference_outputs_and_gradients(t, causal, dtype):
    q, k, v = qkv(1, 2, t, 16, dtype=dtype, seed=t)
    blocks = dict(block_m=32, block_n=32)
    out = on_dev(tri.flash_attention_triton)(q, k, v, causal=causal, **blocks)
    want = ref.flash_attention_reference(q, k, v, causal=causal, **blocks)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    if dtype == torch.float32:
        assert rel(out, want) < 2e-6
        for g, w in zip(grads, want_grads):
            assert rel(g, w) < 1e-5
        return
    # Same rounding sites, so bf16 outputs agree but for rare last-bit flips (exp2 against exp).
    # A flip in one probability moves the output by an ulp of that term p_j |v_j|, which is not an
    # ulp of the output where the terms cancel (seed 200: one output of -7e-4 differs by 7%), so
    # each output's allowance is an ulp of its own magnitude plus an ulp of sum_j p_j |v_j|.
    diff = (out.double() - want.double()).abs()
    terms = ref.attention_fp64(q.detach().double(), k.detach().double(), v.detach().double().abs(), causal=causal)
    assert (diff <= BF16_EPS * (want.double().abs() + terms)).all()
    assert (diff > BF16_EPS * want.double().abs()).double().mean() < 1e-3
    assert (diff > 0).double().mean() < 0.01
    # Gradients round dS (and P for dV) where the emulation does and differ only by accumulation
    # order: measured <= 0.2% of entries differ, by <= 1.2e-3 of the largest; with dS left
    # unrounded ~40% would. And they are no further from float64 than the emulation is.
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    exact = torch.autograd.grad(ref.attention_fp64(q64, k64, v64, causal=causal), (q64, k64, v64), dout.double())
    for g, w, e in zip(grads, want_grads, exact):
        assert (g != w).double().mean() < 0.02
        assert rel(g, w) <= BF16_EPS
        assert rel(g, e) <= 1.25 * rel(w, e) + 1e-3


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_stable_rounding_matches_reference(dtype):
    q, k, v = ref.tied_max_inputs(1, queries=64, keys=160, head_dim=16, dtype=dtype)
    blocks = dict(block_m=32, block_n=32)
    base, lse_base = on_dev(tri.triton_forward)(q, k, v, **blocks)
    fixed, lse_fixed = on_dev(tri.triton_forward)(q, k, v, stable_rounding=True, **blocks)
    want, want_lse = ref.flash_attention_forward(q, k, v, stable_rounding=True, **blocks)
    assert (lse_fixed - want_lse).abs().max() < 1e-5
    assert (lse_fixed - lse_base).abs().max() < 1e-5
    if dtype == torch.float32:
        assert rel(fixed, want) < 2e-6 and rel(fixed, base) < 2e-6
    elif DEVICE == "cpu":
        # interpreted, the kernel takes the emulation's operations in the emulation's order: bit for bit
        assert torch.equal(fixed, want)
        assert not torch.equal(fixed, base)  # the rule fired: P of tied keys is exp(-m) now, not 1
    else:
        # A GPU computes exp2 with ex2.approx (a couple of ulps of fp32) and sums in another order, so a
        # bf16 P or output can land one bf16 ulp away where its exact value is near a rounding boundary.
        # Bound, per output: one bf16 ulp of the output itself plus one of sum_j p_j |v_j| (a flipped
        # P_j moves the output by an ulp of p_j v_j, which is not an ulp of the output where terms
        # cancel), the same allowance as test_triton_matches_reference_outputs_and_gradients; and
        # such flips must stay rare (< 1% of outputs, < 0.1% beyond an ulp of the output).
        diff = (fixed.double() - want.double()).abs()
        terms = ref.attention_fp64(q.double(), k.double(), v.double().abs())
        assert (diff <= BF16_EPS * (want.double().abs() + terms)).all()
        assert (diff > BF16_EPS * want.double().abs()).double().mean() < 1e-3
        assert (diff > 0).double().mean() < 0.01
        # the rule fired here too: the kernel's fixed output is the emulation's fixed one, not its unfixed one
        want_base, _ = ref.flash_attention_forward(q, k, v, **blocks)
        assert (fixed != base).any() and (fixed == want).double().mean() > (fixed == want_base).double().mean()
    # The backward reads only the LSE, so gradients with the fix match the emulation's and the
    # exact maths. dQ is a cancellation on these inputs (the keys are nearly all one vector, so
    # sum_j P_j (dP_j - D) k_j is ~0: |dQ| is 1/20 of |dK|), so it is compared with the emulation
    # only: measured 7e-5 apart in fp32 and bit-equal in bf16.
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    out = on_dev(tri.flash_attention_triton)(qg, kg, vg, stable_rounding=True, **blocks)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    grads = torch.autograd.grad(out, (qg, kg, vg), dout)
    want = torch.autograd.grad(ref.flash_attention_reference(qg, kg, vg, stable_rounding=True, **blocks),
                               (qg, kg, vg), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    exact = torch.autograd.grad(ref.attention_fp64(q64, k64, v64), (q64, k64, v64), dout.double())
    fp32 = dtype == torch.float32
    for g, w in zip(grads, want):
        assert rel(g, w) < (2e-4 if fp32 else BF16_EPS)
    for g, e in zip(grads[1:], exact[1:]):  # measured 4e-7 (fp32), 3.7e-3 (bf16)
        assert rel(g, e) < (1e-5 if fp32 else 2 * BF16_EPS)


@needs_triton
def test_triton_fp16_stable_rounding_matches_reference():
    # fp16 with the fix on: the kernel receives the fp16 cap (4 ln 2) with its launch and sums l
    # from the rounded P, as the emulation does. fp16 keeps 11 bits, so exp2 against exp flips a
    # P's last bit more often than in bf16: not bit for bit even interpreted (measured, seeds 1-5:
    # <= 0.4% of outputs differ, none by more than an ulp of the output), so the allowance of
    # test_triton_stable_rounding_matches_reference on a GPU, in fp16 ulps. Inputs: tied maxima
    # near m~ = 4 (tied_max_inputs, D = 16) and at m~ = 24 and -90 (graded_tied_inputs), where the
    # shift wraps under either cap.
    blocks = dict(block_m=32, block_n=32)
    tied = ref.tied_max_inputs(1, queries=64, keys=160, head_dim=16, dtype=torch.float16)
    graded = [ref.graded_tied_inputs(1, m, queries=64, keys=160, head_dim=16, tied_every=4) for m in (24.0, -90.0)]
    same = {"fp16 cap": 0, "cap 8": 0}
    for i, (q, k, v) in enumerate([tied] + graded):
        fixed, lse = on_dev(tri.triton_forward)(q, k, v, stable_rounding=True, **blocks)
        want, want_lse = ref.flash_attention_forward(q, k, v, stable_rounding=True, **blocks)
        # the LSE keeps the unrounded row sum: a few fp32 ulps of |LSE| apart (|LSE| ~ 90 here)
        assert ((lse - want_lse).abs() <= 1e-5 + 2 ** -22 * want_lse.abs()).all()
        diff = (fixed.double() - want.double()).abs()
        terms = ref.attention_fp64(q.double(), k.double(), v.double().abs())
        assert (diff <= FP16_EPS * (want.double().abs() + terms)).all()
        assert (diff > FP16_EPS * want.double().abs()).double().mean() < 1e-3
        assert (diff > 0).double().mean() < 0.01
        if i:
            want8, _ = ref.flash_attention_forward(q, k, v, stable_rounding=True, stable_cap=8.0, **blocks)
            same["fp16 cap"] += (fixed == want).sum().item()
            same["cap 8"] += (fixed == want8).sum().item()
    # the cap reached the kernel: its outputs are the fp16-cap emulation's (measured 2042 of 2048
    # equal, seed 1), not the cap-8 one's (2026)
    assert same["fp16 cap"] > same["cap 8"], same
    # The backward reads only the LSE. dQ is a cancellation on tied inputs (see the test above):
    # measured (seeds 1-5) <= 3.3e-3 of its largest apart from the emulation, dK and dV <= 3.2e-4,
    # and dK, dV <= 6.5e-4 from the exact maths.
    q, k, v = (x.detach().requires_grad_() for x in tied)
    out = on_dev(tri.flash_attention_triton)(q, k, v, stable_rounding=True, **blocks)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).half()
    grads = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref.flash_attention_reference(q, k, v, stable_rounding=True, **blocks), (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    exact = torch.autograd.grad(ref.attention_fp64(q64, k64, v64), (q64, k64, v64), dout.double())
    assert rel(grads[0], want[0]) < 8 * FP16_EPS
    for g, w, e in zip(grads[1:], want[1:], exact[1:]):
        assert rel(g, w) < 2 * FP16_EPS and rel(g, e) < 2 * FP16_EPS


@needs_triton
def test_triton_widens_bf16_subnormals_exactly():
    # Under the interpreter a plain bf16 -> fp32 cast turns 1.01e-39 into 4.41e-39 (and fp32 -> bf16
    # flushes subnormals); the kernels widen and narrow bf16 by its bits. V of bf16 subnormals only: the output is their weighted mean.
    q, k, v = qkv(1, 1, 40, 16, dtype=torch.bfloat16, seed=7)
    v = (v.detach().float() * 1e-39).bfloat16().requires_grad_()
    assert (v.float().abs() < torch.finfo(torch.bfloat16).tiny).all() and (v != 0).float().mean() > 0.9
    q = q.detach().clone()
    q[0, 0, :4] = (torch.arange(1, 65, dtype=torch.float32).view(4, 16) * 3e-40).bfloat16()  # subnormal queries too
    q.requires_grad_()
    blocks = dict(block_m=32, block_n=32)
    out = on_dev(tri.flash_attention_triton)(q, k, v, **blocks)
    want = ref.flash_attention_reference(q, k, v, **blocks)
    assert rel(out, want) < 2 * BF16_EPS
    # dV = P^T dO reads the subnormal queries through P (dQ and dK are themselves near fp32's
    # subnormal floor here, where summation order decides most of their bits: not compared)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    assert rel(torch.autograd.grad(out, v, dout)[0], torch.autograd.grad(want, v, dout)[0]) < 2 * BF16_EPS


@needs_triton
def test_triton_offsets_past_2_31_elements(huge_views):
    # Batch 2 starts 2 * (2^31 - 2^12) elements in: as an int32 product that wraps to -2^13 and
    # reads the wrong rows; in int64 it is right. Forward and backward, against compact copies.
    stride0 = 2 ** 31 - 2 ** 12
    q, k, v = huge_views([(3, 1, 16, 16)] * 3, torch.bfloat16, stride0, device=DEVICE)
    g = torch.Generator().manual_seed(3)
    for x in (q, k, v):
        x.copy_(torch.randn(x.shape, generator=g).bfloat16())
    small = [x.clone().requires_grad_() for x in (q, k, v)]
    big = [x.requires_grad_() for x in (q, k, v)]
    blocks = dict(block_m=16, block_n=16)
    for causal in (False, True):
        want = on_dev(tri.flash_attention_triton)(*small, causal=causal, **blocks)
        out = on_dev(tri.flash_attention_triton)(*big, causal=causal, **blocks)
        assert torch.equal(out, want)
        dout = torch.randn(out.shape, generator=g).bfloat16()
        for a, b in zip(torch.autograd.grad(out, big, dout), torch.autograd.grad(want, small, dout)):
            assert torch.equal(a, b)


@needs_triton
def test_triton_takes_transposed_inputs_without_copies():
    # The usual [B, T, H, D].transpose(1, 2): read in place, the same result as contiguous inputs.
    x = torch.randn(2, 40, 3, 16, generator=torch.Generator().manual_seed(4))
    q, k, v = ((x * s).transpose(1, 2) for s in (1.0, 0.5, -1.0))
    assert not q.is_contiguous()
    blocks = dict(block_m=16, block_n=32)
    out = on_dev(tri.flash_attention_triton)(q, k, v, causal=True, **blocks)
    assert torch.equal(out, on_dev(tri.flash_attention_triton)(q.contiguous(), k.contiguous(), v.contiguous(), causal=True,
                                                       **blocks))
    assert rel(out, F.scaled_dot_product_attention(q, k, v, is_causal=True)) < 2e-6


@needs_triton
@pytest.mark.parametrize("block_m, block_n", [(32, 16), (16, 32)])
def test_triton_causal_mask_only_on_diagonal_tiles(block_m, block_n):
    # The causal mask runs only on tiles that cross the diagonal or the sequence end; tiles of
    # unequal sizes and lengths that are no multiple of either put those boundaries everywhere.
    q, k, v = qkv(1, 1, 50, 16, seed=9, tk=61)
    out = on_dev(tri.flash_attention_triton)(q, k, v, causal=True, block_m=block_m, block_n=block_n)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = ref.attention_fp64(q64, k64, v64, causal=True)
    assert rel(out, want) < 2e-6
    for g, w in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(want, (q64, k64, v64), dout.double())):
        assert rel(g, w) < 1e-5


@needs_triton
def test_triton_tf32_option_and_its_error():
    # fp32 inputs: IEEE products by default (error ~1e-7 of the output's scale); allow_tf32 rounds
    # every product operand to 10 mantissa bits (emulated bit for bit under the interpreter):
    # measured 6.8e-4 (output) and <= 7.0e-4 (gradients) of their scale here, the price of tensor cores.
    q, k, v = qkv(1, 2, 64, 32, seed=11)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = ref.attention_fp64(q64, k64, v64)
    dout = torch.randn(want.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    exact = torch.autograd.grad(want, (q64, k64, v64), dout)
    blocks = dict(block_m=32, block_n=32)
    ieee = on_dev(tri.flash_attention_triton)(q, k, v, **blocks)
    tf32 = on_dev(tri.flash_attention_triton)(q, k, v, allow_tf32=True, **blocks)
    assert rel(ieee, want) < 2e-6
    assert 1e-4 < rel(tf32, want) < 3e-3
    for g, e in zip(torch.autograd.grad(tf32, (q, k, v), dout.float()), exact):
        assert rel(g, e) < 3e-3


@needs_triton
def test_triton_odd_head_dim_and_unequal_lengths():
    q, k, v = qkv(2, 1, 45, 24, seed=3, tk=70)  # D = 24 pads to 32 inside the kernel
    for causal in (False, True):
        out = on_dev(tri.flash_attention_triton)(q, k, v, causal=causal, block_m=16, block_n=32)
        assert rel(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal)) < 2e-6


# --- dispatch -----------------------------------------------------------------------------------

def test_dispatch_auto_uses_reference_on_cpu_and_rejects_unknown_impls():
    q, k, v = qkv(1, 2, 40, 8, dtype=torch.bfloat16)
    assert attention.resolve_impl("auto", q) == "reference"
    assert attention.resolve_impl("auto", types.SimpleNamespace(is_cuda=True)) == \
        ("triton" if tri.HAS_TRITON else "reference")
    out = attention.flash_attention(q, k, v, causal=True, stable_rounding=True)
    assert torch.equal(out, ref.flash_attention_reference(q, k, v, causal=True, stable_rounding=True))
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="impl must be one of"):
        attention.flash_attention(q, k, v, impl="cuda")
    with pytest.raises(ValueError, match="shapes do not match"):
        attention.flash_attention(q, k[:, :1], v, impl="reference")


@needs_triton
def test_dispatch_triton_runs_the_kernel():
    q, k, v = qkv(1, 1, 33, 8, seed=5)
    out = on_dev(attention.flash_attention)(q, k, v, causal=True, impl="triton")
    assert rel(out, F.scaled_dot_product_attention(q, k, v, is_causal=True)) < 2e-6


def test_without_triton_the_stubs_raise_a_clear_error():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from kernels import attention\n"
        "from kernels.attention import triton as tri\n"
        "assert not tri.HAS_TRITON and not attention.HAS_TRITON\n"
        "q = torch.randn(1, 1, 8, 4)\n"
        "assert attention.resolve_impl('auto', q) == 'reference'\n"
        "attention.flash_attention(q, q, q)\n"
        "try:\n"
        "    attention.flash_attention(q, q, q, impl='triton')\n"
        "except RuntimeError as e:\n"
        "    assert 'Triton is not installed' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
