"""Training memory per method, measured on the tensors a step holds (the mechanism the paper's peak
GPU memory reflects, free of a CPU process's resident-size noise).

A step's peak is counted as what must coexist at its worst moment, summed from tensor sizes:

- the parameters (every one: base and adapter);
- the gradients held when the optimizer steps (first-order methods: the trainable parameters');
- the optimizer state (Adam's two moments, and its step counters, of the trainable parameters);
- the activations saved for backward by the first-order forward (recorded by
  `torch.autograd.graph.saved_tensors_hooks`, each storage once, parameters excluded);
- the zeroth-order noise: z is regenerated one parameter at a time, so one tensor the size of the
  largest perturbed parameter.

Left out, in every method alike: the forward pass's transient buffers (a no-grad forward frees each
layer's output as it goes), the evaluation passes, and the allocator's slack. On a GPU the runner's
device also reports torch's own allocator peak (`torch.cuda.max_memory_allocated`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the given tensors' elements (None skipped)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def grad_bytes(params: Iterable[torch.Tensor]) -> int:
    """Bytes of the gradients the parameters hold now."""
    return tensor_bytes(p.grad for p in params)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of every tensor in the optimizer's state (Adam: exp_avg, exp_avg_sq, step)."""
    if optimizer is None:
        return 0
    return sum(tensor_bytes(v for v in state.values() if isinstance(v, torch.Tensor)) for state in optimizer.state.values())


class SavedActivations:
    """Bytes of the tensors autograd saves for backward while active, each storage counted once and
    the parameters' own storages excluded (they are counted as parameters)."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.exclude = {p.untyped_storage().data_ptr() for p in params}
        self.storages: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.exclude and ptr != 0:
            self.storages[ptr] = max(self.storages.get(ptr, 0), storage.nbytes())
        return t

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    @contextmanager
    def recording(self) -> Iterator["SavedActivations"]:
        self.storages = {}
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self


def zo_noise_bytes(params: Iterable[torch.Tensor]) -> int:
    """One z at a time: the largest perturbed parameter's bytes (0 without zeroth-order parameters)."""
    return max((p.numel() * p.element_size() for p in params), default=0)


def peak(parts: dict[str, int]) -> int:
    """A step's counted peak: the sum of its parts (they coexist at the optimizer step)."""
    return sum(parts.values())


def merge_max(into: dict[str, float], parts: dict[str, int]) -> dict[str, float]:
    """Keep, part by part and for the total, the largest value over steps."""
    for key, value in {**parts, "total": peak(parts)}.items():
        into[key] = max(into.get(key, 0.0), float(value))
    return into


def cuda_peak_bytes(device: Any) -> float | None:
    """torch's allocator peak on a CUDA device (None elsewhere)."""
    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        return None
    return float(torch.cuda.max_memory_allocated(device))
