#!/usr/bin/env python3
"""The GPU evidence run for the Triton kernels: one command, one folder of results.

    python3 benchmarks/gpu.py OUTDIR               # on a machine with one CUDA GPU (~6-8 min on an H100/H200)
    python3 benchmarks/gpu.py --cpu-smoke OUTDIR   # the same code paths at toy sizes on a CPU (Triton interpreter)

Needs only torch, triton and numpy (pytest for the first section, torchao where it is importable):
no Ray, MLflow or DeepSpeed. Writes OUTDIR/gpu.json (every number) and OUTDIR/gpu.md (the tables).
Sections, each timed and caught on its own so that one failure leaves the others' numbers:

1. ``tests``: tests/kernels on the GPU, without the interpreter (pytest in a subprocess).
2. ``mx``: quantize / dequantize GB/s as a ratio of a device-to-device copy of the same input;
   mx_matmul TFLOP/s as a ratio of a bf16 torch.matmul on the dequantized weight, at prefill and
   decode shapes, and of torchao's emulated MX path (dequantize, then bf16 matmul) where torchao
   imports. Targets: quantize >= 0.8 of copy; mx_matmul >= 0.6 of bf16 at 8192^3 and ahead of torchao.
3. ``attention``: flash attention forward and forward+backward TFLOP/s against
   scaled_dot_product_attention's flash backend, with and without the stable-rounding fix, on the
   [B, T, H, D].transpose(1, 2) layout models use. Targets: with the fix >= 0.97 of without;
   forward within 1.3x of SDPA's flash backend.
4. ``family``: a small celerity_lm family (three widths x two seeds, bf16 autocast) trained on
   one GPU, and the collapse check of `ladder audit --family`: is the spread of the normalized
   held-out curves across widths, from 20% of training on, within the seed-to-seed spread?

Timings are medians of CUDA-event-timed repeats after warm-up (on a CPU: wall time of one call,
only to exercise the code). Every kernel's output is compared with a reference in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "quantize_vs_copy": 0.8,
    "mx_matmul_vs_bf16_8192": 0.6,
    "attention_fix_vs_nofix": 0.97,
    "attention_fwd_vs_sdpa_flash": 1 / 1.3,
}


# -- plumbing ---------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, out: Path, smoke: bool, budget_s: float):
        self.out = out
        self.smoke = smoke
        self.start = time.perf_counter()
        self.budget_s = budget_s
        import torch

        self.torch = torch
        self.device = "cpu" if smoke else "cuda"

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def time_ms(self, fn, reps: int = 20, warmup: int = 3) -> float:
        """Median milliseconds of fn() (CUDA events on a GPU; one timed call on a CPU)."""
        torch = self.torch
        if self.smoke:
            fn()
            t0 = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t0)
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


# -- 1. kernel tests --------------------------------------------------------------------------------

def section_tests(ctx: Ctx) -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError as e:
        return {"status": "skipped", "reason": f"pytest does not import in this python ({e}): pip install pytest"}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # "0" on a GPU: the test modules only set TRITON_INTERPRET when it is unset
    env["TRITON_INTERPRET"] = "1" if ctx.smoke else "0"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--confcutdir", str(REPO / "tests" / "kernels"), "--junitxml", str(ctx.out / "kernel_tests.xml")]
    # On a CPU, a few of them only (the whole folder is `make test`'s business there)
    cmd += ["tests/kernels/test_mx_triton.py", "-k", "bit_exact and e8m0-False-e2m1"] if ctx.smoke else ["tests/kernels"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(60, min(300, ctx.left())))
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    summary = next((line for line in reversed(lines) if " passed" in line or " failed" in line or " error" in line), "")
    words = summary.replace(",", " ").split()
    counts = {w: int(words[i - 1]) for i, w in enumerate(words)
              if w in ("passed", "failed", "skipped", "error", "errors", "deselected") and i and words[i - 1].isdigit()}
    return {"status": "ok" if proc.returncode == 0 else "failed", "returncode": proc.returncode,
            "summary": summary, "counts": counts, "seconds": time.perf_counter() - t0,
            "tail": lines[-60:] if proc.returncode else lines[-5:]}


# -- 2. MX ------------------------------------------------------------------------------------------

MX_FORMATS = {"mxfp4": dict(block_size=32, scale_format="e8m0"),
              "nvfp4": dict(block_size=16, scale_format="ue4m3", global_scale=True)}


def _torchao_mx():
    """(quantize(w) -> object, dequantize(obj) -> bf16) from torchao's MX prototype, or an error string."""
    try:
        import torch
        from torchao.prototype.mx_formats.mx_tensor import MXTensor as AOMX

        elem = getattr(torch, "float4_e2m1fn_x2", None) or "fp4_e2m1"

        def q(w):
            return AOMX.to_mx(w, elem, 32)

        def dq(m):
            return m.to_dtype(torch.bfloat16) if hasattr(m, "to_dtype") else m.dequantize(torch.bfloat16)

        return q, dq
    except Exception as e:  # noqa: BLE001 - any import or API mismatch: report it
        return f"{type(e).__name__}: {e}"


