#!/usr/bin/env python3
"""The GPU evidence run for the Triton kernels: one command, one folder of results.

    python3 benchmarks/gpu.py OUTDIR               # on a machine with one CUDA GPU (~9 min on an H100/H200)
    python3 benchmarks/gpu.py --cpu-smoke OUTDIR   # every section at toy sizes on a CPU (Triton interpreter)

Needs only torch, triton and numpy (pytest for the tests, torchao where it imports): no Ray,
MLflow or DeepSpeed. Writes OUTDIR/gpu.json (every number) and OUTDIR/gpu.md (the tables), both
rewritten after every row, so a run killed at any point keeps what it measured. Sections run in
the order that saves the most per second, each timed and caught on its own:

1. ``preflight`` (~10 s): a C compiler and Python's headers (Triton builds its launcher with them),
   one trivial Triton kernel compiled and run, and whether pytest, torchao and the family's
   modules import. Each finding is a row.
2. ``product``: ladder itself on the device. `ladder run celerity_lm --local` (its first line must
   name the device), a two-trial sweep with `gpus_per_worker=1` through Ray (where Ray and MLflow
   are installed: `pip install -e .`; a row says why not otherwise), and every workload's smoke
   config for two reports on the device, and pica and palc with `autocast='bf16'`. On the CPU
   smoke the workloads train on the placement check's stand-in device
   (`orchestrator/run/placement.py`), which fails a tensor a GPU run would leave on the CPU; the
   sweep and bf16 rows are not run there (they need a GPU).
3. ``mx``: quantize / dequantize GB/s against a device-to-device copy of the same input (nvfp4's
   bytes count both of its reads of the input: the global amax, then the quantize pass);
   mx_matmul TFLOP/s against a bf16 torch.matmul on the dequantized weight, at prefill and decode
   shapes, and against torchao's emulated MX path (dequantize, then bf16 matmul) where torchao
   imports; then the OCP MX v1.0 element formats (E5M2, E3M2, E2M3, INT8) bit for bit on the GPU.
4. ``attention``: flash attention forward and forward+backward TFLOP/s against SDPA's flash
   backend, with and without the rounding-bias fix (timed interleaved), on the [B, T, H, D] view
   models hand over; and the fix's effect on the GPU: the rounding bias with and without it on
   tied-max inputs (about a second).
5. ``family``: a celerity_lm family (three widths x two seeds, bf16 autocast), its token budget
   sized from the measured time of its first steps, and the collapse check of `ladder audit
   --family`. Finished curves are kept when the time runs out.
6. ``lowprec_training``: the lowprec_attention workload's own `train` (bf16 autocast, attention
   through the emulating reference with bf16 row statistics, as the paper's code keeps them), three
   arms at one seed: the baseline, the paper's fix (beta*m / 0) and the kernels' bounded fix, the
   same steps each (sized from a timed 20-step probe so the three fit the section's time). Per
   arm: the loss curve, loss spikes, non-finite steps, weight-norm and W_Q/W_K spectral-norm
   growth, the largest attention logit, and whether it diverged (`claims.diverged`).
7. ``tests``: tests/kernels on the GPU, without the interpreter, capped at about 120 s, with the
   kernels' autotuning cut to one candidate (LADDER_KERNELS_AUTOTUNE=first); a run cut short still
   reports the tests that finished.

Every target gets a pass or fail row in the "targets" table (see TARGETS). Timings on a GPU are
`triton.testing.do_bench` medians (it clears L2 between calls and queues that work ahead of each
timed call, so the Python of a launch is not counted); on a CPU one call's wall time, only to
exercise the code.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# name: (threshold, what passes)
TARGETS = {
    "quantize_vs_copy": (0.8, "quantize GB/s >= 0.8 of a copy of the same input (nvfp4: both reads counted)"),
    "mx_matmul_vs_bf16_8192": (0.6, "mx_matmul >= 0.6 of bf16 torch.matmul at 8192^3"),
    "mx_matmul_vs_torchao_decode": (1.0, "mx_matmul faster than torchao's dequantize + bf16 matmul at decode shapes"),
    "attention_fix_vs_nofix": (0.97, "forward with the fix >= 0.97 of without (time ratio)"),
    "attention_fwd_vs_sdpa_flash": (1 / 1.3, "forward within 1.3x of SDPA's flash backend"),
    "rounding_bias_with_fix": (0.4, "|bias ratio| with the fix < 0.4 on tied-max inputs (bf16, GPU kernel)"),
    "ocp_formats_bit_exact": (1.0, "every OCP element format quantizes and dequantizes bit for bit on the device"),
}
# seconds each section may take on a GPU, in order; a section that ends early leaves its time to the next
SECTION_BUDGET = {"preflight": 20, "product": 60, "mx": 110, "attention": 90, "family": 90, "lowprec_training": 80,
                  "tests": 90}
# lowprec_training: the decoder each arm trains (GPU; the CPU smoke trains a toy one a few steps)
LOWPREC_GPU = dict(width=256, depth=4, head_dim=64, seq_len=256, batch_size=32, lr=1e-2, weight_decay=0.0,
                   max_bytes=4_000_000, eval_tokens=16384, bias_seeds=2)
LOWPREC_SMOKE = dict(width=32, depth=1, head_dim=16, seq_len=32, batch_size=8, lr=1e-2, weight_decay=0.0,
                     max_bytes=100_000, eval_tokens=256, bias_seeds=2, bias_queries=32, bias_keys=128,
                     bias_head_dim=16, log_every=2)
LOWPREC_ARMS = {"baseline": {"stable_rounding": False}, "paper_fix": {"stable_rounding": True, "stable_rule": "paper"},
                "bounded_fix": {"stable_rounding": True, "stable_rule": "bounded"}}


# -- plumbing ---------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, out: Path, smoke: bool, budget_s: float, res: dict):
        self.out = out
        self.smoke = smoke
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.res = res
        self.deadline = math.inf
        import torch

        self.torch = torch
        self.device = "cpu" if smoke else "cuda"

    def left(self) -> float:
        """Seconds left of the whole run."""
        return self.budget_s - (time.perf_counter() - self.start)

    def section_left(self) -> float:
        """Seconds left of the running section (its budget, within the run's)."""
        return min(self.deadline - time.perf_counter(), self.left())

    def save(self) -> None:
        """Rewrite gpu.json and gpu.md with everything measured so far."""
        self.res["meta"]["seconds"] = time.perf_counter() - self.start
        (self.out / "gpu.json").write_text(json.dumps(self.res, indent=1, default=str))
        (self.out / "gpu.md").write_text(markdown(self.res))

    def row(self, section: str, table: str, row: dict) -> dict:
        """Append a row to res.sections[section][table] and save both files."""
        self.res["sections"].setdefault(section, {"status": "running"}).setdefault(table, []).append(row)
        self.save()
        return row

    def judge(self, target: str, value: float | None, where: str, lower_is_better: bool = False) -> str:
        """Record a pass / fail of `target` for the measured `value`; returns the verdict."""
        thr = TARGETS[target][0]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            verdict = "not measured"
        else:
            ok = value < thr if lower_is_better else value >= thr
            verdict = "pass" if ok else "fail"
        if self.smoke and verdict != "not measured":
            verdict += " (CPU smoke: no meaning)"
        self.res["targets"].append({"target": target, "where": where, "value": value, "threshold": thr,
                                    "verdict": verdict})
        self.save()
        return verdict

    def bench(self, fn) -> float:
        """Median milliseconds of fn(): triton.testing.do_bench on a GPU, one timed call on a CPU."""
        if self.smoke:
            fn()
            t0 = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t0)
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


