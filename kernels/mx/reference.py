"""OCP Microscaling Formats (MX) Specification v1.0 — https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf

The readable PyTorch specification of block-scaled ("microscaling") quantization, with the scale
rules of three formats:

- E8M0 scales, the OCP MX v1.0 rule: ``shared_exp = floor(log2(amax)) - emax_elem``, clamped to
  [-127, 127]; elements ``x / 2^shared_exp`` rounded to the element format.
- UE4M3 scales, the NVFP4 rule: ``scale = amax / elem_max`` rounded to nearest even into unsigned
  E4M3 (subnormals included), optionally divided first by a per-tensor FP32 global scale
  ``g = amax_tensor / (scale_max * elem_max)``.
- UE5M3 scales, from "Is Finer Better? The Limits of Microscaling Formats in LLMs"
  (https://arxiv.org/abs/2601.19026): the NVFP4 rule with an unsigned 5-bit-exponent,
  3-bit-mantissa scale. The paper's encoding could not be read; the default is the one AMD's
  FP4 kernels use (bias 15, code 0xFF is NaN, max 1.75 * 2^16 = 114688). `ue5m3(bias=..., nan=...)`
  builds the variants (``nan=False`` makes 0xFF the finite 122880).

Elements are the OCP MX v1.0 element formats (section 5.3), selected by ``elem_format``:

==========  ========  ======  ==========  ================  ================================
name        OCP name  bias    max normal  min subnormal     specials
==========  ========  ======  ==========  ================  ================================
``e2m1``    MXFP4     1       6           0.5               none
``e3m2``    MXFP6     3       28          2^-4 = 0.0625     none
``e2m3``    MXFP6     1       7.5         2^-3 = 0.125      none
``e4m3``    MXFP8     7       448         2^-9              S.1111.111 is NaN (no infinity)
``e5m2``    MXFP8     15      57344       2^-16             exponent 11111: inf (m = 0), NaN
``int8``    MXINT8    --      1 63/64     2^-6 (the step)   none
==========  ========  ======  ==========  ================  ================================

MXINT8 elements are 8-bit two's complement integers k with an implied scale of 2^-6 (value
k / 64). Following the spec's note (and microxcaling), quantization leaves the asymmetric code
0x80 (-2) unused, so k is in [-127, 127] and saturates at +-127/64; `decode` still reads 0x80
as -2. Its emax_elem is 0, so with an E8M0 scale a block's amax lands in [1, 2) before rounding.

Storage: E2M1 packs two codes per byte (element 2i in the low nibble); every other format
stores one code per byte. FP6 codes sit in the low six bits of their byte (sign at bit 5, the
top two bits zero): the spec fixes no packing for FP6, and one code per byte keeps every
element byte-addressable in the kernels (a packed layout, 4 codes in 3 bytes, would save 25%
of the element bytes). Every rounding is to nearest, ties to even, and saturates at the
format's largest normal (so E5M2's infinity is never produced).

Behaviour at the edges, the same in the Triton kernels:

- Blocks run along the last dimension. When it is not a multiple of the block size, the last
  block of each row is partial: its scale comes from the elements present, storage is padded
  with zero codes to whole blocks, and `dequantize` drops the padding.
- A block holding a NaN or an infinity gets the scale format's NaN code (E8M0 0xFF, UE4M3 0x7F,
  UE5M3 0xFF) and zero element codes, so the whole block decodes to NaN: only E5M2 among the
  element formats has an infinity, and OCP MX signals a bad block through its scale. A scale format
  without a NaN code stores such a block as zeros. The global scale ignores non-finite values.
- An all-zero block decodes to zeros. A UE4M3/UE5M3 scale that rounds to zero flushes its block
  to zeros (``underflow="flush"``, the default, as in the paper's setting) or is raised to the
  smallest positive scale (``underflow="clamp"``).
- The sign of a zero element is kept (-0 has its own E2M1 code), except in a block whose scale
  is zero or NaN, where every element code is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
UNDERFLOW_MODES = ("flush", "clamp")


@dataclass(frozen=True)
class Minifloat:
    """A small floating-point format, IEEE-like: exponent bits, mantissa bits, a bias."""

    name: str
    """Short name, as accepted by `quantize` ("e2m1", "ue4m3", ...)."""
    exp_bits: int
    """Width of the exponent field."""
    man_bits: int
    """Width of the mantissa field (0 for E8M0)."""
    bias: int
    """Exponent bias: a normal code with exponent field E is worth 2^(E - bias) * 1.m."""
    signed: bool
    """Whether a sign bit sits above the exponent (elements) or not (scales)."""
    nan: bool
    """True: the all-ones magnitude code is NaN (E4M3FN, E8M0, UE5M3 default); False: all finite."""
    subnormals: bool = True
    """False for E8M0, whose code 0 is 2^-127 rather than zero."""
    ieee: bool = False
    """True: the all-ones exponent holds infinity (mantissa 0) and NaN (otherwise), as in E5M2."""
    twos_complement: bool = False
    """True: a signed integer format (MXINT8) stored in two's complement instead of sign-magnitude."""

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value (also the subnormals' exponent)."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """Largest finite magnitude code."""
        if self.ieee:
            return (((1 << self.exp_bits) - 1) << self.man_bits) - 1
        return (1 << (self.exp_bits + self.man_bits)) - 1 - int(self.nan)

    @property
    def nan_code(self) -> int | None:
        """The code that decodes to NaN, if the format has one."""
        return (1 << (self.exp_bits + self.man_bits)) - 1 if self.nan else None

    @property
    def max_value(self) -> float:
        """Largest finite value."""
        return _decode_magnitude_scalar(self.max_code, self)

    @property
    def emax(self) -> int:
        """floor(log2(max_value)): the OCP "emax_elem" (2 for E2M1, 8 for E4M3)."""
        return math.frexp(self.max_value)[1] - 1

    @property
    def bits(self) -> int:
        return self.exp_bits + self.man_bits + int(self.signed)


def _decode_magnitude_scalar(code: int, fmt: Minifloat) -> float:
    e, m = code >> fmt.man_bits, code & ((1 << fmt.man_bits) - 1)
    if e == 0 and fmt.subnormals:
        return math.ldexp(m, fmt.emin - fmt.man_bits)
    return math.ldexp((1 << fmt.man_bits) + m, e - fmt.bias - fmt.man_bits)


E2M1 = Minifloat("e2m1", exp_bits=2, man_bits=1, bias=1, signed=True, nan=False)
E4M3 = Minifloat("e4m3", exp_bits=4, man_bits=3, bias=7, signed=True, nan=True)
E5M2 = Minifloat("e5m2", exp_bits=5, man_bits=2, bias=15, signed=True, nan=False, ieee=True)
E3M2 = Minifloat("e3m2", exp_bits=3, man_bits=2, bias=3, signed=True, nan=False)
E2M3 = Minifloat("e2m3", exp_bits=2, man_bits=3, bias=1, signed=True, nan=False)
# MXINT8 as a "minifloat" with no exponent field: every code is subnormal, k * 2^(emin - 7) = k / 64
INT8 = Minifloat("int8", exp_bits=0, man_bits=7, bias=0, signed=True, nan=False, twos_complement=True)
E8M0 = Minifloat("e8m0", exp_bits=8, man_bits=0, bias=127, signed=False, nan=True, subnormals=False)
UE4M3 = Minifloat("ue4m3", exp_bits=4, man_bits=3, bias=7, signed=False, nan=True)


def ue5m3(bias: int = 15, nan: bool = True) -> Minifloat:
    """The unsigned E5M3 scale format with a chosen bias and NaN convention (see module notes)."""
    return Minifloat("ue5m3", exp_bits=5, man_bits=3, bias=bias, signed=False, nan=nan)


UE5M3 = ue5m3()
ELEM_FORMATS = {"e2m1": E2M1, "e4m3": E4M3, "e5m2": E5M2, "e3m2": E3M2, "e2m3": E2M3, "int8": INT8}
SCALE_FORMATS = {"e8m0": E8M0, "ue4m3": UE4M3, "ue5m3": UE5M3}


@dataclass
class MXTensor:
    """A block-quantized tensor: element codes, one scale code per block, and how to read them."""

    codes: torch.Tensor
    """uint8 [*shape[:-1], padded // 2] for E2M1 (element 2i in the low nibble), [.., padded] (one code
    a byte) for the other element formats; FP6 codes in the low six bits, MXINT8 in two's complement."""
    scales: torch.Tensor
    """uint8 [*shape[:-1], n_blocks]: the block scales as codes of `scale_format`."""
    global_scale: torch.Tensor | None
    """fp32 scalar multiplying every block scale (NVFP4 two-level scaling), or None."""
    shape: torch.Size
    """Shape of the original tensor (and of `dequantize`'s result)."""
    block_size: int
    """Elements per block along the last dimension."""
    elem_format: Minifloat
    """Format of the element codes."""
    scale_format: Minifloat
    """Format of the block scale codes."""
    dtype: torch.dtype
    """dtype of the original tensor, which `dequantize` returns by default."""

    @property
    def n_blocks(self) -> int:
        """Blocks per row: ceil(shape[-1] / block_size)."""
        return self.scales.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        """Storage in bytes (codes, scales and the global scale)."""
        g = 4 if self.global_scale is not None else 0
        return self.codes.numel() + self.scales.numel() + g


def resolve_formats(block_size: int, scale_format: str | Minifloat, elem_format: str | Minifloat,
                    global_scale: bool, underflow: str) -> tuple[Minifloat, Minifloat]:
    """Validate quantize's options; returns (elem, scale) formats. Shared by both implementations."""
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
    elem = ELEM_FORMATS.get(elem_format) if isinstance(elem_format, str) else elem_format
    if elem not in ELEM_FORMATS.values():
        raise ValueError(f"elem_format must be one of {tuple(ELEM_FORMATS)}, got {elem_format!r}")
    scale = SCALE_FORMATS.get(scale_format) if isinstance(scale_format, str) else scale_format
    if not isinstance(scale, Minifloat) or scale.signed or scale.bits > 8:
        raise ValueError(f"scale_format must be one of {tuple(SCALE_FORMATS)} or an unsigned 8-bit Minifloat "
                         f"(e.g. ue5m3(bias=16)), got {scale_format!r}")
    if scale.name != "e8m0" and not (scale.subnormals and scale.man_bits > 0):
        raise ValueError(f"a non-E8M0 scale format needs a mantissa and subnormals, got {scale}")
    if scale.name != "e8m0" and not -126 <= scale.emin - scale.man_bits <= scale.emax <= 127:
        raise ValueError(f"scale format {scale} reaches outside the fp32 range")
    if global_scale and scale.name == "e8m0":
        raise ValueError("global_scale applies to the NVFP4-style rule (ue4m3, ue5m3), not to e8m0")
    if underflow not in UNDERFLOW_MODES:
        raise ValueError(f"underflow must be one of {UNDERFLOW_MODES}, got {underflow!r}")
    return elem, scale


def floor_log2(v: torch.Tensor) -> torch.Tensor:
    """floor(log2(v)) for v > 0, exactly (fp32 log2 rounds 31.999998 up to 5)."""
    return torch.frexp(v)[1] - 1


def encode(v: torch.Tensor, fmt: Minifloat) -> torch.Tensor:
    """Magnitude codes (int32) of v >= 0 (finite fp32), round to nearest even, saturating.

    In binade e (clamped below at emin, which covers subnormals) the representable values are
    n * 2^(e - man_bits); the code is (e - emin) * 2^man_bits + n, which also carries a rounding
    up to 2^(e+1) into the next binade's first code.
    """
    v = v.clamp(max=fmt.max_value)
    e = torch.where(v > 0, floor_log2(v), fmt.emin).clamp(min=fmt.emin)
    n = torch.round(v / torch.exp2((e - fmt.man_bits).float()))  # exact division; round() is RNE
    return (e - fmt.emin) * (1 << fmt.man_bits) + n.int()


def decode(codes: torch.Tensor, fmt: Minifloat) -> torch.Tensor:
    """fp32 values of codes (a sign bit above the magnitude when fmt is signed; two's complement for MXINT8)."""
    c = codes.int()
    if fmt.twos_complement:
        k = torch.where(c >= 1 << (fmt.bits - 1), c - (1 << fmt.bits), c)
        return k.float() * 2.0 ** (fmt.emin - fmt.man_bits)
    mag_bits = fmt.exp_bits + fmt.man_bits
    mag = c & ((1 << mag_bits) - 1)
    e, m = mag >> fmt.man_bits, mag & ((1 << fmt.man_bits) - 1)
    if fmt.subnormals:
        sig = torch.where(e == 0, m, m + (1 << fmt.man_bits))
        ex = torch.where(e == 0, fmt.emin, e - fmt.bias)
    else:
        sig, ex = m + (1 << fmt.man_bits), e - fmt.bias
    val = sig.float() * torch.exp2((ex - fmt.man_bits).float())
    if fmt.nan:
        val = torch.where(mag == fmt.nan_code, float("nan"), val)
    if fmt.ieee:
        top = (1 << fmt.exp_bits) - 1
        val = torch.where(e == top, torch.where(m == 0, float("inf"), float("nan")), val)
    if fmt.signed:
        val = torch.where((c >> mag_bits) & 1 == 1, -val, val)
    return val


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2k] 4-bit codes -> [..., k] bytes, element 2i in the low nibble (as torch.float4_e2m1fn_x2)."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_fp4`."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def tensor_global_scale(x: torch.Tensor, elem: Minifloat, scale: Minifloat) -> torch.Tensor:
    """NVFP4's per-tensor FP32 scale amax / (scale_max * elem_max), over the finite values.

    Held at or above 2^-126 (the smallest normal fp32) so that an all-zero or vanishing tensor
    still has a usable divisor; its blocks then flush to zero as they would anyway.
    """
    xf = x.detach().float()
    amax = torch.where(torch.isfinite(xf), xf.abs(), 0.0).amax() if xf.numel() else xf.new_zeros(())
    g = amax / (scale.max_value * elem.max_value)
    return g.clamp(min=torch.finfo(torch.float32).tiny)


