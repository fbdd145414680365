"""OCP Microscaling Formats (MX) Specification v1.0 — https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf

kernels.mx Triton kernels (on the CPU interpreter here) against the reference: codes, scales
and dequantized values bit for bit on awkward shapes and adversarial values (ties, subnormal
scales, saturation, NaN/inf, zero blocks, fp32 subnormals), for every OCP MX v1.0 element format
(E2M1, E3M2, E2M3, E4M3, E5M2, INT8), mx_matmul within a stated bound of
fp32 summation error (and exactly where every partial sum is exact), and the guards that refuse
to launch without Triton or a device.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels.mx is imported

from kernels import mx  # noqa: E402
from kernels.mx import reference as ref  # noqa: E402
from kernels.mx import triton as tri  # noqa: E402
from kernel_fixtures import huge_views  # noqa: E402, F401  (a fixture: pytest finds it in the module)

# interpreted, the kernels run on CPU tensors; otherwise on the GPU, against the reference on the CPU
DEVICE = "cpu" if tri._INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(not tri.HAS_TRITON or (DEVICE == "cuda" and not torch.cuda.is_available()),
                                reason="needs triton, and TRITON_INTERPRET=1 or a CUDA device")
U = 2.0 ** -24  # fp32 unit roundoff


def moved(m: ref.MXTensor, device) -> ref.MXTensor:
    g = m.global_scale.to(device) if m.global_scale is not None else None
    return dataclasses.replace(m, codes=m.codes.to(device), scales=m.scales.to(device), global_scale=g)


def t_quantize(x, **kw):
    return moved(mx.quantize(x.to(DEVICE), impl="triton", **kw), "cpu")


def t_dequantize(m, dtype=None):
    return mx.dequantize(moved(m, DEVICE), dtype, impl="triton").cpu()


def t_matmul(a, m):
    return mx.mx_matmul(a.to(DEVICE), moved(m, DEVICE), impl="triton").cpu()


def awkward(shape, seed=0, dtype=torch.float32):
    """Values that stress every rule: per-row widths from 1e-6 to 1e4 (UE4M3 subnormal scales,
    flushed blocks, saturation), exact E2M1 ties, exact scale ties, zero blocks, -0, fp32
    subnormals, huge values, NaN and inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1, shape[-1])
    r, k = flat.shape
    widths = 10.0 ** torch.linspace(-6, 4, r)
    flat *= widths[:, None]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -5.0, -0.75])
    for i in range(0, r, 5):  # rows of exact ties at scale 1 (amax 6 -> E8M0 and UE4M3 scale 1)
        flat[i] = ties[torch.randint(0, len(ties), (k,), generator=g)]
        flat[i, ::8] = 6.0
    for i in range(1, r, 7):  # amax/6 exactly between two UE4M3 codes
        flat[i] = torch.rand(k, generator=g) * 6.375
        flat[i, ::8] = 6.375
    if r > 2:
        flat[2, : min(k, 40)] = 0.0
        flat[2, 40:48] = -0.0
    if r > 3:
        flat[3, 5 % k] = float("nan")
        flat[3, 7 * k // 8] = float("inf")
    if r > 4:
        flat[4, 0] = -float("inf")
        flat[4, 1:] = 3e38 * torch.rand(k - 1, generator=g)
    if r > 6:
        flat[6] = torch.randn(k, generator=g) * 1e-40  # fp32 subnormals
    return x.to(dtype)


def assert_same_values(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(a.nan_to_num(0.0).view(torch.int16 if a.element_size() == 2 else torch.int32),
                       b.nan_to_num(0.0).view(torch.int16 if b.element_size() == 2 else torch.int32))


def assert_same_mx(a: ref.MXTensor, b: ref.MXTensor):
    assert torch.equal(a.scales, b.scales)
    assert torch.equal(a.codes, b.codes)
    assert (a.global_scale is None) == (b.global_scale is None)
    if a.global_scale is not None:
        assert torch.equal(a.global_scale, b.global_scale)
    assert (a.shape, a.block_size, a.elem_format, a.scale_format, a.dtype) == \
        (b.shape, b.block_size, b.elem_format, b.scale_format, b.dtype)


CASES = [  # (scale_format, global_scale, elem_format, block_size)
    ("e8m0", False, "e2m1", 32),
    ("e8m0", False, "e4m3", 8),
    ("ue4m3", False, "e2m1", 16),
    ("ue4m3", True, "e2m1", 16),
    ("ue4m3", False, "e4m3", 64),
    ("ue4m3", True, "e4m3", 128),
    ("ue5m3", False, "e2m1", 8),
    ("ue5m3", True, "e2m1", 256),
    ("ue5m3", False, "e4m3", 32),
    (ref.ue5m3(bias=13, nan=False), False, "e2m1", 16),
]


@pytest.mark.parametrize("scale_format, global_scale, elem_format, block_size", CASES,
                         ids=lambda v: getattr(v, "name", str(v)))
def test_quantize_and_dequantize_bit_exact(scale_format, global_scale, elem_format, block_size):
    x = awkward((63, 1000))  # 1000 is a multiple of 8 only: partial last blocks from 16 up
    kw = dict(block_size=block_size, scale_format=scale_format, elem_format=elem_format, global_scale=global_scale)
    want = ref.quantize(x, **kw)
    got = t_quantize(x, **kw)
    assert_same_mx(want, got)
    assert (want.scales == 0).any() or scale_format == "e8m0" or global_scale  # flushed blocks are covered
    assert_same_values(t_dequantize(got), ref.dequantize(want))


def with_element_ties(x, elem, seed=0):
    """x (from `awkward`) with every 9th row (from row 8) made of exact ties of `elem` at scale 1:
    its grid values, the midpoints between neighbours (round half to even) and values just above
    them, random signs, and the format's max every 8th place (so E8M0 and UE4M3 scales are 2^0)."""
    e = ref.ELEM_FORMATS[elem]
    g = torch.Generator().manual_seed(seed)
    grid = ref.decode(torch.arange(1 << (e.bits - 1)), e)  # the non-negative codes
    grid = grid[torch.isfinite(grid) & (grid <= e.max_value)].sort().values
    mids = (grid[1:] + grid[:-1]) / 2
    pool = torch.cat([grid, mids, mids * (1 + 2.0 ** -20)])
    flat = x.view(-1, x.shape[-1])
    for i in range(8, flat.shape[0], 9):
        row = pool[torch.randint(0, len(pool), (flat.shape[1],), generator=g)]
        flat[i] = torch.where(torch.rand(flat.shape[1], generator=g) < 0.5, -row, row)
        flat[i, ::8] = e.max_value
    return x


OCP_CASES = [  # the rest of OCP MX v1.0: each element format with E8M0 and with an NVFP4-style scale
    ("e8m0", False, "e5m2", 32), ("e8m0", False, "e3m2", 32), ("e8m0", False, "e2m3", 32), ("e8m0", False, "int8", 32),
    ("ue4m3", True, "e5m2", 16), ("ue4m3", False, "e3m2", 64), ("ue5m3", False, "e2m3", 8), ("ue4m3", True, "int8", 16),
]


@pytest.mark.parametrize("scale_format, global_scale, elem_format, block_size", OCP_CASES, ids=str)
def test_ocp_elements_bit_exact(scale_format, global_scale, elem_format, block_size):
    x = with_element_ties(awkward((63, 1000), seed=20), elem_format, seed=21)
    kw = dict(block_size=block_size, scale_format=scale_format, elem_format=elem_format, global_scale=global_scale)
    want = ref.quantize(x, **kw)
    got = t_quantize(x, **kw)
    assert_same_mx(want, got)
    if scale_format == "e8m0":
        assert (want.scales == 127).sum() >= 7 * 1000 // block_size  # the tie rows ran at scale 2^0
    if elem_format == "int8" and scale_format == "e8m0":
        assert (want.scales == 254).any()  # shared_exp 127 (amax >= 2^127): 2^-127 is an fp32 subnormal
    assert_same_values(t_dequantize(got), ref.dequantize(want))
    assert_same_values(t_dequantize(got, torch.bfloat16), ref.dequantize(want, torch.bfloat16))


@pytest.mark.parametrize("block_size", ref.BLOCK_SIZES)
def test_every_block_size_on_odd_widths(block_size):
    x = awkward((13, 3 * block_size + 5), seed=block_size)
    for fmt in ("e8m0", "ue4m3"):
        want = ref.quantize(x, block_size=block_size, scale_format=fmt)
        got = t_quantize(x, block_size=block_size, scale_format=fmt)
        assert_same_mx(want, got)
        assert_same_values(t_dequantize(got), ref.dequantize(want))


@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (2, 3, 40), (300,)])
def test_small_and_batched_shapes(shape):
    x = awkward(shape, seed=3)
    want = ref.quantize(x, block_size=16, scale_format="ue5m3")
    got = t_quantize(x, block_size=16, scale_format="ue5m3")
    assert_same_mx(want, got)
    assert_same_values(t_dequantize(got), ref.dequantize(want))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_and_outputs(dtype):
    x = awkward((24, 200), seed=4).clamp(-6e4, 6e4).to(dtype)
    want = ref.quantize(x, block_size=32, scale_format="ue4m3", global_scale=True)
    got = t_quantize(x, block_size=32, scale_format="ue4m3", global_scale=True)
    assert_same_mx(want, got)
    # with a global scale the products are rounded to the output dtype: RNE in both
    assert_same_values(t_dequantize(got), ref.dequantize(want))
    assert_same_values(t_dequantize(got, torch.float32), ref.dequantize(want, torch.float32))