# -- 1. preflight -----------------------------------------------------------------------------------

def section_preflight(ctx: Ctx) -> dict:
    """The environment Triton needs, checked in seconds, each finding a row."""
    def find(name, ok, detail):
        ctx.row("preflight", "findings", {"check": name, "ok": bool(ok), "detail": str(detail)})
        return ok

    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    find("C compiler (Triton builds its launcher with it)", cc and shutil.which(cc), shutil.which(cc) if cc else
         "none of $CC, cc, gcc, clang on PATH: every Triton kernel will fail to launch")
    inc = sysconfig.get_paths().get("include", "")
    find("Python headers (Python.h)", (Path(inc) / "Python.h").is_file(), inc + "/Python.h")
    ok_all = True
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _add_one(X, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(X + offs, tl.load(X + offs, mask=offs < N) + 1.0, mask=offs < N)

        torch = ctx.torch
        x = torch.zeros(1000, device=ctx.device)
        t0 = time.perf_counter()
        _add_one[(triton.cdiv(1000, 256),)](x, 1000, BLOCK=256)
        ok = bool((x == 1.0).all().item())
        ok_all &= find("a trivial Triton kernel compiles and runs", ok,
                       f"triton {triton.__version__}, {time.perf_counter() - t0:.1f}s on a fresh cache")
    except Exception as e:  # noqa: BLE001 - the finding is the error
        ok_all &= find("a trivial Triton kernel compiles and runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
    for mod, why in (("pytest", "the tests section"), ("torchao", "the torchao comparison"), ("numpy", "the family"),
                     ("workloads.celerity_lm.workload", "the family section")):
        try:
            m = __import__(mod, fromlist=["_"])
            find(f"import {mod} ({why})", True, getattr(m, "__version__", "ok"))
        except Exception as e:  # noqa: BLE001
            find(f"import {mod} ({why})", False, f"{type(e).__name__}: {e}")
    if not ctx.smoke:
        torch = ctx.torch
        p = torch.cuda.get_device_properties(0)
        find("device", True, f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                             f"{p.total_memory / 2 ** 30:.0f} GiB")
    return {"status": "ok" if ok_all else "failed"}


# -- 3. MX ------------------------------------------------------------------------------------------

MX_FORMATS = {"mxfp4": dict(block_size=32, scale_format="e8m0"),
              "nvfp4": dict(block_size=16, scale_format="ue4m3", global_scale=True),
              # the rest of OCP MX v1.0: one code per byte (FP6 too, see kernels/mx/reference.py)
              "mxfp8_e4m3": dict(block_size=32, scale_format="e8m0", elem_format="e4m3"),
              "mxfp8_e5m2": dict(block_size=32, scale_format="e8m0", elem_format="e5m2"),
              "mxfp6_e3m2": dict(block_size=32, scale_format="e8m0", elem_format="e3m2"),
              "mxfp6_e2m3": dict(block_size=32, scale_format="e8m0", elem_format="e2m3"),
              "mxint8": dict(block_size=32, scale_format="e8m0", elem_format="int8")}
TARGET_FORMATS = ("mxfp4", "nvfp4")
"""The formats the speed targets judge (TARGETS); the others' rows are measured and reported only."""
OCP_ELEMENTS = ("e5m2", "e3m2", "e2m3", "int8", "e4m3", "e2m1")


# -- 2. the product on the device ------------------------------------------------------------------

PRODUCT_SWEEP = """
from orchestrator.sweep import Sweep, choice
sweep = Sweep(name="gpu_two_trials", workload="celerity_lm", base="smoke", workers=1, cpus_per_worker=1,
              gpus_per_worker=1, space={"lr": choice([0.01, 0.02])}, scheduler="fifo")
"""


def _ladder(ctx: Ctx, args: list[str], cwd: Path, timeout: float) -> tuple[int | None, str, float]:
    """`ladder ARGS` in a subprocess from `cwd`: (exit code or None when cut, its output, seconds)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("TRITON_INTERPRET", None)
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "orchestrator.commands.cli", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=max(5.0, timeout))
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out, time.perf_counter() - t0


def _missing(*modules: str) -> list[str]:
    import importlib.util

    return [m for m in modules if importlib.util.find_spec(m) is None]


def section_product(ctx: Ctx) -> dict:
    """ladder's own commands and every workload on the device (see the module docstring, 2.)."""
    import tempfile

    from orchestrator.run.placement import few_steps, where
    from orchestrator.runners import registry

    torch = ctx.torch
    work = ctx.out / "product"
    work.mkdir(exist_ok=True)
    failed = 0
    # `ladder run --local` (untracked: it needs neither Ray nor MLflow) says where it trains first.
    device_arg = "cpu" if ctx.smoke else "cuda"
    code, out, seconds = _ladder(ctx, ["run", "celerity_lm", "--smoke", "--local", "--no-track", "--device",
                                       device_arg, "--set", "tpp=1"], work, ctx.section_left() / 3)
    first = out.strip().splitlines()[0] if out.strip() else ""
    ok = code == 0 and first.startswith("celerity_lm: training in this process on " + device_arg)
    row = {"what": f"ladder run celerity_lm --local --device {device_arg}", "status": "pass" if ok else "fail",
           "seconds": seconds, "detail": first if ok else out.strip()[-400:]}
    failed += row["status"] == "fail"
    ctx.row("product", "commands", row)
    # A two-trial sweep, one GPU per trial, through Ray Tune and Ray Train.
    lacking = _missing("ray", "mlflow")
    if ctx.smoke:
        row = {"what": "ladder sweep (2 trials, gpus_per_worker=1)", "status": "not run",
               "detail": "needs a GPU; CPU sweeps are tested by the suite"}
    elif lacking:
        row = {"what": "ladder sweep (2 trials, gpus_per_worker=1)", "status": "not run",
               "detail": f"{', '.join(lacking)} not installed in this python (pip install -e .)"}
    else:
        (work / "gpu_sweep.py").write_text(PRODUCT_SWEEP)
        code, out, seconds = _ladder(ctx, ["sweep", "gpu_sweep.py"], work, ctx.section_left() / 2)
        row = {"what": "ladder sweep (2 trials, gpus_per_worker=1)", "status": "pass" if code == 0 else "fail",
               "seconds": seconds, "detail": out.strip()[-400:]}
    failed += row["status"] == "fail"
    ctx.row("product", "commands", row)
    # Every workload's smoke, two reports, on the device (or the stand-in under the placement check).
    device = None if ctx.smoke else torch.device("cuda")
    names = sorted(registry.WORKLOADS)
    for i, name in enumerate(names):
        if not ctx.smoke and ctx.section_left() < 3:
            ctx.row("product", "workloads", {"workload": name, "status": "not run", "detail": "out of time"})
            continue
        t0 = time.perf_counter()
        try:
            workload = registry.load(name)
            with tempfile.TemporaryDirectory(prefix=f"gpu-{name}-") as folder:
                ran = few_steps(workload.train, workload.smoke(), folder, device=device)
            if device is not None:
                torch.cuda.synchronize()
            row = {"workload": name, "status": "pass", "reports": ran["reports"], "ops_checked": ran["ops"]}
        except Exception as e:  # noqa: BLE001 - each workload is its own row
            failed += 1
            row = {"workload": name, "status": "fail", "detail": f"{type(e).__name__}: {str(e)[:300]} (at {where(e)})"}
        row["device"] = "stand-in (placement check)" if device is None else torch.cuda.get_device_name()
        row["seconds"] = time.perf_counter() - t0
        ctx.row("product", "workloads", row)
    # bf16 autocast where the papers train in it (pica, palc): two reports each on the GPU.
    for name in ("pica", "palc"):
        row = {"what": f"{name} smoke, autocast=bf16, 2 reports"}
        if ctx.smoke:
            row.update(status="not run", detail="autocast='bf16' is refused without a GPU (tested by the suite)")
        else:
            import dataclasses

            t0 = time.perf_counter()
            try:
                workload = registry.load(name)
                with tempfile.TemporaryDirectory(prefix=f"gpu-{name}-bf16-") as folder:
                    ran = few_steps(workload.train, dataclasses.replace(workload.smoke(), autocast="bf16"), folder,
                                    device=device)
                torch.cuda.synchronize()
                row.update(status="pass", detail=f"{ran['reports']} reports")
            except Exception as e:  # noqa: BLE001 - its own row
                failed += 1
                row.update(status="fail", detail=f"{type(e).__name__}: {str(e)[:300]} (at {where(e)})")
            row["seconds"] = time.perf_counter() - t0
        ctx.row("product", "commands", row)
    return {"status": "ok" if not failed else "failed", "failed": failed}


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
    t_copy = ctx.bench(lambda: copy_dst.copy_(x))
    copy_gbs = 2 * nbytes / t_copy / 1e6
    ctx.res["sections"]["mx"]["copy_GBs"] = copy_gbs
    for name, kw in MX_FORMATS.items():
        if name not in TARGET_FORMATS and ctx.section_left() < 40:
            ctx.row("mx", "quantize", {"format": name, "status": "skipped: out of time"})
            continue
        m = mx.quantize(x, impl="triton", **kw)
        out_bytes = m.codes.numel() * m.codes.element_size() + m.scales.numel() * m.scales.element_size()
        reads = 2 if kw.get("global_scale") else 1  # the global scale's amax pass reads x once more
        t_q = ctx.bench(lambda: mx.quantize(x, impl="triton", **kw))
        t_d = ctx.bench(lambda: mx.dequantize(m, impl="triton"))
        part = x[:128]
        want = ref.quantize(part.cpu(), **kw)
        got = mx.quantize(part, impl="triton", **kw)
        exact = bool(torch.equal(got.codes.cpu(), want.codes) and torch.equal(got.scales.cpu(), want.scales))
        q_gbs = (reads * nbytes + out_bytes) / t_q / 1e6
        d_gbs = (nbytes + out_bytes) / t_d / 1e6
        r = ctx.row("mx", "quantize", {"format": name, "shape": [rows, cols], "input_reads": reads, "quantize_ms": t_q,
                                       "quantize_GBs": q_gbs, "quantize_vs_copy": q_gbs / copy_gbs, "dequantize_ms": t_d,
                                       "dequantize_GBs": d_gbs, "dequantize_vs_copy": d_gbs / copy_gbs,
                                       "bit_exact_vs_reference": exact})
        if name in TARGET_FORMATS:
            r["target"] = ctx.judge("quantize_vs_copy", q_gbs / copy_gbs, f"{name} {rows}x{cols}")
    ao = _torchao_mx()
    shapes = ([("prefill", 64, 64, 64), ("decode", 4, 64, 64)] if ctx.smoke else
              [("prefill", 8192, 8192, 8192), ("decode", 16, 8192, 8192), ("decode", 1, 8192, 8192),
               ("prefill", 4096, 4096, 4096), ("decode", 16, 4096, 4096)])
    for kind, M, N, K in shapes:
        if ctx.section_left() < 25:
            ctx.row("mx", "matmul", {"kind": kind, "shape": [M, N, K], "status": "skipped: out of time"})
            continue
        a = torch.randn(M, K, device=dev, generator=g).bfloat16()
        w = torch.randn(N, K, device=dev, generator=g) * 0.02
        flops = 2 * M * N * K
        for name in MX_FORMATS:
            if name not in TARGET_FORMATS and ctx.section_left() < 25:
                ctx.row("mx", "matmul", {"kind": kind, "shape": [M, N, K], "format": name, "status": "skipped: out of time"})
                continue
            wm = mx.quantize(w, impl="triton", **MX_FORMATS[name])
            w_hat = mx.dequantize(wm, torch.bfloat16, impl="triton")
            t_ours = ctx.bench(lambda: mx.mx_matmul(a, wm, impl="triton"))
            t_bf16 = ctx.bench(lambda: torch.matmul(a, w_hat.T))
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
                        t_ao = ctx.bench(lambda: torch.matmul(a, dq(w_ao).T))
                        row.update(torchao_ms=t_ao, torchao_TFLOPs=flops / t_ao / 1e9, vs_torchao=t_ao / t_ours)
                    except Exception as e:  # noqa: BLE001
                        row["torchao"] = f"{type(e).__name__}: {e}"
            ctx.row("mx", "matmul", row)
            if kind == "prefill" and M == (64 if ctx.smoke else 8192) and name in TARGET_FORMATS:
                row["target"] = ctx.judge("mx_matmul_vs_bf16_8192", row["vs_bf16"], f"{name} {M}x{N}x{K}")
            if kind == "decode" and name == "mxfp4":
                row["target_torchao"] = ctx.judge("mx_matmul_vs_torchao_decode", row.get("vs_torchao"),
                                                  f"{name} {M}x{N}x{K}")
    # the OCP MX v1.0 element formats, quantized and dequantized on the device against the reference on the CPU
    r_, k_, n_, m_ = (16, 200, 24, 5) if ctx.smoke else (64, 1000, 96, 20)
    xs = torch.randn(r_, k_, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 3, r_)[:, None]
    xs[3, 7], xs[5, 40:72] = float("nan"), 0.0
    exact_all = True
    for elem in OCP_ELEMENTS:
        if ctx.section_left() < 8:
            ctx.row("mx", "ocp_formats", {"elem_format": elem, "status": "skipped: out of time"})
            exact_all = None
            continue
        for scale in ("e8m0", "ue4m3"):
            kw = dict(block_size=32, scale_format=scale, elem_format=elem)
            want = ref.quantize(xs, **kw)
            got = mx.quantize(xs.to(dev), impl="triton", **kw)
            same = bool(torch.equal(got.codes.cpu(), want.codes) and torch.equal(got.scales.cpu(), want.scales))
            back = mx.dequantize(got, impl="triton").cpu()
            same_dq = bool(torch.equal(back.isnan(), ref.dequantize(want).isnan()) and
                           torch.equal(back.nan_to_num(), ref.dequantize(want).nan_to_num()))
            w = (torch.randn(n_, k_, generator=torch.Generator().manual_seed(2)) * 0.05)
            wm = ref.quantize(w, **kw)
            a = torch.randn(m_, k_, generator=torch.Generator().manual_seed(3)).bfloat16()
            dev_mm = mx.mx_matmul(a.to(dev), mx.quantize(w.to(dev), impl="triton", **kw), impl="triton").cpu()
            err = _rel(dev_mm, ref.mx_matmul(a, wm))
            exact_all = exact_all and same and same_dq
            ctx.row("mx", "ocp_formats", {"elem_format": elem, "scale_format": scale, "codes_and_scales_equal": same,
                                          "dequantize_equal": same_dq, "mx_matmul_rel_err_bf16": err})
    ctx.judge("ocp_formats_bit_exact", None if exact_all is None else float(exact_all),
              f"{r_} x {k_}, NaN and zero blocks, e8m0 and ue4m3 scales")
    return {"status": "ok"}


# -- 3. attention -----------------------------------------------------------------------------------

def section_attention(ctx: Ctx) -> dict:
    torch = ctx.torch
    import torch.nn.functional as F

    from kernels.attention import reference as aref
    from kernels.attention.triton import flash_attention_triton

    dev = ctx.device
    # the fix's effect on the device first (about a second): bias ratio mean(err) / std(err) of the bf16
    # output on tied-max inputs, with and without the fix, both signs of V's mean, seeds 0-2
    sizes = dict(queries=64, keys=256, head_dim=16) if ctx.smoke else dict(queries=128, keys=1024, head_dim=64)
    worst = 0.0
    for v_mean in (-1.0, 1.0):
        for seed in range(1 if ctx.smoke else 3):
            q, k, v = aref.tied_max_inputs(seed, v_mean=v_mean, **sizes)
            truth = aref.attention_fp64(q, k, v)
            with torch.no_grad():
                base = flash_attention_triton(q.to(dev), k.to(dev), v.to(dev)).cpu()
                fixed = flash_attention_triton(q.to(dev), k.to(dev), v.to(dev), stable_rounding=True).cpu()
            r_base, r_fix = aref.error_bias(base, truth), aref.error_bias(fixed, truth)
            worst = max(worst, abs(r_fix))
            ctx.row("attention", "rounding_bias", {"v_mean": v_mean, "seed": seed, "bias_without_fix": r_base,
                                                   "bias_with_fix": r_fix, **sizes})
    ctx.judge("rounding_bias_with_fix", worst, "max |r| over the rows of rounding_bias", lower_is_better=True)

    cases = ([(1, 2, 64, 16, False), (1, 2, 64, 16, True)] if ctx.smoke else
             [(8, 16, 2048, 128, False), (8, 16, 2048, 128, True), (8, 16, 2048, 64, True), (2, 16, 8192, 128, True)])
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        flash = (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)) if not ctx.smoke else None
    except ImportError:
        flash = None
    for B, H, T, D, causal in cases:
        if ctx.section_left() < 20:
            ctx.row("attention", "cases", {"shape": [B, H, T, D], "causal": causal, "status": "skipped: out of time"})
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
        fwd, fb = {n: [] for n in impls}, {n: [] for n in impls}
        errs = {}
        with torch.no_grad():
            for name, fn in impls.items():
                errs[name] = (fn().float() - want).abs().max().item()
        # interleaved: ours and ours_fix alternate, so clock or thermal drift does not favour either
        for _ in range(1 if ctx.smoke else 3):
            for name, fn in impls.items():
                with torch.no_grad():
                    fwd[name].append(ctx.bench(fn))

                def step(fn=fn):
                    q.grad = k.grad = v.grad = None
                    fn().backward(dout)

                fb[name].append(ctx.bench(step))
        for name in impls:
            t_f, t_fb = statistics.median(fwd[name]), statistics.median(fb[name])
            row[name] = {"fwd_ms": t_f, "fwd_TFLOPs": fwd_flops / t_f / 1e9, "fwdbwd_ms": t_fb,
                         "fwdbwd_TFLOPs": 3.5 * fwd_flops / t_fb / 1e9, "max_abs_err_vs_sdpa": errs[name]}
        row["fwd_vs_sdpa"] = row["sdpa_flash"]["fwd_ms"] / row["ours"]["fwd_ms"]
        row["fwdbwd_vs_sdpa"] = row["sdpa_flash"]["fwdbwd_ms"] / row["ours"]["fwdbwd_ms"]
        row["fix_vs_nofix_fwd"] = row["ours"]["fwd_ms"] / row["ours_fix"]["fwd_ms"]
        row["fix_vs_nofix_fwdbwd"] = row["ours"]["fwdbwd_ms"] / row["ours_fix"]["fwdbwd_ms"]
        ctx.row("attention", "cases", row)
        where = f"B={B} H={H} T={T} D={D} causal={causal}"
        row["target_fix"] = ctx.judge("attention_fix_vs_nofix", row["fix_vs_nofix_fwd"], where)
        row["target_sdpa"] = ctx.judge("attention_fwd_vs_sdpa_flash", row["fwd_vs_sdpa"], where)
    return {"status": "ok"}


# -- 4. a celerity_lm family and its collapse check --------------------------------------------------

def _spreads(curves, groups, after):
    """`orchestrator.sweeps.plots.family_spreads` when it imports here; the same few lines otherwise."""
    try:
        from orchestrator.sweeps.plots import family_spreads

        return family_spreads(curves, groups, after=after)
    except ImportError:
        import numpy as np
        from collections import defaultdict

        from orchestrator.sweeps.collapse import normalize

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

    from components.lm.corpus import BatchSampler, heldout_batches, load_data
    from workloads.celerity_lm.workload import Config, build, evaluate, lr_factor

    if ctx.smoke:
        widths, base = (16, 32, 48), Config(depth=1, head_dim=16, seq_len=32, batch_size=8, tpp=2.0, base_width=16,
                                            base_depth=1, max_bytes=300_000, eval_tokens=1024)
    else:
        widths, base = (96, 192, 384), Config(depth=3, head_dim=32, seq_len=256, batch_size=64, tpp=20.0,
                                              base_width=96, base_depth=3, max_bytes=60_000_000, eval_tokens=65536)
    seeds, after, evals = (0, 1), 0.2, 20
    dev = torch.device(ctx.device)
    train_bytes, held_bytes = load_data(base.data, heldout_frac=base.heldout_frac, max_bytes=base.max_bytes)
    heldout = heldout_batches(held_bytes, base.seq_len, base.eval_tokens, batch=32)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if not ctx.smoke else torch.autocast("cpu", enabled=False))

    def steps_of(cfg, n, sampler, model, opt, peaks, plan, start=1):
        for step in range(start, start + n):
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

    # size the token budget from measured steps: 3 warm-up + 5 timed steps per width, then
    # tpp = base tpp * (time left for the runs) / (time the runs would take at base tpp), clamped to [2, base]
    step_s, base_steps = {}, {}
    for width in widths:
        cfg = dataclasses.replace(base, width=width, seed=0)
        torch.manual_seed(0)
        model, opt, plan = build(cfg)
        model.to(dev)
        sampler = BatchSampler(train_bytes, cfg.seq_len, cfg.batch_size, seed=0, rank=0)
        peaks = [grp["lr"] for grp in opt.param_groups]
        steps_of(cfg, 3, sampler, model, opt, peaks, plan)
        if not ctx.smoke:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        steps_of(cfg, 5, sampler, model, opt, peaks, plan, start=4)
        if not ctx.smoke:
            torch.cuda.synchronize()
        step_s[width], base_steps[width] = (time.perf_counter() - t0) / 5, plan.steps
        del model, opt
    evals_s = 1.0 if not ctx.smoke else 0.0  # allowance for each run's 20 held-out evaluations
    at_base = sum(len(seeds) * (base_steps[w] * step_s[w] + evals_s) for w in widths)
    room = max(1.0, ctx.section_left() - 10)
    tpp = base.tpp if ctx.smoke else max(2.0, min(base.tpp, base.tpp * room / at_base))
    base = dataclasses.replace(base, tpp=tpp)
    ctx.res["sections"]["family"]["sizing"] = {"step_seconds": step_s, "steps_at_base_tpp": base_steps,
                                               "estimated_seconds_at_base_tpp": at_base, "room_seconds": room,
                                               "tpp": tpp}
    ctx.save()

    curves, groups = {}, {}
    complete = True
    for width in widths:
        for seed in seeds:
            cfg = dataclasses.replace(base, width=width, seed=seed)
            torch.manual_seed(seed)
            model, opt, plan = build(cfg)
            model.to(dev)
            peaks = [grp["lr"] for grp in opt.param_groups]
            sampler = BatchSampler(train_bytes, cfg.seq_len, cfg.batch_size, seed=seed, rank=0)
            marks = sorted({max(1, round(plan.steps * i / evals)) for i in range(1, evals + 1)})
            prog, loss = [], []
            t0 = time.perf_counter()
            done = 0
            for mark in marks:
                if not ctx.smoke and ctx.section_left() < 3:
                    break
                steps_of(cfg, mark - done, sampler, model, opt, peaks, plan, start=done + 1)
                done = mark
                with autocast:
                    loss.append(evaluate(model, heldout, dev))
                prog.append(mark / plan.steps)
            tid = f"w{width}-s{seed}"
            finished = done == plan.steps
            complete &= finished
            if prog:
                curves[tid], groups[tid] = (prog, loss), width
            ctx.row("family", "runs", {"trial": tid, "width": width, "seed": seed, "params": plan.params,
                                       "steps": plan.steps, "steps_done": done, "tokens": plan.tokens,
                                       "final_eval_loss": loss[-1] if loss else None, "finished": finished,
                                       "seconds": time.perf_counter() - t0, "progress": prog, "eval_loss": loss})
            if not finished:
                break
        if not complete:
            break
    out = {"status": "ok" if complete else "partial", "widths": list(widths), "seeds": list(seeds), "after": after,
           "tpp": tpp, "precision": "fp32" if ctx.smoke else "bf16 autocast"}
    full = {t: c for t, c in curves.items() if c[0] and c[0][-1] == 1.0}
    by_width = {}
    for t in full:
        by_width.setdefault(groups[t], []).append(t)
    usable = [t for w, ts in by_width.items() if len(ts) == len(seeds) for t in ts]
    if len({groups[t] for t in usable}) >= 2:
        import numpy as np

        t, width_range, seed_range = _spreads({k: full[k] for k in usable}, {k: groups[k] for k in usable}, after)
        w, s = float(np.max(width_range)), float(np.max(seed_range))
        out.update(width_spread=w, seed_spread=s, collapses=w <= s, widths_judged=sorted({groups[t] for t in usable}),
                   spreads_at={f"{x:g}": {"width": float(np.interp(x, t, width_range)),
                                          "seed": float(np.interp(x, t, seed_range))} for x in (0.2, 0.4, 0.6, 0.8, 1.0)})
    else:
        out["collapse_check"] = "not judged: fewer than two widths finished every seed"
    return out


