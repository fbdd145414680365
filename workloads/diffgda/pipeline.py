"""The stages of one DiffGDA trial as steps a loop can interleave with reports and checkpoints:
a score-model step, a guidance-network step, the evolution of the source graphs, a GCN epoch;
and the label-free domain distances. Nothing here takes target labels: the target enters only
as `Unlabelled` graphs."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from workloads.diffgda.data import Graphs, Unlabelled, descriptors
from workloads.diffgda.model import (
    GCN, DomainDiscriminator, DomainNet, ScoreNet, gcn_norm, grad_reverse, grl_coeff, macro_f1, median_bandwidths, mmd2,
)
from workloads.diffgda.networks import Network
from workloads.diffgda.sde import SDE, T_EPS, dsm_loss, perturb, reverse_sample, sym_noise


def _batch(n: int, size: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(n, generator=gen)[:size] if size < n else torch.arange(n)


def score_step(net: ScoreNet, opt: torch.optim.Optimizer, sde_x: SDE, sde_a: SDE, source: Graphs,
               batch: int, gen: torch.Generator) -> float:
    """One denoising-score-matching step on a batch of labelled source graphs."""
    idx = _batch(source.x.shape[0], batch, gen)
    y = source.y[idx]
    loss_x, loss_a = dsm_loss(lambda x, a, t: net(x, a, y, t), sde_x, sde_a, source.x[idx], source.a[idx], gen)
    loss = loss_x + loss_a
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def _noised(sde_x: SDE, sde_a: SDE, x: torch.Tensor, a: torch.Tensor, t: torch.Tensor,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    mask = 1.0 - torch.eye(a.shape[-1])
    return (perturb(sde_x, x, t, torch.randn(x.shape, generator=gen)),
            perturb(sde_a, a, t, sym_noise(a.shape, gen)) * mask)


def classifier_step(net: DomainNet, opt: torch.optim.Optimizer, sde_x: SDE, sde_a: SDE, source: Graphs,
                    target: Unlabelled, batch: int, gen: torch.Generator) -> float:
    """One step of the time-dependent domain classifier: source nodes 0, target nodes 1, both
    noised to the same random t per graph pair. Balanced batches make its logit the log density
    ratio of the noisy marginals, the guidance's estimate."""
    i_s, i_t = _batch(source.x.shape[0], batch, gen), _batch(target.x.shape[0], batch, gen)
    b = min(len(i_s), len(i_t))
    i_s, i_t = i_s[:b], i_t[:b]
    t = T_EPS + (1.0 - T_EPS) * torch.rand(b, generator=gen)
    xs, as_ = _noised(sde_x, sde_a, source.x[i_s], source.a[i_s], t, gen)
    xt, at = _noised(sde_x, sde_a, target.x[i_t], target.a[i_t], t, gen)
    logits = torch.cat([net(xs, as_, t), net(xt, at, t)])
    labels = torch.cat([torch.zeros(b, xs.shape[1]), torch.ones(b, xt.shape[1])])
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def ratio_step(h: DomainNet, opt: torch.optim.Optimizer, clf: DomainNet, sde_x: SDE, sde_a: SDE,
               source: Graphs, batch: int, clip: float, gen: torch.Generator) -> float:
    """One step of the TGDP-style guidance network: exp(h(G_t, y, t)) regressed onto the clean
    per-node density ratio r_i(G_0) = exp(classifier logit at t ~ 0), over source graphs only, so
    that h_t = E[r(G_0) | G_t, y] and grad log h_t is the exact guidance of p_source * r."""
    idx = _batch(source.x.shape[0], batch, gen)
    x0, a0, y = source.x[idx], source.a[idx], source.y[idx]
    with torch.no_grad():
        r = clf(x0, a0, torch.full((len(idx),), T_EPS)).exp().clamp(max=clip)
    t = T_EPS + (1.0 - T_EPS) * torch.rand(len(idx), generator=gen)
    xt, at = _noised(sde_x, sde_a, x0, a0, t, gen)
    loss = ((h(xt, at, t, y).exp() - r) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def evolve(net: ScoreNet, sde_x: SDE, sde_a: SDE, source: Graphs, copies: int, *, steps: int,
           gen: torch.Generator, guide=None, scale: float = 0.0, adj_scale: float | None = None,
           t_start: float = 1.0) -> Graphs:
    """`copies` evolved graphs per source graph: the reverse SDE conditioned on the source graph's
    labels (which every evolved graph keeps), from the prior (t_start = 1) or from the source graph
    noised to t_start, with the guidance added at `scale` on X and `adj_scale` on A (default
    `scale`). Edges are a_0 > 1/2."""
    y = source.y.repeat(copies, 1)
    start = None if t_start >= 1.0 else (source.x.repeat(copies, 1, 1), source.a.repeat(copies, 1, 1))
    g = None if guide is None else (lambda x, a, t: guide(x, a, t, y))
    x, a = reverse_sample(lambda x, a, t: net(x, a, y, t), sde_x, sde_a, tuple(y.shape) + (source.x.shape[-1],),
                          steps=steps, gen=gen, guide=g, scale=scale, adj_scale=adj_scale, start=start,
                          t_start=t_start)
    return Graphs(x, (a > 0.5).float(), y)


Part = Graphs | Unlabelled | Network
"""What a GCN reads: a batch of small dense graphs, or one whole graph with a sparse adjacency."""


def _forward(gcn: GCN, part: Part, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [n, C], embeddings [n, H]) of every node of the part, flattened over its graphs."""
    if isinstance(part, Network):
        return gcn(part.x, part.a_norm, gen)
    logits, emb = gcn(part.x, gcn_norm(part.a), gen)
    return logits.reshape(-1, logits.shape[-1]), emb.reshape(-1, emb.shape[-1])


def _labelled(part: Graphs | Network, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, labels) of the nodes whose labels count: all of a batch, a network's `mask`."""
    if isinstance(part, Network) and part.mask is not None:
        return rows[part.mask], part.y[part.mask]
    return rows, part.y.reshape(-1)


def gcn_epoch(gcn: GCN, opt: torch.optim.Optimizer, train: Graphs | Network | list, target: Unlabelled | Network,
              mmd_weight: float, gen: torch.Generator, *, disc: DomainDiscriminator | None = None,
              dann_weight: float = 0.0, progress: float = 0.0) -> tuple[float, dict[str, float]]:
    """One full-batch epoch: cross-entropy on the labelled nodes of the training parts (+ mmd_weight
    * MMD^2 between their node embeddings and the target's, the released code's alignment term and,
    alone, the MMD baseline: Long et al. 2015, "Learning Transferable Features with Deep Adaptation
    Networks", https://arxiv.org/abs/1502.02791, a multi-kernel RBF MMD^2 on one layer's embeddings;
    + dann_weight * the domain classifier's cross-entropy behind a gradient reversal layer, DANN).
    Returns the loss and the domain classifier's loss and accuracy when it trains."""
    gcn.train()
    parts = train if isinstance(train, list) else [train]
    logits, emb, ys = [], [], []
    for part in parts:
        lo, em = _forward(gcn, part, gen)
        lo, y = _labelled(part, lo)
        logits.append(lo)
        ys.append(y)
        emb.append(_labelled(part, em)[0])
    logits, emb = (logits[0], emb[0]) if len(parts) == 1 else (torch.cat(logits), torch.cat(emb))
    loss = F.cross_entropy(logits, torch.cat(ys) if len(ys) > 1 else ys[0])
    extra: dict[str, float] = {}
    if mmd_weight or (disc is not None and dann_weight):
        _, emb_t = _forward(gcn, target, gen)
    if mmd_weight:
        es, et = emb, emb_t
        es = es[_batch(len(es), 512, gen)]
        et = et[_batch(len(et), 512, gen)]
        loss = loss + mmd_weight * mmd2(es, et, median_bandwidths(es.detach(), et.detach()))
    if disc is not None and dann_weight:
        coeff = grl_coeff(progress)
        ds, dt = disc(grad_reverse(emb, coeff)), disc(grad_reverse(emb_t, coeff))
        # each domain weighs half, whatever its node count
        dom = 0.5 * (F.binary_cross_entropy_with_logits(ds, torch.zeros_like(ds))
                     + F.binary_cross_entropy_with_logits(dt, torch.ones_like(dt)))
        loss = loss + dann_weight * dom
        extra["train/domain_loss"] = float(dom.detach())
        extra["train/domain_acc"] = 0.5 * (float((ds < 0).float().mean()) + float((dt > 0).float().mean()))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach()), extra


