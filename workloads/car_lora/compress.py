"""Compression operators C(W0) as fake compressors of a frozen base, and the switch that applies
one of them to every decoder linear of a (peft-wrapped) causal LM in the forward pass.

Every weight operator maps a weight [out, in] to a weight of the same shape holding the values
the compressed model would compute with (dequantised, or with the pruned entries zeroed):

- `int_per_channel(w, bits)`: symmetric integer grid, one absmax scale per output row;
- `int_grouped(w, bits, group)`: the same grid, one absmax scale per `group` consecutive inputs
  of a row (GPTQ/AWQ-style groups); at 2 bits it is the one quantiser that costs a plain LoRA
  on tiny-local real accuracy (int4 and fp4 even per tensor cost it under a point);
- `nf4_blockwise(w, block)`: QLoRA's 4-bit NormalFloat, absmax per block of the flattened weight;
- `mxfp4(w, block)`: OCP MX FP4 (E2M1 elements, E8M0 block scales) from `kernels.mx.fake_quant`;
- `prune_2_4(w)`: of every 4 consecutive input weights, keep the 2 largest magnitudes;
- `prune_unstructured(w, frac)`: the smallest-magnitude weights of every row, zeroed;
- `row_prune_mask(w, frac)` / `col_prune_mask`: the output neurons / input channels of smallest
  L2 norm, removed; the same mask is applied to the adapter, as the paper's
  h = (M_row W0 M_col) x + (M_row B A M_col) x asks;
- layer skipping: a decoder layer returns its input (its adapter is skipped with it).

`CompressedLinear` replaces each projection of the transformer blocks (`projections`: nn.Linear,
or GPT-2's Conv1D through `as_linear`, a transposed view of the same storage) in place (same
Parameters) and computes x @ C(W0)^T. Its backward is either the straight-through "full precision"
one, grad_x = grad_y @ W0 (the estimator dC/dW0 ~ I), or autograd through the compressed weight
as QLoRA does, grad_x = grad_y @ C(W0) (`Compressor(backward=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from components.basemodel import Projection, as_linear, projections
from components.basemodel.adapters import blocks

NF4_CODEBOOK = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)
"""The 16 NF4 levels of QLoRA (Dettmers et al. 2023, as in bitsandbytes): normal quantiles on [-1, 1]."""

BACKWARDS = ("full", "compressed")


# --- weight operators ---------------------------------------------------------------------------


def int_per_channel(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Symmetric signed integer grid {-q..q}, q = 2^(bits-1) - 1, scale = row absmax / q."""
    q = 2 ** (bits - 1) - 1
    scale = w.abs().amax(dim=1, keepdim=True) / q  # [out, 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    return torch.round(w / scale).clamp(-q, q) * scale


def int_grouped(w: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """`int_per_channel` with one absmax scale per `group` consecutive inputs of each row (a
    row whose length is no multiple of `group` ends on a shorter group). At bits=2 the grid is
    {-1, 0, 1} x scale: a value under half its group's absmax becomes 0."""
    out_f, in_f = w.shape
    pad = (-in_f) % group
    groups = torch.nn.functional.pad(w, (0, pad)).view(out_f, -1, group)  # [out, in / group, group]
    # Padding zeros never raise an absmax, so a short last group keeps its own scale.
    return int_per_channel(groups.reshape(-1, group), bits).view(out_f, -1)[:, :in_f]


def nf4_blockwise(w: torch.Tensor, block: int = 64) -> torch.Tensor:
    """Flatten (row-major, as bitsandbytes does), split into blocks of `block` values, scale each
    by its absmax into [-1, 1] and round to the nearest NF4 level (a value halfway between two
    levels goes to the lower one)."""
    flat = w.reshape(-1)
    pad = (-flat.numel()) % block
    blocks = torch.nn.functional.pad(flat, (0, pad)).view(-1, block)  # [n_blocks, block]
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    absmax = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    levels = torch.tensor(NF4_CODEBOOK, dtype=torch.float32, device=w.device)
    midpoints = (levels[1:] + levels[:-1]) / 2
    idx = torch.bucketize((blocks / absmax).float(), midpoints)  # nearest level, no [n, 16] table
    out = levels[idx].to(w.dtype) * absmax
    return out.reshape(-1)[: flat.numel()].view_as(w)


def mxfp4(w: torch.Tensor, block: int = 32, impl: str = "auto") -> torch.Tensor:
    """OCP MX FP4: E2M1 elements, one E8M0 (power-of-two) scale per `block` inputs of a row."""
    from kernels.mx import fake_quant

    return fake_quant(w, block_size=block, scale_format="e8m0", elem_format="e2m1", impl=impl)


def prune_2_4(w: torch.Tensor) -> torch.Tensor:
    """2:4 semi-structured sparsity along the input dimension: in each group of 4 consecutive
    weights of a row the 2 of largest magnitude stay (on ties, the earlier one)."""
    if w.shape[-1] % 4:
        raise ValueError(f"2:4 pruning needs in_features divisible by 4, got {w.shape[-1]}")
    groups = w.reshape(-1, 4)
    order = torch.sort(groups.abs(), dim=1, descending=True, stable=True).indices
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, order[:, :2], True)
    return (groups * keep).view_as(w)


