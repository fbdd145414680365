"""Batched rank-r weight diffs and the DIT adapter, as one wrapper around each targeted projection.

Every targeted projection W (an `nn.Linear` or GPT-2's `Conv1D`, as `projections(model)` finds them
in the transformer blocks: q/k/v/o/gate/up/down for Llama, c_attn/c_proj/c_fc for GPT-2; never the
head) becomes

    y = W x  +  (u_d v_d / r) x  +  (s / r_DIT) B A x

where d is the diff applied to the batch row (`DiffContext.index[row]`, or none), u_d [out, r] and
v_d [r, in] are rows of a bank holding every diff's factors, and A [r_DIT, in], B [out, r_DIT]
are the one DIT adapter shared by all rows. Per-row diffs are two batched matmuls over gathered
factors (the paper's `bsi,bir->bsr`, `bsr,bro->bso` einsums), so hundreds of diffs train in one
forward pass: each diff only ever sees its own rows, and its loss and gradient are exactly those
of training it alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

from components.basemodel import as_linear, linear_types, select


@dataclass
class DiffContext:
    """What every wrapped linear reads at forward time (one object shared by all of them)."""

    bank: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """module name -> (u [N, out, r], v [N, r, in]) of all N diffs in the bank"""
    index: torch.Tensor | None = None
    """[G] diff applied to each group of `group` consecutive batch rows (None: no diff anywhere)"""
    group: int = 1
    """rows per group: the batch is G contiguous groups of this many rows, one diff each"""
    rank: int = 1
    """r of the diffs: ΔW = u v / r"""
    dit: bool = False
    """apply the DIT adapter"""


class DiffLinear(nn.Module):
    """A frozen linear plus the per-row diff of `ctx` and the DIT adapter (see the module doc)."""

    def __init__(self, name: str, base: nn.Linear, ctx: DiffContext, dit_rank: int, dit_alpha: float) -> None:
        super().__init__()
        self.name, self.base, self.ctx = name, base, ctx
        self.dit_scale = dit_alpha / dit_rank
        dev = base.weight.device
        # peft's LoRA init: A Kaiming-uniform, B zero, so the adapter starts as the identity. Kept in
        # float32 (cast at use) so that a bfloat16 base still gets full-precision optimizer updates.
        self.dit_a = nn.Parameter(torch.empty(dit_rank, base.in_features, device=dev))
        self.dit_b = nn.Parameter(torch.zeros(base.out_features, dit_rank, device=dev))
        nn.init.kaiming_uniform_(self.dit_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        ctx = self.ctx
        if ctx.index is not None:
            u, v = ctx.bank[self.name]
            # A bank may live on another device than the model (diffs read from files stay on the
            # CPU): only the gathered diffs of this batch travel.
            index = ctx.index.to(u.device)
            u_g = u[index].to(device=x.device, dtype=x.dtype)  # [G, out, r]
            v_g = v[index].to(device=x.device, dtype=x.dtype)  # [G, r, in]
            # One matmul pair per group (not per row): a group's rows and positions share its diff.
            flat = x.reshape(len(ctx.index), -1, x.shape[-1])  # [G, group * T, in]
            delta = torch.bmm(torch.bmm(flat, v_g.transpose(1, 2)), u_g.transpose(1, 2))  # [G, group * T, out]
            y = y + delta.reshape(y.shape) / ctx.rank
        if ctx.dit:
            y = y + (x @ self.dit_a.T.to(x.dtype)) @ self.dit_b.T.to(x.dtype) * self.dit_scale
        return y


def wrap(model: nn.Module, targets: tuple[str, ...], dit_rank: int, dit_alpha: float) -> DiffContext:
    """Replace every projection of the transformer blocks whose kind is in `targets` (see
    `components.basemodel.kinds`) by a `DiffLinear` (a `Conv1D` through an `nn.Linear` view of its
    own storage), freeze the base weights, and return the context all wrappers share. An unknown
    kind raises ValueError naming it and the model's kinds."""
    ctx = DiffContext()
    for p in model.parameters():
        p.requires_grad_(False)
    for name, proj in select(model, targets, what="diff_targets").items():
        parent = model.get_submodule(name.rsplit(".", 1)[0])
        setattr(parent, name.rsplit(".", 1)[1], DiffLinear(name, as_linear(proj.module), ctx, dit_rank, dit_alpha))
    return ctx


def diff_linears(model: nn.Module) -> Iterator[DiffLinear]:
    """Every `DiffLinear` of a model `wrap` has prepared, in module order."""
    return (m for m in model.modules() if isinstance(m, DiffLinear))


def dit_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The DIT adapter's parameters (A and B of every wrapped linear): all that stage B trains."""
    return [p for m in diff_linears(model) for p in (m.dit_a, m.dit_b)]


def new_bank(model: nn.Module, n: int, rank: int, init_scale: float, gen: torch.Generator,
             ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """N fresh diffs, float32: u uniform in ±init_scale/sqrt(r) (init_scale 1 is the paper's
    Kaiming-uniform of the out side, fan-in r), v zero, so every diff starts at ΔW = 0."""
    bank = {}
    for m in diff_linears(model):
        dev = m.base.weight.device
        u = (torch.rand(n, m.base.out_features, rank, generator=gen) * 2 - 1) * (init_scale / math.sqrt(rank))
        v = torch.zeros(n, rank, m.base.in_features)
        bank[m.name] = (u.to(dev), v.to(dev))
    return bank


def merged_weight(model: nn.Module, bank: dict[str, tuple[torch.Tensor, torch.Tensor]], name: str, d: int,
                  rank: int) -> torch.Tensor:
    """W + u_d v_d / r of module `name`: the weight a merged copy of diff d would carry."""
    u, v = bank[name]
    return model.get_submodule(name).base.weight + u[d] @ v[d] / rank


def targets_of(model: torch.nn.Module, spec: str) -> tuple[str, ...]:
    """The linear types `spec` ('all-linear' or 'q_proj,down_proj,...') names in this model;
    ValueError naming the model's types when one is unknown."""
    known = linear_types(model)
    if spec.strip() == "all-linear":
        return tuple(known)
    wanted = tuple(t.strip() for t in spec.split(","))
    unknown = [t for t in wanted if t not in known]
    if unknown:
        raise ValueError(f"diff_targets {unknown} are not linear types of this model; choose among {known}")
    return wanted
