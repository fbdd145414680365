"""A decoder's linear projections, found by asking the model, and LoRA through peft.

Which modules are "the linear projections" is answered by the model itself, not by name
patterns: its transformer blocks are the modules whose class transformers declares as a block
(`model._no_split_modules`, e.g. `LlamaDecoderLayer`, `GPT2Block`, `OPTDecoderLayer`), and a
projection is an `nn.Linear` or transformers' `Conv1D` inside one (GPT-2 stores the latter's
weight as [in, out]). The output head (`model.get_output_embeddings()`) and embeddings are never
projections. A model without that declaration falls back to the children of its longest
`nn.ModuleList` of identical blocks.

A projection's *kind* is the shortest suffix of its name inside its block that tells it apart from
the block's other projections: `q_proj` ... `down_proj` for Llama, Qwen, Mistral and OPT's
attention; `c_attn`, `attn.c_proj`, `c_fc`, `mlp.c_proj` for GPT-2. Kinds are peft
`target_modules` entries as they stand (peft matches a target as a name suffix).

    from components.basemodel.adapters import projections, kinds, weight_oi
    for name, p in projections(model).items():  # {full name: Projection}
        print(name, p.kind, p.layer, p.in_features, p.out_features)
        w = weight_oi(p.module)                  # [out, in], a view (GPT-2: the transpose)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
from torch import nn

LLAMA_LINEAR_TYPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projection kinds of a Llama-architecture decoder layer (also Qwen, Gemma, Mistral)."""


def _conv1d_type() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers is optional for plain-torch models
        return None
    return Conv1D


def is_projection_module(module: nn.Module) -> bool:
    """An `nn.Linear` or a transformers `Conv1D` (a linear map whose weight is [in, out])."""
    conv = _conv1d_type()
    return isinstance(module, nn.Linear) or (conv is not None and isinstance(module, conv))


def weight_oi(module: nn.Module) -> torch.Tensor:
    """The projection's weight as [out_features, in_features]: `weight` itself for `nn.Linear`,
    its transpose (a view: in-place updates reach the module) for `Conv1D`."""
    if isinstance(module, nn.Linear):
        return module.weight
    if is_projection_module(module):
        return module.weight.T
    raise TypeError(f"{type(module).__name__} is not a linear projection (nn.Linear or transformers Conv1D)")


def features(module: nn.Module) -> tuple[int, int]:
    """(in_features, out_features) of an `nn.Linear` or a `Conv1D`."""
    out_f, in_f = weight_oi(module).shape
    return int(in_f), int(out_f)


def as_linear(module: nn.Module) -> nn.Linear:
    """The projection as an `nn.Linear`, for code that wraps one: the module itself, or for a
    `Conv1D` an `nn.Linear` whose weight is the transposed view of the same storage and whose bias
    is the same Parameter (no copy: the model's memory does not grow)."""
    if isinstance(module, nn.Linear):
        return module
    weight = weight_oi(module)
    in_f, out_f = features(module)
    lin = nn.Linear(in_f, out_f, bias=module.bias is not None, device="meta")
    lin.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
    if module.bias is not None:
        lin.bias = module.bias
    return lin


@dataclass(frozen=True)
class Projection:
    """One linear projection of a transformer block."""

    name: str
    """full module name (`model.layers.0.self_attn.q_proj`, `transformer.h.0.attn.c_attn`)"""
    kind: str
    """the shortest in-block name suffix that tells it apart (`q_proj`, `attn.c_proj`)"""
    layer: int
    """the block's index, 0 first"""
    module: nn.Module
    """the `nn.Linear` or `Conv1D` itself"""

    @property
    def in_features(self) -> int:
        return features(self.module)[0]

    @property
    def out_features(self) -> int:
        return features(self.module)[1]


