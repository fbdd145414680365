"""The maths: rank-k subspaces of a growing prefix, their cost and recourse, and the three rules
that decide when to recompute.

Everything works on the prefix's Gram matrix G = A^(t)T A^(t) [d, d], updated by one outer product
per row: the optimal rank-k cost OPT_t is the sum of G's d-k smallest eigenvalues, the cost of an
orthonormal basis V [d, k] is tr(G) - tr(VT G V), and the top-k eigenvectors of G are the best
subspace. float64 throughout, since tr(G) - tr(VT G V) subtracts two numbers close to ||A||_F^2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

ALGORITHMS = ("every", "additive", "multiplicative", "heavy_light", "fd")
SKETCHES = ("leverage", "exact")
TRIGGERS = ("check", "kept")


def projection_distance(v: torch.Tensor, w: torch.Tensor) -> float:
    """||P_V - P_W||_F^2 for orthonormal bases V, W [d, k]: 2k - 2 ||VT W||_F^2."""
    k = v.shape[1]
    return max(0.0, 2.0 * k - 2.0 * float((v.T @ w).square().sum()))


def subspace_cost(gram: torch.Tensor, frob: float, v: torch.Tensor) -> float:
    """||A - A V VT||_F^2 of the matrix whose Gram is `gram` and squared norm is `frob`."""
    return max(0.0, frob - float(((gram @ v) * v).sum()))


def best_subspace(gram: torch.Tensor, k: int) -> tuple[torch.Tensor, float]:
    """The top-k eigenvectors of `gram` [d, k] and OPT, the sum of its d-k smallest eigenvalues.
    When the prefix has rank below k the basis is completed by eigh's arbitrary null vectors."""
    evals, evecs = torch.linalg.eigh(gram)  # ascending
    d = gram.shape[0]
    return evecs[:, d - k:], float(evals[: d - k].clamp_min(0.0).sum())


def ridge_leverage(gram: torch.Tensor, row: torch.Tensor, opt: float, k: int, frob: float) -> float:
    """Online ridge leverage score of `row` against the prefix that includes it,
    rowT (G + lambda I)^-1 row with lambda = OPT_t / k: the regularisation under which sampling by
    ridge leverage preserves every rank-k projection cost (Cohen, Musco & Musco). The score is in
    [0, 1]; lambda is floored so a prefix of rank <= k keeps every row that is new to it."""
    lam = max(opt / k, 1e-12 * frob, 1e-300)
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    score = float(row @ torch.linalg.solve(gram + lam * eye, row))
    return min(1.0, max(0.0, score))


def split_accuracy(eps: float) -> float:
    """The accuracy a given to each of the sketch (a (1 +- a) projection-cost preserver) and the
    recluster trigger (1 + a), so that their product (1 + a)^2 / (1 - a) is exactly 1 + eps:
    the positive root of a^2 + (3 + eps) a - eps = 0."""
    b = 3.0 + eps
    return (math.sqrt(b * b + 4.0 * eps) - b) / 2.0


@dataclass
class Step:
    """What one row did: the measured cost and optimum of the prefix, and the output's change."""

    cost: float
    opt: float
    frob: float
    recourse: float
    refreshed: bool