def section_mx(ctx: Ctx) -> dict:
    torch = ctx.torch
    from kernels import mx
    from kernels.mx import reference as ref

    dev = ctx.device
    g = torch.Generator(device=dev).manual_seed(0)
    rows, cols = (64, 256) if ctx.smoke else (8192, 8192)
    x = torch.randn(rows, cols, device=dev, generator=g).bfloat16()
    copy_dst = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    t_copy = ctx.time_ms(lambda: copy_dst.copy_(x))
    copy_gbs = 2 * nbytes / t_copy / 1e6
    quant = []
    for name, kw in MX_FORMATS.items():
        m = mx.quantize(x, impl="triton", **kw)
        out_bytes = m.codes.numel() + m.scales.numel()
        t_q = ctx.time_ms(lambda: mx.quantize(x, impl="triton", **kw))
        t_d = ctx.time_ms(lambda: mx.dequantize(m, impl="triton"))
        t_ref = ctx.time_ms(lambda: ref.quantize(x, **kw), reps=5)
        part = x[:128]
        want = ref.quantize(part, **kw)
        got = mx.quantize(part, impl="triton", **kw)
        exact = bool(torch.equal(got.codes, want.codes) and torch.equal(got.scales, want.scales))
        q_gbs = (nbytes + out_bytes) / t_q / 1e6
        d_gbs = (nbytes + out_bytes) / t_d / 1e6
        quant.append({"format": name, "shape": [rows, cols], "quantize_ms": t_q, "quantize_GBs": q_gbs,
                      "quantize_vs_copy": q_gbs / copy_gbs, "dequantize_ms": t_d, "dequantize_GBs": d_gbs,
                      "dequantize_vs_copy": d_gbs / copy_gbs, "speedup_vs_reference": t_ref / t_q,
                      "bit_exact_vs_reference": exact})
    ao = _torchao_mx()
    shapes = ([("prefill", 64, 64, 64), ("decode", 4, 64, 64)] if ctx.smoke else
              [("prefill", 8192, 8192, 8192), ("prefill", 4096, 4096, 4096), ("decode", 1, 8192, 8192),
               ("decode", 16, 8192, 8192), ("decode", 16, 4096, 4096)])
    mm = []
    for kind, M, N, K in shapes:
        if ctx.left() < 60:
            mm.append({"shape": [M, N, K], "status": "skipped: out of time"})
            continue
        a = torch.randn(M, K, device=dev, generator=g).bfloat16()
        w = torch.randn(N, K, device=dev, generator=g) * 0.02
        flops = 2 * M * N * K
        for name in ("mxfp4", "nvfp4"):
            wm = mx.quantize(w, impl="triton", **MX_FORMATS[name])
            w_hat = mx.dequantize(wm, torch.bfloat16, impl="triton")
            t_ours = ctx.time_ms(lambda: mx.mx_matmul(a, wm, impl="triton"))
            t_bf16 = ctx.time_ms(lambda: torch.matmul(a, w_hat.T))
            got = mx.mx_matmul(a, wm, impl="triton")
            row = {"kind": kind, "shape": [M, N, K], "format": name, "ours_ms": t_ours,
                   "ours_TFLOPs": flops / t_ours / 1e9, "bf16_ms": t_bf16, "bf16_TFLOPs": flops / t_bf16 / 1e9,
                   "vs_bf16": t_bf16 / t_ours, "rel_err_vs_bf16_on_dequantized": _rel(got, a @ w_hat.T)}
            if name == "mxfp4":
                if isinstance(ao, str):
                    row["torchao"] = ao
                else:
                    try:
                        q, dq = ao
                        w_ao = q(w.bfloat16())
                        t_ao = ctx.time_ms(lambda: torch.matmul(a, dq(w_ao).T))
                        row.update(torchao_ms=t_ao, torchao_TFLOPs=flops / t_ao / 1e9, vs_torchao=t_ao / t_ours)
                    except Exception as e:  # noqa: BLE001
                        row["torchao"] = f"{type(e).__name__}: {e}"
            mm.append(row)
    return {"status": "ok", "copy_GBs": copy_gbs, "quantize": quant, "matmul": mm}


