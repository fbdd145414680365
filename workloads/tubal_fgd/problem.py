"""The recovery problem: a low-tubal-rank PSD target, Gaussian linear measurements, the FGD maths.

Measurements are y_i = <A_i, X*> + s_i with A_i Gaussian and symmetrised in the t-sense, so that
the gradient (1/m) M*(M(U * U^T) - y) * U stays symmetric; for a symmetric X symmetrising A_i
does not change <A_i, X>. The operator M is held as one [m, n*n*k] matrix: M(X) is a matrix-vector
product and M*(z) its transpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from workloads.tubal_fgd.tensor import t_gram, t_product, t_transpose, top_factor

# Independent random streams of one seed: the data, and the factor's initialisation.
DATA_STREAM, INIT_STREAM = 0, 1


def generator(seed: int, stream: int) -> torch.Generator:
    """A CPU generator for one (seed, stream); CPU so that every device sees the same numbers."""
    state = np.random.SeedSequence([seed, stream]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


@dataclass(frozen=True)
class Problem:
    target: torch.Tensor
    """X* = X * X^T, [n, n, k], scaled to unit Frobenius norm."""
    a_train: torch.Tensor
    """[m_train, n*n*k] symmetrised sensing tensors used by gradient descent."""
    y_train: torch.Tensor
    """[m_train] noisy training measurements."""
    a_val: torch.Tensor
    """[m_val, n*n*k] held-out sensing tensors, for early stopping only."""
    y_val: torch.Tensor
    """[m_val] noisy held-out measurements."""

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.target.shape)  # type: ignore[return-value]


def measure(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """M(X) = [<A_i, X>]_i for the operator `a` [m, n*n*k] and X [n, n, k]."""
    return a @ x.reshape(-1)


def adjoint(a: torch.Tensor, z: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """M*(z) = sum_i z_i A_i, as a tensor of `shape`."""
    return (a.T @ z).reshape(shape)


class SymmetricSensing:
    """M and M* for t-symmetric sensing tensors acting on t-symmetric X, with one column per pair of
    entries X[i, j, l] = X[j, i, -l mod k] (the t-transpose's pairing): the same values from about
    half the columns. The loop is bound by reading the operator, so this halves a step's time.

    <A, X> = sum over pairs of w A_p X_p (w = 2 for a pair, 1 for an entry paired with itself), and
    M*(z) is t-symmetric with M*(z)_p = sum_i z_i A_ip at both entries of a pair."""

    def __init__(self, a: torch.Tensor, shape: tuple[int, int, int]) -> None:
        flat = torch.arange(math.prod(shape), device=a.device).reshape(shape)
        partner = t_transpose(flat).reshape(-1)  # the flat index each entry is paired with
        self.reps = flat.reshape(-1)[flat.reshape(-1) <= partner]
        self.partners = partner[self.reps]
        self.weight = (1.0 + (self.partners != self.reps).to(a.dtype))  # [d]
        self.a = (a[:, self.reps] * self.weight).contiguous()  # [m, d], d ~ n^2 k / 2
        self.shape = shape

    def measure(self, x: torch.Tensor) -> torch.Tensor:
        return self.a @ x.reshape(-1)[self.reps]

    def adjoint(self, z: torch.Tensor) -> torch.Tensor:
        v = (self.a.T @ z) / self.weight
        out = torch.empty(math.prod(self.shape), dtype=v.dtype, device=v.device)
        out[self.reps] = v
        out[self.partners] = v
        return out.reshape(self.shape)


class DenseSensing:
    """M and M* of any sensing tensors, one column per entry (the interface of SymmetricSensing)."""

    def __init__(self, a: torch.Tensor, shape: tuple[int, int, int]) -> None:
        self.a, self.shape = a, shape

    def measure(self, x: torch.Tensor) -> torch.Tensor:
        return measure(self.a, x)

    def adjoint(self, z: torch.Tensor) -> torch.Tensor:
        return adjoint(self.a, z, self.shape)


def sensing(a: torch.Tensor, shape: tuple[int, int, int], symmetric: bool) -> SymmetricSensing | DenseSensing:
    """The operator of rows `a` as the loop uses it: packed by entry pairs when every A_i is t-symmetric."""
    return SymmetricSensing(a, shape) if symmetric else DenseSensing(a, shape)


def symmetrise(a: torch.Tensor) -> torch.Tensor:
    """(A + A^T) / 2 for a batch of tensors [m, n, n, k] (t-transpose of each)."""
    return (a + t_transpose(a)) / 2


def make_problem(
    *, n: int, k: int, rank: int, measurements: int, val_measurements: int, noise_std: float,
    seed: int, symmetric_sensing: bool = True, dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> Problem:
    """Draw X* (unit Frobenius norm, tubal rank `rank`) and its train/validation measurements.

    The factor X [n, rank, k] has i.i.d. N(0, 1) entries [reconstructed: the paper's target
    distribution and condition number were not available]. Sensing entries are N(0, 1), so that
    (1/m) M* M is close to the identity on symmetric tensors, and the noise is N(0, noise_std^2).
    """
    g = generator(seed, DATA_STREAM)
    factor = torch.randn(n, rank, k, generator=g, dtype=torch.float64)
    target = t_gram(factor)
    target = target / torch.linalg.vector_norm(target)
    total = measurements + val_measurements
    a = torch.randn(total, n, n, k, generator=g, dtype=torch.float64)
    if symmetric_sensing:
        a = symmetrise(a)
    a = a.reshape(total, -1)
    y = measure(a, target) + noise_std * torch.randn(total, generator=g, dtype=torch.float64)
    cast = dict(dtype=dtype, device=device)
    return Problem(
        target=target.to(**cast),
        a_train=a[:measurements].to(**cast).contiguous(),
        y_train=y[:measurements].to(**cast),
        a_val=a[measurements:].to(**cast).contiguous(),
        y_val=y[measurements:].to(**cast),
    )


def loss(problem: Problem, u: torch.Tensor) -> torch.Tensor:
    """f(U) = (1 / 4m) ||y - M(U * U^T)||^2 on the training measurements."""
    r = measure(problem.a_train, t_gram(u)) - problem.y_train
    return r.square().sum() / (4 * problem.y_train.numel())


def gradient(problem: Problem, u: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """grad f(U) = [(1/m) M*(M(U * U^T) - y)] * U; `residual` = M(U * U^T) - y when known."""
    if residual is None:
        residual = measure(problem.a_train, t_gram(u)) - problem.y_train
    g = adjoint(problem.a_train, residual, problem.shape) / problem.y_train.numel()
    return t_product(g, u)


def small_init(n: int, factor_rank: int, k: int, scale: float, *, seed: int,
               dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> torch.Tensor:
    """U_0 with i.i.d. N(0, scale^2 / R) entries."""
    g = generator(seed, INIT_STREAM)
    u = torch.randn(n, factor_rank, k, generator=g, dtype=torch.float64) * (scale / math.sqrt(factor_rank))
    return u.to(dtype=dtype, device=device)


def spectral_init(problem: Problem, factor_rank: int, *, by: str = "eig") -> torch.Tensor:
    """U_0 = the top-R factor of (1/m) M*(y), per Fourier slice (see `top_factor` for `by`)."""
    y0 = adjoint(problem.a_train, problem.y_train, problem.shape) / problem.y_train.numel()
    return top_factor(y0, factor_rank, by=by)


def minimax_level(n: int, rank: int, k: int, noise_std: float, measurements: int) -> float:
    """The minimax-order error level n r k sigma^2 / m of ||X - X*||_F^2 (= the RSE, ||X*||_F = 1
    here): the paper's lower bound n r k sigma^2 / ((1 + delta) m) at delta = 0, constant 1.

    delta is the t-RIP constant of the draw, which is not computable cheaply; delta = 0 is the
    isotropic operator Gaussian sensing is in expectation, E (1/m)||M(X)||^2 = ||X||_F^2. It is the
    bound's largest value, so the ratio of an error to it is at most (1 + delta) smaller than to
    the draw's own bound. For scale: n r k is the target's degrees of freedom to first order (d =
    n r - r(r - 1)/2 on a real Fourier slice plus 2 n r - r^2 per complex pair: 91 against 96 at
    the smoke's size), and least squares on the true rank-r set errs by about d sigma^2 / (m - d),
    1.13x this level at the smoke's size."""
    return n * rank * k * noise_std ** 2 / measurements


def relative_error(problem: Problem, x: torch.Tensor) -> float:
    """RSE = ||X - X*||_F^2 / ||X*||_F^2."""
    return float((x - problem.target).square().sum() / problem.target.square().sum())
