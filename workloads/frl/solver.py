"""Pseudo-spectral solvers that generate the data, and the spectral resampling between grids.

Both PDEs live on a periodic box of side 2*pi, so a Fourier index is a physical wavenumber on
every grid. A field "at resolution rho" is the DNS truncated to |k| < rho/2 and sampled on the
rho-point grid: the same band-limited function a perfect rho-point observation would give.

- 1-D viscous Burgers, u_t + u u_x = nu u_xx.
- 2-D incompressible Navier-Stokes in vorticity form, w_t + (u . grad) w = nu lap w + f, with
  Kolmogorov forcing f = A sin(n y) and a linear drag that keeps the flow statistically steady.

Time stepping is the integrating-factor RK4 of Trefethen (Spectral Methods in MATLAB, p27): the
viscous term is integrated exactly, so the step is set by advection (CFL) alone; the quadratic
term is dealiased with the 2/3 rule.
"""

from __future__ import annotations

import math

import torch

DTYPE = torch.float64


# --- resampling -----------------------------------------------------------------------------


def truncate(u: torch.Tensor, rho: int, dims: int = 1) -> torch.Tensor:
    """Field(s) `u` on any grid (last `dims` axes), band-limited to |k| < rho/2, sampled on rho points per axis."""
    n = u.shape[-1]
    if dims == 1:
        uh = torch.fft.rfft(u, dim=-1)
        keep = rho // 2  # modes 0..rho/2-1: the Nyquist mode itself is dropped (it has no sign)
        out = torch.zeros(*u.shape[:-1], rho // 2 + 1, dtype=uh.dtype, device=u.device)
        out[..., :keep] = uh[..., :keep]
        return torch.fft.irfft(out, n=rho, dim=-1) * (rho / n)
    uh = torch.fft.rfft2(u, dim=(-2, -1))
    keep = rho // 2
    out = torch.zeros(*u.shape[:-2], rho, rho // 2 + 1, dtype=uh.dtype, device=u.device)
    out[..., :keep, :keep] = uh[..., :keep, :keep]
    out[..., -keep + 1 :, :keep] = uh[..., n - keep + 1 :, :keep]
    return torch.fft.irfft2(out, s=(rho, rho), dim=(-2, -1)) * (rho * rho / (n * n))


def upsample(u: torch.Tensor, n: int, dims: int = 1) -> torch.Tensor:
    """Band-limited (trigonometric) interpolation of field(s) `u` to n points per axis (n >= the grid)."""
    rho = u.shape[-1]  # rho == n still drops the Nyquist mode: every field here is band-limited below it
    if dims == 1:
        uh = torch.fft.rfft(u, dim=-1)
        out = torch.zeros(*u.shape[:-1], n // 2 + 1, dtype=uh.dtype, device=u.device)
        keep = rho // 2
        out[..., :keep] = uh[..., :keep]
        return torch.fft.irfft(out, n=n, dim=-1) * (n / rho)
    uh = torch.fft.rfft2(u, dim=(-2, -1))
    keep = rho // 2
    out = torch.zeros(*u.shape[:-2], n, n // 2 + 1, dtype=uh.dtype, device=u.device)
    out[..., :keep, :keep] = uh[..., :keep, :keep]
    out[..., n - keep + 1 :, :keep] = uh[..., rho - keep + 1 :, :keep]
    return torch.fft.irfft2(out, s=(n, n), dim=(-2, -1)) * (n * n / (rho * rho))


# --- 1-D Burgers ------------------------------------------------------------------------------


def burgers_initial(batch: int, n: int, max_mode: int, generator: torch.Generator) -> torch.Tensor:
    """sum_{k<=max_mode} a_k sin(k x + phi_k), a_k ~ N(0, k^-2), scaled to max|u| = 1. [B, n]"""
    x = torch.arange(n, dtype=DTYPE) * (2 * math.pi / n)
    k = torch.arange(1, max_mode + 1, dtype=DTYPE)
    a = torch.randn(batch, max_mode, generator=generator, dtype=DTYPE) / k
    phi = 2 * math.pi * torch.rand(batch, max_mode, generator=generator, dtype=DTYPE)
    u = (a[:, :, None] * torch.sin(k[None, :, None] * x[None, None, :] + phi[:, :, None])).sum(1)
    return u / u.abs().amax(dim=-1, keepdim=True)


class Burgers:
    """IF-RK4 for u_t + (u^2/2)_x = nu u_xx on [0, 2pi), n points, fixed step dt."""

    def __init__(self, n: int, nu: float, dt: float) -> None:
        self.n, self.nu, self.dt = n, nu, dt
        k = torch.arange(n // 2 + 1, dtype=DTYPE)
        self.ik = 1j * k
        self.dealias = (k < n / 3).to(DTYPE)  # 2/3 rule: products of kept modes do not alias
        self.e = torch.exp(-nu * k**2 * dt)
        self.e2 = torch.exp(-nu * k**2 * dt / 2)

    def _nonlinear(self, uh: torch.Tensor) -> torch.Tensor:
        u = torch.fft.irfft(uh * self.dealias, n=self.n)
        return -0.5 * self.ik * torch.fft.rfft(u * u)

    def step(self, uh: torch.Tensor) -> torch.Tensor:
        dt, e, e2 = self.dt, self.e, self.e2
        a = dt * self._nonlinear(uh)
        b = dt * self._nonlinear(e2 * (uh + a / 2))
        c = dt * self._nonlinear(e2 * uh + b / 2)
        d = dt * self._nonlinear(e * uh + e2 * c)
        return e * uh + (e * a + 2 * e2 * (b + c) + d) / 6

    def evolve(self, u: torch.Tensor, t: float) -> torch.Tensor:
        """u after time t (t a multiple of dt up to rounding)."""
        uh = torch.fft.rfft(u.to(DTYPE))
        for _ in range(round(t / self.dt)):
            uh = self.step(uh)
        return torch.fft.irfft(uh, n=self.n)


# --- 2-D Navier-Stokes (vorticity) -----------------------------------------------------------


def vorticity_initial(batch: int, n: int, generator: torch.Generator, alpha: float = 2.5, tau: float = 7.0) -> torch.Tensor:
    """Gaussian random vorticity with spectrum (|k|^2 + tau^2)^(-alpha), zero mean, unit std. [B, n, n]"""
    k = torch.fft.fftfreq(n, 1.0 / n).to(DTYPE)
    kk = k[:, None] ** 2 + k[None, : n // 2 + 1] ** 2
    amp = (kk + tau**2) ** (-alpha / 2)
    amp[0, 0] = 0.0
    noise = torch.randn(batch, n, n, generator=generator, dtype=DTYPE)
    w = torch.fft.irfft2(torch.fft.rfft2(noise) * amp, s=(n, n))
    return w / w.std(dim=(-2, -1), keepdim=True)


class NavierStokes2d:
    """IF-RK4 for w_t + u.grad w = nu lap w - drag w + A sin(n_f y) on [0, 2pi)^2, n^2 points."""

    def __init__(self, n: int, nu: float, dt: float, forcing_amp: float = 0.1, forcing_mode: int = 4, drag: float = 0.1) -> None:
        self.n, self.dt = n, dt
        kx = torch.fft.fftfreq(n, 1.0 / n).to(DTYPE)[:, None].expand(n, n // 2 + 1)
        ky = torch.arange(n // 2 + 1, dtype=DTYPE)[None, :].expand(n, n // 2 + 1)
        # Axis 0 is x, axis 1 is y: the last (rfft) axis carries ky.
        self.ikx, self.iky = 1j * kx, 1j * ky
        lap = kx**2 + ky**2
        self.inv_lap = torch.where(lap > 0, 1.0 / lap.clamp(min=1e-12), torch.zeros_like(lap))
        self.dealias = ((kx.abs() < n / 3) & (ky < n / 3)).to(DTYPE)
        lin = nu * lap + drag
        self.e = torch.exp(-lin * dt)
        self.e2 = torch.exp(-lin * dt / 2)
        y = torch.arange(n, dtype=DTYPE) * (2 * math.pi / n)
        f = forcing_amp * torch.sin(forcing_mode * y)[None, :].expand(n, n)
        self.fh = torch.fft.rfft2(f)

    def _nonlinear(self, wh: torch.Tensor) -> torch.Tensor:
        wh = wh * self.dealias
        psi = wh * self.inv_lap  # -lap psi = w
        u = torch.fft.irfft2(self.iky * psi, s=(self.n, self.n))  # u = psi_y
        v = torch.fft.irfft2(-self.ikx * psi, s=(self.n, self.n))  # v = -psi_x
        wx = torch.fft.irfft2(self.ikx * wh, s=(self.n, self.n))
        wy = torch.fft.irfft2(self.iky * wh, s=(self.n, self.n))
        return -torch.fft.rfft2(u * wx + v * wy) + self.fh

    def step(self, wh: torch.Tensor) -> torch.Tensor:
        dt, e, e2 = self.dt, self.e, self.e2
        a = dt * self._nonlinear(wh)
        b = dt * self._nonlinear(e2 * (wh + a / 2))
        c = dt * self._nonlinear(e2 * wh + b / 2)
        d = dt * self._nonlinear(e * wh + e2 * c)
        return e * wh + (e * a + 2 * e2 * (b + c) + d) / 6

    def evolve(self, w: torch.Tensor, t: float) -> torch.Tensor:
        wh = torch.fft.rfft2(w.to(DTYPE))
        for _ in range(round(t / self.dt)):
            wh = self.step(wh)
        return torch.fft.irfft2(wh, s=(self.n, self.n))