def gcn_sets(source: Graphs | Network, source_val: Graphs | Network, evolved: Graphs | None, n_val: int, *,
             select_by: str, train_on: str) -> tuple[Graphs | Network | list, Graphs | Network | None]:
    """(training parts, selection part) of the GCN, labelled only: select_by 'evolved' holds out the
    first n_val evolved graphs, 'source' uses the held-out source graphs (or nodes), 'last' none.
    A whole source graph and evolved subgraphs train side by side, as one disjoint union."""
    val = {"source": source_val, "last": None}.get(select_by)
    if evolved is None:
        return source, val
    if select_by == "evolved":
        val, evolved = evolved.take(slice(0, n_val)), evolved.take(slice(n_val, None))
    if train_on == "evolved":
        return evolved, val
    if isinstance(source, Network):
        return [source, evolved], val
    return Graphs(torch.cat([source.x, evolved.x]), torch.cat([source.a, evolved.a]), torch.cat([source.y, evolved.y])), val


@torch.no_grad()
def predict(gcn: GCN, graphs: Part) -> torch.Tensor:
    gcn.eval()
    if isinstance(graphs, Network):
        return gcn(graphs.x, graphs.a_norm)[0].argmax(-1)
    return gcn(graphs.x, gcn_norm(graphs.a))[0].argmax(-1)


