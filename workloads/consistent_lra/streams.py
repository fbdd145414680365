"""The row streams: generated in full from the seed (or read from a file, `data.py`), so a
restarted run replays the same rows.

Every stream is a float64 [n, d] matrix, fed to the algorithms one row at a time. Where a stream is
built in coordinates (flip, emerging), a seeded random rotation is applied last: cost and recourse
are invariant under A -> AQ, and the rotation keeps the subspaces off the coordinate axes.
"""

from __future__ import annotations

import torch

STREAMS = ("flip", "gaussian", "emerging", "randint", "file", "bundled")
# Real tables that ship inside scikit-learn (a dependency), so they stream offline: name -> (rows, columns).
BUNDLED = {"digits": (1797, 64), "breast_cancer": (569, 30), "wine": (178, 13), "diabetes": (442, 10)}


def _rotation(d: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))  # Haar-distributed: fix QR's sign ambiguity


def flip(n: int, d: int, k: int, noise: float, gen: torch.Generator) -> torch.Tensor:
    """k interleaved alternating pairs: row t (1-based) feeds pair j = (t-1) mod k with sqrt(t)
    on the pair's coordinate that its previous row did not use, so the newest row always makes
    its coordinate the pair's leader and the best rank-k subspace changes at every row.
    Coordinates past 2k carry noise only."""
    a = torch.zeros(n, d, dtype=torch.float64)
    t = torch.arange(1, n + 1)
    pair = (t - 1) % k
    visit = (t - 1) // k
    a[t - 1, 2 * pair + visit % 2] = torch.sqrt(t.to(torch.float64))
    a += noise * torch.randn(n, d, generator=gen, dtype=torch.float64)
    return a @ _rotation(d, gen)


def gaussian(n: int, d: int, k: int, gap: float, tail: float, gen: torch.Generator) -> torch.Tensor:
    """i.i.d. N(0, Sigma) rows, Sigma with k+1 nearly tied leading eigenvalues 1, 1-gap, ..., 1-k*gap
    and variance `tail` on the other d-k-1 directions, in a random eigenbasis. The near tie is the
    hardest i.i.d. case for recomputing every step, and still its subspaces converge."""
    var = torch.full((d,), tail, dtype=torch.float64)
    lead = min(k + 1, d)
    var[:lead] = 1.0 - gap * torch.arange(lead, dtype=torch.float64)
    z = torch.randn(n, d, generator=gen, dtype=torch.float64) * var.sqrt()
    return z @ _rotation(d, gen).T


def emerging(n: int, d: int, k: int, weak: float, onset: float, noise: float, gen: torch.Generator) -> torch.Tensor:
    """A nearly rank-k stream whose best subspace changes once, abruptly: k-1 strong directions
    (std 1), a weak k-th one (std `weak`), and from row onset*n a new direction as strong as the
    signal. Until then OPT is a sliver of ||A||_F^2 (weak^2 against k-1), so an error of
    eps*||A||_F^2 is many times OPT: the stream separates additive from multiplicative error.
    The d-k-1 remaining directions carry `noise`."""
    std = torch.full((d,), noise, dtype=torch.float64)
    std[: k - 1] = 1.0
    std[k - 1] = weak
    std[k] = 1.0
    a = torch.randn(n, d, generator=gen, dtype=torch.float64) * std
    a[: int(onset * n), k] = 0.0
    return a @ _rotation(d, gen)


def randint(n: int, d: int, normalize: bool, gen: torch.Generator) -> torch.Tensor:
    """The paper's random experiment (App. G): entries uniform on the integers 0..99. The paper
    says the matrix is column-normalised, the released code does not scale it [not verified which
    the reported figures used]; `normalize` divides each column by its norm over the whole stream."""
    a = torch.randint(0, 100, (n, d), generator=gen).to(torch.float64)
    if normalize:
        a = a / a.norm(dim=0).clamp_min(1e-300)
    return a


def bundled(name: str, n: int, standardize: bool, shuffle: bool, gen: torch.Generator) -> torch.Tensor:
    """The first n rows of a real table shipped with scikit-learn, read offline from the package.
    'digits' (UCI optical digits, 8x8 images, entries the integers 0..16) is the paper's kind of
    integer-bounded matrix; 'breast_cancer' (UCI WDBC), standardised, stands in for the paper's
    standardised UCI tables (Rice, Skin), which are not in any installed package. With `shuffle`
    the rows come in a seeded random order (so that seeds vary the stream), else in file order
    as the paper streams its tables; `standardize` is applied over the n streamed rows."""
    from sklearn import datasets

    if name not in BUNDLED:
        raise ValueError(f"dataset must be one of {', '.join(BUNDLED)}, got {name!r}")
    a = torch.from_numpy(getattr(datasets, f"load_{name}")().data).to(torch.float64)
    if shuffle:
        a = a[torch.randperm(a.shape[0], generator=gen)]
    a = a[:n].clone()
    if standardize:
        std = a.std(dim=0, unbiased=False)
        a = (a - a.mean(dim=0)) / torch.where(std > 0, std, torch.ones_like(std))
    return a


def make_stream(cfg) -> torch.Tensor:
    """The stream of `cfg` (a workload Config), on the CPU: [n, d] float64."""
    gen = torch.Generator().manual_seed(cfg.seed)
    if cfg.stream == "flip":
        return flip(cfg.n, cfg.d, cfg.k, cfg.noise, gen)
    if cfg.stream == "gaussian":
        return gaussian(cfg.n, cfg.d, cfg.k, cfg.gap, cfg.tail, gen)
    if cfg.stream == "emerging":
        return emerging(cfg.n, cfg.d, cfg.k, cfg.weak, cfg.onset, cfg.noise, gen)
    if cfg.stream == "randint":
        return randint(cfg.n, cfg.d, cfg.normalize, gen)
    if cfg.stream == "bundled":
        return bundled(cfg.dataset, cfg.n, cfg.standardize, cfg.shuffle, gen)
    if cfg.stream == "file":
        from workloads.consistent_lra.data import read_rows

        return read_rows(cfg.data_path, cfg.n, cfg.columns, cfg.standardize)
    raise ValueError(f"unknown stream {cfg.stream!r}; known: {', '.join(STREAMS)}")


def uniforms(n: int, seed: int) -> torch.Tensor:
    """The sampling draws of the leverage-score sketch, one per row, independent of the stream's."""
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    return torch.rand(n, generator=gen, dtype=torch.float64)