def _unwrap(model: nn.Module) -> nn.Module:
    # A peft model: its projections are those of the model it wraps.
    inner = getattr(model, "get_base_model", None)
    return inner() if callable(inner) else model


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The transformer blocks, in order: modules of a class the model declares in
    `_no_split_modules` that hold a projection; else the children of the longest `nn.ModuleList`
    of same-class modules. Raises ValueError when neither finds any."""
    model = _unwrap(model)
    declared = set(getattr(model, "_no_split_modules", None) or ())
    found = [(n, m) for n, m in model.named_modules()
             if type(m).__name__ in declared and any(is_projection_module(c) for c in m.modules())]
    # Keep the outermost: a declared class inside another declared one is part of that block.
    found = [(n, m) for n, m in found if not any(n.startswith(o + ".") for o, _ in found if o != n)]
    if found:
        return found
    lists = [(n, m) for n, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1
             and any(is_projection_module(c) for c in m[0].modules())]
    if not lists:
        raise ValueError(f"{type(model).__name__} declares no transformer block class (_no_split_modules) and holds no "
                         f"list of identical blocks with linear layers: ladder cannot tell its projections apart")
    name, longest = max(lists, key=lambda item: len(item[1]))
    return [(f"{name}.{i}" if name else str(i), c) for i, c in enumerate(longest)]


def _kinds_of(suffixes: list[tuple[str, ...]]) -> list[str]:
    out = []
    for parts in suffixes:
        for k in range(1, len(parts) + 1):
            tail = parts[-k:]
            if sum(1 for other in suffixes if other[-k:] == tail) == 1 or k == len(parts):
                out.append(".".join(tail))
                break
    return out


def projections(model: nn.Module) -> dict[str, Projection]:
    """Every linear projection inside the transformer blocks, by full module name, in module
    order; the output head and the embeddings are never among them (see the module docstring).
    On a peft model: the base layers of its adapted modules, under the adapted module's name
    (its LoRA factors are not projections of the model)."""
    model = _unwrap(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out: dict[str, Projection] = {}
    for layer, (block_name, block) in enumerate(blocks(model)):
        inner: list[tuple[str, nn.Module]] = []
        wrapped: list[str] = []  # peft layers: the projection is their base_layer, under their own name
        for n, m in block.named_modules():
            if not n or m is head or any(n.startswith(w + ".") for w in wrapped):
                continue
            base = getattr(m, "base_layer", None)
            if isinstance(base, nn.Module) and is_projection_module(base):
                inner.append((n, base))
                wrapped.append(n)
            elif is_projection_module(m):
                inner.append((n, m))
        kinds = _kinds_of([tuple(n.split(".")) for n, _ in inner])
        for (n, m), kind in zip(inner, kinds):
            full = f"{block_name}.{n}"
            out[full] = Projection(full, kind, layer, m)
    if not out:
        raise ValueError(f"{type(model).__name__}'s transformer blocks hold no nn.Linear or Conv1D projection")
    return out


def kinds(model: nn.Module) -> list[str]:
    """The distinct projection kinds, in first-seen order: the `target_modules` vocabulary of this
    model (Llama: q_proj ... down_proj; GPT-2: c_attn, attn.c_proj, c_fc, mlp.c_proj)."""
    return list(dict.fromkeys(p.kind for p in projections(model).values()))


linear_types = kinds
"""The former name of `kinds`."""


def select(model: nn.Module, targets: Iterable[str] | str = "all", *, what: str = "targets") -> dict[str, Projection]:
    """The projections whose kind is in `targets` ("all": every one). An unknown kind raises
    ValueError naming it and this model's kinds, before anything is built."""
    found = projections(model)
    if isinstance(targets, str):
        if targets in ("all", "all-linear"):
            return found
        targets = [targets]
    wanted = list(targets)
    known = list(dict.fromkeys(p.kind for p in found.values()))
    unknown = [t for t in wanted if t not in known]
    if unknown:
        raise ValueError(f"{what} {unknown} are not linear projection kinds of {type(_unwrap(model)).__name__}; "
                         f"choose among {known}")
    return {n: p for n, p in found.items() if p.kind in wanted}


def check_targets(model: nn.Module, targets: Sequence[str], *, what: str = "targets") -> None:
    """Raises ValueError naming the kinds in `targets` this model does not have (see `select`)."""
    select(model, list(targets), what=what)


def lora(model: nn.Module, targets: Sequence[str] | str = "all-linear", *, r: int = 8, alpha: float = 16,
         dropout: float = 0.0, adapter_name: str = "default", **lora_kwargs: Any) -> Any:
    """`peft.get_peft_model` with a causal-LM `LoraConfig`: only the adapter is trainable.
    `targets` are projection kinds (see `kinds`) or "all-linear" (every projection, the head
    excluded). GPT-2's `Conv1D` projections get `fan_in_fan_out=True`, as peft needs."""
    from peft import LoraConfig, get_peft_model

    chosen = select(model, targets, what="LoRA targets")
    names = sorted(chosen) if targets in ("all", "all-linear") else list(dict.fromkeys(p.kind for p in chosen.values()))
    if not any(isinstance(p.module, nn.Linear) for p in chosen.values()):
        lora_kwargs.setdefault("fan_in_fan_out", True)
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=names, task_type="CAUSAL_LM",
                     **lora_kwargs)
    return get_peft_model(model, cfg, adapter_name=adapter_name)