# -- 5. low-precision training: baseline against the fix ---------------------------------------------

class _OutOfTime(Exception):
    pass


class _BudgetRun:
    """The workload `Run` protocol, in process: keeps every report and stops the run (by raising
    from `report`) once `deadline` has passed, so a slow arm leaves its curve so far."""

    rank, world_size = 0, 1

    def __init__(self, device, deadline: float):
        self.device, self.deadline, self.reports = device, deadline, []

    def report(self, metrics: dict, *, step: int) -> None:
        self.reports.append((step, dict(metrics)))
        if time.perf_counter() > self.deadline:
            raise _OutOfTime(step)

    def save(self, state: dict) -> None:
        pass

    def restore(self):
        return None

    def prepare(self, model, optimizer):
        return model.to(self.device), optimizer

    def log_artifact(self, path) -> None:
        pass


def section_lowprec_training(ctx: Ctx) -> dict:
    torch = ctx.torch
    import dataclasses

    from workloads.lowprec_attention.claims import diverged
    from workloads.lowprec_attention.workload import Config, train

    dev = torch.device(ctx.device)
    # impl="reference": the bf16 row statistics the paper's code keeps (the Triton kernel keeps fp32)
    base = Config(impl="reference", precision="paper", dtype="bf16", warmup_frac=0.02,
                  **{"log_every": 10, **(LOWPREC_SMOKE if ctx.smoke else LOWPREC_GPU)})

    def arm(name: str, steps: int, deadline: float) -> tuple[dict | None, _BudgetRun, float]:
        cfg = dataclasses.replace(base, steps=steps, eval_every=max(1, steps // 4), checkpoint_every=steps,
                                  **LOWPREC_ARMS[name])
        run = _BudgetRun(dev, deadline)
        torch.manual_seed(0)
        t0 = time.perf_counter()
        try:
            final = train(cfg, run)
        except _OutOfTime:
            final = None
        if not ctx.smoke:
            torch.cuda.synchronize()
        return final, run, time.perf_counter() - t0

    # size: a timed 20-step probe of the baseline, then every arm the same steps, all three fitting
    # (the CPU smoke trains a fixed 6 steps: each train() call lists the corpus, ~1 s on a CPU)
    probe_steps = 20 if not ctx.smoke else 0
    probe_s = arm("baseline", probe_steps, math.inf)[2] if probe_steps else math.nan
    step_s = probe_s / probe_steps if probe_steps else math.nan  # an upper bound: bias statistic and data load included
    room = max(1.0, ctx.section_left() - 5)
    steps = 6 if ctx.smoke else int(max(50, min(5000, room / len(LOWPREC_ARMS) / step_s)))
    sizing = {"probe_steps": probe_steps, "probe_seconds": probe_s, "step_seconds_upper": step_s,
              "room_seconds": room, "steps": steps, "config": dataclasses.asdict(base)}
    ctx.res["sections"]["lowprec_training"]["sizing"] = sizing
    ctx.save()
    complete = True
    for i, name in enumerate(LOWPREC_ARMS):
        # each arm's share of what is left, so a slow arm cannot starve the next
        share = ctx.section_left() / (len(LOWPREC_ARMS) - i)
        final, run, seconds = arm(name, steps, time.perf_counter() + share if not ctx.smoke else math.inf)
        curve = [(step, m["train/loss"]) for step, m in run.reports if "train/loss" in m]
        row = {"arm": name, **LOWPREC_ARMS[name], "steps": steps, "steps_done": run.reports[-1][0] if run.reports else 0,
               "finished": final is not None, "seconds": seconds, "curve_steps": [c[0] for c in curve],
               "curve_train_loss": [c[1] for c in curve]}
        if final is not None:
            row.update({k.replace("/", "_"): v for k, v in final.items() if not k.startswith("eval/bias_r/")})
            row["diverged"] = diverged(final)
        complete &= final is not None
        ctx.row("lowprec_training", "arms", row)
    return {"status": "ok" if complete else "partial", "steps": steps}


# -- 7. kernel tests --------------------------------------------------------------------------------

def section_tests(ctx: Ctx) -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError as e:
        return {"status": "skipped", "reason": f"pytest does not import in this python ({e}): pip install pytest"}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # "0" on a GPU: the test modules only set TRITON_INTERPRET when it is unset
    env["TRITON_INTERPRET"] = "1" if ctx.smoke else "0"
    if not ctx.smoke:
        env["LADDER_KERNELS_AUTOTUNE"] = "first"  # results, not speed: one autotune candidate per kernel
    log = ctx.out / "kernel_tests.log"
    # --confcutdir: tests/conftest.py imports the orchestrator (Ray, MLflow); the kernel tests need none of it
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
           "--confcutdir", str(REPO / "tests" / "kernels"), "--junitxml", str(ctx.out / "kernel_tests.xml")]
    # On a CPU, a few only (the whole folder is `make test`'s business there), the 2^31 fixture among them
    cmd += (["tests/kernels/test_mx_triton.py", "-k", "(bit_exact and e8m0-False-e2m1) or offsets_past or int8-32"]
            if ctx.smoke else ["tests/kernels"])
    cap = max(20.0, min(120.0, ctx.left() - 5))
    t0 = time.perf_counter()
    timed_out = False
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, 9)
            proc.wait()
    lines = log.read_text(errors="replace").splitlines()
    counts = {}
    failed = []
    for line in lines:
        if "::" in line and line.startswith("tests/"):
            for word in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"):
                if f" {word}" in line:
                    counts[word.lower()] = counts.get(word.lower(), 0) + 1
                    if word in ("FAILED", "ERROR"):
                        failed.append(line.split(" ")[0])
                    break
    summary = next((x for x in reversed(lines) if " passed" in x or " failed" in x or " error" in x), "")
    status = "timed out" if timed_out else ("ok" if proc.returncode == 0 else "failed")
    return {"status": status, "returncode": None if timed_out else proc.returncode, "cap_seconds": cap,
            "summary": summary or f"cut at {cap:.0f}s: {counts}", "counts": counts, "failed": failed[:40],
            "seconds": time.perf_counter() - t0, "tail": lines[-60:] if (timed_out or proc.returncode) else lines[-5:]}