def f1_on(gcn: GCN, graphs: Graphs | Network, classes: int) -> float:
    """Macro-F1 over the labelled nodes (a network's `mask`, else all)."""
    pred, y = _labelled(graphs, predict(gcn, graphs).reshape(-1))
    return macro_f1(pred, y, classes)


METRIC_NODES = 4096
"""Most node descriptors per side the MMD distances compare: a larger set (the subgraphs of a
whole graph) is subsampled, always the same way, so that the N x N kernels stay small."""


def _descriptors(graphs: Graphs | Unlabelled) -> torch.Tensor:
    d = descriptors(graphs.x, graphs.a)
    if len(d) > METRIC_NODES:
        d = d[torch.randperm(len(d), generator=torch.Generator().manual_seed(0))[:METRIC_NODES]]
    return d


def domain_bandwidths(source: Graphs, target: Unlabelled) -> torch.Tensor:
    """MMD bandwidths fixed by the source and target descriptors, so that every arm of a seed is
    measured with the same kernel."""
    return median_bandwidths(_descriptors(source), _descriptors(target))


def mmd_distance(graphs: Graphs | Unlabelled, target: Unlabelled, bandwidths: torch.Tensor) -> float:
    """MMD^2 between the node descriptors (x, neighbour mean, degree) of two sets of graphs."""
    return float(mmd2(_descriptors(graphs), _descriptors(target), bandwidths))


def classifier_distance(graphs: Graphs | Unlabelled, target: Unlabelled, seed: int, steps: int = 300) -> float:
    """Held-out accuracy of a fresh MLP told these graphs' nodes from the target's (0.5: the
    domains are indistinguishable to it); a random half of each side's nodes trains it, the rest test it."""
    gen = torch.Generator().manual_seed(seed)
    a, b = descriptors(graphs.x, graphs.a), descriptors(target.x, target.a)
    n = min(len(a), len(b))
    a, b = a[torch.randperm(len(a), generator=gen)[:n]], b[torch.randperm(len(b), generator=gen)[:n]]
    feats = torch.cat([a, b])
    mu, sd = feats.mean(0), feats.std(0).clamp(min=1e-6)
    feats = (feats - mu) / sd
    labels = torch.cat([torch.zeros(n), torch.ones(n)])
    half = torch.zeros(2 * n, dtype=torch.bool)
    half[: n // 2] = True
    half[n: n + n // 2] = True
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mlp = torch.nn.Sequential(torch.nn.Linear(feats.shape[1], 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(mlp(feats[half]).squeeze(-1), labels[half])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = (mlp(feats[~half]).squeeze(-1) > 0).float()
    return float((pred == labels[~half]).float().mean())


def intermediate_graphs(source: Graphs, target: Unlabelled, pseudo: torch.Tensor, lam: float,
                        gen: torch.Generator) -> Graphs:
    """One discrete intermediate domain at ratio `lam` between source and target graphs (the
    baseline mode='gradual'): GIFT's class-matched interpolation (Abnar et al. 2021, "Gradual Domain
    Adaptation in the Wild: When Intermediate Distributions are Absent", https://arxiv.org/abs/2106.06080)
    carried over to graphs. Each source graph is paired with a random target graph; each source node
    with a node of that graph the current GCN pseudo-labels (`pseudo` [B_t, m]) as its class (any
    node when none is), so the mixture keeps the source label. Features mix linearly,
    x = (1 - lam) x_s + lam x_t[match]; every node pair takes the target's edge between the matched
    nodes with probability lam, else the source edge. The labels are the source's."""
    b, m = source.y.shape
    pair = torch.randint(target.x.shape[0], (b,), generator=gen)
    match = torch.empty(b, m, dtype=torch.long)
    for i in range(b):  # B * C small index lists: the pairing stays readable
        for c in source.y[i].unique():
            rows = (source.y[i] == c).nonzero().squeeze(-1)
            pool = (pseudo[pair[i]] == c).nonzero().squeeze(-1)
            pool = pool if len(pool) else torch.arange(m)
            match[i, rows] = pool[torch.randint(len(pool), (len(rows),), generator=gen)]
    xt = target.x[pair[:, None], match]  # [B, m, d]
    at = target.a[pair[:, None, None], match[:, :, None], match[:, None, :]]  # [B, m, m]; a repeated match gives 0
    take = torch.triu(torch.rand(b, m, m, generator=gen) < lam, diagonal=1)
    take = take | take.transpose(1, 2)  # one draw per node pair: the mixture stays symmetric
    a = torch.where(take, at, source.a) * (1.0 - torch.eye(m))
    return Graphs((1.0 - lam) * source.x + lam * xt, a, source.y.clone())
