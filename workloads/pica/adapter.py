"""The PiCa adapter: y = x W0^T + (x P^T) M^T, with P the top-r right singular vectors of the frozen
W0 (PyTorch's (out, in) layout; the paper's left singular vectors of its (in, out) W0) and one
trainable M (out x r, zero at the start) shared by every layer of a module type.

Also the measurements behind the method's exact claims, taken on a trained model: the merge, the
residual of the update outside span(P), the shared gradient against the per-layer gradients, and
the trainable count at several depths.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Literal

import torch
from torch import nn
from torch.nn import functional as F

from components.basemodel import as_linear, projections, select, weight_oi

Subspace = Literal["column", "random"]


class PiCaLinear(nn.Module):
    """A frozen `nn.Linear` plus the projected update M P; `m` may be shared with other layers."""

    def __init__(self, base: nn.Linear, projector: torch.Tensor, m: nn.Parameter) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("projector", projector)  # [r, in], frozen, recomputable from W0
        self.m = m  # [out, r]; the same Parameter object in every layer of its type when shared

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Two thin matmuls through the r-dim bottleneck; W0 + M P is never materialised.
        return self.base(x) + F.linear(F.linear(x, self.projector.to(x.dtype)), self.m.to(x.dtype))

    def delta(self) -> torch.Tensor:
        """The weight update M P, [out, in]."""
        return self.m @ self.projector.to(self.m.dtype)

    def merged(self) -> nn.Linear:
        """A plain Linear holding W0 + M P (and the base bias)."""
        out = copy.deepcopy(self.base)
        with torch.no_grad():
            out.weight.copy_(self.base.weight + self.delta().to(self.base.weight.dtype))
        return out


def column_projector(weight: torch.Tensor, rank: int) -> torch.Tensor:
    """Top-`rank` right singular vectors of `weight` [out, in] -> [rank, in] (orthonormal rows).
    The SVD runs in float64 (float32 on the meta device) so the rows are orthonormal to ~1e-15."""
    w = weight.detach()
    w = w.float() if w.device.type == "meta" else w.double()
    _, _, vh = torch.linalg.svd(w, full_matrices=False)
    return vh[:rank].to(weight.dtype)


def random_projector(in_features: int, rank: int, generator: torch.Generator, *, dtype: torch.dtype,
                     device: torch.device | str = "cpu") -> torch.Tensor:
    """A uniformly random r-dim subspace of R^in, as orthonormal rows [rank, in] (QR of a Gaussian)."""
    if torch.device(device).type == "meta":
        return torch.empty(rank, in_features, dtype=dtype, device="meta")
    g = torch.randn(in_features, rank, generator=generator, dtype=torch.float64)
    q, _ = torch.linalg.qr(g)
    return q.T.contiguous().to(dtype=dtype, device=device)


def decoder_linears(model: nn.Module, targets: Iterable[str]) -> list[tuple[str, nn.Module, str, nn.Module]]:
    """(full name, parent, attribute name, projection) of every block projection whose kind
    (`components.basemodel.kinds`: `q_proj`, GPT-2's `c_attn` / `mlp.c_proj`) is in `targets`, in
    module order (layer 0 first). The projection is an `nn.Linear` or GPT-2's `Conv1D`; an unknown
    kind raises ValueError naming it and the model's kinds."""
    out = []
    for name, proj in select(model, list(targets), what="PiCa targets").items():
        parent_name, _, attr = name.rpartition(".")
        out.append((name, model.get_submodule(parent_name), attr, proj.module))
    return out


def kind_of(model: nn.Module) -> dict[str, str]:
    """full name -> projection kind of every block projection (see `decoder_linears`)."""
    return {name: p.kind for name, p in projections(model).items()}


class PiCa(nn.Module):
    """Attaches PiCa to `model` in place (base frozen) and holds the trainable Ms.

    `ms` maps a module type (e.g. `q_proj`) to its shared M, or `q_proj_<i>` (i: its index among the wrapped modules) to a per-layer M
    when `share=False`. `layers` lists the wrapped modules in layer order.
    """

    def __init__(self, model: nn.Module, targets: Iterable[str], rank: int, *, subspace: Subspace = "column",
                 share: bool = True, seed: int = 0) -> None:
        super().__init__()
        targets = list(targets)
        kinds = kind_of(model)
        found = decoder_linears(model, targets)  # raises naming an unknown kind
        for p in model.parameters():
            p.requires_grad_(False)
        self.rank, self.subspace, self.share = rank, subspace, share
        self.ms = nn.ParameterDict()
        self.layers: dict[str, PiCaLinear] = {}
        self.kinds: dict[str, str] = {}
        gen = torch.Generator().manual_seed(seed)
        for index, (name, parent, leaf, module) in enumerate(found):
            linear = as_linear(module)  # GPT-2's Conv1D: an nn.Linear over the same storage, [out, in]
            w = weight_oi(module)
            kind = kinds[name]
            if subspace == "column":
                proj = column_projector(w, rank)
            else:
                proj = random_projector(linear.in_features, rank, gen, dtype=w.dtype, device=w.device)
            key = kind if share else f"{kind}_{index}"
            key = key.replace(".", "_")  # ParameterDict keys cannot hold dots (GPT-2's `attn.c_proj`)
            if key not in self.ms:
                self.ms[key] = nn.Parameter(torch.zeros(linear.out_features, rank, dtype=w.dtype, device=w.device))
            elif self.ms[key].shape[0] != linear.out_features:
                raise ValueError(f"{name}: out_features {linear.out_features} differs from other {kind} layers "
                                 f"({self.ms[key].shape[0]}); a shared M needs one shape per type: use share=False")
            wrapped = PiCaLinear(linear, proj, self.ms[key])
            setattr(parent, leaf, wrapped)
            self.layers[name] = wrapped
            self.kinds[name] = kind

    def by_type(self) -> dict[str, list[PiCaLinear]]:
        groups: dict[str, list[PiCaLinear]] = {}
        for name, layer in self.layers.items():
            groups.setdefault(self.kinds[name], []).append(layer)
        return groups

    def trainable(self) -> int:
        return sum(p.numel() for p in self.ms.values())


def trainable_count(model: nn.Module) -> int:
    """Parameters with requires_grad, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merge(model: nn.Module) -> nn.Module:
    """A copy of `model` with every PiCaLinear replaced by its merged plain Linear."""
    out = copy.deepcopy(model)
    for name, module in list(out.named_modules()):
        for leaf, child in list(module.named_children()):
            if isinstance(child, PiCaLinear):
                setattr(module, leaf, child.merged())
    return out


# --- measurements behind the exact claims ---------------------------------------------------


def span_residual(delta: torch.Tensor, projector: torch.Tensor) -> float:
    """||dW - dW P^T P||_F / ||dW||_F: the share of the update outside span(P) (rows of P orthonormal).
    0 when dW = 0."""
    d = delta.double()
    p = projector.double()
    norm = float(torch.linalg.matrix_norm(d))
    if norm == 0.0:
        return 0.0
    return float(torch.linalg.matrix_norm(d - d @ p.T @ p)) / norm


def shared_gradient_error(model: nn.Module, pica: PiCa, loss_fn: Any) -> float:
    """max over Ms of ||dL/dM - sum_l (dL/dW_l) P_l^T|| / ||dL/dM||.

    dL/dM comes from autograd through the adapter; dL/dW_l from a merged copy whose weights
    W_l = W0_l + M P_l are leaves. `loss_fn(model) -> scalar` evaluates one fixed batch."""
    for m in pica.ms.values():
        m.grad = None
    loss_fn(model).backward()
    grads_m = {k: m.grad.detach().clone() for k, m in pica.ms.items()}
    for m in pica.ms.values():
        m.grad = None

    merged = merge(model)
    names = list(pica.layers)
    merged_linears = dict(merged.named_modules())
    weights = {}
    for name in names:
        w = merged_linears[name].weight
        w.requires_grad_(True)
        weights[name] = w
    loss_fn(merged).backward()
    summed: dict[str, torch.Tensor] = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in grads_m.items()}
    keys = {id(m): k for k, m in pica.ms.items()}
    for name in names:
        layer = pica.layers[name]
        summed[keys[id(layer.m)]] += weights[name].grad.double() @ layer.projector.double().T
    worst = 0.0
    for k, g in grads_m.items():
        ref = float(torch.linalg.matrix_norm(summed[k]))
        worst = max(worst, float(torch.linalg.matrix_norm(g.double() - summed[k])) / max(ref, 1e-30))
    return worst


def full_gradients(model: nn.Module, targets: Iterable[str], loss_fn: Any) -> dict[str, torch.Tensor]:
    """name -> dL/dW of every target weight of the (not yet adapted) model, from one backward of
    `loss_fn(model)`; requires_grad is restored afterwards."""
    found = [(name, module.weight, module.weight is not weight_oi(module)) for name, _, _, module in decoder_linears(model, targets)]
    saved = [w.requires_grad for _, w, _ in found]
    for _, w, _ in found:
        w.requires_grad_(True)
        w.grad = None
    loss_fn(model).backward()
    # [out, in], as PiCa's projector; a Conv1D's weight (and its gradient) is stored [in, out]
    out = {name: (w.grad.T if transposed else w.grad).detach().clone() for name, w, transposed in found}
    for (_, w, _), flag in zip(found, saved):
        w.grad = None
        w.requires_grad_(flag)
    return out


def gradient_energy(pica: "PiCa", grads: dict[str, torch.Tensor]) -> float:
    """Mean over wrapped layers of ||G P^T||_F^2 / ||G||_F^2: the share of the full gradient G = dL/dW0
    that the layer's subspace can express (r / in for a random subspace, on average)."""
    shares = []
    for name, layer in pica.layers.items():
        g = grads[name].double()
        total = float(g.square().sum())
        if total > 0:
            shares.append(float((g @ layer.projector.double().T).square().sum()) / total)
    return sum(shares) / len(shares) if shares else float("nan")


def count_at_depths(config: Any, depths: Iterable[int], targets: Iterable[str], rank: int, *, share: bool,
                    subspace: Subspace = "column") -> dict[int, int]:
    """depth -> trainable count of PiCa on an untrained model of `config`'s architecture with that
    many layers, built on the meta device (module shapes only, no memory, no weights)."""
    from transformers import AutoModelForCausalLM

    out = {}
    for depth in depths:
        cfg = copy.deepcopy(config)
        cfg.num_hidden_layers = depth
        if getattr(cfg, "layer_types", None) is not None:  # per-layer attention kinds must match the depth
            cfg.layer_types = list(cfg.layer_types)[:depth] + [cfg.layer_types[-1]] * max(0, depth - len(cfg.layer_types))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
            PiCa(model, targets, rank, subspace=subspace, share=share)
        out[depth] = trainable_count(model)
        del model  # one meta model at a time
    return out