def prune_unstructured(w: torch.Tensor, frac: float) -> torch.Tensor:
    """Unstructured magnitude pruning: in every row the floor(frac * in) weights of smallest
    magnitude are zeroed (on ties, the earlier)."""
    n_drop = int(frac * w.shape[1])
    order = torch.sort(w.abs(), dim=1, stable=True).indices
    keep = torch.ones_like(w, dtype=torch.bool).scatter_(1, order[:, :n_drop], False)
    return w * keep


def row_prune_mask(w: torch.Tensor, frac: float) -> torch.Tensor:
    """[out] bool, False for the floor(frac * out) rows of smallest L2 norm (on ties, the earlier)."""
    n_drop = int(frac * w.shape[0])
    order = torch.sort(w.norm(dim=1), stable=True).indices
    mask = torch.ones(w.shape[0], dtype=torch.bool, device=w.device)
    mask[order[:n_drop]] = False
    return mask


def col_prune_mask(w: torch.Tensor, frac: float) -> torch.Tensor:
    """[in] bool, False for the floor(frac * in) input columns of smallest L2 norm (on ties, the earlier)."""
    return row_prune_mask(w.T, frac)


# --- schemes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scheme:
    """A compression scheme: a weight operator, or a structured one the switch handles itself."""

    name: str
    kind: str
    """'weight' (an operator on W0), 'rows' (row pruning with the mask synced onto the adapter's
    output) or 'skip' (drop a decoder layer)."""
    op: Callable[[torch.Tensor], torch.Tensor] | None = None


def make_schemes(*, nf4_block: int = 64, mx_block: int = 32, prune_frac: float = 0.3, mx_impl: str = "auto") -> dict[str, Scheme]:
    """Every scheme by name; 'none' is the uncompressed base. Row and column pruning remove
    `prune_frac` of a linear's output neurons or input channels; sparse50 is unstructured."""
    return {
        "none": Scheme("none", "weight", None),
        "int8": Scheme("int8", "weight", lambda w: int_per_channel(w, 8)),
        "int4": Scheme("int4", "weight", lambda w: int_per_channel(w, 4)),
        "int3": Scheme("int3", "weight", lambda w: int_per_channel(w, 3)),
        "int2g16": Scheme("int2g16", "weight", lambda w: int_grouped(w, 2, 16)),
        "nf4": Scheme("nf4", "weight", lambda w: nf4_blockwise(w, nf4_block)),
        "mxfp4": Scheme("mxfp4", "weight", lambda w: mxfp4(w, mx_block, mx_impl)),
        "sparse24": Scheme("sparse24", "weight", prune_2_4),
        "sparse50": Scheme("sparse50", "weight", lambda w: prune_unstructured(w, 0.5)),
        "rowprune": Scheme("rowprune", "rows", lambda w: row_prune_mask(w, prune_frac)),
        "colprune": Scheme("colprune", "cols", lambda w: col_prune_mask(w, prune_frac)),
        "skip": Scheme("skip", "skip"),
    }


SCHEME_NAMES = tuple(make_schemes())
QUANTISERS = ("int8", "int4", "int3", "int2g16", "nf4", "mxfp4")
"""The schemes that quantise (the rest prune or skip): the paper's INT8 / FP4 / NF4 comparison."""


# --- the compressed linear and its backward -------------------------------------------------------


class _StraightThrough(torch.autograd.Function):
    """y = x @ Wc^T + b forward; the input gradient uses the full-precision W0 (dC/dW0 ~ I)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w0: torch.Tensor, wc: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, w0)
        ctx.has_bias = bias is not None
        return torch.nn.functional.linear(x, wc, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w0 = ctx.saved_tensors
        grad_x = grad @ w0 if ctx.needs_input_grad[0] else None
        # The base is frozen here; when it is not, the estimator passes W's gradient straight through.
        grad_w = grad.reshape(-1, grad.shape[-1]).T @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        grad_b = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None
        return grad_x, grad_w, None, grad_b


class CompressedLinear(torch.nn.Linear):
    """A decoder linear computing with `compressed` (C(W0)) when set, with W0 itself otherwise.
    It shares the original module's Parameters, so state dicts and peft see the same weights."""

    def __init__(self, linear: torch.nn.Linear, backward: str = "full") -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.backward_mode = backward
        self.compressed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compressed is None:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if self.backward_mode == "full":
            return _StraightThrough.apply(x, self.weight, self.compressed, self.bias)
        return torch.nn.functional.linear(x, self.compressed, self.bias)  # autograd through C(W0)


