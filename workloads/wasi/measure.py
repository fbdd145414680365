"""Measured, not estimated: the bytes autograd keeps for the backward pass and the flops of a step.

Saved bytes come from `torch.autograd.graph.saved_tensors_hooks`: the pack hook sees every tensor
an op saves for its backward. A tensor is charged the bytes of its whole storage (a view keeps
its base alive), and each storage is counted once however many ops save it or views of it. A
saved tensor is in the `linear` scope when it is saved while a `Dense` layer's forward runs (the
layers WASI replaces, plus the patch embedding and head, dense in both variants), and is a
`weight` when its storage is a parameter's or a WASI layer's weight factor (L, R), an
`activation` otherwise.

Flops come from `torch.utils.flop_counter.FlopCounterMode` (matmuls, bmm, einsum: 2 m n p per
product), with a formula for `linalg_qr`, which it does not count. Elementwise ops, softmax,
layer norm and the optimizer update are not counted, for either variant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from workloads.wasi.lowrank import qr_flops


@dataclass
class SavedBytes:
    """Distinct storages saved for backward, in bytes, by scope and kind."""

    linear_activation: int = 0
    linear_weight: int = 0
    other_activation: int = 0
    other_weight: int = 0
    tensors: int = 0
    by_layer: dict[str, int] = field(default_factory=dict)

    @property
    def linear(self) -> int:
        """The linear layers' saved activations plus weights: the paper's memory accounting."""
        return self.linear_activation + self.linear_weight

    @property
    def total(self) -> int:
        """Everything the step's backward keeps (attention, norms, GELU included)."""
        return self.linear + self.other_activation + self.other_weight


class SavedTensorMeter:
    """Context manager: records every tensor saved for backward while active, by storage."""

    def __init__(self, model: nn.Module, scope_type: type[nn.Module]) -> None:
        self.model = model
        self.scope_type = scope_type
        self._stack: list[str] = []
        self._seen: dict[int, dict[str, Any]] = {}
        self._handles: list[Any] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._weights: set[int] = set()
        self._alive: list[torch.Tensor] = []  # held so that no recorded storage is freed and its address reused
        self.saved_count = 0

    def _weight_ptrs(self) -> set[int]:
        ptrs = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        for m in self.model.modules():
            for name in ("left", "right"):
                buf = getattr(m, name, None)
                if isinstance(buf, torch.Tensor) and buf.numel():
                    ptrs.add(buf.untyped_storage().data_ptr())
        return ptrs

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.saved_count += 1
        self._alive.append(t)
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0:
            return t
        rec = self._seen.setdefault(ptr, {"bytes": nbytes, "layers": []})
        rec["bytes"] = max(rec["bytes"], nbytes)
        if self._stack:
            rec["layers"].append(self._stack[-1])
        return t

    def _enter_layer(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self._stack.append(name)
        return hook

    def _leave_layer(self, module: nn.Module, args: Any, output: Any) -> None:
        self._stack.pop()  # returns None: a forward hook's return value would replace the output

    def __enter__(self) -> SavedTensorMeter:
        self._weights = self._weight_ptrs()
        for name, module in self.model.named_modules():
            if isinstance(module, self.scope_type):
                self._handles.append(module.register_forward_pre_hook(self._enter_layer(name)))
                self._handles.append(module.register_forward_hook(self._leave_layer))
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._weights |= self._weight_ptrs()
        self._alive.clear()

    def result(self) -> SavedBytes:
        out = SavedBytes(tensors=self.saved_count)
        weights = self._weights
        for ptr, rec in self._seen.items():
            kind = "weight" if ptr in weights else "activation"
            scope = "linear" if rec["layers"] else "other"
            setattr(out, f"{scope}_{kind}", getattr(out, f"{scope}_{kind}") + rec["bytes"])
            if rec["layers"]:  # charged to the first layer that saved it
                out.by_layer[rec["layers"][0]] = out.by_layer.get(rec["layers"][0], 0) + rec["bytes"]
        return out


def _qr_formula(a_shape, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    m, k = a_shape[-2], a_shape[-1]
    batch = 1
    for s in a_shape[:-2]:
        batch *= s
    return batch * qr_flops(m, k)


def count_flops(fn: Callable[[], Any]) -> tuple[int, Any]:
    """(flops of everything fn runs, fn's result), QR included."""
    with FlopCounterMode(display=False, custom_mapping={torch.ops.aten.linalg_qr: _qr_formula}) as counter:
        result = fn()
    return int(counter.get_total_flops()), result