def test_bf16_output_rounds_ties_to_even():
    # random codes, power-of-two scales and a global scale of 1 + 3 * 2^-8: many products fall exactly
    # halfway between two bf16 values
    g = torch.Generator().manual_seed(10)
    m = ref.MXTensor(codes=torch.randint(0, 256, (16, 32), generator=g, dtype=torch.uint8),
                     scales=(torch.randint(4, 12, (16, 4), generator=g) * 8).to(torch.uint8),
                     global_scale=torch.tensor(1 + 3 * 2 ** -8), shape=torch.Size((16, 64)), block_size=16,
                     elem_format=ref.E2M1, scale_format=ref.UE4M3, dtype=torch.bfloat16)
    assert ((ref.dequantize(m, torch.float32).view(torch.int32) & 0xFFFF) == 0x8000).sum() > 100
    assert_same_values(t_dequantize(m), ref.dequantize(m))


if tri.HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _round_kernel(X, Y, N, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tri._store_rounded(Y + offs, tl.load(X + offs, mask=offs < N), offs < N, 1)


def test_bf16_rounding_helper_matches_torch():
    """Ties, the carry into infinity, and NaN payloads (a GPU's canonical NaN is 0x7FFFFFFF, which a
    bare round-by-adding would carry into the sign bit)."""
    g = torch.Generator().manual_seed(11)
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (200,), generator=g, dtype=torch.int64)
    bits[:100] = (bits[:100] & ~0xFFFF) | 0x8000
    special = torch.tensor([0x7FFFFFFF, 0xFFC00000 - 2 ** 32, 0x7F800001, 0x7F7FFFFF, 0x7F7F8000, 0x00008000,
                            0x80018000 - 2 ** 32, 0x3F808000, 0x3F818000])
    x = torch.cat([bits, special]).to(torch.int32).view(torch.float32)
    y = torch.empty(len(x), dtype=torch.bfloat16, device=DEVICE)
    _round_kernel[(1,)](x.to(DEVICE), y, len(x), BLOCK=256)
    y = y.cpu()
    assert y[-9:-6].isnan().all()
    assert_same_values(y, x.bfloat16())


