"""The papers' graph-transfer datasets: one large attributed graph per domain, read from the MATLAB
files the cross-network node classification benchmarks are published in (ACDNE's release, which
pygda and the GDA papers' citation and Blog tasks use):

    DATA_DIR/<domain>.mat    e.g. acmv9.mat, citationv1.mat, dblpv7.mat, Blog1.mat, Blog2.mat

read by `scipy.io.loadmat`, with the variables `attrb` (node attributes [N, d], sparse or dense),
`network` (adjacency [N, N], sparse or dense; binarised, symmetrised, self loops dropped) and
`group` (labels [N, C], one column per class; a node's class is its first label, the argmax, as
pygda reads these files).

Both domains' attributes are projected together onto their top `dim` principal components (no
label is read: the target's attributes are unlabelled data adaptation may see) and scaled to unit
mean square, so that a GCN and the diffusion's VP prior see the same space; with d <= dim the
attributes are only centred and scaled. The GCN runs on each whole graph through a sparse
normalised adjacency; the diffusion runs on batches of small dense subgraphs cut from it by
breadth-first search (the released code diffuses a sampled subgraph too, densified).
"""

from __future__ import annotations

import difflib
import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp
import torch

from workloads.diffgda.data import Graphs, Unlabelled

PUBLISHED = {"acmv9": "citation", "citationv1": "citation", "dblpv7": "citation", "Blog1": "blog", "Blog2": "blog"}
"""The domains of the published release, by file stem, and the family each belongs to (a transfer
task pairs two domains of one family: they share the attribute vocabulary and the classes)."""
KEYS = ("attrb", "network", "group")
LAYOUT = ("DATA_DIR/<domain>.mat, MATLAB files read by scipy.io.loadmat with the variables attrb (node attributes "
          "[N, d]), network (adjacency [N, N]) and group (labels [N, C], one column per class)")
WHERE = ("the citation domains acmv9, citationv1, dblpv7 and the Blog domains Blog1, Blog2 are published with ACDNE "
         "(https://github.com/shenxiaocam/ACDNE, folder ACDNE_codes/input/) (the citation graphs UDAGCN and pygda also use, as text files); put the "
         ".mat files in one folder and set data_dir to it, source and target to file stems (e.g. acmv9, dblpv7)")


class NetworkDataError(ValueError):
    """A dataset folder or file that cannot be used as the config asks, with what to change."""


@dataclass(frozen=True)
class Network:
    """One domain's whole graph: x [N, d], the normalised sparse adjacency a_norm = D^-1/2 (A + I)
    D^-1/2 [N, N] (torch sparse), the 0/1 adjacency `adj` (scipy CSR, for subgraphs and statistics),
    labels y [N] (None: unlabelled, what adaptation sees of the target) and `mask` [N], the nodes
    whose labels count (training or selection; None: all)."""

    x: torch.Tensor
    a_norm: torch.Tensor
    adj: sp.csr_matrix
    y: torch.Tensor | None
    mask: torch.Tensor | None = None

    def unlabelled(self) -> "Network":
        return replace(self, y=None, mask=None)

    def only(self, mask: torch.Tensor) -> "Network":
        return replace(self, mask=mask)


def mat_path(data_dir: str, domain: str) -> Path:
    return Path(data_dir).expanduser() / f"{domain}.mat"


