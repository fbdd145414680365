"""Contextual stochastic block model domains: batches of small dense graphs with a controllable
shift between a labelled source domain and an unlabelled target domain.

A domain is `n_graphs` graphs of `nodes` nodes each (dense adjacency, fixed size, no padding).
Every graph has balanced labels (node i of class i mod C, shuffled). Features are
x = mu_y + feature_std * eps; an edge joins i < j with probability p_in when y_i = y_j and p_out
otherwise. The target domain moves every class mean by `shift` along mu_1 - mu_0 (towards
class 1 from class 0), optionally rotates the means in the (mu_0, mu_1) plane, and has its own
(p_in, p_out): the homophily shift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Graphs:
    """A labelled batch of dense graphs: x [B, m, d], a [B, m, m] (0/1, symmetric, zero diagonal), y [B, m]."""

    x: torch.Tensor
    a: torch.Tensor
    y: torch.Tensor

    def unlabelled(self) -> "Unlabelled":
        return Unlabelled(self.x, self.a)

    def take(self, index: torch.Tensor | slice) -> "Graphs":
        return Graphs(self.x[index], self.a[index], self.y[index])


@dataclass(frozen=True)
class Unlabelled:
    """A batch of dense graphs without labels: what adaptation sees of the target domain."""

    x: torch.Tensor
    a: torch.Tensor


@dataclass(frozen=True)
class Domains:
    """The source (train and validation graphs, labelled) and the target; target labels are only
    for evaluation and never enter adaptation (`Domains.target.unlabelled()` is what it sees)."""

    source: Graphs
    source_val: Graphs
    target: Graphs
    means_source: torch.Tensor
    means_target: torch.Tensor


def class_means(classes: int, dim: int, sep: float, gen: torch.Generator) -> torch.Tensor:
    """[C, d] means on random orthonormal directions, every pair exactly `sep` apart."""
    q, _ = torch.linalg.qr(torch.randn(dim, classes, generator=gen, dtype=torch.float64))
    return (q.T * (sep / math.sqrt(2.0))).float()


def shifted_means(means: torch.Tensor, shift: float, rotation_deg: float) -> torch.Tensor:
    """Target means: rotate by `rotation_deg` in the (mu_0, mu_1) plane, then add shift * unit(mu_1 - mu_0)."""
    u = means[1] - means[0]
    u = u / u.norm()
    out = means.clone()
    if rotation_deg:
        v = means[0] - (means[0] @ u) * u  # the plane's second direction, orthogonal to u
        v = v / v.norm()
        c, s = math.cos(math.radians(rotation_deg)), math.sin(math.radians(rotation_deg))
        pu, pv = out @ u, out @ v
        rest = out - pu[:, None] * u - pv[:, None] * v
        out = rest + (c * pu - s * pv)[:, None] * u + (s * pu + c * pv)[:, None] * v
    return out + shift * u


def csbm(n_graphs: int, nodes: int, means: torch.Tensor, feature_std: float, p_in: float, p_out: float,
         gen: torch.Generator) -> Graphs:
    """`n_graphs` CSBM graphs of `nodes` nodes each with balanced labels."""
    classes, dim = means.shape
    base = torch.arange(nodes) % classes
    y = torch.stack([base[torch.randperm(nodes, generator=gen)] for _ in range(n_graphs)])  # [B, m]
    x = means[y] + feature_std * torch.randn(n_graphs, nodes, dim, generator=gen)
    same = y[:, :, None] == y[:, None, :]
    p = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
    upper = torch.triu(torch.ones(nodes, nodes, dtype=torch.bool), diagonal=1)
    draw = (torch.rand(n_graphs, nodes, nodes, generator=gen) < p) & upper
    a = (draw | draw.transpose(1, 2)).float()
    return Graphs(x, a, y)


def expected_homophily(nodes: int, classes: int, p_in: float, p_out: float) -> float:
    """Expected edge homophily of a balanced CSBM graph: p_in S / (p_in S + p_out D) over its
    same-class pairs S and different-class pairs D."""
    sizes = [len(range(c, nodes, classes)) for c in range(classes)]
    same = sum(s * (s - 1) / 2 for s in sizes)
    diff = nodes * (nodes - 1) / 2 - same
    return p_in * same / (p_in * same + p_out * diff)


def edge_homophily(a: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of edges whose ends share a label, pooled over the batch (nan without edges)."""
    same = (y[:, :, None] == y[:, None, :]).float()
    edges = float(a.sum())
    return float((a * same).sum()) / edges if edges else math.nan


def make_domains(*, seed: int, classes: int, nodes: int, dim: int, feature_sep: float, feature_std: float,
                 source_graphs: int, source_val_graphs: int, target_graphs: int,
                 source_p_in: float, source_p_out: float, target_p_in: float, target_p_out: float,
                 shift: float, rotation_deg: float) -> Domains:
    """Source and target domains drawn from `seed` alone (every arm of one seed sees the same data)."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    means_s = class_means(classes, dim, feature_sep, gen)
    means_t = shifted_means(means_s, shift, rotation_deg)
    src = csbm(source_graphs + source_val_graphs, nodes, means_s, feature_std, source_p_in, source_p_out, gen)
    tgt = csbm(target_graphs, nodes, means_t, feature_std, target_p_in, target_p_out, gen)
    return Domains(src.take(slice(0, source_graphs)), src.take(slice(source_graphs, None)), tgt, means_s, means_t)


def neighbour_mean(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """[B, m, d] mean feature of each node's neighbours (0 for an isolated node)."""
    deg = a.sum(-1, keepdim=True)
    return (a @ x) / deg.clamp(min=1.0)


def descriptors(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """[B * m, 2d + 1] per-node descriptor of feature and structure: x, neighbour mean, degree.
    The domain distances compare these, so a homophily shift shows as well as a feature shift."""
    deg = a.sum(-1, keepdim=True)
    return torch.cat([x, neighbour_mean(x, a), deg], -1).reshape(-1, 2 * x.shape[-1] + 1)