# -- 3. attention -----------------------------------------------------------------------------------

def section_attention(ctx: Ctx) -> dict:
    torch = ctx.torch
    import torch.nn.functional as F

    from kernels.attention.triton import flash_attention_triton

    dev = ctx.device
    cases = ([(1, 2, 64, 16, False), (1, 2, 64, 16, True)] if ctx.smoke else
             [(8, 16, 2048, 128, False), (8, 16, 2048, 128, True), (2, 16, 8192, 128, True),
              (8, 16, 2048, 64, True)])
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        flash = (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)) if not ctx.smoke else None
    except ImportError:
        flash = None
    rows = []
    for B, H, T, D, causal in cases:
        if ctx.left() < 60:
            rows.append({"shape": [B, H, T, D], "causal": causal, "status": "skipped: out of time"})
            continue
        g = torch.Generator(device=dev).manual_seed(T + D)
        dtype = torch.float32 if ctx.smoke else torch.bfloat16
        # the layout a model hands over: [B, T, H, D] viewed as [B, H, T, D] (read in place)
        q, k, v = (torch.randn(B, T, H, D, device=dev, dtype=dtype, generator=g).transpose(1, 2).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(B, H, T, D, device=dev, dtype=dtype, generator=g)

        def sdpa():
            if flash is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with flash():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        impls = {"sdpa_flash": sdpa,
                 "ours": lambda: flash_attention_triton(q, k, v, causal=causal),
                 "ours_fix": lambda: flash_attention_triton(q, k, v, causal=causal, stable_rounding=True)}
        with torch.no_grad():
            want = sdpa().float()
        fwd_flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
        row = {"shape": [B, H, T, D], "causal": causal, "dtype": str(dtype).replace("torch.", "")}
        for name, fn in impls.items():
            with torch.no_grad():
                err = (fn().float() - want).abs().max().item()
                t_f = ctx.time_ms(fn)

            def step(fn=fn):
                q.grad = k.grad = v.grad = None
                fn().backward(dout)

            t_fb = ctx.time_ms(step)
            row[name] = {"fwd_ms": t_f, "fwd_TFLOPs": fwd_flops / t_f / 1e9, "fwdbwd_ms": t_fb,
                         "fwdbwd_TFLOPs": 3.5 * fwd_flops / t_fb / 1e9, "max_abs_err_vs_sdpa": err}
        row["fwd_vs_sdpa"] = row["sdpa_flash"]["fwd_ms"] / row["ours"]["fwd_ms"]
        row["fwdbwd_vs_sdpa"] = row["sdpa_flash"]["fwdbwd_ms"] / row["ours"]["fwdbwd_ms"]
        row["fix_vs_nofix_fwd"] = row["ours"]["fwd_ms"] / row["ours_fix"]["fwd_ms"]
        row["fix_vs_nofix_fwdbwd"] = row["ours"]["fwdbwd_ms"] / row["ours_fix"]["fwdbwd_ms"]
        rows.append(row)
    return {"status": "ok", "cases": rows}


# -- 4. a celerity_lm family and its collapse check --------------------------------------------------

def _spreads(curves, groups, after):
    """`orchestrator.plots.family_spreads` when it imports here; the same few lines otherwise."""
    try:
        from orchestrator.plots import family_spreads

        return family_spreads(curves, groups, after=after)
    except ImportError:
        import numpy as np
        from collections import defaultdict

        from orchestrator.collapse import normalize

        t = np.linspace(after, 1.0, 81)
        by = defaultdict(list)
        for tid, (p, y) in curves.items():
            p, y = np.asarray(p, float), np.asarray(y, float)
            by[groups[tid]].append(np.interp(t, p, normalize(p, y)))
        means = np.vstack([np.mean(v, axis=0) for v in by.values()])
        return t, np.ptp(means, axis=0), np.mean([np.ptp(np.vstack(v), axis=0) for v in by.values()], axis=0)


def section_family(ctx: Ctx) -> dict:
    torch = ctx.torch
    import dataclasses

    import torch.nn.functional as F

    from orchestrator.lm.corpus import BatchSampler, heldout_batches, load_data
    from workloads.celerity_lm.workload import Config, build, evaluate, lr_factor

    if ctx.smoke:
        widths, base = (16, 32, 48), Config(depth=1, head_dim=16, seq_len=32, batch_size=8, tpp=2.0, base_width=16,
                                            base_depth=1, max_bytes=300_000, eval_tokens=1024)
    else:
        widths, base = (96, 192, 384), Config(depth=3, head_dim=32, seq_len=256, batch_size=64, tpp=20.0,
                                              base_width=96, base_depth=3, max_bytes=60_000_000, eval_tokens=65536)
    seeds, after, evals = (0, 1), 0.2, 20
    if not ctx.smoke and ctx.left() < 220:  # sized for ~3 min: shrink the token budget to the time left
        base = dataclasses.replace(base, tpp=max(2.0, base.tpp * (ctx.left() - 40) / 180))
    dev = torch.device(ctx.device)
    train_bytes, held_bytes = load_data(base.data, heldout_frac=base.heldout_frac, max_bytes=base.max_bytes)
    heldout = heldout_batches(held_bytes, base.seq_len, base.eval_tokens, batch=32)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if not ctx.smoke else torch.autocast("cpu", enabled=False))
    curves, groups, runs = {}, {}, []
    budget_s = ctx.left() - 20
    for width in widths:
        for seed in seeds:
            cfg = dataclasses.replace(base, width=width, seed=seed)
            torch.manual_seed(seed)
            model, opt, plan = build(cfg)
            model.to(dev)
            peaks = [grp["lr"] for grp in opt.param_groups]
            sampler = BatchSampler(train_bytes, cfg.seq_len, cfg.batch_size, seed=seed, rank=0)
            marks = {max(1, round(plan.steps * i / evals)) for i in range(1, evals + 1)}
            prog, loss = [], []
            t0 = time.perf_counter()
            for step in range(1, plan.steps + 1):
                f = lr_factor(step, plan.steps, cfg.warmup_frac)
                for grp, peak in zip(opt.param_groups, peaks):
                    grp["lr"] = peak * f
                xb, yb = (t.to(dev, non_blocking=True) for t in sampler.next())
                with autocast:
                    logits = model(xb)
                    lo = F.cross_entropy(logits.flatten(0, 1).float(), yb.flatten())
                opt.zero_grad(set_to_none=True)
                lo.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                if step in marks:
                    with autocast:
                        loss.append(evaluate(model, heldout, dev))
                    prog.append(step / plan.steps)
            tid = f"w{width}-s{seed}"
            curves[tid], groups[tid] = (prog, loss), width
            runs.append({"trial": tid, "width": width, "seed": seed, "params": plan.params, "steps": plan.steps,
                         "tokens": plan.tokens, "final_eval_loss": loss[-1], "seconds": time.perf_counter() - t0})
            if time.perf_counter() - ctx.start > ctx.budget_s and not ctx.smoke:
                raise TimeoutError(f"the family ran past the time budget after {tid} ({budget_s:.0f}s were left)")
    t, width_range, seed_range = _spreads(curves, groups, after)
    import numpy as np

    w, s = float(np.max(width_range)), float(np.max(seed_range))
    at = {f"{x:g}": {"width": float(np.interp(x, t, width_range)), "seed": float(np.interp(x, t, seed_range))}
          for x in (0.2, 0.4, 0.6, 0.8, 1.0)}
    return {"status": "ok", "widths": list(widths), "seeds": list(seeds), "after": after, "tpp": base.tpp,
            "precision": "fp32" if ctx.smoke else "bf16 autocast", "width_spread": w, "seed_spread": s,
            "collapses": w <= s, "spreads_at": at, "runs": runs,
            "curves": {k: {"progress": v[0], "eval_loss": v[1]} for k, v in curves.items()}}


