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

Whole-step peak memory comes from `PeakMemoryMeter`, a dispatch mode that follows the live bytes
of every tensor storage through one whole training step (forward, backward, clip, optimizer step,
WASI refresh): the storages alive when it starts (parameters, buffers, WASI's L, R and activation
factors, optimizer state, the previous step's gradients, the batch) plus every storage an op
creates, each freed when its storage dies. Its peak is everything the step holds at once.
LAPACK's internal workspace (QR, SVD) is not a torch tensor and is not seen.

Time per step (`time_steps`) is wall-clock on this machine, interleaved between the models timed
so that load from other processes falls on each alike: machine-dependent, reported as ratios.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import copy
import statistics
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.run import devices
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


class PeakMemoryMeter(TorchDispatchMode):
    """Context manager: the peak of live tensor bytes while active, by storage (a view and its base
    count once). `resident` are the tensors alive at the start (weights, optimizer state, ...)."""

    def __init__(self, resident: list[torch.Tensor]) -> None:
        super().__init__()
        self._live: dict[int, int] = {}  # storage address -> bytes
        self._refs: dict[int, weakref.ref] = {}  # weak: a dying storage calls _free
        self.current = self.peak = 0
        for t in resident:
            self._track(t)
        self.resident = self.current

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)
        self._refs.pop(key, None)

    def _track(self, t: object) -> None:
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        key, nbytes = storage._cdata, storage.nbytes()
        if key in self._live:  # seen already; an in-place resize may have grown it
            self.current += max(0, nbytes - self._live[key])
            self._live[key] = max(nbytes, self._live[key])
        else:
            self._live[key] = nbytes
            self._refs[key] = weakref.ref(storage, lambda _, key=key: self._free(key))
            self.current += nbytes
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self._track(t)
        return out


def resident_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """What a training step finds alive: parameters, their gradients, buffers, WASI's activation
    factors and the optimizer's state."""
    out = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    out += list(model.buffers())
    out += [u for m in wasi_layers(model) for u in (m.act_factors or []) if u is not None]
    out += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                  grad_clip: float) -> torch.Tensor:
    """One fine-tuning step as `train` runs it: forward, backward, clip, optimizer step and, for
    WASI, one subspace-iteration refresh per layer. Returns the loss (detached)."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)  # after the forward: the previous gradients live through it
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    for layer in wasi_layers(model):
        layer.refresh()
    return loss.detach()


def make_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float, momentum: float = 0.0
                   ) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def measure_peak(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: str, grad_clip: float,
                 lr: float = 1e-3, weight_decay: float = 0.0, momentum: float = 0.0) -> dict[str, float]:
    """Peak bytes of one whole training step on a copy of the model, after one unmeasured step
    so that the optimizer's state and the previous gradients exist, as in the middle of training."""
    model = copy.deepcopy(model)
    model.train()
    opt = make_optimizer(model, optimizer, lr, weight_decay, momentum)
    training_step(model, opt, x, y, grad_clip)
    with PeakMemoryMeter(resident_tensors(model, opt) + [x, y]) as meter:
        training_step(model, opt, x, y, grad_clip)
    return {"perf/peak_step_bytes": float(meter.peak), "perf/resident_bytes": float(meter.resident)}


def time_steps(models: dict[str, nn.Module], x: torch.Tensor, y: torch.Tensor, optimizer: str, grad_clip: float,
               rounds: int = 12, warmup: int = 2, lr: float = 1e-3, weight_decay: float = 0.0,
               momentum: float = 0.0) -> dict[str, float]:
    """Median wall-clock seconds of a training step and of an inference forward (eval, no_grad) of
    each model on the same batch, on copies. Rounds are interleaved across the models so that a
    change in the machine's load falls on each model alike."""
    copies = {name: copy.deepcopy(m).train() for name, m in models.items()}
    opts = {name: make_optimizer(m, optimizer, lr, weight_decay, momentum) for name, m in copies.items()}
    times: dict[str, list[float]] = {f"{name}/{kind}": [] for name in copies for kind in ("train", "infer")}
    for r in range(warmup + rounds):
        for name, m in copies.items():
            start = devices.clock(x.device)  # a GPU runs asynchronously: the clock waits for it
            training_step(m, opts[name], x, y, grad_clip)
            train_s = devices.clock(x.device) - start
            m.eval()
            with torch.no_grad():
                start = devices.clock(x.device)
                m(x)
                infer_s = devices.clock(x.device) - start
            m.train()
            if r >= warmup:
                times[f"{name}/train"].append(train_s)
                times[f"{name}/infer"].append(infer_s)
    return {key: statistics.median(v) for key, v in times.items()}


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
