"""Networks on dense graph batches: the joint score network over (X, A), the time-dependent domain
network that gives the density-ratio guidance, the GCN node classifier; MMD and Macro-F1."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def time_features(t: torch.Tensor, count: int = 8) -> torch.Tensor:
    """[B, 2 * count + 1] Fourier features of t in [0, 1]."""
    k = torch.arange(1, count + 1, dtype=t.dtype) * math.pi
    return torch.cat([t[:, None], torch.sin(t[:, None] * k), torch.cos(t[:, None] * k)], -1)


class GraphBlock(nn.Module):
    """Residual message passing on a continuous (noisy) adjacency: h + MLP([h, A h / sqrt(m), t])."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, h: torch.Tensor, a: torch.Tensor, te: torch.Tensor) -> torch.Tensor:
        agg = a @ h / math.sqrt(a.shape[-1])  # noisy A has entries of either sign: no degree normalisation
        return self.norm(h + self.mlp(torch.cat([h, agg, te.expand_as(h)], -1)))


class ScoreNet(nn.Module):
    """GDSS-style joint noise predictor: a shared trunk of graph blocks over [x_t, onehot(y)] and
    a_t, an X head per node and an A head per node pair (from h_i * h_j, a_t and (a_t^2)_ij).
    The labels y condition every step and are never noised: they are carried along."""

    def __init__(self, dim: int, classes: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.classes = classes
        self.inp = nn.Linear(dim + classes, hidden)
        self.time = nn.Sequential(nn.Linear(17, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(GraphBlock(hidden) for _ in range(layers))
        self.head_x = nn.Linear(hidden, dim)
        self.pair = nn.Linear(hidden, hidden)
        self.edge_in = nn.Linear(2, hidden)
        self.head_a = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor, a: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = x.shape[1]
        te = self.time(time_features(t))[:, None, :]  # [B, 1, H]
        h = self.inp(torch.cat([x, F.one_hot(y, self.classes).float()], -1)) + te
        for block in self.blocks:
            h = block(h, a, te)
        p = self.pair(h)
        edges = torch.stack([a, a @ a / math.sqrt(m)], -1)  # [B, m, m, 2]
        e = p[:, :, None, :] * p[:, None, :, :] + self.edge_in(edges) + te[:, :, None, :]
        ea = self.head_a(e).squeeze(-1)
        ea = 0.5 * (ea + ea.transpose(-1, -2)) * (1.0 - torch.eye(m))
        return self.head_x(h), ea


class DomainNet(nn.Module):
    """Per-node domain logit of a noisy graph (x_t, a_t, t); no label enters it unless `classes`
    is set (the ratio network, trained on labelled source graphs only). Inputs per node:
    x, the neighbour sum A x / sqrt(m), their product (feature agreement, which reveals homophily)
    and the degree, then graph blocks. Trained as a source-vs-target classifier its logit is the
    log density ratio log p_target,t / p_source,t of the noisy node marginals; trained by
    regression it is log h_t (see workload)."""

    def __init__(self, dim: int, hidden: int, layers: int, classes: int = 0) -> None:
        super().__init__()
        self.classes = classes  # > 0: the labels are an input too (the ratio network, trained on source only)
        self.inp = nn.Linear(3 * dim + 1 + classes, hidden)
        self.time = nn.Sequential(nn.Linear(17, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(GraphBlock(hidden) for _ in range(layers))
        self.out = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor, a: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        m = x.shape[1]
        agg = a @ x / math.sqrt(m)
        deg = a.sum(-1, keepdim=True) / math.sqrt(m)
        te = self.time(time_features(t))[:, None, :]
        parts = [x, agg, x * agg, deg]
        if self.classes:
            parts.append(F.one_hot(y, self.classes).float())
        h = self.inp(torch.cat(parts, -1)) + te
        for block in self.blocks:
            h = block(h, a, te)
        return self.out(h).squeeze(-1)  # [B, m]


def gcn_norm(a: torch.Tensor) -> torch.Tensor:
    """D^-1/2 (A + I) D^-1/2 of a batch of 0/1 adjacencies."""
    a = a + torch.eye(a.shape[-1])
    d = a.sum(-1).rsqrt()
    return d[..., :, None] * a * d[..., None, :]


class GCN(nn.Module):
    """Kipf-Welling GCN on dense batches; returns (logits, last hidden embedding)."""

    def __init__(self, dim: int, hidden: int, classes: int, layers: int, dropout: float) -> None:
        super().__init__()
        sizes = [dim] + [hidden] * (layers - 1)
        self.hidden = nn.ModuleList(nn.Linear(i, o) for i, o in zip(sizes[:-1], sizes[1:]))
        self.out = nn.Linear(sizes[-1], classes)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, a_norm: torch.Tensor, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = x
        for lin in self.hidden:
            h = torch.relu(a_norm @ lin(h))
            if self.training and self.dropout:  # own mask so that a generator makes it reproducible
                keep = (torch.rand(h.shape, generator=gen) >= self.dropout).float()
                h = h * keep / (1.0 - self.dropout)
        return a_norm @ self.out(h), h


def mmd2(a: torch.Tensor, b: torch.Tensor, bandwidths: torch.Tensor) -> torch.Tensor:
    """Biased MMD^2 between samples a [n, k] and b [n', k] with a sum of RBF kernels
    exp(-|u - v|^2 / (2 s^2)) over the bandwidths s."""
    def k(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        d2 = torch.cdist(u, v).pow(2)
        return sum(torch.exp(-d2 / (2 * s * s)) for s in bandwidths)
    return k(a, a).mean() + k(b, b).mean() - 2 * k(a, b).mean()


def median_bandwidths(a: torch.Tensor, b: torch.Tensor, factors: tuple[float, ...] = (0.5, 1.0, 2.0)) -> torch.Tensor:
    """Bandwidths around the median pairwise distance of the pooled samples."""
    pooled = torch.cat([a, b])
    d = torch.cdist(pooled, pooled)
    med = d[d > 0].median()
    return torch.tensor(factors) * med


def macro_f1(pred: torch.Tensor, true: torch.Tensor, classes: int) -> float:
    """Unweighted mean over classes of F1 = 2 TP / (2 TP + FP + FN); a class that is neither
    present nor predicted is left out (as sklearn's labels=present classes)."""
    scores = []
    for c in range(classes):
        tp = int(((pred == c) & (true == c)).sum())
        fp = int(((pred == c) & (true != c)).sum())
        fn = int(((pred != c) & (true == c)).sum())
        if tp + fp + fn:
            scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores) if scores else math.nan


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, coeff: float) -> torch.Tensor:
        ctx.coeff = coeff
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.coeff * grad, None


def grad_reverse(x: torch.Tensor, coeff: float) -> torch.Tensor:
    """Identity forward, gradient times -coeff backward (Ganin & Lempitsky's gradient reversal layer)."""
    return _GradReverse.apply(x, coeff)


def grl_coeff(progress: float) -> float:
    """DANN's schedule of the reversal coefficient, 2 / (1 + exp(-10 p)) - 1, from 0 to ~1 over training."""
    return 2.0 / (1.0 + math.exp(-10.0 * progress)) - 1.0


class DomainDiscriminator(nn.Module):
    """DANN's domain classifier on node embeddings (Ganin et al. 2016, "Domain-Adversarial Training of
    Neural Networks", https://arxiv.org/abs/1505.07818): an MLP with one hidden layer, a logit per node
    (source 0, target 1). Behind a gradient reversal layer, the GCN learns embeddings it cannot tell apart."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h).squeeze(-1)