def test_underflow_clamp():
    x = awkward((20, 96), seed=5)
    want = ref.quantize(x, block_size=8, scale_format="ue4m3", underflow="clamp")
    got = t_quantize(x, block_size=8, scale_format="ue4m3", underflow="clamp")
    assert_same_mx(want, got)
    assert (want.scales == 1).any() and not (want.scales == 0).any()


def matmul_bound(a, w_hat, k, extra=0.0):
    """|fl(a @ w.T) - a @ w.T| <= K u sum|a||w| for each of two summation orders, so they differ by at
    most twice that (plus `extra` relative to sum|a||w| for roundings outside the sum)."""
    return (2 * k * U + extra) * (a.double().abs() @ w_hat.double().abs().T)


@pytest.mark.parametrize("scale_format, global_scale, elem_format, block_size", [
    ("e8m0", False, "e2m1", 32),
    ("ue4m3", True, "e2m1", 16),
    ("ue5m3", False, "e4m3", 8),
    ("ue5m3", False, "e2m1", 256),
    ("e8m0", False, "e5m2", 32),
    ("e8m0", False, "e3m2", 16),
    ("ue4m3", False, "e2m3", 32),
    ("e8m0", False, "int8", 32),
    ("ue5m3", True, "int8", 64),
], ids=lambda v: str(v))
def test_mx_matmul_within_fp32_bound(scale_format, global_scale, elem_format, block_size):
    g = torch.Generator().manual_seed(6)
    n, k = 70, 1000
    w = torch.randn(n, k, generator=g) * 0.02
    a = torch.randn(63, k, generator=g)
    wm = ref.quantize(w, block_size=block_size, scale_format=scale_format, elem_format=elem_format,
                      global_scale=global_scale)
    got = t_matmul(a, wm)
    want = ref.mx_matmul(a, wm)
    w_hat = ref.dequantize(wm)
    # a global scale is one more rounding per weight in the reference and one per output in the kernel
    bound = matmul_bound(a, w_hat, k, extra=4 * U if global_scale else 0.0)
    assert ((got.double() - want.double()).abs() <= bound).all()


