"""Plasticity diagnostics: critic-gradient norms and GraMa, feature rank, NTK Gram rank.

- Gradient statistics follow the paper's monitor: L1 and L2 norms of the whole critic gradient
  (both Q networks) and GraMa, the fraction of entries with |g| < 1e-8.
- Effective rank (srank, Kumar et al. 2021): the smallest k whose top-k singular values hold
  (1 - delta) of their sum.
- Feature rank: srank of the critic's penultimate features over a batch of (s, a) [B, H].
- NTK rank: srank of the per-sample Jacobian J [B, P] of Q1 with respect to all of its
  parameters; J's singular values are the square roots of the NTK Gram matrix J J^T's eigenvalues,
  the matrix whose rank collapse the paper ties to plasticity loss.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch.func import functional_call, jacrev, vmap

GRAMA_THRESHOLD = 1e-8


def grad_stats(params: Iterable[torch.nn.Parameter]) -> dict[str, float]:
    """L1 and L2 norms of the concatenated gradient and GraMa (fraction of |g| < 1e-8)."""
    grads = [p.grad.detach().flatten() for p in params if p.grad is not None]
    g = torch.cat(grads)
    return {
        "l1": float(g.abs().sum()),
        "l2": float(torch.linalg.vector_norm(g)),
        "grama": float((g.abs() < GRAMA_THRESHOLD).float().mean()),
    }


def effective_rank(singular_values: torch.Tensor, delta: float = 0.01) -> int:
    """srank_delta: min k with sum_{i<=k} s_i >= (1 - delta) sum_i s_i (s sorted descending)."""
    s = torch.sort(singular_values.detach().double().clamp_min(0), descending=True).values
    total = float(s.sum())
    if total <= 0:
        return 0
    cumulative = torch.cumsum(s, 0) / total
    # The tolerance keeps a sum that reaches 1 - delta only up to rounding from needing one more.
    return int((cumulative < (1 - delta) - 1e-12).sum()) + 1


def matrix_rank(m: torch.Tensor, delta: float = 0.01) -> int:
    """Effective rank of a matrix from its singular values."""
    return effective_rank(torch.linalg.svdvals(m.detach().double()), delta)


def feature_rank(features: torch.Tensor, delta: float = 0.01) -> int:
    """Effective rank of a [B, H] feature matrix."""
    return matrix_rank(features, delta)


def jacobian(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Per-sample gradients of the scalar output of `model(*x)` for each row, as a [B, P] matrix."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def one(p: dict[str, torch.Tensor], *x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, tuple(t.unsqueeze(0) for t in x)).reshape(())

    per_sample: dict[str, torch.Tensor] = vmap(jacrev(one), in_dims=(None, *([0] * len(inputs))))(params, *inputs)
    return torch.cat([g.reshape(g.shape[0], -1) for g in per_sample.values()], dim=1)


def ntk_rank(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], delta: float = 0.01) -> int:
    """Effective rank of the NTK Gram matrix's square-root spectrum, i.e. of the Jacobian [B, P]."""
    return matrix_rank(jacobian(model, inputs), delta)


def mean_of(fn: Callable[[], dict[str, float]], repeats: int) -> dict[str, float]:
    """Average every value of `fn()` over `repeats` calls."""
    total: dict[str, float] = {}
    for _ in range(repeats):
        for k, v in fn().items():
            total[k] = total.get(k, 0.0) + v
    return {k: v / repeats for k, v in total.items()}