def check_files(data_dir: str, source: str, target: str, min_nodes: int) -> dict[str, tuple[int, int, int]]:
    """Preflight: both domains' files present, holding the three variables with consistent shapes
    (from the files' headers: scipy.io.whosmat, no matrix is read). Returns {domain: (N, d, C)}."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise NetworkDataError(f"data_dir={data_dir!r} is not a folder (a relative path is read from the folder the run "
                               f"starts in); expected {LAYOUT}: {WHERE}")
    present = sorted(p.stem for p in root.glob("*.mat"))
    shapes = {}
    for field, domain in (("source", source), ("target", target)):
        path = mat_path(data_dir, domain)
        if not path.is_file():
            near = difflib.get_close_matches(domain, present + list(PUBLISHED), n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            holds = ", ".join(f"{p}.mat" for p in present) or "no .mat file"
            raise NetworkDataError(f"{field}={domain!r}: no file {path.name} in data_dir={data_dir!r}{hint}; the folder "
                                   f"holds {holds}; expected {LAYOUT}: {WHERE}")
        try:
            found = {name: shape for name, shape, _ in scipy.io.whosmat(str(path))}
        except (OSError, ValueError, TypeError) as exc:
            raise NetworkDataError(f"{field}={domain!r}: {path} cannot be read as a MATLAB file: {exc}") from None
        missing = [k for k in KEYS if k not in found]
        if missing:
            raise NetworkDataError(f"{field}={domain!r}: {path.name} lacks the variable(s) {', '.join(missing)} "
                                   f"(it holds {', '.join(sorted(found)) or 'none'}); expected {LAYOUT}")
        (n, d), net, (ng, c) = found["attrb"], found["network"], found["group"]
        if net != (n, n) or ng != n:
            raise NetworkDataError(f"{field}={domain!r}: {path.name} has attrb {found['attrb']}, network {net} and group "
                                   f"{found['group']}: expected [N, d], [N, N] and [N, C] for one N")
        if c < 2:
            raise NetworkDataError(f"{field}={domain!r}: {path.name}'s group has {c} column(s): need one per class, >= 2")
        if n < min_nodes:
            raise NetworkDataError(f"{field}={domain!r}: {path.name} has {n} nodes, fewer than nodes={min_nodes} "
                                   f"of one diffusion subgraph: lower nodes")
        shapes[domain] = (n, d, c)
    (_, ds, cs), (_, dt, ct) = shapes[source], shapes[target]
    if ds != dt or cs != ct:
        raise NetworkDataError(f"source={source!r} has {ds} attributes and {cs} classes, target={target!r} has {dt} and "
                               f"{ct}: a transfer task pairs domains of one family (same attributes, same classes)")
    return shapes


def read_mat(path: Path) -> tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray, int]:
    """(attributes [N, d] CSR float, 0/1 symmetric adjacency without self loops [N, N] CSR, labels
    [N] int64, class count C) of one published .mat file."""
    net = scipy.io.loadmat(str(path))
    x = sp.csr_matrix(net["attrb"], dtype=np.float64)
    a = sp.csr_matrix(net["network"])
    a = ((a + a.T) != 0).astype(np.float64)
    a.setdiag(0)
    a.eliminate_zeros()
    group = net["group"]
    group = group.toarray() if sp.issparse(group) else np.asarray(group)
    return x, sp.csr_matrix(a), np.asarray(group.argmax(1)).reshape(-1).astype(np.int64), group.shape[1]


def project(xs: sp.csr_matrix, xt: sp.csr_matrix, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both domains' attributes on the top `dim` principal components of the pooled attributes
    (randomised PCA with a fixed seed), scaled to unit mean square; d <= dim: centred and scaled."""
    pooled = sp.vstack([xs, xt]).tocoo()
    mean = torch.from_numpy(np.asarray(pooled.mean(0)).reshape(-1)).float()
    dense = lambda m: torch.from_numpy(m.toarray()).float()  # noqa: E731
    if pooled.shape[1] <= dim:
        zs, zt = dense(xs) - mean, dense(xt) - mean
    else:
        idx = torch.from_numpy(np.vstack([pooled.row, pooled.col]).astype(np.int64))
        a = torch.sparse_coo_tensor(idx, torch.from_numpy(pooled.data).float(), pooled.shape,
                                    check_invariants=True).coalesce()
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # pca_lowrank builds sparse tensors of its own (from this valid one) without asking for checks
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
            torch.manual_seed(0)
            _, _, v = torch.pca_lowrank(a, q=dim, center=True, niter=4)  # [d, dim]
        shift = mean @ v
        zs = torch.from_numpy((xs @ v.double().numpy())).float() - shift
        zt = torch.from_numpy((xt @ v.double().numpy())).float() - shift
    scale = torch.cat([zs, zt]).pow(2).mean().sqrt().clamp(min=1e-12)
    return zs / scale, zt / scale