def test_mx_matmul_exact_when_every_sum_is_exact():
    """Small-integer activations times E8M0-scaled E2M1 weights: every partial sum is exact in fp32, so
    any wrong nibble, scale or tile edge shows as a difference."""
    g = torch.Generator().manual_seed(7)
    n, k = 45, 520
    w = torch.randn(n, k, generator=g)
    a = torch.randint(-3, 4, (2, 19, k), generator=g).float()
    wm = ref.quantize(w, block_size=8)
    got = t_matmul(a, wm)
    assert got.shape == (2, 19, n)
    assert torch.equal(got, ref.mx_matmul(a, wm))
    assert torch.equal(got, (a.double() @ ref.dequantize(wm).double().T).float())


@pytest.mark.parametrize("elem_format", ["e2m1", "int8"])  # int8 with UE4M3 takes the fp32 dot on a GPU
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mx_matmul_half_activations(dtype, elem_format):
    g = torch.Generator().manual_seed(8)
    n, k = 40, 136
    wm = ref.quantize(torch.randn(n, k, generator=g) * 0.05, block_size=16, scale_format="ue4m3",
                      elem_format=elem_format)
    a = torch.randn(33, k, generator=g).to(dtype)
    got = t_matmul(a, wm)
    assert got.dtype == dtype
    want = ref.mx_matmul(a, wm)
    exact = a.double() @ ref.dequantize(wm).double().T
    # both round one fp32 sum to the output dtype: within a unit in the last place of each other
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    tol = ulp * exact.abs() + matmul_bound(a, ref.dequantize(wm), k) + 1e-30
    assert ((got.double() - want.double()).abs() <= tol).all()


