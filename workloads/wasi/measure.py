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

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from workloads.wasi.lowrank import qr_flops
from workloads.wasi.model import WASILinear, wasi_layers


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


def measure_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Saved bytes and flops of one fine-tuning step on a copy of the model (the run is untouched).

    Flops: forward (with WASI's Tucker power steps), backward, and WASI's subspace-iteration
    refresh, each counted by FlopCounterMode; saved bytes: everything autograd keeps between
    that forward and backward."""
    model = copy.deepcopy(model)
    model.train()
    meter = SavedTensorMeter(model, scope_type=torch.nn.Linear)
    with meter:
        fwd, loss = count_flops(lambda: F.cross_entropy(model(x), y))
    bwd, _ = count_flops(loss.backward)
    refresh, _ = count_flops(lambda: [layer.refresh() for layer in wasi_layers(model)])
    saved = meter.result()
    return {
        "perf/saved_linear_bytes": float(saved.linear),
        "perf/saved_linear_act_bytes": float(saved.linear_activation),
        "perf/saved_linear_weight_bytes": float(saved.linear_weight),
        "perf/saved_total_bytes": float(saved.total),
        "perf/saved_total_act_bytes": float(saved.linear_activation + saved.other_activation),
        "perf/flops_forward": float(fwd),
        "perf/flops_backward": float(bwd),
        "perf/flops_refresh": float(refresh),
        "perf/flops_step": float(fwd + bwd + refresh),
    }


def probe_ranks(model: nn.Module, x: torch.Tensor, y: torch.Tensor, thresholds: tuple[float, ...],
                act_ranks: tuple[int, int, int], act_scales: tuple[float, ...]) -> dict[str, float]:
    """Saved bytes and flops of one step at other weight thresholds and activation ranks, measured
    on copies of the trained WASI model (nothing is trained at these ranks)."""
    out: dict[str, float] = {}
    variants = [(f"eps={t:g}", t, 1.0) for t in thresholds]
    variants += [(f"act={a:g}", None, a) for a in act_scales]
    for label, threshold, scale in variants:
        probe = copy.deepcopy(model)
        layers = wasi_layers(probe)
        ranks = tuple(0 if r == 0 else max(1, round(r * scale)) for r in act_ranks)
        for layer in layers:
            if threshold is not None:
                layer.init_subspace(threshold)
            layer.act_ranks, layer.act_factors = ranks, None
        with torch.enable_grad():
            probe(x)  # warm-starts the activation factors at the new ranks, as in training
        measured = measure_step(probe, x, y)
        for key in ("saved_linear_bytes", "saved_linear_act_bytes", "saved_linear_weight_bytes", "flops_step"):
            out[f"perf/probe/{label}/{key}"] = measured[f"perf/{key}"]
        out[f"perf/probe/{label}/rank_mean"] = sum(l.rank for l in layers) / len(layers)
        # The ranks in effect, after capping by each activation's shape, averaged over layers.
        out[f"perf/probe/{label}/act_rank_sum"] = sum(
            sum(u.shape[1] for u in l.act_factors if u is not None) for l in layers) / len(layers)
    return out


def subspace_diagnostics(layers: list[WASILinear]) -> dict[str, float]:
    """Ranks, orthonormality of L, and how much of W the rank-k forward leaves out."""
    if not layers:
        return {}
    orth = max(float(torch.linalg.matrix_norm(l.left.t() @ l.left - torch.eye(l.rank, device=l.left.device))) for l in layers)
    residual = [float(torch.linalg.matrix_norm(l.weight.detach() - l.left @ l.right) / torch.linalg.matrix_norm(l.weight.detach())) for l in layers]
    fracs = [l.rank / min(l.in_features, l.out_features) for l in layers]
    return {
        "diag/rank_mean": sum(l.rank for l in layers) / len(layers),
        "diag/rank_frac_mean": sum(fracs) / len(fracs),
        "diag/orth_err_max": orth,
        "diag/weight_residual_mean": sum(residual) / len(residual),
    }
