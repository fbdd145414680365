"""OCP Microscaling Formats (MX) Specification v1.0 — https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf

Triton kernels for `reference.py`: quantize (codes and scales bit-identical to the reference),
dequantize (bit-identical values), and `mx_matmul`, which dequantizes the weight tile in
registers and multiplies it with `tl.dot`, accumulating in fp32 (Hopper has no FP4 tensor cores).

Exactness rests on three choices:

- Every division whose divisor is not a power of two is `tl.div_rn`: on NVIDIA GPUs a plain
  fp32 `/` is approximate, while the reference's (and the interpreter's) is correctly rounded.
- Amax is an integer max over the bits of |x| (non-negative floats order like their bits), so
  NaN semantics of float max and denormal flushing cannot differ between backends; non-finite
  values are detected on the bits and kept out of the max.
- Rounding to a minifloat is done on exact quantities: v * 2^(man_bits - e) is an exact scaling,
  and ties to even are decided from the integer and fractional parts.

For the matmul, a floating-point element (E2M1, E3M2, E2M3, E4M3, E5M2: at most 4 significant
bits) times a UE4M3, UE5M3 or E8M0 scale has at most 8 significant bits, as has an MXINT8 element
(7) times an E8M0 scale (1), so the dequantized weight is exact in bf16 and a bf16 `tl.dot`
equals the reference up to the fp32 summation order; MXINT8 with a UE4M3/UE5M3 scale (11 bits)
takes the fp32 dot instead (`bf16_exact`). A global scale is applied once to the fp32
accumulator. fp32 activations use an fp32 ("ieee") dot. Under TRITON_INTERPRET=1 the bf16 dot
multiplies raw bits and fp32 -> bf16 casts truncate, so interpreted, every dot runs in fp32 on
operands already rounded to the activation dtype, and bf16 results are rounded by bit arithmetic.
bf16 inputs are widened to fp32 by their bits (u16 -> u32 << 16), exact everywhere (the
interpreter's cast turns the subnormal 1.01e-39 into 4.41e-39). Offsets are int64 (row * stride
passes 2^31 elements on large tensors), and quantize reads rows with any stride in place.

Speed. The global scale's amax is one reduction kernel (an integer max over |x|'s bits, one
atomic per program) instead of PyTorch passes over an fp32 copy. `mx_matmul` walks its output
tiles in grouped order (GROUP_M rows of tiles share the weight tiles in L2, as in the Triton
matmul tutorial), decodes E2M1 by assembling the fp32 bits (two integer ops and a select per
element, no int -> float conversion), and on a GPU autotunes its tiles: large-M shapes over the
tutorial's Hopper configurations, decode shapes (M <= 64) over 16- and 32-row tiles with split-K
(each program sums a slice of K into an fp32 partial; the partials are summed in a fixed order,
so results do not depend on scheduling), the split chosen so that about two programs run per SM.
"""

from __future__ import annotations

import os

import torch

from kernels.mx.reference import E2M1, MXTensor, resolve_formats, tensor_global_scale

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    HAS_TRITON = False

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (read when the kernels were decorated)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_INTERPRETED = interpreting()
# "first": autotune over the first candidate only (each compiles once per launch key; a GPU test run
# on a fresh cache would spend minutes on them). Read at import, like TRITON_INTERPRET.
AUTOTUNE = os.environ.get("LADDER_KERNELS_AUTOTUNE", "full")


def _check_runnable(t: torch.Tensor) -> None:
    if not HAS_TRITON:
        raise RuntimeError("kernels.mx impl='triton' needs the `triton` package; install it or use impl='reference'")
    if not t.is_cuda and not _INTERPRETED:
        raise RuntimeError("kernels.mx Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 set before "
                           "kernels.mx is imported to run them on the CPU; or use impl='reference'")


def _fmt_args(fmt) -> dict:
    """A Minifloat's parameters as kernel constexprs (SPEC: the exponent field of E5M2's inf/NaN, or -1;
    SIGN: the sign bit of an element code; TWOS: two's complement, MXINT8)."""
    return dict(M=fmt.man_bits, EMIN=fmt.emin, MAXV=fmt.max_value, MAXC=fmt.max_code,
                NANC=fmt.nan_code if fmt.nan else -1, SPEC=(1 << fmt.exp_bits) - 1 if fmt.ieee else -1,
                SIGN=1 << (fmt.bits - 1), TWOS=fmt.twos_complement)


