"""Compile every Triton kernel in its GPU configurations for a CUDA target, without a GPU.

The tests run the kernels under the CPU interpreter, which takes the interpreter's branches
(bf16 rounded by bits, fp32 dots) and checks no types the way the compiler does; the GPU's
branches (tensor-core dots in bf16/fp16, TF32, casts) are only ever compiled on a GPU. This
builds each kernel ahead of time for `--arch` (default sm_90, Hopper) with the ptxas that ships
in the triton wheel, so a compile error shows here instead of in the first GPU run:

    python benchmarks/kernels/compile_check.py [--arch 90] [--quick]

Takes a few minutes on 2 cores (fp32 "ieee" attention tiles compile slowly); --quick builds the
bf16 configurations only. Exit status 1 when any configuration fails, with its innermost error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the compiler's kernels, not the interpreter's
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.attention import triton as at  # noqa: E402
from kernels.mx import triton as mt  # noqa: E402
from kernels.mx.reference import E2M1, resolve_formats  # noqa: E402

FLOATS = ("qk_scale", "tie_tol2", "beta", "cap2", "sm_scale")


def build(fn, ptrs: dict, consts: dict, target, warps: int = 4, stages: int = 3) -> str | None:
    """None when fn compiles with these pointer types and constexprs, else the innermost error."""
    sig = {a: "constexpr" if a in consts else "*" + ptrs[a] if a in ptrs else "fp32" if a in FLOATS else "i32"
           for a in fn.arg_names}
    try:
        triton.compile(ASTSource(fn, sig, consts), target=target, options={"num_warps": warps, "num_stages": stages})
        return None
    except Exception as e:  # noqa: BLE001 - report whatever the compiler raised
        inner = e
        while inner.__cause__ or inner.__context__:
            inner = inner.__cause__ or inner.__context__
        return f"{type(inner).__name__}: {str(inner).strip().splitlines()[-1][:300]}"


def cases(quick: bool):
    dts = [("bf16", 2, 1)] if quick else [("bf16", 2, 1), ("fp16", 2, 1), ("fp32", 0, 0), ("fp32", 0, 2)]
    for dt, rnd, dot in dts:
        wide = dot == 1  # tensor-core tiles; fp32 "ieee" tiles are kept small (they compile slowly)
        for causal in (False, True):
            for stable in ((0, 1, 2) if dt == "bf16" else (0,)):
                yield (f"attention fwd {dt} dot={dot} causal={causal} stable={stable}", at._fwd_kernel,
                       {a: dt for a in "QKVO"} | {"LSE": "fp32"},
                       dict(CAUSAL=causal, STABLE=stable, BLOCK_M=128 if wide else 64, BLOCK_N=64,
                            BLOCK_D=128 if wide else 32, ROUND=rnd, DOT=dot), 4)
            bwd = dict(CAUSAL=causal, BLOCK_D=64 if wide else 32, ROUND=rnd, DOT=dot)
            yield (f"attention dkdv {dt} dot={dot} causal={causal}", at._bwd_dkdv_kernel,
                   {a: dt for a in ("Q", "K", "V", "DO", "DK", "DV")} | {"LSE": "fp32", "DELTA": "fp32"},
                   bwd | dict(BLOCK_M=32, BLOCK_N=128 if wide else 64), 4)
            yield (f"attention dq {dt} dot={dot} causal={causal}", at._bwd_dq_kernel,
                   {a: dt for a in ("Q", "K", "V", "DO", "DQ")} | {"LSE": "fp32", "DELTA": "fp32"},
                   bwd | dict(BLOCK_M=128 if wide else 64, BLOCK_N=32), 4)
        yield (f"attention preprocess {dt}", at._bwd_preprocess, {"O": dt, "DO": dt, "DELTA": "fp32"},
               dict(BLOCK_M=64, BLOCK_D=128), 4)
    formats = [(32, "e8m0", "e2m1", False), (16, "ue4m3", "e2m1", True)]
    if not quick:  # every OCP MX v1.0 element format, with E8M0 and with a UE scale (MXINT8 + UE: the fp32 dot)
        formats += [(32, "e8m0", "e4m3", False), (32, "e8m0", "e5m2", False), (32, "e8m0", "e3m2", False),
                    (32, "e8m0", "e2m3", False), (32, "e8m0", "int8", False), (16, "ue5m3", "e2m3", False),
                    (16, "ue4m3", "int8", True)]
    for bs, sf, ef, g in formats:
        elem, scale = resolve_formats(bs, sf, ef, g, "flush")
        e, s = mt._fmt_args(elem), mt._fmt_args(scale)
        sa = dict(BS=bs, IS_FP4=elem == E2M1, EM=e["M"], EEMIN=e["EMIN"], ENANC=e["NANC"], ESIGN=e["SIGN"],
                  ESPEC=e["SPEC"], ETWOS=e["TWOS"], SCALE_E8M0=sf == "e8m0", SM=s["M"], SEMIN=s["EMIN"],
                  SNANC=s["NANC"], HAS_G=g)
        bf16_dot = mt.significant_bits(elem) + mt.significant_bits(scale) <= 8
        for dt, out, dot in [("bf16", 1, 1)] + ([] if quick else [("fp16", 2, 2), ("fp32", 0, 0)]):
            yield (f"mx quantize {dt} {sf} {ef}", mt._quantize_kernel, {"X": dt, "CODES": "u8", "SCALES": "u8", "G": "fp32"},
                   dict(BS=bs, NBP=4, BLOCK_R=32, IS_FP4=elem == E2M1, EM=e["M"], EEMIN=e["EMIN"], EMAXV=e["MAXV"],
                        EEMAX=elem.emax, SCALE_E8M0=sf == "e8m0", SM=s["M"], SEMIN=s["EMIN"], SMAXV=s["MAXV"],
                        SBADC=scale.nan_code if scale.nan else scale.max_code, SNANC=s["NANC"], HAS_G=g, CLAMP=False,
                        ESIGN=e["SIGN"], TWOS=e["TWOS"]), 4)
            yield (f"mx dequantize {dt} {sf} {ef}", mt._dequantize_kernel,
                   {"CODES": "u8", "SCALES": "u8", "G": "fp32", "OUT": dt}, sa | dict(NBP=4, BLOCK_R=32, OUT_KIND=out), 4)
            if dot == 1 and not bf16_dot:
                dot = 0  # as mx_matmul_triton: weights bf16 would round take the fp32 dot
            for bm, bn, bk, gm, split in ((128, 256, 64, 8, 1), (16, 64, 256, 1, 4), (64, 64, 32, 8, 1)):
                if (dt == "fp32" or dot == 0) and bm == 128:
                    continue
                yield (f"mx_matmul {dt} {sf} {ef} {bm}x{bn}x{bk} group={gm} split_k={split}", mt._mx_matmul_kernel,
                       {"A": dt, "CODES": "u8", "SCALES": "u8", "G": "fp32", "C": "fp32" if split > 1 else dt},
                       sa | dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, SPLIT_K=split, DOT=dot, OUT_KIND=out),
                       8 if bm * bn >= 128 * 128 else 4)
    yield "mx amax bf16", mt._amax_kernel, {"X": "bf16", "OUT": "i32"}, dict(BLOCK_R=16, BLOCK_K=1024), 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability as an integer (90: H100/H200)")
    ap.add_argument("--quick", action="store_true", help="bf16 configurations and the FP4 formats only")
    ap.add_argument("--only", choices=["mx", "attention"], help="one kernel family's configurations")
    args = ap.parse_args(argv)
    target = GPUTarget("cuda", args.arch, 32)
    failures = 0
    for name, fn, ptrs, consts, warps in cases(args.quick):
        if args.only and not name.startswith(args.only):
            continue
        t0 = time.perf_counter()
        err = build(fn, ptrs, consts, target, warps=warps)
        failures += err is not None
        print(f"{'FAIL' if err else 'ok  '} {name} ({time.perf_counter() - t0:.1f}s){': ' + err if err else ''}", flush=True)
    print(f"{failures} configuration(s) failed to compile for sm_{args.arch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