def normalised(a: sp.csr_matrix) -> torch.Tensor:
    """D^-1/2 (A + I) D^-1/2 as a torch sparse COO tensor (the GCN's propagation on a whole graph)."""
    a = (a + sp.eye(a.shape[0], format="csr")).tocoo()
    d = np.asarray(a.sum(1)).reshape(-1) ** -0.5
    vals = d[a.row] * a.data * d[a.col]
    idx = torch.from_numpy(np.vstack([a.row, a.col]).astype(np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(vals).float(), a.shape, check_invariants=True).coalesce()


def load_pair(data_dir: str, source: str, target: str, dim: int) -> tuple[Network, Network, int]:
    """(source Network, target Network, class count): both read, projected together, labelled (the
    target's labels are for `evaluate` alone: adaptation receives `target.unlabelled()`)."""
    xs, as_, ys, c = read_mat(mat_path(data_dir, source))
    xt, at, yt, _ = read_mat(mat_path(data_dir, target))
    zs, zt = project(xs, xt, dim)
    return (Network(zs, normalised(as_), as_, torch.from_numpy(ys)),
            Network(zt, normalised(at), at, torch.from_numpy(yt)), c)


def split_nodes(n: int, val_frac: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(training mask, held-out mask) of a random val_frac of n nodes."""
    held = torch.zeros(n, dtype=torch.bool)
    held[torch.randperm(n, generator=gen)[: round(val_frac * n)]] = True
    return ~held, held


def bfs_nodes(adj: sp.csr_matrix, size: int, allowed: np.ndarray, gen: torch.Generator) -> np.ndarray:
    """`size` nodes of one connected neighbourhood: breadth-first from a random allowed node,
    neighbours in random order, restarting from another random node when a component runs out."""
    taken: list[int] = []
    seen = np.zeros(adj.shape[0], dtype=bool)
    seen[~allowed] = True
    queue: list[int] = []
    while len(taken) < size:
        if not queue:
            free = np.flatnonzero(~seen)
            start = int(free[int(torch.randint(len(free), (1,), generator=gen))])
            seen[start] = True
            queue.append(start)
        node = queue.pop(0)
        taken.append(node)
        nb = adj.indices[adj.indptr[node]: adj.indptr[node + 1]]
        nb = nb[~seen[nb]]
        nb = nb[torch.randperm(len(nb), generator=gen).numpy()]
        seen[nb] = True
        queue.extend(int(v) for v in nb)
    return np.asarray(taken, dtype=np.int64)


def subgraphs(net: Network, labels: torch.Tensor | None, count: int, size: int, gen: torch.Generator,
              mask: torch.Tensor | None = None) -> Graphs | Unlabelled:
    """A batch of `count` dense subgraphs of `size` nodes cut from the graph by breadth-first search
    over the nodes in `mask` (None: all): x [B, m, d], a [B, m, m], y [B, m] (Unlabelled without labels)."""
    allowed = np.ones(net.adj.shape[0], dtype=bool) if mask is None else mask.numpy()
    idx = [bfs_nodes(net.adj, size, allowed, gen) for _ in range(count)]
    x = torch.stack([net.x[torch.from_numpy(i)] for i in idx])
    a = torch.stack([torch.from_numpy(net.adj[i][:, i].toarray()).float() for i in idx])
    if labels is None:
        return Unlabelled(x, a)
    return Graphs(x, a, torch.stack([labels[torch.from_numpy(i)] for i in idx]))


def homophily(adj: sp.csr_matrix, y: torch.Tensor) -> float:
    """Fraction of a whole graph's edges whose ends share a label (nan without edges)."""
    a = sp.triu(adj, k=1).tocoo()
    if not a.nnz:
        return math.nan
    yy = y.numpy()
    return float((yy[a.row] == yy[a.col]).mean())
