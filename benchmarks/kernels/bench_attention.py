"""Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention (Qiu & Yao, 2025) — https://arxiv.org/abs/2510.04212

Times our Triton flash attention (with and without the rounding-bias fix) against
`torch.nn.functional.scaled_dot_product_attention` on the same inputs, forward and
forward+backward, at a few sequence lengths, and prints the ratios measured in this run. Also
prints each kernel's largest deviation from SDPA's output, so a fast wrong kernel shows.

    python benchmarks/kernels/bench_attention.py [--seq-lens 512 1024 2048 4096] [--batch 4] [--heads 16]
                                           [--head-dim 64] [--dtype bf16] [--causal both] [--reps 30]

Needs a CUDA GPU and Triton; TFLOP/s count 4*B*H*T^2*D for the forward (halved when causal)
and 2.5 times that for the backward (its five matrix products against the forward's two).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `kernels` from a bare checkout, as bench_mx.py

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def time_ms(fn, reps: int, warmup: int = 5) -> float:
    """Median wall time of fn() in milliseconds, timed with CUDA events."""
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
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("bench_attention: no CUDA device; this benchmark times GPU kernels and needs one.", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench_attention: TRITON_INTERPRET is set; unset it (the interpreter times nothing useful).",
              file=sys.stderr)
        return 2
    from kernels.attention.triton import HAS_TRITON, flash_attention_triton
    if not HAS_TRITON:
        print("bench_attention: Triton is not installed.", file=sys.stderr)
        return 2

    dtype = DTYPES[args.dtype]
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    B, H, D = args.batch, args.heads, args.head_dim
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  B={B} H={H} D={D} {args.dtype}")
    header = (f"{'T':>6} {'causal':>6} | {'impl':<10} {'fwd ms':>8} {'fwd TF/s':>9} {'f+b ms':>8} {'f+b TF/s':>9} "
              f"{'max|dO|':>9} | {'f+b / sdpa':>10} {'fix cost':>8}")
    print(header)
    print("-" * len(header))
    for T in args.seq_lens:
        for causal in causals:
            g = torch.Generator(device="cuda").manual_seed(T)
            q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
                       for _ in range(3))
            dout = torch.randn(B, H, T, D, device="cuda", dtype=dtype, generator=g)
            impls = {
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                "ours": lambda: flash_attention_triton(q, k, v, causal=causal),
                "ours+fix": lambda: flash_attention_triton(q, k, v, causal=causal, stable_rounding=True),
            }
            with torch.no_grad():
                want = impls["sdpa"]().float()
            flops_fwd = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
            rows = {}
            for name, fn in impls.items():
                with torch.no_grad():
                    err = (fn().float() - want).abs().max().item()
                    fwd = time_ms(fn, args.reps)

                def step(fn=fn):
                    q.grad = k.grad = v.grad = None
                    fn().backward(dout)

                fb = time_ms(step, args.reps)
                rows[name] = (fwd, fb, err)
            for name, (fwd, fb, err) in rows.items():
                ratio = fb / rows["sdpa"][1]
                cost = f"{100 * (fb / rows['ours'][1] - 1):+.1f}%" if name == "ours+fix" else ""
                print(f"{T:>6} {str(causal):>6} | {name:<10} {fwd:>8.3f} {flops_fwd / fwd / 1e9:>9.1f} {fb:>8.3f} "
                      f"{3.5 * flops_fwd / fb / 1e9:>9.1f} {err:>9.2e} | {ratio:>10.2f} {cost:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