if HAS_TRITON:

    @triton.jit
    def _widen(x):
        """x loaded from memory as fp32; bf16 by its bits, exact also for subnormals under the interpreter."""
        if x.dtype == tl.bfloat16:
            y = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        else:
            y = x.to(tl.float32)
        return y

    @triton.jit
    def _pow2(e):
        """2^e as fp32 for integer -126 <= e <= 127, built from the exponent bits (exact)."""
        return ((e + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def _encode(v, M: tl.constexpr, EMIN: tl.constexpr, MAXV: tl.constexpr):
        """Magnitude codes (int32) of finite v >= 0: round to nearest even, saturate at MAXV."""
        v = tl.minimum(v, MAXV)
        ef = (v.to(tl.int32, bitcast=True) >> 23) & 0xFF
        e = tl.maximum(ef - 127, EMIN)  # fp32 zeros and subnormals (ef = 0) land on EMIN
        n = v * _pow2(M - e)  # exact: in [0, 2^(M+1)]
        ni = n.to(tl.int32)
        frac = n - ni.to(tl.float32)
        up = (frac > 0.5) | ((frac == 0.5) & ((ni & 1) == 1))
        return (e - EMIN) * (1 << M) + ni + up.to(tl.int32)

    @triton.jit
    def _decode(c, M: tl.constexpr, EMIN: tl.constexpr, NANC: tl.constexpr, SPEC: tl.constexpr):
        """fp32 value of unsigned magnitude codes c (int32) of a minifloat with subnormals. NANC: the
        NaN code or -1; SPEC: the exponent field that holds inf (mantissa 0) and NaN (E5M2), or -1."""
        e = c >> M
        m = c & ((1 << M) - 1)
        sig = tl.where(e == 0, m, m + (1 << M))
        ex = tl.where(e == 0, EMIN, e - 1 + EMIN) - M
        val = sig.to(tl.float32) * _pow2(ex)
        if NANC >= 0:
            val = tl.where(c == NANC, float("nan"), val)
        if SPEC >= 0:
            val = tl.where(e == SPEC, tl.where(m == 0, float("inf"), float("nan")), val)
        return val

    @triton.jit
    def _decode_e8m0(c):
        """fp32 value of E8M0 codes: 2^(c - 127), 0xFF NaN; code 0 (2^-127) is an fp32 subnormal."""
        val = tl.where(c == 0, 1 << 22, c << 23).to(tl.float32, bitcast=True)
        return tl.where(c == 255, float("nan"), val)

    @triton.jit
    def _decode_elem(c, IS_FP4: tl.constexpr, M: tl.constexpr, EMIN: tl.constexpr, NANC: tl.constexpr,
                     SIGN: tl.constexpr, SPEC: tl.constexpr, TWOS: tl.constexpr):
        """Signed element codes (int32, one byte each) -> fp32. SIGN: the sign bit (0x80 for FP8, 0x20
        for FP6); TWOS: MXINT8, k / 2^(M - EMIN) with k the byte read as two's complement."""
        if IS_FP4:
            # the fp32 bits of E2M1 code c: magnitude codes 0, 1 are 0 and 0.5 (= 126 << 23); from 2 on,
            # exponent e and mantissa bit m sit right below fp32's, biased by 126: (mag << 22) + (126 << 23)
            mag = c & 7
            bits = tl.where(mag < 2, mag * (126 << 23), (mag << 22) + (126 << 23)) | ((c & 8) << 28)
            return bits.to(tl.float32, bitcast=True)
        elif TWOS:
            k = c - ((c & SIGN) << 1)  # a byte >= 128 stands for byte - 256
            return k.to(tl.float32) * (1.0 / (1 << (M - EMIN)))  # an exact power of two (1/64)
        else:
            val = _decode(c & (SIGN - 1), M, EMIN, NANC, SPEC)
            return tl.where((c & SIGN) != 0, -val, val)

    @triton.jit
    def _block_multiplier(sc, g, SCALE_E8M0: tl.constexpr, SM: tl.constexpr, SEMIN: tl.constexpr,
                          SNANC: tl.constexpr, HAS_G: tl.constexpr):
        if SCALE_E8M0:
            s = _decode_e8m0(sc)
        else:
            s = _decode(sc, SM, SEMIN, SNANC, -1)
        if HAS_G:
            s = s * g
        return s

    @triton.jit
    def _store_rounded(ptr, val, mask, OUT: tl.constexpr):
        """Store fp32 val as OUT (0 fp32, 1 bf16, 2 fp16); bf16 rounding by bits, ties to even."""
        if OUT == 1:
            bits = val.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            bits = tl.where(val != val, 0x7FC0, bits)  # a GPU's NaN 0x7FFFFFFF would carry into the sign
            tl.store(ptr, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        elif OUT == 2:
            tl.store(ptr, val.to(tl.float16), mask=mask)
        else:
            tl.store(ptr, val, mask=mask)

    @triton.jit
    def _quantize_kernel(X, CODES, SCALES, G, R, K, NB, sxr, scr, ssr,
                         BS: tl.constexpr, NBP: tl.constexpr, BLOCK_R: tl.constexpr,
                         IS_FP4: tl.constexpr, EM: tl.constexpr, EEMIN: tl.constexpr, EMAXV: tl.constexpr,
                         EEMAX: tl.constexpr, SCALE_E8M0: tl.constexpr, SM: tl.constexpr, SEMIN: tl.constexpr,
                         SMAXV: tl.constexpr, SBADC: tl.constexpr, SNANC: tl.constexpr, HAS_G: tl.constexpr,
                         CLAMP: tl.constexpr, ESIGN: tl.constexpr, TWOS: tl.constexpr):
        pid_r = tl.program_id(0)
        pid_b = tl.program_id(1)
        W: tl.constexpr = NBP * BS
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = pid_b * W + tl.arange(0, W)
        rmask = rows < R
        r64 = rows.to(tl.int64)
        x = tl.load(X + r64[:, None] * sxr + cols[None, :], mask=rmask[:, None] & (cols[None, :] < K), other=0.0)
        bits = _widen(x).to(tl.int32, bitcast=True)  # [BLOCK_R, W]
        absbits = bits & 0x7FFFFFFF
        finite_el = absbits < 0x7F800000
        magbits = tl.reshape(tl.where(finite_el, absbits, 0), (BLOCK_R, NBP, BS))
        amax_bits = tl.max(magbits, axis=2)  # [BLOCK_R, NBP]
        bad = tl.max(tl.reshape(tl.where(finite_el, 0, 1), (BLOCK_R, NBP, BS)), axis=2) > 0
        mag = magbits.to(tl.float32, bitcast=True)

        if SCALE_E8M0:
            shared = tl.minimum(tl.maximum(((amax_bits >> 23) & 0xFF) - 127 - EEMAX, -127), 127)
            scode = tl.where(bad, 255, shared + 127)
            # x / 2^shared, exact: 2^-shared is normal down to 2^-126; shared = 127 (MXINT8, emax_elem 0,
            # on amax >= 2^127) takes a second halving, which can only round values that encode to 0
            neg = -shared
            v = mag * _pow2(tl.maximum(neg, -126))[:, :, None]
            v = tl.where((neg < -126)[:, :, None], v * 0.5, v)
            usable = ~bad
        else:
            g = 1.0
            s_raw = tl.div_rn(amax_bits.to(tl.float32, bitcast=True), EMAXV)
            if HAS_G:
                g = tl.load(G)
                s_raw = tl.div_rn(s_raw, g)
            scode = _encode(s_raw, SM, SEMIN, SMAXV)
            if CLAMP:
                scode = tl.maximum(scode, 1)
            total = _block_multiplier(scode, g, False, SM, SEMIN, SNANC, HAS_G)
            usable = (~bad) & (total > 0)
            v = tl.div_rn(mag, tl.where(usable, total, 1.0)[:, :, None])
            scode = tl.where(bad, SBADC, scode)
        ecode = _encode(v, EM, EEMIN, EMAXV)
        sign = tl.reshape((bits >> 31) & 1, (BLOCK_R, NBP, BS))
        if TWOS:  # -k as a byte is (2 * ESIGN - k) mod 2 * ESIGN; k = 0 stays 0
            ecode = tl.where(sign == 1, (2 * ESIGN - ecode) & (2 * ESIGN - 1), ecode)
        else:
            ecode = ecode | (sign * ESIGN)
        ecode = tl.where(usable[:, :, None], ecode, 0)
        ecode = tl.reshape(ecode, (BLOCK_R, W))

        blocks = pid_b * NBP + tl.arange(0, NBP)
        tl.store(SCALES + r64[:, None] * ssr + blocks[None, :], scode.to(tl.uint8),
                 mask=rmask[:, None] & (blocks[None, :] < NB))
        if IS_FP4:
            lo, hi = tl.split(tl.reshape(ecode, (BLOCK_R, W // 2, 2)))
            byte = (lo | (hi << 4)).to(tl.uint8)
            bcols = pid_b * (W // 2) + tl.arange(0, W // 2)
            tl.store(CODES + r64[:, None] * scr + bcols[None, :], byte,
                     mask=rmask[:, None] & (bcols[None, :] < NB * (BS // 2)))
        else:
            tl.store(CODES + r64[:, None] * scr + cols[None, :], ecode.to(tl.uint8),
                     mask=rmask[:, None] & (cols[None, :] < NB * BS))

    @triton.jit
    def _load_elems(CODES, rows, rmask, c0, scr, K, IS_FP4: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
        """Element codes (int32) [ROWS, COLS] of the logical (unpacked) code matrix from column c0 (even);
        columns at or past K read as 0."""
        rows = rows.to(tl.int64)
        if IS_FP4:
            bc = c0 // 2 + tl.arange(0, COLS // 2)
            byte = tl.load(CODES + rows[:, None] * scr + bc[None, :], mask=rmask[:, None] & (bc[None, :] * 2 < K),
                           other=0).to(tl.int32)
            return tl.reshape(tl.join(byte & 0xF, byte >> 4), (ROWS, COLS))
        else:
            cols = c0 + tl.arange(0, COLS)
            return tl.load(CODES + rows[:, None] * scr + cols[None, :], mask=rmask[:, None] & (cols[None, :] < K),
                           other=0).to(tl.int32)

    @triton.jit
    def _dequantize_kernel(CODES, SCALES, G, OUT, R, K, NB, scr, ssr, sor,
                           BS: tl.constexpr, NBP: tl.constexpr, BLOCK_R: tl.constexpr, IS_FP4: tl.constexpr,
                           EM: tl.constexpr, EEMIN: tl.constexpr, ENANC: tl.constexpr, ESIGN: tl.constexpr,
                           ESPEC: tl.constexpr, ETWOS: tl.constexpr, SCALE_E8M0: tl.constexpr,
                           SM: tl.constexpr, SEMIN: tl.constexpr, SNANC: tl.constexpr, HAS_G: tl.constexpr,
                           OUT_KIND: tl.constexpr):
        pid_r = tl.program_id(0)
        pid_b = tl.program_id(1)
        W: tl.constexpr = NBP * BS
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = pid_b * W + tl.arange(0, W)
        rmask = rows < R
        r64 = rows.to(tl.int64)
        blocks = pid_b * NBP + tl.arange(0, NBP)
        sc = tl.load(SCALES + r64[:, None] * ssr + blocks[None, :], mask=rmask[:, None] & (blocks[None, :] < NB),
                     other=0).to(tl.int32)
        g = 1.0
        if HAS_G:
            g = tl.load(G)
        total = _block_multiplier(sc, g, SCALE_E8M0, SM, SEMIN, SNANC, HAS_G)  # [BLOCK_R, NBP]
        mask = rmask[:, None] & (cols[None, :] < K)
        c = _load_elems(CODES, rows, rmask, pid_b * W, scr, K, IS_FP4, BLOCK_R, W)
        val = tl.reshape(_decode_elem(c, IS_FP4, EM, EEMIN, ENANC, ESIGN, ESPEC, ETWOS), (BLOCK_R, NBP, BS)) * total[:, :, None]
        _store_rounded(OUT + r64[:, None] * sor + cols[None, :], tl.reshape(val, (BLOCK_R, W)), mask, OUT_KIND)

    @triton.jit
    def _amax_kernel(X, OUT, R, K, sxr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
        """OUT (int32, zeroed) = max over finite x of |x|'s fp32 bits: non-negative floats order like their bits."""
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(X + rows.to(tl.int64)[:, None] * sxr + cols[None, :], mask=(rows[:, None] < R) & (cols[None, :] < K),
                    other=0.0)
        absbits = _widen(x).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        tl.atomic_max(OUT, tl.max(tl.max(tl.where(absbits < 0x7F800000, absbits, 0), 1), 0))

    @triton.jit
    def _mx_matmul_kernel(A, CODES, SCALES, G, C, M, N, K, NB, sam, sak, scn, ssn, scm, scs, M_BUCKET,
                          BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
                          IS_FP4: tl.constexpr, EM: tl.constexpr, EEMIN: tl.constexpr, ENANC: tl.constexpr,
                          ESIGN: tl.constexpr, ESPEC: tl.constexpr, ETWOS: tl.constexpr,
                          SCALE_E8M0: tl.constexpr, SM: tl.constexpr, SEMIN: tl.constexpr, SNANC: tl.constexpr,
                          HAS_G: tl.constexpr, DOT: tl.constexpr, OUT_KIND: tl.constexpr):
        """C[M, N] = A[M, K] @ W[N, K]^T with W dequantized tile by tile in registers.

        DOT: 0 fp32 ("ieee"), 1 bf16, 2 fp16 tensor-core dot, 3 fp32 dot on fp16-rounded weights.
        Output tiles in grouped order (GROUP_M tile rows at a time). SPLIT_K > 1: program (tile, s)
        sums the s-th slice of K's tiles and stores the fp32 partial at C + s * scs (no global scale,
        no rounding: the caller sums the slices).
        """
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        in_group = GROUP_M * num_n
        first_m = (pid // in_group) * GROUP_M
        group_rows = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % group_rows
        pid_n = (pid % in_group) // group_rows
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm64 = rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        nmask = rn < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_tiles = tl.cdiv(K, BLOCK_K)
        per_split = tl.cdiv(k_tiles, SPLIT_K)
        k_lo = tl.program_id(1) * per_split * BLOCK_K
        k_hi = tl.minimum(K, k_lo + per_split * BLOCK_K)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            kmask = rk < K
            a = tl.load(A + rm64[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
            wmask = nmask[:, None] & kmask[None, :]
            c = _load_elems(CODES, rn, nmask, k0, scn, K, IS_FP4, BLOCK_N, BLOCK_K)
            w = _decode_elem(c, IS_FP4, EM, EEMIN, ENANC, ESIGN, ESPEC, ETWOS)  # [BLOCK_N, BLOCK_K]
            if BLOCK_K >= BS:
                rb = k0 // BS + tl.arange(0, BLOCK_K // BS)
                sc = tl.load(SCALES + rn64[:, None] * ssn + rb[None, :], mask=nmask[:, None] & (rb[None, :] < NB),
                             other=0).to(tl.int32)
                s = _block_multiplier(sc, 1.0, SCALE_E8M0, SM, SEMIN, SNANC, False)
                w = tl.reshape(tl.reshape(w, (BLOCK_N, BLOCK_K // BS, BS)) * s[:, :, None], (BLOCK_N, BLOCK_K))
            else:
                sc = tl.load(SCALES + rn64 * ssn + k0 // BS, mask=nmask, other=0).to(tl.int32)
                s = _block_multiplier(sc, 1.0, SCALE_E8M0, SM, SEMIN, SNANC, False)
                w = w * s[:, None]
            # codes past K are padding: zeroed so that a NaN block's padding cannot reach a masked-out a
            w = tl.where(wmask, w, 0.0)
            if DOT == 1:
                acc += tl.dot(a.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
            elif DOT == 2:
                acc += tl.dot(a.to(tl.float16), tl.trans(w.to(tl.float16)))
            elif DOT == 3:
                acc += tl.dot(_widen(a), tl.trans(w.to(tl.float16).to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(_widen(a), tl.trans(w), input_precision="ieee")
        cmask = (rm[:, None] < M) & nmask[None, :]
        if SPLIT_K > 1:
            tl.store(C + tl.program_id(1).to(tl.int64) * scs + rm64[:, None] * scm + rn[None, :], acc, mask=cmask)
        else:
            if HAS_G:
                acc = acc * tl.load(G)
            _store_rounded(C + rm64[:, None] * scm + rn[None, :], acc, cmask, OUT_KIND)

    def _mm_configs(small: bool):
        if AUTOTUNE == "first":
            return _mm_configs_all(small)[:1]
        return _mm_configs_all(small)

    def _mm_configs_all(small: bool):
        if small:  # decode shapes: few rows, many columns, split-K chosen by the caller
            tiles = [(16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (16, 64, 256, 4, 3), (16, 32, 256, 4, 4),
                     (16, 128, 64, 4, 4), (32, 64, 128, 4, 4), (32, 128, 128, 4, 3), (32, 64, 256, 4, 3)]
            return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1}, num_warps=w, num_stages=st)
                    for bm, bn, bk, w, st in tiles]
        tiles = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4),
                 (128, 128, 128, 8, 3), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                 (64, 64, 64, 4, 4), (128, 32, 64, 4, 4)]
        return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=st)
                for bm, bn, bk, w, st in tiles]

    _MM_KEY = ["M_BUCKET", "N", "K", "SPLIT_K", "DOT", "IS_FP4", "ETWOS", "BS"]
    _mm_small = triton.autotune(_mm_configs(True), key=_MM_KEY)(_mx_matmul_kernel)
    _mm_large = triton.autotune(_mm_configs(False), key=_MM_KEY)(_mx_matmul_kernel)


def _out_kind(dtype: torch.dtype) -> int:
    return {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype]


def _tiles(block_size: int, rows: int) -> tuple[int, int]:
    """(blocks per program, rows per program): ~4k elements a program on a GPU, fewer, larger
    programs under the interpreter, which runs them one after another."""
    width = max(block_size, 256 if _INTERPRETED else 128)
    block_r = 32 if _INTERPRETED else max(1, 4096 // width)
    block_r = min(block_r, triton.next_power_of_2(max(rows, 1)))
    return width // block_size, block_r


def quantize_triton(x: torch.Tensor, *, block_size: int = 32, scale_format="e8m0", elem_format="e2m1",
                    global_scale: bool = False, underflow: str = "flush") -> MXTensor:
    """`reference.quantize` with a Triton kernel: the same codes and scales, bit for bit."""
    elem, scale = resolve_formats(block_size, scale_format, elem_format, global_scale, underflow)
    _check_runnable(x)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"quantize needs a last dimension of at least one element, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"quantize takes a floating-point tensor, got {x.dtype}")
    shape, k, dtype = x.shape, x.shape[-1], x.dtype
    x2 = x.detach().reshape(-1, k)
    x2 = x2 if x.dtype in DTYPES else x2.float()
    if x2.stride(-1) != 1 and k > 1:
        x2 = x2.contiguous()  # rows may have any stride; elements within a row must be adjacent
    r, nb = x2.shape[0], -(-k // block_size)
    fp4 = elem == E2M1
    codes = torch.empty(r, nb * block_size // (2 if fp4 else 1), dtype=torch.uint8, device=x.device)
    scales = torch.empty(r, nb, dtype=torch.uint8, device=x.device)
    g = global_scale_triton(x2, elem, scale) if global_scale else None
    if r:
        nbp, block_r = _tiles(block_size, r)
        e, s = _fmt_args(elem), _fmt_args(scale)
        grid = (triton.cdiv(r, block_r), triton.cdiv(nb, nbp))
        _quantize_kernel[grid](x2, codes, scales, g if g is not None else scales, r, k, nb,
                               x2.stride(0), codes.stride(0), scales.stride(0),
                               BS=block_size, NBP=nbp, BLOCK_R=block_r, IS_FP4=fp4, EM=e["M"], EEMIN=e["EMIN"],
                               EMAXV=e["MAXV"], EEMAX=elem.emax, SCALE_E8M0=scale.name == "e8m0", SM=s["M"],
                               SEMIN=s["EMIN"], SMAXV=s["MAXV"], SBADC=scale.nan_code if scale.nan else scale.max_code,
                               SNANC=s["NANC"], HAS_G=g is not None, CLAMP=underflow == "clamp",
                               ESIGN=e["SIGN"], TWOS=e["TWOS"])
    return MXTensor(codes=codes.reshape(*shape[:-1], -1), scales=scales.reshape(*shape[:-1], nb), global_scale=g,
                    shape=shape, block_size=block_size, elem_format=elem, scale_format=scale, dtype=dtype)


def global_scale_triton(x2: torch.Tensor, elem, scale) -> torch.Tensor:
    """`reference.tensor_global_scale` of x2 [R, K] (unit last stride) with one reduction kernel: the
    same fp32 value, bit for bit."""
    amax_bits = torch.zeros(1, dtype=torch.int32, device=x2.device)
    r, k = x2.shape
    if r and k:
        block_r, block_k = (32, 256) if _INTERPRETED else (16, 1024)
        grid = (triton.cdiv(r, block_r), triton.cdiv(k, block_k))
        _amax_kernel[grid](x2, amax_bits, r, k, x2.stride(0), BLOCK_R=block_r, BLOCK_K=block_k)
    g = amax_bits.view(torch.float32)[0] / (scale.max_value * elem.max_value)
    return g.clamp(min=torch.finfo(torch.float32).tiny)


def _scale_args(mx: MXTensor) -> dict:
    e, s = _fmt_args(mx.elem_format), _fmt_args(mx.scale_format)
    return dict(BS=mx.block_size, IS_FP4=mx.elem_format == E2M1, EM=e["M"], EEMIN=e["EMIN"], ENANC=e["NANC"],
                ESIGN=e["SIGN"], ESPEC=e["SPEC"], ETWOS=e["TWOS"], SCALE_E8M0=mx.scale_format.name == "e8m0",
                SM=s["M"], SEMIN=s["EMIN"], SNANC=s["NANC"], HAS_G=mx.global_scale is not None)


def significant_bits(fmt) -> int:
    """Bits of significand a value of fmt can need (MXINT8: 7 magnitude bits; E8M0: 1)."""
    return fmt.man_bits + (0 if fmt.twos_complement else 1)


def bf16_exact(mx: MXTensor) -> bool:
    """Whether every element times its block scale fits bf16's 8-bit significand, so that a bf16
    tensor-core dot sees the reference's weights exactly (MXINT8 with a UE4M3/UE5M3 scale needs 11)."""
    return significant_bits(mx.elem_format) + significant_bits(mx.scale_format) <= 8


def dequantize_triton(mx: MXTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`reference.dequantize` with a Triton kernel: the same values, bit for bit."""
    _check_runnable(mx.codes)
    dtype = dtype or mx.dtype
    if dtype not in DTYPES:
        return dequantize_triton(mx, torch.float32).to(dtype)
    k = mx.shape[-1]
    codes = mx.codes.reshape(-1, mx.codes.shape[-1]).contiguous()
    scales = mx.scales.reshape(-1, mx.n_blocks).contiguous()
    r = scales.shape[0]
    out = torch.empty(r, k, dtype=dtype, device=mx.device)
    if r:
        nbp, block_r = _tiles(mx.block_size, r)
        grid = (triton.cdiv(r, block_r), triton.cdiv(mx.n_blocks, nbp))
        g = mx.global_scale if mx.global_scale is not None else scales
        _dequantize_kernel[grid](codes, scales, g, out, r, k, mx.n_blocks, codes.stride(0), scales.stride(0),
                                 out.stride(0), NBP=nbp, BLOCK_R=block_r, OUT_KIND=_out_kind(dtype), **_scale_args(mx))
    return out.reshape(mx.shape)


def _split_k(m: int, n: int, k: int, device) -> int:
    """K slices for a decode shape: about two programs per SM with 16 x 64 output tiles, each slice
    at least 512 deep, a power of two up to 8."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = triton.cdiv(m, 16) * triton.cdiv(n, 64)
    split = 1
    while split < 8 and tiles * split * 2 <= 2 * sms and k // (split * 2) >= 512:
        split *= 2
    return split


def mx_matmul_triton(a: torch.Tensor, w_mx: MXTensor, *, block_m: int | None = None, block_n: int | None = None,
                     block_k: int | None = None, group_m: int | None = None, split_k: int | None = None
                     ) -> torch.Tensor:
    """a [..., K] @ dequantize(w_mx).T, the weight dequantized in registers; fp32 accumulation.

    bf16 and fp16 activations take the tensor-core dot of their dtype (fp16 needs the dequantized
    weights within fp16's range), fp32 activations an fp32 dot. The result has a's dtype. Tiles,
    group_m and split_k left unset are autotuned on a GPU (split_k by `_split_k` for M <= 64) and
    32 x 32 x 64, group 2, no split under the interpreter.
    """
    _check_runnable(a)
    if len(w_mx.shape) != 2:
        raise ValueError(f"mx_matmul needs a 2-D quantized weight [N, K], got shape {tuple(w_mx.shape)}")
    n, k = w_mx.shape
    if a.shape[-1] != k:
        raise ValueError(f"inner dimensions differ: a has {a.shape[-1]}, w_mx has {k}")
    if a.dtype not in DTYPES:
        raise ValueError(f"mx_matmul_triton takes activations in {DTYPES}, got {a.dtype}")
    a2 = a.reshape(-1, k)
    m = a2.shape[0]
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    if not (m and n):
        return c.reshape(*a.shape[:-1], n)
    if _INTERPRETED:
        dot = 3 if a.dtype == torch.float16 else 0
    else:
        dot = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[a.dtype]
        if dot == 1 and not bf16_exact(w_mx):
            dot = 0  # weights that bf16 would round: an fp32 dot on the widened activations instead
    tiles = None
    if _INTERPRETED or block_m or block_n or block_k:
        bm, bn, bk = (32, 32, 64) if _INTERPRETED else ((64, 64, 32) if dot == 0 else (128, 128, 64))
        bm, bn, bk = block_m or bm, block_n or bn, block_k or bk
        if any(b < 16 or b & (b - 1) for b in (bm, bn, bk)):
            raise ValueError(f"matmul tiles must be powers of two >= 16, got {(bm, bn, bk)}")
        tiles = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m or (2 if _INTERPRETED else 8))
    if split_k is None:
        split_k = 1 if (_INTERPRETED or m > 64) else _split_k(m, n, k, a.device)
    if split_k < 1:
        raise ValueError(f"split_k must be at least 1, got {split_k}")
    codes, scales = w_mx.codes.contiguous(), w_mx.scales.contiguous()
    g = w_mx.global_scale if w_mx.global_scale is not None else scales
    out = c if split_k == 1 else torch.empty(split_k, m, n, dtype=torch.float32, device=a.device)
    args = (a2, codes, scales, g, out, m, n, k, w_mx.n_blocks, a2.stride(0), a2.stride(1), codes.stride(0),
            scales.stride(0), n, m * n, triton.next_power_of_2(m))
    opts = dict(SPLIT_K=split_k, DOT=dot, OUT_KIND=_out_kind(a.dtype), **_scale_args(w_mx))

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]), split_k)

    if tiles is not None:
        extra = {} if _INTERPRETED else dict(num_warps=8 if tiles["BLOCK_M"] * tiles["BLOCK_N"] >= 128 * 128 else 4,
                                             num_stages=3)
        _mx_matmul_kernel[grid(tiles)](*args, **opts, **tiles, **extra)
    else:
        (_mm_small if m <= 64 else _mm_large)[grid](*args, **opts)
    if split_k > 1:
        acc = out.sum(0)  # a fixed order: the same result on every run
        if w_mx.global_scale is not None:
            acc = acc * w_mx.global_scale
        c = acc.to(a.dtype)
    return c.reshape(*a.shape[:-1], n)