def test_bf16_dot_only_where_the_weights_are_exact_in_bf16():
    """The GPU's bf16 tensor-core dot sees the dequantized weights rounded to bf16: used only where
    element and scale significands together fit bf16's 8 bits (every pair but MXINT8 with UE scales)."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(14))
    for elem in ref.ELEM_FORMATS:
        for scale in ("e8m0", "ue4m3", "ue5m3"):
            m = ref.quantize(x, block_size=32, scale_format=scale, elem_format=elem)
            exact = not (elem == "int8" and scale != "e8m0")
            assert tri.bf16_exact(m) == exact, (elem, scale)
            if exact:
                w = ref.dequantize(m, torch.float32)
                assert torch.equal(w.bfloat16().float(), w), (elem, scale)
    # 127/64 under a UE4M3 scale of 1.125 is 1143 * 2^-9: eleven significant bits, which bf16 rounds
    m = ref.quantize(torch.tensor([[127 / 64 * 1.125] + [0.0] * 15]), block_size=16, scale_format="ue4m3",
                     elem_format="int8")
    w = ref.dequantize(m, torch.float32)
    assert w[0, 0] == 127 / 64 * 1.125 and w[0, 0].bfloat16().float() != w[0, 0]


def test_mx_matmul_nan_block_propagates_like_the_reference():
    w = torch.randn(8, 40)
    w[3, 33] = float("nan")  # in the partial last block
    wm = ref.quantize(w, block_size=16)
    a = torch.randn(5, 40)
    got, want = t_matmul(a, wm), ref.mx_matmul(a, wm)
    assert torch.equal(got.isnan(), want.isnan()) and want[:, 3].isnan().all() and not want[:, 2].isnan().any()


def test_fake_quant_triton_forward_and_gradient():
    x = awkward((9, 100), seed=9).nan_to_num(0.0, 0.0, 0.0).clamp(-1e4, 1e4)
    xd = x.to(DEVICE).requires_grad_()
    y = mx.fake_quant(xd, block_size=32, scale_format="ue5m3", impl="triton")
    assert_same_values(y.detach().cpu(), ref.fake_quant(x, block_size=32, scale_format="ue5m3"))
    up = torch.randn(9, 100)
    (y * up.to(DEVICE)).sum().backward()
    assert torch.equal(xd.grad.cpu(), up)


def test_guards(monkeypatch):
    x = torch.randn(4, 32)
    monkeypatch.setattr(tri, "HAS_TRITON", False)
    with pytest.raises(RuntimeError, match="needs the `triton` package"):
        tri.quantize_triton(x)
    monkeypatch.setattr(tri, "HAS_TRITON", True)
    monkeypatch.setattr(tri, "_INTERPRETED", False)
    for call in (lambda: tri.quantize_triton(x), lambda: tri.dequantize_triton(ref.quantize(x)),
                 lambda: tri.mx_matmul_triton(x, ref.quantize(x))):
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            call()


BF16_SUBNORMAL_CASES = [("e8m0", False, "e2m1", 32), ("e8m0", False, "e4m3", 16), ("ue4m3", True, "e2m1", 16),
                        ("ue5m3", False, "e4m3", 8)]


@pytest.mark.parametrize("scale_format, global_scale, elem_format, block_size", BF16_SUBNORMAL_CASES,
                         ids=lambda v: str(v))
def test_bf16_subnormals_bit_exact(scale_format, global_scale, elem_format, block_size):
    # bf16 subnormals (below 1.18e-38): the interpreter's bf16 -> fp32 cast gets them wrong (1.01e-39
    # -> 4.41e-39); the kernels widen bf16 by its bits. E8M0 blocks of them quantize to nonzero codes
    # (the scale clamps at 2^-127), so a wrong widening shows in the codes.
    g = torch.Generator().manual_seed(12)
    x = torch.randn(6, 64, generator=g) * 1e-39
    x[1] *= 100.0  # normal and subnormal values in one block
    x[2, ::3] = 3e-38
    x = x.bfloat16()
    assert (x.float().abs() < torch.finfo(torch.bfloat16).tiny).float().mean() > 0.5
    kw = dict(block_size=block_size, scale_format=scale_format, elem_format=elem_format, global_scale=global_scale)
    want = ref.quantize(x, **kw)
    got = t_quantize(x, **kw)
    assert_same_mx(want, got)
    assert scale_format != "e8m0" or (want.codes != 0).float().mean() > 0.3
    assert_same_values(t_dequantize(got), ref.dequantize(want))
    # subnormal activations in the matmul
    w = ref.quantize(torch.randn(24, 64, generator=g), block_size=32)
    got_mm, want_mm = t_matmul(x, w), ref.mx_matmul(x, w)
    bound = matmul_bound(x, ref.dequantize(w), 64) + 2.0 ** -8 * want_mm.double().abs()
    assert ((got_mm.double() - want_mm.double()).abs() <= bound).all()


def test_offsets_past_2_31_elements(huge_views):
    # Row 2 of each view starts 2 * (2^31 - 2^12) elements in: an int32 row * stride wraps there.
    stride0 = 2 ** 31 - 2 ** 12
    x, a = huge_views([(3, 64), (3, 64)], torch.bfloat16, stride0, device=DEVICE)
    gen = torch.Generator().manual_seed(13)
    x.copy_(torch.randn(3, 64, generator=gen).bfloat16())
    a.copy_(torch.randn(3, 64, generator=gen).bfloat16())
    for kw in (dict(block_size=32), dict(block_size=16, scale_format="ue4m3", global_scale=True)):
        got = moved(mx.quantize(x, impl="triton", **kw), "cpu")
        assert_same_mx(ref.quantize(x.cpu(), **kw), got)
    w = ref.quantize(torch.randn(40, 64, generator=gen), block_size=32)
    got = mx.mx_matmul(a, moved(w, DEVICE), impl="triton").cpu()
    assert torch.equal(got, mx.mx_matmul(a.clone(), moved(w, DEVICE), impl="triton").cpu())


@pytest.mark.parametrize("tiles", [dict(split_k=3), dict(split_k=2, group_m=1, block_m=16),
                                   dict(group_m=3, block_m=16, block_n=16, block_k=32)], ids=str)
def test_mx_matmul_split_k_and_grouped_order_exact(tiles):
    """Split-K partials (summed in a fixed order) and grouped tile order on the exact-sum case."""
    if DEVICE == "cuda":
        pytest.skip("explicit tiles: interpreter check (the GPU run autotunes them)")
    g = torch.Generator().manual_seed(7)
    n, k = 40, 200
    wm = ref.quantize(torch.randn(n, k, generator=g), block_size=8)
    a = torch.randint(-3, 4, (19, k), generator=g).float()
    assert torch.equal(tri.mx_matmul_triton(a, wm, **tiles), ref.mx_matmul(a, wm))
    # a global scale is applied after the partials are summed, then the bf16 rounding: as unsplit
    wg = ref.quantize(torch.randn(n, k, generator=g), block_size=16, scale_format="ue4m3", global_scale=True)
    assert torch.equal(tri.mx_matmul_triton(a.bfloat16(), wg, **tiles), tri.mx_matmul_triton(a.bfloat16(), wg))