def quantize(x: torch.Tensor, *, block_size: int = 32, scale_format: str | Minifloat = "e8m0",
             elem_format: str | Minifloat = "e2m1", global_scale: bool = False,
             underflow: str = "flush") -> MXTensor:
    """Block-quantize x along its last dimension (see the module notes for every rule)."""
    elem, scale = resolve_formats(block_size, scale_format, elem_format, global_scale, underflow)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"quantize needs a last dimension of at least one element, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"quantize takes a floating-point tensor, got {x.dtype}")
    shape, k = x.shape, x.shape[-1]
    nb = -(-k // block_size)
    xf = x.detach().float().reshape(-1, k)
    xf = torch.nn.functional.pad(xf, (0, nb * block_size - k)).view(-1, nb, block_size)  # [R, nb, B]
    finite_el = torch.isfinite(xf)
    finite = finite_el.all(-1)  # [R, nb]
    mag = torch.where(finite_el, xf.abs(), 0.0)
    amax = mag.amax(-1)
    g = tensor_global_scale(x, elem, scale) if global_scale else None

    if scale.name == "e8m0":
        # amax = 0 (or subnormal) lands on the lower clamp, as in OCP's reference code
        shared = torch.where(amax > 0, floor_log2(amax), -127) - elem.emax
        shared = shared.clamp(-127, 127)
        scale_codes = torch.where(finite, shared + 127, scale.nan_code)
        total = torch.exp2(shared.float())
    else:
        s_raw = amax / elem.max_value
        if g is not None:
            s_raw = s_raw / g
        scale_codes = encode(s_raw, scale)
        if underflow == "clamp":
            scale_codes = scale_codes.clamp(min=1)
        total = decode(scale_codes, scale)
        if g is not None:
            total = total * g
        scale_codes = torch.where(finite, scale_codes, scale.nan_code if scale.nan else scale.max_code)
    usable = finite & (total > 0)
    v = torch.where(usable[..., None], mag / total[..., None], 0.0)
    codes = encode(v, elem)
    sign = torch.signbit(xf) & usable[..., None]
    if elem.twos_complement:  # -k as a byte: 256 - k (k = 0 stays 0: no negative zero)
        codes = torch.where(sign, ((1 << elem.bits) - codes) & ((1 << elem.bits) - 1), codes)
    else:
        codes = codes | (sign.int() << (elem.bits - 1))

    codes = codes.to(torch.uint8).view(-1, nb * block_size)
    if elem == E2M1:
        codes = pack_fp4(codes)
    return MXTensor(codes=codes.reshape(*shape[:-1], -1), scales=scale_codes.to(torch.uint8).reshape(*shape[:-1], nb),
                    global_scale=g, shape=shape, block_size=block_size, elem_format=elem, scale_format=scale,
                    dtype=x.dtype)


def block_scales(mx: MXTensor) -> torch.Tensor:
    """fp32 [*shape[:-1], n_blocks]: each block's multiplier (decoded scale times the global scale)."""
    total = decode(mx.scales, mx.scale_format)
    if mx.global_scale is not None:
        total = total * mx.global_scale
    return total


def dequantize(mx: MXTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The values `mx` stands for, shaped like the original tensor, in `dtype` (default: the original's)."""
    k, bs = mx.shape[-1], mx.block_size
    codes = unpack_fp4(mx.codes) if mx.elem_format == E2M1 else mx.codes
    vals = decode(codes, mx.elem_format).view(-1, mx.n_blocks, bs)  # [R, nb, B]
    out = vals * block_scales(mx).view(-1, mx.n_blocks, 1)
    out = out.view(-1, mx.n_blocks * bs)[:, :k].reshape(mx.shape)
    return out.to(dtype or mx.dtype)


class FakeQuant(torch.autograd.Function):
    """quantize-then-dequantize in the forward, the identity (straight-through) in the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, qdq) -> torch.Tensor:  # noqa: D102
        return qdq(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102
        return grad, None


def fake_quant(x: torch.Tensor, *, block_size: int = 32, scale_format: str | Minifloat = "e8m0",
               elem_format: str | Minifloat = "e2m1", global_scale: bool = False,
               underflow: str = "flush") -> torch.Tensor:
    """dequantize(quantize(x, ...)) in x's dtype, with a straight-through (identity) gradient."""
    opts = dict(block_size=block_size, scale_format=scale_format, elem_format=elem_format,
                global_scale=global_scale, underflow=underflow)
    return FakeQuant.apply(x, lambda t: dequantize(quantize(t, **opts), dtype=t.dtype))


def mx_matmul(a: torch.Tensor, w_mx: MXTensor) -> torch.Tensor:
    """a [..., K] @ dequantize(w_mx).T for a weight w_mx [N, K]; fp32 accumulation, result in a's dtype."""
    if len(w_mx.shape) != 2:
        raise ValueError(f"mx_matmul needs a 2-D quantized weight [N, K], got shape {tuple(w_mx.shape)}")
    if a.shape[-1] != w_mx.shape[-1]:
        raise ValueError(f"inner dimensions differ: a has {a.shape[-1]}, w_mx has {w_mx.shape[-1]}")
    w = dequantize(w_mx, dtype=torch.float32)
    return (a.float() @ w.T).to(a.dtype)