class ConsistentLRA:
    """A rank-k subspace maintained over a stream of rows, by one of these rules.

    - `every`: recompute the best subspace of the prefix at every row (the baseline).
    - `additive`: recompute only when ||A^(t)||_F^2 has grown past (1 + eps) times its value at
      the last recomputation; cost_t <= OPT_t + eps ||A^(t)||_F^2 at every t (Theorem 1.1).
    - `multiplicative`: keep a sketch of the prefix, by default the online ridge-leverage-score
      sample (each row kept with probability p = min(1, oversample * score / a^2), weighted 1/p);
      recompute from the sketch when the sketch says the current subspace costs more than
      (1 + a) times its optimum (`trigger="check"`), or at every kept row (`trigger="kept"`).
      With `sketch="exact"` the sketch is the whole prefix and a = eps (check-and-recluster).

    - `heavy_light`: the multiplicative rule's sketch and trigger, with the paper's improved
      Algorithm 2 (k^(3/2)/eps^2 polylog recourse on integer matrices) in place of the full
      recomputation, reconstructed from its summary (HEAVY/LIGHT cases on the tail energy of
      the top-k spectrum; `_heavy_light`).

    - `fd`: the Frequent Directions baseline (`FrequentDirections`): the output is the top-k
      right singular subspace of an l-row FD sketch of the prefix, recomputed at every row, as a
      streaming low-rank method outputs it; its recourse is measured the same way as the others'.

    The multiplicative rule is reconstructed too: it is the paper's simpler k^2/eps^2 polylog
    version, sampling then recomputing from the sample. The sampling constant
    (`oversample`, no log factor), lambda = OPT_t / k, scores against the exact prefix, the even
    split of eps between sketch and trigger (`split_accuracy`) and the check before recomputing
    are this implementation's choices; `sketch` and `trigger` switch the last two off.
    """

    def __init__(
        self,
        d: int,
        k: int,
        algorithm: str,
        eps: float,
        *,
        sketch: str = "leverage",
        oversample: float = 1.0,
        trigger: str = "check",
        fd_rows: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        self.d, self.k, self.algorithm, self.eps = d, k, algorithm, eps
        self.sketch, self.oversample, self.trigger = sketch, oversample, trigger
        self.accuracy = eps if sketch == "exact" else split_accuracy(eps)
        self.device = torch.device(device)
        self.gram = torch.zeros(d, d, dtype=torch.float64, device=self.device)
        self.frob = 0.0
        self.frob_last = 0.0  # ||A||_F^2 at the last recomputation (additive rule)
        self.frob_first = 0.0  # the first nonzero ||A^(t)||_F^2, for the refresh-count bound
        self.basis: torch.Tensor | None = None  # [d, k]
        self.sketch_gram = torch.zeros(d, d, dtype=torch.float64, device=self.device)
        self.sketch_frob = 0.0
        self.refreshes = 0
        self.kept = 0
        self.light = 0  # heavy_light: updates of the bottom sqrt(k) directions only
        self.heavy = 0  # heavy_light: full recomputations (heavy tail, periodic recluster, fallback)
        self.light_run = 0  # heavy_light: light updates since the last full recomputation
        self.fd = FrequentDirections(d, fd_rows or 2 * k, device=self.device) if algorithm == "fd" else None

    def update(self, row: torch.Tensor, u: float = 0.0) -> Step:
        """Take row a_t [d] (and the uniform draw u of its sampling coin); output V^(t)."""
        row = row.to(self.device, torch.float64)
        self.gram.addr_(row, row)
        self.frob += float(row @ row)
        if self.frob_first == 0.0:
            self.frob_first = self.frob
        top, opt = best_subspace(self.gram, self.k)
        new = None
        if self.algorithm == "every":
            new = top
        elif self.algorithm == "additive":
            if self.basis is None or self.frob > (1.0 + self.eps) * self.frob_last:
                new = top
                self.frob_last = self.frob
        elif self.algorithm == "multiplicative":
            new = self._multiplicative(row, u, top, opt)
        elif self.algorithm == "fd":
            self.fd.insert(row)
            new = self.fd.top(self.k)
        else:
            new = self._heavy_light(row, u, top, opt)
        recourse = 0.0
        if new is not None:
            self.refreshes += 1
            if self.basis is not None:
                recourse = projection_distance(self.basis, new)
            self.basis = new.clone()
        cost = subspace_cost(self.gram, self.frob, self.basis)
        return Step(cost, opt, self.frob, recourse, new is not None)

    def _sketch(self, row: torch.Tensor, u: float, top: torch.Tensor,
                opt: float) -> tuple[torch.Tensor, float, torch.Tensor, float] | None:
        """The sketch after row a_t: (Gram, squared norm, best basis, OPT) of the sampled rows (of
        the whole prefix with `sketch="exact"`), or None when the row was not sampled."""
        if self.sketch == "exact":
            return self.gram, self.frob, top, opt
        score = ridge_leverage(self.gram, row, opt, self.k, self.frob)
        # The first row is always kept: the output has to come from a non-empty sketch.
        p = 1.0 if self.basis is None else min(1.0, self.oversample * score / self.accuracy**2)
        if not u < p:
            return None  # the sketch did not change, so neither does its answer
        self.sketch_gram.addr_(row, row, alpha=1.0 / p)
        self.sketch_frob += float(row @ row) / p
        self.kept += 1
        return (self.sketch_gram, self.sketch_frob) + best_subspace(self.sketch_gram, self.k)

    def _stale(self, gram: torch.Tensor, frob: float, opt: float) -> bool:
        """Does the current basis cost more than (1 + a) times the optimum on the sketch?"""
        return subspace_cost(gram, frob, self.basis) > (1.0 + self.accuracy) * opt + 1e-12 * frob

    def _multiplicative(
        self, row: torch.Tensor, u: float, top: torch.Tensor, opt: float
    ) -> torch.Tensor | None:
        """The new basis, or None to keep the current one."""
        sketch = self._sketch(row, u, top, opt)
        if sketch is None:
            return None
        gram, frob, sketch_top, sketch_opt = sketch
        if self.basis is None or self.trigger == "kept":
            return sketch_top
        return sketch_top if self._stale(gram, frob, sketch_opt) else None

    def _heavy_light(
        self, row: torch.Tensor, u: float, top: torch.Tensor, opt: float
    ) -> torch.Tensor | None:
        """Algorithm 2, reconstructed [the paper gives it only in summary; these are our choices].

        When the sketch finds the current basis V stale, let s = floor(sqrt(k)) and h = k - s.
        - LIGHT: keep the h directions of V that carry most of the sketch's energy and replace
          only the other s by the best s directions orthogonal to them. Recourse is at most 2s,
          not 2k. The paper takes this case when the tail energy of the top-k spectrum (its
          bottom sqrt(k) eigenvalues) is light, against a threshold its summary does not give;
          here the case is taken when it works: when the new basis costs at most (1 + a) times
          the sketch's optimum, the same bound the full recomputation meets.
        - HEAVY: otherwise, and at the s-th update since the last full one (the paper's periodic
          recluster), recompute the whole top-k basis.
        """
        sketch = self._sketch(row, u, top, opt)
        if sketch is None:
            return None
        gram, frob, sketch_top, sketch_opt = sketch
        if self.basis is None:
            return sketch_top
        if self.trigger == "check" and not self._stale(gram, frob, sketch_opt):
            return None
        s = max(1, math.isqrt(self.k))
        h = self.k - s
        if h > 0 and self.light_run + 1 < s:
            _, inner_vecs = torch.linalg.eigh(self.basis.T @ gram @ self.basis)
            head = self.basis @ inner_vecs[:, -h:]  # [d, h], inside span(V)
            rest = torch.eye(self.d, dtype=gram.dtype, device=gram.device) - head @ head.T
            _, outside_vecs = torch.linalg.eigh(rest @ gram @ rest)
            candidate = torch.cat([head, outside_vecs[:, -s:]], dim=1)
            candidate, _ = torch.linalg.qr(candidate)  # orthonormal up to eigh's rounding
            if subspace_cost(gram, frob, candidate) <= (1.0 + self.accuracy) * sketch_opt + 1e-12 * frob:
                self.light += 1
                self.light_run += 1
                return candidate
        self.heavy += 1
        self.light_run = 0
        return sketch_top

    def state_dict(self) -> dict[str, Any]:
        return {
            "gram": self.gram.cpu(),
            "frob": self.frob,
            "frob_last": self.frob_last,
            "frob_first": self.frob_first,
            "basis": None if self.basis is None else self.basis.cpu(),
            "sketch_gram": self.sketch_gram.cpu(),
            "sketch_frob": self.sketch_frob,
            "refreshes": self.refreshes,
            "kept": self.kept,
            "light": self.light,
            "heavy": self.heavy,
            "light_run": self.light_run,
            "fd": None if self.fd is None else self.fd.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gram = state["gram"].to(self.device, torch.float64)
        self.sketch_gram = state["sketch_gram"].to(self.device, torch.float64)
        basis = state["basis"]
        self.basis = None if basis is None else basis.to(self.device, torch.float64)
        for name in ("frob", "frob_last", "frob_first", "sketch_frob"):
            setattr(self, name, float(state[name]))
        self.refreshes, self.kept = int(state["refreshes"]), int(state["kept"])
        # Checkpoints written before heavy_light existed have no counts of its cases.
        self.light, self.heavy, self.light_run = (int(state.get(k, 0)) for k in ("light", "heavy", "light_run"))
        if self.fd is not None:
            self.fd.load_state_dict(state["fd"])


class FrequentDirections:
    """Frequent Directions, the deterministic streaming sketch: an [l, d] matrix B with
    ||A^T A - B^T B||_2 <= ||A - A_k||_F^2 / (l - k) for every k < l.

    Liberty, "Simple and Deterministic Matrix Sketching", KDD 2013, https://arxiv.org/abs/1206.0594;
    Ghashami, Liberty, Phillips & Woodruff, "Frequent Directions: Simple and Deterministic Matrix
    Sketching", SIAM J. Comput. 2016, https://arxiv.org/abs/1501.01711 (its Algorithm 2.1, written
    here from the paper). A row goes into a zero row of B; when B has none, B is replaced by
    sqrt(Sigma^2 - sigma_l^2) V^T from its SVD, which zeroes at least the last row. The shrink is by
    the l-th (smallest) squared singular value, not Liberty's l/2-th: with the notes' l = 2k the
    l/2-th would keep only k - 1 directions and leave the rank-k output partly arbitrary. With
    l >= d, B^T B = A^T A - c I (c = 0 for l > d): the output is the same as recomputing.
    """

    def __init__(self, d: int, rows: int, *, device: torch.device | str = "cpu") -> None:
        if rows < 1:
            raise ValueError(f"a Frequent Directions sketch needs at least one row, got {rows}")
        self.ell = rows
        self.sketch = torch.zeros(rows, d, dtype=torch.float64, device=device)  # [l, d]
        self.filled = 0  # rows of `sketch` in use; the rest are zero

    def insert(self, row: torch.Tensor) -> None:
        if self.filled == self.ell:
            self._shrink()
        self.sketch[self.filled] = row
        self.filled += 1

    def _shrink(self) -> None:
        _, sigma, vh = torch.linalg.svd(self.sketch, full_matrices=False)  # sigma descending
        # Only when l <= d does B have l singular values to take the l-th of; else it is exact.
        delta = sigma[-1].square() if self.ell <= self.sketch.shape[1] else sigma.new_zeros(())
        shrunk = (sigma.square() - delta).clamp_min(0.0).sqrt()
        keep = int((shrunk > 0).sum())
        self.sketch.zero_()
        self.sketch[:keep] = shrunk[:keep, None] * vh[:keep]
        self.filled = keep

    def gram(self) -> torch.Tensor:
        return self.sketch.T @ self.sketch  # [d, d]

    def top(self, k: int) -> torch.Tensor:
        """The sketch's rank-k output: the top-k eigenvectors of B^T B [d, k]."""
        return best_subspace(self.gram(), k)[0]

    def state_dict(self) -> dict[str, Any]:
        return {"sketch": self.sketch.cpu(), "filled": self.filled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sketch = state["sketch"].to(self.sketch.device, torch.float64)
        self.filled = int(state["filled"])