# -- report -----------------------------------------------------------------------------------------

def _fmt(v, spec=".3g"):
    return "" if v is None else (format(v, spec) if isinstance(v, (int, float)) else str(v))


def markdown(res: dict) -> str:
    m = res["meta"]
    out = [f"# GPU evidence run ({'CPU smoke, toy sizes: no speed meaning' if m['cpu_smoke'] else m['device']})", "",
           f"torch {m['torch']}, triton {m['triton']}, python {m['python']}, {m['seconds']:.3g} s in all.", "",
           "| section | status | seconds |", "|---|---|---|"]
    for name, sec in res["sections"].items():
        out.append(f"| {name} | {sec.get('status')} | {_fmt(sec.get('seconds'), '.1f')} |")
    t = res["sections"].get("tests", {})
    if t.get("summary"):
        out += ["", f"## kernel tests\n\n`{t['summary']}`"]
    mxs = res["sections"].get("mx", {})
    if mxs.get("quantize"):
        out += ["", f"## MX (copy: {mxs['copy_GBs']:.3g} GB/s; target quantize >= {TARGETS['quantize_vs_copy']} of copy)",
                "", "| format | shape | quantize GB/s | x copy | dequantize GB/s | x copy | x reference | bit-exact |",
                "|---|---|---|---|---|---|---|---|"]
        for r in mxs["quantize"]:
            out.append(f"| {r['format']} | {r['shape']} | {r['quantize_GBs']:.3g} | {r['quantize_vs_copy']:.2f} | "
                       f"{r['dequantize_GBs']:.3g} | {r['dequantize_vs_copy']:.2f} | {r['speedup_vs_reference']:.1f} | "
                       f"{r['bit_exact_vs_reference']} |")
        out += ["", f"mx_matmul (target >= {TARGETS['mx_matmul_vs_bf16_8192']} of bf16 at 8192^3, ahead of torchao):",
                "", "| kind | M, N, K | format | ours TFLOP/s | bf16 TFLOP/s | x bf16 | torchao TFLOP/s | x torchao | rel. err |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in mxs["matmul"]:
            if "ours_ms" not in r:
                out.append(f"| | {r['shape']} | | {r.get('status')} | | | | | |")
                continue
            out.append(f"| {r['kind']} | {r['shape']} | {r['format']} | {r['ours_TFLOPs']:.3g} | {r['bf16_TFLOPs']:.3g} | "
                       f"{r['vs_bf16']:.2f} | {_fmt(r.get('torchao_TFLOPs')) or r.get('torchao', '')[:40]} | "
                       f"{_fmt(r.get('vs_torchao'), '.2f')} | {r['rel_err_vs_bf16_on_dequantized']:.1e} |")
    at = res["sections"].get("attention", {})
    if at.get("cases"):
        out += ["", "## flash attention (targets: fix >= 0.97 of no fix; forward >= 1/1.3 of SDPA flash)", "",
                "| B, H, T, D | causal | SDPA fwd / f+b TF/s | ours fwd / f+b TF/s | +fix fwd / f+b TF/s | fwd x SDPA | "
                "f+b x SDPA | fix x no fix (fwd / f+b) | max err (ours, fix) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in at["cases"]:
            if "ours" not in r:
                out.append(f"| {r['shape']} | {r['causal']} | {r.get('status')} | | | | | | |")
                continue
            s, o, f = r["sdpa_flash"], r["ours"], r["ours_fix"]
            out.append(f"| {r['shape']} | {r['causal']} | {s['fwd_TFLOPs']:.3g} / {s['fwdbwd_TFLOPs']:.3g} | "
                       f"{o['fwd_TFLOPs']:.3g} / {o['fwdbwd_TFLOPs']:.3g} | {f['fwd_TFLOPs']:.3g} / {f['fwdbwd_TFLOPs']:.3g} | "
                       f"{r['fwd_vs_sdpa']:.2f} | {r['fwdbwd_vs_sdpa']:.2f} | {r['fix_vs_nofix_fwd']:.3f} / "
                       f"{r['fix_vs_nofix_fwdbwd']:.3f} | {o['max_abs_err_vs_sdpa']:.1e}, {f['max_abs_err_vs_sdpa']:.1e} |")
    fam = res["sections"].get("family", {})
    if fam.get("runs"):
        verdict = "collapses" if fam["collapses"] else "does NOT collapse"
        out += ["", f"## celerity_lm family ({fam['precision']}, {fam['tpp']:g} tokens per parameter): {verdict}", "",
                f"width spread after {fam['after']:.0%}: {fam['width_spread']:.4f}; seed spread: {fam['seed_spread']:.4f}",
                "", "| run | params | steps | final eval loss | seconds |", "|---|---|---|---|---|"]
        for r in fam["runs"]:
            out.append(f"| {r['trial']} | {r['params']} | {r['steps']} | {r['final_eval_loss']:.4f} | {r['seconds']:.1f} |")
        out += ["", "| t/T | " + " | ".join(fam["spreads_at"]) + " |", "|---|" + "---|" * len(fam["spreads_at"]),
                "| width spread | " + " | ".join(f"{v['width']:.4f}" for v in fam["spreads_at"].values()) + " |",
                "| seed spread | " + " | ".join(f"{v['seed']:.4f}" for v in fam["spreads_at"].values()) + " |"]
    for name, sec in res["sections"].items():
        if sec.get("status") in ("error", "failed") and sec.get("tail"):
            out += ["", f"## {name}: {sec['status']}", "", "```", *sec["tail"][-30:], "```"]
    return "\n".join(out) + "\n"


SECTIONS = {"tests": section_tests, "mx": section_mx, "attention": section_attention, "family": section_family}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path, help="folder for gpu.json, gpu.md and the tests' junit XML")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU, kernels under the Triton interpreter")
    ap.add_argument("--sections", nargs="+", choices=sorted(SECTIONS), default=list(SECTIONS))
    ap.add_argument("--budget-s", type=float, default=450.0, help="sections still to start are skipped past this")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated: before they are imported
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, str(REPO))
    import torch

    if args.cpu_smoke:
        torch.set_num_threads(1)  # toy sizes: threads only contend (a shared CI machine runs other work too)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu.py: no CUDA device; run with --cpu-smoke for the CPU check.", file=sys.stderr)
        return 2
    args.outdir.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(args.outdir, args.cpu_smoke, args.budget_s)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    res = {"meta": {"cpu_smoke": args.cpu_smoke, "device": "cpu" if args.cpu_smoke else torch.cuda.get_device_name(),
                    "torch": torch.__version__, "triton": triton_version, "python": platform.python_version(),
                    "targets": TARGETS, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
           "sections": {}}
    for name in args.sections:
        if ctx.left() < 30:
            res["sections"][name] = {"status": "skipped", "reason": "out of time"}
            continue
        t0 = time.perf_counter()
        print(f"gpu.py: {name} ...", file=sys.stderr, flush=True)
        try:
            sec = SECTIONS[name](ctx)
        except Exception as e:  # noqa: BLE001 - one failing section must not hide the others
            sec = {"status": "error", "error": f"{type(e).__name__}: {e}",
                   "tail": traceback.format_exc().splitlines()[-30:]}
        sec.setdefault("seconds", time.perf_counter() - t0)
        res["sections"][name] = sec
        print(f"gpu.py: {name} {sec['status']} in {sec['seconds']:.1f}s", file=sys.stderr, flush=True)
        (args.outdir / "gpu.json").write_text(json.dumps(res, indent=1, default=str))  # partial results survive a kill
    res["meta"]["seconds"] = time.perf_counter() - ctx.start
    (args.outdir / "gpu.json").write_text(json.dumps(res, indent=1, default=str))
    (args.outdir / "gpu.md").write_text(markdown(res))
    print(markdown(res))
    return 0 if all(s.get("status") in ("ok", "skipped") for s in res["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
