"""SVFT, the singular-vector baseline PiCa's paper compares with: Lingam et al., "SVFT: Parameter-Efficient
Fine-Tuning with Singular Vectors" (NeurIPS 2024) — https://arxiv.org/abs/2405.19597

Each frozen weight W0 = U S V^T (PyTorch's (out, in) layout, thin SVD, k = min(out, in)) is updated as
W = W0 + U M V^T, with U [out, k] and V [in, k] the frozen singular vectors of W0 and M [k, k] a
trainable sparse matrix, zero at the start (the update starts at zero: the base model's outputs).
M's pattern is the paper's variants: the diagonal only (SVFT^P, `bands=0`), the diagonal and `bands`
off-diagonals on each side (banded, SVFT^B_d), or the diagonal plus as many off-diagonal entries as
the banded pattern has, at uniformly random positions (SVFT^R_d). One M per layer: the trainable
count is the number of M's non-zero positions summed over the wrapped layers.
"""

from __future__ import annotations

import copy
from typing import Iterable, Literal

import torch
from torch import nn
from torch.nn import functional as F

from components.basemodel import as_linear, select, weight_oi

Pattern = Literal["banded", "random"]


def band_count(k: int, bands: int) -> int:
    """Non-zeros of a k x k matrix's diagonal and `bands` off-diagonals on each side."""
    d = min(bands, k - 1)
    return k * (2 * d + 1) - d * (d + 1)


def positions(k: int, bands: int, pattern: Pattern, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of M's trainable entries: the diagonal first, then the off-diagonal ones; `random` draws
    band_count(k, bands) - k off-diagonal positions uniformly without replacement."""
    diag = torch.arange(k)
    if pattern == "banded":
        i, j = torch.meshgrid(diag, diag, indexing="ij")
        off = ((i - j).abs() <= bands) & (i != j)
        return torch.cat([diag, i[off]]), torch.cat([diag, j[off]])
    if pattern != "random":
        raise ValueError(f"pattern must be 'banded' or 'random', got {pattern!r}")
    n_off = band_count(k, bands) - k
    flat = torch.arange(k * k).view(k, k)
    candidates = flat[~torch.eye(k, dtype=torch.bool)]  # every off-diagonal position
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:n_off]].sort().values
    return torch.cat([diag, chosen // k]), torch.cat([diag, chosen % k])


class SVFTLinear(nn.Module):
    """A frozen `nn.Linear` plus U M V^T, M sparse on fixed positions holding the trainable `values`."""

    def __init__(self, base: nn.Linear, bands: int, pattern: Pattern = "banded", generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.base = base
        w = weight_oi(base)
        u, _, vh = torch.linalg.svd(w.detach().double(), full_matrices=False)
        k = u.shape[1]
        self.register_buffer("u", u.to(w.dtype))  # [out, k]
        self.register_buffer("v", vh.T.contiguous().to(w.dtype))  # [in, k]
        rows, cols = positions(k, bands, pattern, generator)
        self.register_buffer("rows", rows)
        self.register_buffer("cols", cols)
        self.values = nn.Parameter(torch.zeros(len(rows), dtype=w.dtype, device=w.device))

    def m(self) -> torch.Tensor:
        """M [k, k], zero off the pattern."""
        k = self.u.shape[1]
        return torch.zeros(k, k, dtype=self.values.dtype, device=self.values.device).index_put((self.rows, self.cols), self.values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x V M^T U^T through the k-dim bottleneck: U M V^T is never materialised.
        h = F.linear(x, self.v.T.to(x.dtype))  # [..., k]
        return self.base(x) + F.linear(F.linear(h, self.m().to(x.dtype)), self.u.to(x.dtype))

    def delta(self) -> torch.Tensor:
        """The weight update U M V^T, [out, in]."""
        return self.u @ self.m() @ self.v.T

    def merged(self) -> nn.Linear:
        """A plain Linear holding W0 + U M V^T (and the base bias)."""
        out = copy.deepcopy(self.base)
        with torch.no_grad():
            out.weight.copy_(self.base.weight + self.delta().to(self.base.weight.dtype))
        return out


class SVFT(nn.Module):
    """Attaches SVFT to every projection of `model` whose kind is in `targets`, in place (base frozen)."""

    def __init__(self, model: nn.Module, targets: Iterable[str], bands: int, *, pattern: Pattern = "banded", seed: int = 0) -> None:
        super().__init__()
        found = select(model, list(targets), what="SVFT targets")
        for p in model.parameters():
            p.requires_grad_(False)
        gen = torch.Generator().manual_seed(seed)
        self.layers: dict[str, SVFTLinear] = {}
        for name, proj in found.items():
            parent_name, _, leaf = name.rpartition(".")
            wrapped = SVFTLinear(as_linear(proj.module), bands, pattern, gen)
            setattr(model.get_submodule(parent_name), leaf, wrapped)
            self.layers[name] = wrapped

    def parameters_list(self) -> list[nn.Parameter]:
        return [layer.values for layer in self.layers.values()]

    def trainable(self) -> int:
        return sum(layer.values.numel() for layer in self.layers.values())


def svft_count(model: nn.Module, targets: Iterable[str], bands: int) -> int:
    """SVFT's trainable count on `model` with `bands` off-diagonals (either pattern: the same count)."""
    return sum(band_count(min(weight_oi(p.module).shape), bands) for p in select(model, list(targets), what="SVFT targets").values())


def matched_bands(model: nn.Module, targets: Iterable[str], budget: int, *, most: int = 64) -> int:
    """The off-diagonal count d >= 0 whose SVFT count is nearest `budget` (ties: the smaller d)."""
    counts = [(abs(svft_count(model, targets, d) - budget), d) for d in range(most + 1)]
    return min(counts)[1]


def merge(model: nn.Module) -> nn.Module:
    """A copy of `model` with every SVFTLinear replaced by its merged plain Linear."""
    out = copy.deepcopy(model)
    for module in list(out.modules()):
        for leaf, child in list(module.named_children()):
            if isinstance(child, SVFTLinear):
                setattr(module, leaf, child.merged())
    return out