# -- report -----------------------------------------------------------------------------------------

def _fmt(v, spec=".3g"):
    return "" if v is None else (format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v))


def markdown(res: dict) -> str:
    m = res["meta"]
    out = [f"# GPU evidence run ({'CPU smoke, toy sizes: no speed meaning' if m['cpu_smoke'] else m['device']})", "",
           f"torch {m['torch']}, triton {m['triton']}, python {m['python']}, {m.get('seconds', 0):.3g} s so far.", "",
           "| section | status | seconds |", "|---|---|---|"]
    for name, sec in res["sections"].items():
        out.append(f"| {name} | {sec.get('status')} | {_fmt(sec.get('seconds'), '.1f')} |")
    if res["targets"]:
        out += ["", "## targets", "", "| target | where | value | threshold | verdict |", "|---|---|---|---|---|"]
        for t in res["targets"]:
            out.append(f"| {t['target']} | {t['where']} | {_fmt(t['value'])} | {_fmt(t['threshold'])} | {t['verdict']} |")
    pre = res["sections"].get("preflight", {})
    if pre.get("findings"):
        out += ["", "## preflight", "", "| check | ok | detail |", "|---|---|---|"]
        out += [f"| {f['check']} | {f['ok']} | {f['detail']} |" for f in pre["findings"]]
    prod = res["sections"].get("product", {})
    if prod.get("commands") or prod.get("workloads"):
        out += ["", "## ladder on the device", "", "| what | status | seconds | detail |", "|---|---|---|---|"]
        out += [f"| {r['what']} | {r['status']} | {_fmt(r.get('seconds'), '.1f')} | {str(r.get('detail', ''))[-160:]} |"
                for r in prod.get("commands", [])]
        out += [f"| {r['workload']} smoke, 2 reports | {r['status']} | {_fmt(r.get('seconds'), '.1f')} | "
                f"{r.get('device', '')} {r.get('detail', '')} |" for r in prod.get("workloads", [])]
    mxs = res["sections"].get("mx", {})
    if mxs.get("quantize"):
        out += ["", f"## MX quantize (copy: {mxs.get('copy_GBs', 0):.3g} GB/s)", "",
                "| format | shape | reads of x | quantize GB/s | x copy | dequantize GB/s | x copy | bit-exact |",
                "|---|---|---|---|---|---|---|---|"]
        for r in mxs["quantize"]:
            if "quantize_GBs" not in r:
                out.append(f"| {r['format']} | | | {r.get('status')} | | | | |")
                continue
            out.append(f"| {r['format']} | {r['shape']} | {r['input_reads']} | {r['quantize_GBs']:.3g} | "
                       f"{r['quantize_vs_copy']:.2f} | {r['dequantize_GBs']:.3g} | {r['dequantize_vs_copy']:.2f} | "
                       f"{r['bit_exact_vs_reference']} |")
    if mxs.get("matmul"):
        out += ["", "## mx_matmul", "", "| kind | M, N, K | format | ours TFLOP/s | bf16 TFLOP/s | x bf16 | torchao TFLOP/s | "
                "x torchao | rel. err |", "|---|---|---|---|---|---|---|---|---|"]
        for r in mxs["matmul"]:
            if "ours_ms" not in r:
                out.append(f"| {r.get('kind')} | {r['shape']} | | {r.get('status')} | | | | | |")
                continue
            out.append(f"| {r['kind']} | {r['shape']} | {r['format']} | {r['ours_TFLOPs']:.3g} | {r['bf16_TFLOPs']:.3g} | "
                       f"{r['vs_bf16']:.2f} | {_fmt(r.get('torchao_TFLOPs')) or str(r.get('torchao', ''))[:40]} | "
                       f"{_fmt(r.get('vs_torchao'), '.2f')} | {r['rel_err_vs_bf16_on_dequantized']:.1e} |")
    if mxs.get("ocp_formats"):
        out += ["", "## OCP MX element formats on the device", "",
                "| element | scale | codes and scales equal | dequantize equal | mx_matmul rel. err (bf16) |",
                "|---|---|---|---|---|"]
        for r in mxs["ocp_formats"]:
            out.append(f"| {r['elem_format']} | {r.get('scale_format', '')} | {r.get('codes_and_scales_equal', r.get('status'))} | "
                       f"{r.get('dequantize_equal', '')} | {_fmt(r.get('mx_matmul_rel_err_bf16'), '.1e')} |")
    at = res["sections"].get("attention", {})
    if at.get("rounding_bias"):
        out += ["", "## rounding bias on tied-max inputs (bf16, mean(err) / std(err))", "",
                "| V mean | seed | without fix | with fix |", "|---|---|---|---|"]
        out += [f"| {r['v_mean']:+g} | {r['seed']} | {r['bias_without_fix']:+.3f} | {r['bias_with_fix']:+.3f} |"
                for r in at["rounding_bias"]]
    if at.get("cases"):
        out += ["", "## flash attention", "",
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
        if "collapses" in fam:
            verdict = "collapses" if fam["collapses"] else "does NOT collapse"
            head = (f"{verdict} (width spread after {fam['after']:.0%}: {fam['width_spread']:.4f}; "
                    f"seed spread: {fam['seed_spread']:.4f})")
        else:
            head = fam.get("collapse_check", "running")
        out += ["", f"## celerity_lm family ({fam.get('precision', '')}, {_fmt(fam.get('tpp'), '.3g')} tokens per "
                    f"parameter): {head}", "", "| run | params | steps done / planned | final eval loss | seconds |",
                "|---|---|---|---|---|"]
        for r in fam["runs"]:
            out.append(f"| {r['trial']} | {r['params']} | {r['steps_done']} / {r['steps']} | "
                       f"{_fmt(r['final_eval_loss'], '.4f')} | {r['seconds']:.1f} |")
    lp = res["sections"].get("lowprec_training", {})
    if lp.get("arms"):
        cfg = lp.get("sizing", {}).get("config", {})
        out += ["", f"## low-precision training: baseline against the fix (bf16, bf16 row statistics, reference "
                    f"attention; width {cfg.get('width')}, depth {cfg.get('depth')}, T {cfg.get('seq_len')}, "
                    f"lr {cfg.get('lr')})", "",
                "| arm | steps done / planned | final train loss | lowest logged loss | eval loss | non-finite steps | "
                "spikes | max loss / running min | weight norm x | W_Q,W_K spectral x | max attention logit | "
                "diverged | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in lp["arms"]:
            out.append(f"| {r['arm']} | {r['steps_done']} / {r['steps']} | {_fmt(r.get('train_loss'), '.4f')} | "
                       f"{_fmt(r.get('train_loss_min'), '.4f')} | {_fmt(r.get('eval_loss'), '.4f')} | "
                       f"{_fmt(r.get('train_nonfinite_steps'))} | {_fmt(r.get('train_loss_spikes'))} | "
                       f"{_fmt(r.get('train_loss_jump'))} | {_fmt(r.get('train_weight_norm_growth'))} | "
                       f"{_fmt(r.get('train_qk_spectral_growth'))} | {_fmt(r.get('train_attn_logit_max'))} | "
                       f"{r.get('diverged', 'unfinished')} | {r['seconds']:.1f} |")
    t = res["sections"].get("tests", {})
    if t.get("summary"):
        out += ["", f"## kernel tests\n\n`{t['summary']}`"]
        if t.get("failed"):
            out += ["", "failed or errored:", ""] + [f"- `{x}`" for x in t["failed"]]
    for name, sec in res["sections"].items():
        if sec.get("status") in ("error", "failed", "timed out") and sec.get("tail"):
            out += ["", f"## {name}: {sec['status']}", "", "```", *sec["tail"][-30:], "```"]
    return "\n".join(out) + "\n"


SECTIONS = {"preflight": section_preflight, "product": section_product, "mx": section_mx, "attention": section_attention,
            "family": section_family, "lowprec_training": section_lowprec_training, "tests": section_tests}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path, help="folder for gpu.json, gpu.md and the tests' junit XML and log")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU, kernels under the Triton interpreter")
    ap.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    ap.add_argument("--budget-s", type=float, default=540.0, help="the whole run's seconds; sections share them "
                    "by SECTION_BUDGET, and one that ends early leaves its time to the next")
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
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    res = {"meta": {"cpu_smoke": args.cpu_smoke, "device": "cpu" if args.cpu_smoke else torch.cuda.get_device_name(),
                    "torch": torch.__version__, "triton": triton_version, "python": platform.python_version(),
                    "targets": {k: v[1] for k, v in TARGETS.items()},
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
           "sections": {}, "targets": []}
    ctx = Ctx(args.outdir, args.cpu_smoke, args.budget_s, res)
    order = [s for s in SECTIONS if s in args.sections]
    for i, name in enumerate(order):
        later = sum(SECTION_BUDGET[s] for s in order[i + 1:])
        own = ctx.left() - later if not args.cpu_smoke else math.inf
        if not args.cpu_smoke and own < 10:
            res["sections"][name] = {"status": "skipped", "reason": f"out of time ({ctx.left():.0f}s left)"}
            ctx.save()
            continue
        # its budget, plus what earlier sections left unused (never less than 10 s)
        ctx.deadline = time.perf_counter() + max(10.0, min(own, ctx.left()))
        t0 = time.perf_counter()
        print(f"gpu.py: {name} ...", file=sys.stderr, flush=True)
        res["sections"][name] = {"status": "running"}
        try:
            sec = SECTIONS[name](ctx)
        except Exception as e:  # noqa: BLE001 - one failing section must not hide the others
            sec = {"status": "error", "error": f"{type(e).__name__}: {e}",
                   "tail": traceback.format_exc().splitlines()[-30:]}
        res["sections"][name].update(sec)
        res["sections"][name].setdefault("seconds", time.perf_counter() - t0)
        res["sections"][name]["seconds"] = time.perf_counter() - t0
        print(f"gpu.py: {name} {res['sections'][name]['status']} in {res['sections'][name]['seconds']:.1f}s",
              file=sys.stderr, flush=True)
        ctx.save()
    ctx.save()
    print(markdown(res))
    ok = ("ok", "skipped", "partial")
    return 0 if all(s.get("status") in ok for s in res["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
