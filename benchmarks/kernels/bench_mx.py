"""OCP Microscaling Formats (MX) Specification v1.0 — https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf

kernels.mx on a GPU, every ratio measured in the same run:

- quantize and dequantize: GB/s of the Triton kernel against a device-to-device copy of the same
  input (the memory-bound ceiling), and the speed-up over the PyTorch reference;
- mx_matmul: TFLOP/s of the Triton kernel (weights dequantized in registers) against
  `torch.matmul` in bf16 on the already dequantized weights, at M = N = K = --size.

Each timing is the median of CUDA-event-timed repeats after warm-up; the Triton outputs are
checked against the reference in the same run. Without CUDA it says so, skips the timings and
runs the correctness part on small shapes under the Triton interpreter.

    python benchmarks/kernels/bench_mx.py [--size 8192] [--reps 20]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated, so before the import

from kernels import mx  # noqa: E402
from kernels.mx import reference as ref  # noqa: E402

CONFIGS = [  # (label, quantize options)
    ("mxfp4 e8m0 B32", dict(block_size=32, scale_format="e8m0")),
    ("nvfp4 ue4m3+g B16", dict(block_size=16, scale_format="ue4m3", global_scale=True)),
    ("ue5m3 B16", dict(block_size=16, scale_format="ue5m3")),
    ("ue5m3 B8", dict(block_size=8, scale_format="ue5m3")),
]


def cuda_time(fn, reps: int, warmup: int = 3) -> float:
    """Median seconds of fn() over reps CUDA-event-timed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def same_mx(a: mx.MXTensor, b: mx.MXTensor) -> bool:
    return torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def matmul_error(got: torch.Tensor, a: torch.Tensor, w_hat: torch.Tensor) -> float:
    """max |got - a @ w_hat.T| relative to max |a @ w_hat.T|, the exact product in fp64 (or fp32 on CPU)."""
    hi = torch.float64 if a.device.type == "cpu" else torch.float32
    exact = a.to(hi) @ w_hat.to(hi).T
    return ((got.to(hi) - exact).abs().max() / exact.abs().max()).item()


def correctness_on_cpu() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(63, 1000, generator=g) * 0.01
    a = torch.randn(37, 1000, generator=g)
    print(f"{'config':<20} {'quantize bit-exact':>18} {'dequantize bit-exact':>21} {'mx_matmul rel err':>18}")
    for label, opts in CONFIGS:
        want, got = ref.quantize(x, **opts), mx.quantize(x, impl="triton", **opts)
        deq = same_values(mx.dequantize(got, impl="triton"), ref.dequantize(want))
        err = matmul_error(mx.mx_matmul(a, want, impl="triton"), a, ref.dequantize(want))
        print(f"{label:<20} {str(same_mx(want, got)):>18} {str(deq):>21} {err:>18.2e}")


def bench_gpu(size: int, reps: int) -> None:
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}; x, a, w: [{size}, {size}] bf16; median of {reps}")
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.randn(size, size, generator=g, device=dev) * 0.02).bfloat16()
    a = torch.randn(size, size, generator=g, device=dev).bfloat16()
    buf = torch.empty_like(x)
    t_copy = cuda_time(lambda: buf.copy_(x), reps)
    copy_gbs = 2 * x.numel() * x.element_size() / t_copy / 1e9
    print(f"device-to-device copy: {copy_gbs:,.0f} GB/s\n")
    header = (f"{'config':<20} {'quant GB/s':>10} {'/copy':>6} {'vs ref':>7} {'exact':>6} {'dequant GB/s':>12} "
              f"{'/copy':>6} {'exact':>6} {'mx_matmul TF/s':>14} {'bf16 TF/s':>9} {'ratio':>6} {'rel err':>8}")
    print(header)
    flops = 2.0 * size ** 3
    for label, opts in CONFIGS:
        want = ref.quantize(x, **opts)
        got = mx.quantize(x, impl="triton", **opts)
        q_exact = same_mx(want, got)
        t_q = cuda_time(lambda: mx.quantize(x, impl="triton", **opts), reps)
        t_qref = cuda_time(lambda: ref.quantize(x, **opts), max(3, reps // 4))
        packed = got.codes.numel() + got.scales.numel()
        q_gbs = (x.numel() * x.element_size() + packed) / t_q / 1e9
        w_hat = mx.dequantize(got, impl="triton")
        d_exact = same_values(w_hat, ref.dequantize(want))
        t_d = cuda_time(lambda: mx.dequantize(got, impl="triton"), reps)
        d_gbs = (packed + w_hat.numel() * w_hat.element_size()) / t_d / 1e9
        out = mx.mx_matmul(a, got, impl="triton")
        err = matmul_error(out, a, ref.dequantize(want, torch.float32))
        t_mm = cuda_time(lambda: mx.mx_matmul(a, got, impl="triton"), reps)
        t_bf = cuda_time(lambda: torch.matmul(a, w_hat.T), reps)
        print(f"{label:<20} {q_gbs:>10,.0f} {q_gbs / copy_gbs:>6.0%} {t_qref / t_q:>6.1f}x {str(q_exact):>6} "
              f"{d_gbs:>12,.0f} {d_gbs / copy_gbs:>6.0%} {str(d_exact):>6} {flops / t_mm / 1e12:>14.1f} "
              f"{flops / t_bf / 1e12:>9.1f} {t_bf / t_mm:>6.0%} {err:>8.1e}")
    print("\ntargets (issue 25): quantize >= 80% of copy bandwidth; mx_matmul >= 60% of the bf16 matmul's rate at 8192^3")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=8192, help="M = N = K of the matmul, rows = cols of x")
    p.add_argument("--reps", type=int, default=20, help="timed repeats per measurement (median reported)")
    args = p.parse_args(argv)
    if not mx.HAS_TRITON:
        print("triton is not installed: nothing to benchmark")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: timings skipped (they need a GPU); correctness under the Triton interpreter:\n")
        correctness_on_cpu()
        return 0
    bench_gpu(args.size, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
