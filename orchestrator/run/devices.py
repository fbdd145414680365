"""Which device a run trains on, chosen once, said out loud and recorded.

`ladder run --local` trains on CUDA when this machine has it (`--device` chooses), a Ray Train
run on the GPUs Ray gives its workers (`--gpus-per-worker`), and every run records where it
trained on its MLflow run (`ladder.device`, and `ladder.device_name` for a GPU).
"""

from __future__ import annotations

from typing import Any

CHOICES = "auto, cpu, cuda or cuda:N"


class DeviceError(ValueError):
    """A device was asked for that this machine cannot give (or that is not a device)."""


def cuda_count() -> int:
    """CUDA devices torch sees here (0 without a usable CUDA runtime)."""
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver is no GPU
        return 0


def resolve(requested: str | None = None) -> Any:
    """The `torch.device` for `requested`: None or "auto" is the first CUDA device when there is
    one, else the CPU; "cpu"; "cuda" or "cuda:N", refused where torch sees no such GPU."""
    import torch

    text = (requested or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda", 0) if cuda_count() else torch.device("cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise DeviceError(f"--device {requested!r} is not a device: use {CHOICES}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise DeviceError(f"--device {requested!r}: ladder runs on the CPU or on CUDA GPUs; use {CHOICES}")
    count = cuda_count()
    if not count:
        raise DeviceError(f"--device {requested} asks for a GPU, but torch sees no CUDA device on this machine "
                          f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}): drop --device to "
                          "train on the CPU, or run where a GPU is (docs/cluster.md)")
    index = 0 if device.index is None else device.index
    if index >= count:
        raise DeviceError(f"--device {requested}: this machine has {count} CUDA device{'s' if count != 1 else ''} "
                          f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
    return torch.device("cuda", index)


def name(device: Any) -> str:
    """The GPU's name for a CUDA device, "" for the CPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return ""
    try:
        return torch.cuda.get_device_name(device)
    except Exception:
        return ""


def describe(device: Any) -> str:
    """`cuda:0 (NVIDIA H100 80GB HBM3)`, or `cpu`."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({name(device) or 'GPU'})"
    return str(device)


def tags(device: Any) -> dict[str, str]:
    """The MLflow tags that say where a run trained."""
    import torch

    device = torch.device(device)
    out = {"ladder.device": str(device) if device.type != "cpu" else "cpu"}
    if device.type == "cuda":
        out["ladder.device_name"] = name(device) or "GPU"
    return out


def synchronize(device: Any) -> None:
    """Wait for the device's queued work (CUDA runs ops asynchronously): call before reading a
    clock that times GPU work. Nothing to wait for on the CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: Any) -> float:
    """time.perf_counter() after the device's queued work is done (`synchronize`): the clock a
    workload reads to time GPU work."""
    import time

    synchronize(device)
    return time.perf_counter()


AUTOCAST = ("fp32", "bf16")
"""A workload's `autocast` Config field: 'fp32' trains in fp32; 'bf16' runs the forward passes under
CUDA autocast to bfloat16, where the paper trains in bf16 (on a GPU only)."""


def check_autocast(cfg: Any, *, gpu: bool) -> None:
    """Refuse (ValueError) an `autocast` Config field that is not one of AUTOCAST, or 'bf16' for a run
    without a GPU: CPU autocast is slow or missing there, and not the paper's setting."""
    _check_autocast(getattr(cfg, "autocast", "fp32"), gpu)


def _check_autocast(value: str, gpu: bool) -> None:
    if value not in AUTOCAST:
        raise ValueError(f"autocast must be one of {', '.join(map(repr, AUTOCAST))}, got {value!r}")
    if value == "bf16" and not gpu:
        raise ValueError("autocast='bf16' trains under CUDA autocast, as the paper does, and this run has no GPU: "
                         "set autocast=fp32, or run on a GPU (--device cuda with --local, --gpus-per-worker 1, "
                         "gpus_per_worker in a sweep)")


def autocast(device: Any, precision: str = "fp32") -> Any:
    """The context a workload runs its forward passes in: nothing for 'fp32', CUDA autocast to
    bfloat16 for 'bf16' (refused off a GPU, `check_autocast`)."""
    import contextlib

    import torch

    device = torch.device(device)
    if precision == "fp32":
        return contextlib.nullcontext()
    _check_autocast(precision, device.type == "cuda")
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
