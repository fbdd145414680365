"""The forward SDEs (VP and VE, as in GDSS), their closed-form marginals, denoising score
matching on (X, A) jointly, and the guided reverse-time Euler-Maruyama sampler.

Node features X [B, m, d] and adjacency A [B, m, m] diffuse by their own SDE. The adjacency's
noise is symmetric with a zero diagonal, so A_t stays a symmetric matrix of off-diagonal entries;
every off-diagonal entry has the scalar marginal N(alpha_t a_0, std_t^2).
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import torch

T_EPS = 1e-3
"""Smallest diffusion time used in training and sampling (the marginals degenerate at t = 0)."""


class SDE(Protocol):
    def marginal(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def drift_diffusion(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def prior_std(self) -> float: ...


class VPSDE:
    """dx = -beta(t)/2 x dt + sqrt(beta(t)) dw, beta linear from beta_min to beta_max on [0, 1]."""

    def __init__(self, beta_min: float, beta_max: float) -> None:
        self.beta_min, self.beta_max = beta_min, beta_max

    def beta(self, t: torch.Tensor) -> torch.Tensor:
        return self.beta_min + t * (self.beta_max - self.beta_min)

    def marginal(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(alpha_t, std_t): x_t | x_0 ~ N(alpha_t x_0, std_t^2), alpha_t = exp(-int_0^t beta / 2)."""
        integral = self.beta_min * t + 0.5 * (self.beta_max - self.beta_min) * t ** 2
        alpha = torch.exp(-0.5 * integral)
        return alpha, torch.sqrt(1.0 - alpha ** 2)

    def drift_diffusion(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.beta(t)
        return -0.5 * _bcast(b, x) * x, torch.sqrt(b)

    def prior_std(self) -> float:
        return 1.0


class VESDE:
    """dx = sqrt(d sigma(t)^2 / dt) dw, sigma(t) = sigma_min (sigma_max / sigma_min)^t."""

    def __init__(self, sigma_min: float, sigma_max: float) -> None:
        self.sigma_min, self.sigma_max = sigma_min, sigma_max

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigma_min * (self.sigma_max / self.sigma_min) ** t

    def marginal(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, std_t) with std_t^2 = sigma(t)^2 - sigma_min^2, exact from x(0) = x_0."""
        std = torch.sqrt(self.sigma(t) ** 2 - self.sigma_min ** 2)
        return torch.ones_like(std), std

    def drift_diffusion(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.sigma(t) * math.sqrt(2.0 * math.log(self.sigma_max / self.sigma_min))
        return torch.zeros_like(x), g

    def prior_std(self) -> float:
        return math.sqrt(self.sigma_max ** 2 - self.sigma_min ** 2)


def make_sde(kind: str, low: float, high: float) -> SDE:
    """'vp' with (beta_min, beta_max) or 've' with (sigma_min, sigma_max)."""
    return VPSDE(low, high) if kind == "vp" else VESDE(low, high)


def sym_noise(shape: torch.Size | tuple[int, ...], gen: torch.Generator | None) -> torch.Tensor:
    """[B, m, m] symmetric standard normal noise with a zero diagonal."""
    z = torch.triu(torch.randn(*shape, generator=gen), diagonal=1)
    return z + z.transpose(-1, -2)


def off_diagonal(m: int) -> torch.Tensor:
    return 1.0 - torch.eye(m)


def _bcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.reshape(-1, *([1] * (like.dim() - 1)))


def perturb(sde: SDE, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """x_t = alpha_t x_0 + std_t noise, t per graph [B]."""
    alpha, std = sde.marginal(t)
    return _bcast(alpha, x0) * x0 + _bcast(std, x0) * noise


ScoreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(x_t, a_t, t) -> predicted noise (eps_x, eps_a); the score is -eps / std_t."""

GuideFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(x_t, a_t, t) -> [B, m] per-node log density ratio log p_target / p_source, differentiable."""


def dsm_loss(eps_fn: ScoreFn, sde_x: SDE, sde_a: SDE, x0: torch.Tensor, a0: torch.Tensor,
             gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Denoising score matching by noise prediction, one t per graph: (loss_x, loss_a), the latter
    over off-diagonal entries only."""
    b, m = x0.shape[0], x0.shape[1]
    t = T_EPS + (1.0 - T_EPS) * torch.rand(b, generator=gen)
    zx = torch.randn(x0.shape, generator=gen)
    za = sym_noise(a0.shape, gen)
    ex, ea = eps_fn(perturb(sde_x, x0, t, zx), perturb(sde_a, a0, t, za), t)
    mask = off_diagonal(m)
    loss_a = ((ea - za) ** 2 * mask).sum() / (mask.sum() * b)
    return ((ex - zx) ** 2).mean(), loss_a


def guidance_grad(guide: GuideFn, x: torch.Tensor, a: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient of the summed per-node log density ratio w.r.t. (x_t, a_t), a's symmetrised."""
    with torch.enable_grad():
        xg, ag = x.detach().requires_grad_(True), a.detach().requires_grad_(True)
        gx, ga = torch.autograd.grad(guide(xg, ag, t).sum(), (xg, ag), allow_unused=True)
    gx = torch.zeros_like(x) if gx is None else gx  # a guide may ignore the features or the structure
    ga = torch.zeros_like(a) if ga is None else ga
    ga = 0.5 * (ga + ga.transpose(-1, -2)) * off_diagonal(a.shape[-1])
    return gx, ga


@torch.no_grad()
def reverse_sample(eps_fn: ScoreFn, sde_x: SDE, sde_a: SDE, shape_x: tuple[int, int, int], *,
                   steps: int, gen: torch.Generator, guide: GuideFn | None = None, scale: float = 0.0,
                   adj_scale: float | None = None, start: tuple[torch.Tensor, torch.Tensor] | None = None, t_start: float = 1.0,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Euler-Maruyama on the reverse SDE from t_start to T_EPS, the score plus `scale` times the
    guidance gradient on X and `adj_scale` (default `scale`) times it on A; the last step adds no
    noise. From the prior when `start` is None, else from
    `start` = (x_0, a_0) perturbed to t_start (the source graph's own trajectory). Returns the
    continuous (x, a); thresholding is the caller's."""
    b, m, _ = shape_x
    mask = off_diagonal(m)
    t0 = torch.full((b,), t_start)
    if start is None:
        x = sde_x.prior_std() * torch.randn(shape_x, generator=gen)
        a = sde_a.prior_std() * sym_noise((b, m, m), gen)
    else:
        x = perturb(sde_x, start[0], t0, torch.randn(shape_x, generator=gen))
        a = perturb(sde_a, start[1], t0, sym_noise((b, m, m), gen)) * mask
    adj_scale = scale if adj_scale is None else adj_scale
    guided = guide is not None and (scale != 0.0 or adj_scale != 0.0)
    dt = (t_start - T_EPS) / steps
    for i in range(steps):
        t = torch.full((b,), t_start - i * dt)
        ex, ea = eps_fn(x, a, t)
        sx = -ex / _bcast(sde_x.marginal(t)[1], x)
        sa = -ea / _bcast(sde_a.marginal(t)[1], a)
        if guided:
            gx, ga = guidance_grad(guide, x, a, t)
            sx, sa = sx + scale * gx, sa + adj_scale * ga
        fx, g_x = sde_x.drift_diffusion(x, t)
        fa, g_a = sde_a.drift_diffusion(a, t)
        g_x, g_a = _bcast(g_x, x), _bcast(g_a, a)
        x = x + (g_x ** 2 * sx - fx) * dt
        a = (a + (g_a ** 2 * sa - fa) * dt) * mask
        if i < steps - 1:
            x = x + g_x * math.sqrt(dt) * torch.randn(shape_x, generator=gen)
            a = a + g_a * math.sqrt(dt) * sym_noise((b, m, m), gen)
    return x, a
