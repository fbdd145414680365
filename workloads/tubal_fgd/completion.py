"""The completion task: recover a real image tensor X [n1, n2, k] from a uniformly sampled part of
its entries, by factorized gradient descent on X ~ U * V^T from small random initialisation.

An image tensor is not t-symmetric, so the factorization is the asymmetric one, U [n1, R, k] and
V [n2, R, k], both initialised small. A fraction `observed_frac` of the entries, drawn uniformly
without replacement, is observed with Gaussian noise, M = P_Omega(X + s); `val_frac` of those are
held out for early stopping and the rest, Omega_train, drive the gradient of

    f(U, V) = (1 / 2 p) ||P_train(U * V^T - M)||_F^2,    p = |Omega_train| / (n1 n2 k),

    grad_U f = G * V,   grad_V f = G^T * U,   G = (1/p) P_train(U * V^T - M).

Scales [ours; the paper's were not available]: the step is lr / sigma_1 and the initial factors
have t-spectral norm init_scale * sqrt(sigma_1), sigma_1 being the largest singular value among
the Fourier slices of (1/p) P_train(M), so that one lr and one init_scale serve every image size
(init_scale = 1 starts the product as large as the data's top component: large initialisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workloads.tubal_fgd.problem import DATA_STREAM, INIT_STREAM, generator
from workloads.tubal_fgd.tensor import t_outer, t_product, t_spectral_norm, t_transpose, top_pair


@dataclass(frozen=True)
class Completion:
    truth: torch.Tensor
    """The image tensor X [n1, n2, k], values in [0, 1] (the error is measured on all its entries)."""
    train_idx: torch.Tensor
    """Flat indices of Omega_train, the observed entries the gradient uses."""
    y_train: torch.Tensor
    """Their noisy values."""
    val_idx: torch.Tensor
    """Flat indices of the held-out observed entries (early stopping only)."""
    y_val: torch.Tensor
    """Their noisy values."""
    sigma_1: float
    """Largest Fourier-slice singular value of (1/p) P_train(M): the scale of the step and the init."""

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.truth.shape)  # type: ignore[return-value]

    @property
    def p(self) -> float:
        return self.train_idx.numel() / self.truth.numel()


def observed_counts(entries: int, observed_frac: float, val_frac: float) -> tuple[int, int]:
    """(training, held-out) observed entry counts of a tensor with `entries` entries."""
    observed = round(observed_frac * entries)
    val = round(val_frac * observed)
    return observed - val, val


def scatter(idx: torch.Tensor, values: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """P_Omega*: `values` at flat indices `idx` of a zero tensor of `shape`."""
    out = torch.zeros(math.prod(shape), dtype=values.dtype, device=values.device)
    out[idx] = values
    return out.reshape(shape)


def make_completion(truth: torch.Tensor, *, observed_frac: float, val_frac: float, noise_std: float, seed: int,
                    dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> Completion:
    """Sample Omega uniformly (without replacement) and the noise, from the seed's data stream."""
    truth = truth.to(torch.float64)
    train_m, val_m = observed_counts(truth.numel(), observed_frac, val_frac)
    g = generator(seed, DATA_STREAM)
    order = torch.randperm(truth.numel(), generator=g)[:train_m + val_m]
    y = truth.reshape(-1)[order] + noise_std * torch.randn(train_m + val_m, generator=g, dtype=torch.float64)
    train_idx, val_idx = order[:train_m], order[train_m:]
    sigma_1 = t_spectral_norm(scatter(train_idx, y[:train_m], truth.shape) * (truth.numel() / train_m))
    cast = dict(dtype=dtype, device=device)
    return Completion(truth=truth.to(**cast), train_idx=train_idx.to(device), y_train=y[:train_m].to(**cast),
                      val_idx=val_idx.to(device), y_val=y[train_m:].to(**cast), sigma_1=sigma_1)


def residuals(c: Completion, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(X - M) on Omega_train and on the held-out entries."""
    flat = x.reshape(-1)
    return flat[c.train_idx] - c.y_train, flat[c.val_idx] - c.y_val


def loss(c: Completion, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """f(U, V) = (1 / 2p) ||P_train(U * V^T - M)||_F^2."""
    r, _ = residuals(c, t_outer(u, v))
    return r.square().sum() / (2 * c.p)


def gradients(c: Completion, u: torch.Tensor, v: torch.Tensor,
              residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_U f, grad_V f) = (G * V, G^T * U); `residual` = (U * V^T - M) on Omega_train when known."""
    if residual is None:
        residual, _ = residuals(c, t_outer(u, v))
    g = scatter(c.train_idx, residual / c.p, c.shape)
    return t_product(g, v), t_product(t_transpose(g), u)


def small_pair(c: Completion, factor_rank: int, scale: float, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """U_0, V_0: Gaussian, each scaled to t-spectral norm scale * sqrt(sigma_1)."""
    g = generator(seed, INIT_STREAM)
    n1, n2, k = c.shape
    out = []
    for rows in (n1, n2):
        w = torch.randn(rows, factor_rank, k, generator=g, dtype=torch.float64)
        out.append((w * (scale * math.sqrt(c.sigma_1) / t_spectral_norm(w))).to(c.truth))
    return out[0], out[1]


def spectral_pair(c: Completion, factor_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """U_0, V_0 from the truncated t-SVD of (1/p) P_train(M) (the spectral baseline)."""
    return top_pair(scatter(c.train_idx, c.y_train / c.p, c.shape), factor_rank)


def relative_error(c: Completion, x: torch.Tensor) -> float:
    """RSE = ||X - X_true||_F^2 / ||X_true||_F^2 over all entries (the simulation's definition)."""
    return float((x - c.truth).square().sum() / c.truth.square().sum())


def psnr(c: Completion, rse: float) -> float:
    """PSNR in dB of an estimate with relative error `rse`, for pixel values in [0, 1]."""
    mse = rse * float(c.truth.square().mean())
    if math.isnan(mse):
        return math.nan
    if mse <= 0 or math.isinf(mse):  # exact recovery, or a diverged iterate
        return math.inf if mse <= 0 else -math.inf
    return 10 * math.log10(1 / mse)