# --- the switch ---------------------------------------------------------------------------------


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The model a peft wrapper holds (the names `blocks` and `projections` use), or the model."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


class Compressor:
    """Swaps every projection of the transformer blocks (`projections`: nn.Linear, or GPT-2's
    Conv1D seen through `as_linear`) for a `CompressedLinear` and applies one scheme at a time:
    `use("nf4")`, `use("none")`. Compressed weights are computed once per scheme from the frozen
    W0 and kept (`cache=False` recomputes them on every switch: less memory on a large base).
    `projs`: the base's projections taken before peft wrapped it (peft's own lora_A / lora_B are
    linears too); by default those of `model` itself."""

    def __init__(self, model: torch.nn.Module, schemes: dict[str, Scheme], *, skip_layer: int = -1,
                 backward: str = "full", cache: bool = True, projs: dict[str, Projection] | None = None) -> None:
        if backward not in BACKWARDS:
            raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
        self.schemes, self.cache = schemes, cache
        projs = projections(model) if projs is None else projs
        named_layers = blocks(model)
        self.layers = [layer for _, layer in named_layers]
        self.skip_index = skip_layer % len(self.layers)
        where = {id(m): n for n, m in _inner(model).named_modules()}
        self.linears: dict[str, CompressedLinear] = {}
        self.row_masks: dict[str, torch.Tensor | None] = {}
        self.col_masks: dict[str, torch.Tensor | None] = {}
        for p in projs.values():
            layer_name, layer = named_layers[p.layer]
            full = where.get(id(p.module))
            if full is None or not full.startswith(layer_name + "."):
                raise ValueError(f"projection {p.name} is not in block {layer_name} of this model: pass the "
                                 f"projections of the model the Compressor wraps")
            name = full[len(layer_name) + 1:]
            parent_name, _, leaf = name.rpartition(".")
            parent = layer.get_submodule(parent_name) if parent_name else layer
            new = CompressedLinear(as_linear(p.module), backward)
            setattr(parent, leaf, new)
            key = f"{p.layer}.{name}"
            self.linears[key] = new
            # The output of the whole (adapted) module gets the row mask: M_row (W0 + BA) x.
            owner = _adapted_owner(layer, parent_name, leaf)
            owner.register_forward_hook(self._row_hook(key))
            owner.register_forward_pre_hook(self._col_hook(key))
            self.row_masks[key] = None
            self.col_masks[key] = None
        for layer_index, layer in enumerate(self.layers):
            layer.register_forward_hook(self._skip_hook(layer_index), with_kwargs=True)
        self._store: dict[str, dict[str, torch.Tensor]] = {}
        self.active = "none"

    def _row_hook(self, key: str) -> Callable:
        def hook(module: torch.nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor | None:
            mask = self.row_masks[key]
            return None if mask is None else out * mask.to(out.dtype)
        return hook

    def _col_hook(self, key: str) -> Callable:
        def hook(module: torch.nn.Module, args: Any) -> Any:
            mask = self.col_masks[key]
            return None if mask is None else (args[0] * mask.to(args[0].dtype), *args[1:])
        return hook

    def _skip_hook(self, index: int) -> Callable:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> Any:
            if self.active == "none" or self.schemes[self.active].kind != "skip" or index != self.skip_index:
                return None
            hidden = args[0] if args else kwargs["hidden_states"]
            return (hidden, *out[1:]) if isinstance(out, tuple) else hidden
        return hook

    @torch.no_grad()
    def _tensors(self, scheme: Scheme) -> dict[str, torch.Tensor]:
        if scheme.name in self._store:
            return self._store[scheme.name]
        out = {key: scheme.op(lin.weight.detach()) for key, lin in self.linears.items()}
        if self.cache:
            self._store[scheme.name] = out
        return out

    def use(self, name: str) -> None:
        if name not in self.schemes:
            raise ValueError(f"unknown compression scheme {name!r}; choose among {sorted(self.schemes)}")
        scheme = self.schemes[name]
        tensors = self._tensors(scheme) if scheme.op is not None else {}
        for key, lin in self.linears.items():
            lin.compressed = tensors[key] if scheme.kind == "weight" and tensors else None
            self.row_masks[key] = tensors[key] if scheme.kind == "rows" else None
            self.col_masks[key] = tensors[key] if scheme.kind == "cols" else None
        self.active = name

    def clear(self) -> None:
        """Forget cached compressed weights (after the base weights changed)."""
        self._store.clear()


def _adapted_owner(layer: torch.nn.Module, parent_name: str, leaf: str) -> torch.nn.Module:
    """The module whose output is the linear's full output: peft's LoRA layer when the linear is
    its `base_layer`, the linear itself otherwise."""
    if leaf == "base_layer":
        return layer.get_submodule(parent_name)
    return layer.get_submodule(f"{parent_name}.{leaf}" if parent_name else leaf)
