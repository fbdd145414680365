"""Backbones (a Fourier neural operator and a residual CNN; the Galerkin Transformer is in
`transformer.py`), each in a baseline and an FRL form.

Every model maps a field on a grid of n points per axis to a field on the same grid:
`forward(u)` with u of shape [B, n] (1-D) or [B, n, n] (2-D). The resolution is read from the
input's shape; `rho0` is the training resolution. The box is [0, 2 pi) per axis, so a Fourier
index k is the same physical wavenumber on every grid.

FRL-recon (the paper publishes no code; the layer-level details are reconstructed):

- `FRLSpectralConv`: the per-mode weight is a function W(nu), not a table, and it is applied to
  every mode below the grid's Nyquist. A table of `modes` weights (the baseline FNO) has no
  response at all above its last mode: Theorem 1's blind zone. With coord='physical',
  nu = min(|k| / k_Nyq(rho0), 1): a mode keeps its code on every grid, and above the training
  Nyquist the response is held at its value there. With coord='nyquist', nu = |k| / k_Nyq(rho)
  and log2(rho / rho0) is a second input, as the notes write it; the MLP then has to extrapolate
  in log2(rho / rho0), which it does badly (on the smoke Burgers problem: relative error 0.48 at
  4x, against 0.023 with 'physical').
- `frequency_channels`: input channels sin/cos(2 pi m x / k_Nyq(rho)), m = 1..M.
- `AlignedConv`: the CNN's resolution-aligned convolution, applied through its frequency
  response at physical wavenumbers (a tap j cells away on the training grid is the physical
  offset j * pi / k_Nyq(rho0)), held above the training Nyquist like FRLSpectralConv's.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def fourier_features(nu: torch.Tensor, count: int) -> torch.Tensor:
    """[sin(pi j nu), cos(pi j nu)]_{j=1..count} of normalised coordinates nu in [0, 1]. [..., 2*count]

    The notes write 2*pi*j*nu; with nu in [0, 1] that gives the Nyquist mode the same code as the
    mean (nu = 1 and nu = 0 coincide). pi*j*nu keeps the code one-to-one on [0, 1].
    """
    j = torch.arange(1, count + 1, dtype=nu.dtype, device=nu.device)
    arg = math.pi * nu[..., None] * j
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=-1)


def frequency_channels(shape: tuple[int, ...], count: int, coord: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """FRL's positional frequency channels on a grid of `shape` (1 or 2 axes). [2*count*len(shape), *shape]

    PE_freq(x, m, rho) = sin(2 pi m x / k_Nyq(rho)). With x the grid index j (coord='index') this
    is sin(2 m x_phys), the same physical function on every grid, which is what makes the code
    resolution-aligned. The paper does not say whether x is the index or the physical coordinate;
    coord='physical' takes x = x_phys in [0, 2 pi), whose code changes with rho.
    """
    chans = []
    m = torch.arange(1, count + 1, dtype=dtype, device=device)
    for axis, n in enumerate(shape):
        j = torch.arange(n, dtype=dtype, device=device)
        x = j if coord == "index" else j * (2 * math.pi / n)
        arg = 2 * math.pi * m[:, None] * x[None, :] / (n / 2)  # [count, n]
        for c in (torch.sin(arg), torch.cos(arg)):
            view = [count] + [1] * len(shape)
            view[1 + axis] = n
            chans.append(c.view(view).expand(count, *shape))
    return torch.cat(chans, dim=0)


# --- spectral convolutions -------------------------------------------------------------------


def mode_grid(n: int, dims: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """|k| of every rfft coefficient of an n-point grid (Euclidean in 2-D), and the mask of those
    strictly below Nyquist on every axis (the Nyquist mode itself carries no sign, so it is dropped)."""
    if dims == 1:
        k = torch.arange(n // 2 + 1, device=device, dtype=torch.float32)
        return k, k < n / 2
    kx = torch.fft.fftfreq(n, 1.0 / n).to(device).float()[:, None].abs().expand(n, n // 2 + 1)
    ky = torch.arange(n // 2 + 1, device=device, dtype=torch.float32)[None, :].expand(n, n // 2 + 1)
    return torch.sqrt(kx**2 + ky**2), torch.maximum(kx, ky) < n / 2


def _rfft(h: torch.Tensor, dims: int) -> torch.Tensor:
    return torch.fft.rfft(h) if dims == 1 else torch.fft.rfft2(h)


def _irfft(hh: torch.Tensor, n: int, dims: int) -> torch.Tensor:
    return torch.fft.irfft(hh, n=n) if dims == 1 else torch.fft.irfft2(hh, s=(n, n))


class SpectralConv(nn.Module):
    """The FNO layer: a learned complex [c_in, c_out] matrix per Fourier mode, for the lowest
    `modes` modes per axis only; every mode above is zeroed."""

    def __init__(self, channels: int, modes: int, dims: int) -> None:
        super().__init__()
        self.channels, self.modes, self.dims = channels, modes, dims
        shape = (channels, channels, modes) if dims == 1 else (channels, channels, 2 * modes, modes)
        self.weight = nn.Parameter(torch.randn(*shape, 2) / channels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, C, *grid]
        n = h.shape[-1]
        m = min(self.modes, (n - 1) // 2 + 1)  # modes strictly below this grid's Nyquist
        w = torch.view_as_complex(self.weight)
        hh = _rfft(h, self.dims)
        out = torch.zeros_like(hh)
        if self.dims == 1:
            out[..., :m] = torch.einsum("bim,iom->bom", hh[..., :m], w[..., :m])
        else:
            # Rows hold kx = 0..m-1 then the negative kx = -(m-1)..-1 at the end of the axis.
            out[..., :m, :m] = torch.einsum("bixy,ioxy->boxy", hh[..., :m, :m], w[:, :, :m, :m])
            if m > 1:
                neg = torch.einsum("bixy,ioxy->boxy", hh[..., n - m + 1 :, :m], w[:, :, 2 * self.modes - m + 1 :, :m])
                out[..., n - m + 1 :, :m] = neg
        return _irfft(out, n, self.dims)


class FRLSpectralConv(nn.Module):
    """FRL-recon spectral layer: the weight of mode k is MLP(features(nu(k))), on every mode below Nyquist.

    `diagonal` makes W one complex number per channel instead of a [c, c] matrix.
    """

    def __init__(self, channels: int, dims: int, rho0: int, features: int = 8, hidden: int = 64,
                 coord: str = "physical", diagonal: bool = False) -> None:
        super().__init__()
        self.channels, self.dims, self.rho0 = channels, dims, rho0
        self.features, self.coord, self.diagonal = features, coord, diagonal
        out = channels * 2 if diagonal else channels * channels * 2
        # 2-D 'physical': the signed (kx, ky), each held at +-1, not |k|; a radial weight W(|k|) cannot
        # represent an anisotropic operator (advection, the Kolmogorov forcing's direction).
        n_in = 2 * features * (dims if coord == "physical" else 1) + (1 if coord == "nyquist" else 0)
        self.mlp = nn.Sequential(nn.Linear(n_in, hidden), nn.GELU(), nn.Linear(hidden, out))
        with torch.no_grad():  # start near the scale of the table-initialised FNO layer
            self.mlp[-1].weight.mul_(0.1 / math.sqrt(1 if diagonal else channels))
            self.mlp[-1].bias.normal_(0.0, 1.0 / channels)

    def coordinates(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP's input per rfft coefficient of an n-point grid, and the below-Nyquist mask."""
        k, keep = mode_grid(n, self.dims, device)
        if self.coord == "physical":
            if self.dims == 1:
                return fourier_features((k / (self.rho0 / 2)).clamp(max=1.0), self.features), keep
            kx = torch.fft.fftfreq(n, 1.0 / n).to(device).float()[:, None].expand(n, n // 2 + 1)
            ky = torch.arange(n // 2 + 1, device=device, dtype=torch.float32)[None, :].expand(n, n // 2 + 1)
            held = [(c / (self.rho0 / 2)).clamp(-1.0, 1.0) for c in (kx, ky)]
            return torch.cat([fourier_features(c, self.features) for c in held], dim=-1), keep
        feats = fourier_features(k / (n / 2), self.features)
        res = torch.full_like(k, math.log2(n / self.rho0))
        return torch.cat([feats, res[..., None]], dim=-1), keep

    def weights(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        feats, keep = self.coordinates(n, device)
        w = self.mlp(feats)  # [*modes, out]
        return torch.view_as_complex(w.reshape(*w.shape[:-1], -1, 2).contiguous()), keep

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, C, *grid]
        n, c = h.shape[-1], self.channels
        w, keep = self.weights(n, h.device)
        hh = _rfft(h, self.dims) * keep
        if self.diagonal:
            out = hh * w.movedim(-1, 0)
        elif self.dims == 1:
            out = torch.einsum("bim,mio->bom", hh, w.reshape(-1, c, c))
        else:
            out = torch.einsum("bixy,xyio->boxy", hh, w.reshape(*w.shape[:2], c, c))
        return _irfft(out, n, self.dims)


# --- resolution-aligned convolution ----------------------------------------------------------


class AlignedConv(nn.Module):
    """A periodic convolution applied through its frequency response at physical wavenumbers.

    The kernel is a table of 2r+1 taps per axis on the training grid. Its response
    H(k) = sum_j K_j exp(-i k j 2 pi / rho0) is a function of the physical wavenumber k, so on
    any grid the layer multiplies mode k by H(k): on the training grid that is the ordinary
    convolution (less the Nyquist mode), on a coarser grid the same physical filter, and above
    the training Nyquist, where a table of taps has no defined response (it would alias back,
    H being periodic in k), the response is held at H(rho0/2), as FRLSpectralConv holds its own.
    An ordinary convolution's taps instead shrink with the cell on a finer grid.
    """

    def __init__(self, channels: int, dims: int, rho0: int, radius: int) -> None:
        super().__init__()
        self.channels, self.dims, self.rho0, self.radius = channels, dims, rho0, radius
        taps = 2 * radius + 1
        fan_in = channels * taps**dims
        self.weight = nn.Parameter(torch.randn(channels, channels, *([taps] * dims)) / math.sqrt(fan_in))
        self.bias = nn.Parameter(torch.zeros(channels))

    def _phases(self, k: torch.Tensor) -> torch.Tensor:
        """exp(-i k_held j 2 pi / rho0) for signed wavenumbers k, taps j = -r..r. [len(k), taps]"""
        held = k.sign() * k.abs().clamp(max=self.rho0 / 2)
        j = torch.arange(-self.radius, self.radius + 1, device=k.device, dtype=torch.float32)
        return torch.polar(torch.ones(len(k), len(j), device=k.device), -held[:, None] * j[None, :] * (2 * math.pi / self.rho0))

    def response(self, n: int, device: torch.device) -> torch.Tensor:
        """H per rfft coefficient of an n-point grid. [c_out, c_in, *modes]"""
        w = self.weight.to(torch.complex64)
        ky = torch.arange(n // 2 + 1, device=device, dtype=torch.float32)
        if self.dims == 1:
            return torch.einsum("oij,mj->oim", w, self._phases(ky))
        kx = torch.fft.fftfreq(n, 1.0 / n).to(device).float()
        return torch.einsum("oijl,xj,yl->oixy", w, self._phases(kx), self._phases(ky))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, C, *grid]
        n = h.shape[-1]
        _, keep = mode_grid(n, self.dims, h.device)
        hh = _rfft(h, self.dims) * keep
        eq = "bim,oim->bom" if self.dims == 1 else "bixy,oixy->boxy"
        out = torch.einsum(eq, hh, self.response(n, h.device))
        bias = self.bias.view(1, -1, *([1] * self.dims))
        return _irfft(out, n, self.dims) + bias


# --- backbones -------------------------------------------------------------------------------


class _Backbone(nn.Module):
    """Shared input/output plumbing: optional FRL frequency channels in, residual out."""

    def __init__(self, dims: int, width: int, frl: bool, pe_count: int, pe_coord: str, residual: bool,
                 coord_channels: int = 0) -> None:
        super().__init__()
        self.dims, self.frl, self.pe_count, self.pe_coord, self.residual = dims, frl, pe_count, pe_coord, residual
        # A backbone whose tokens carry their position (the Transformer) adds `coord_channels` channels
        # from `coordinates`, a function of the physical coordinate, baseline and FRL alike.
        self.coord_channels = coord_channels
        extra = (2 * pe_count * dims if frl else 0) + coord_channels
        self.lift = nn.Linear(1 + extra, width)
        self.proj = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, 1))

    def body(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def coordinates(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Positional channels of a grid of `shape`. [coord_channels, *shape]"""
        raise NotImplementedError

    def forward(self, u: torch.Tensor) -> torch.Tensor:  # [B, *grid] -> [B, *grid]
        x = u[:, None]
        if self.coord_channels:
            pos = self.coordinates(tuple(u.shape[1:]), u.dtype, u.device)
            x = torch.cat([x, pos.expand(u.shape[0], *pos.shape)], dim=1)
        if self.frl and self.pe_count > 0:
            pe = frequency_channels(tuple(u.shape[1:]), self.pe_count, self.pe_coord, u.dtype, u.device)
            x = torch.cat([x, pe.expand(u.shape[0], *pe.shape)], dim=1)
        h = self.lift(x.movedim(1, -1)).movedim(-1, 1)  # [B, W, *grid]
        out = self.proj(self.body(h).movedim(1, -1)).squeeze(-1)
        return u + out if self.residual else out


def spectral_layers(dims: int, width: int, n: int, modes: int, rho0: int, frl: bool,
                    **frl_kw) -> tuple[nn.ModuleList, nn.ModuleList]:
    """`n` blocks of (spectral conv + 1x1 conv): `FRLSpectralConv` on every mode with FRL, else
    `SpectralConv` tables of `modes` modes. Built spectral first, as the RNG draws them."""
    if frl:
        spectral = nn.ModuleList(FRLSpectralConv(width, dims, rho0, **frl_kw) for _ in range(n))
    else:
        spectral = nn.ModuleList(SpectralConv(width, modes, dims) for _ in range(n))
    conv = nn.Conv1d if dims == 1 else nn.Conv2d
    return spectral, nn.ModuleList(conv(width, width, 1) for _ in range(n))


def spectral_body(h: torch.Tensor, spectral: nn.ModuleList, pointwise: nn.ModuleList) -> torch.Tensor:
    """The blocks of `spectral_layers` in turn, GELU between them."""
    for i, (spec, point) in enumerate(zip(spectral, pointwise)):
        h = spec(h) + point(h)
        if i < len(spectral) - 1:
            h = F.gelu(h)
    return h


class FNO(_Backbone):
    """lift -> `depth` blocks of (spectral conv + 1x1 conv), GELU between -> two-layer projection.

    Baseline: `SpectralConv` tables of `modes` modes. FRL: `FRLSpectralConv` on every mode.
    """

    def __init__(self, dims: int, width: int, depth: int, modes: int, rho0: int, frl: bool, *,
                 pe_count: int = 4, pe_coord: str = "index", residual: bool = True, **frl_kw) -> None:
        super().__init__(dims, width, frl, pe_count, pe_coord, residual)
        self.spectral, self.pointwise = spectral_layers(dims, width, depth, modes, rho0, frl, **frl_kw)

    def body(self, h: torch.Tensor) -> torch.Tensor:
        return spectral_body(h, self.spectral, self.pointwise)


class CNN(_Backbone):
    """lift -> `depth` residual blocks of periodic convolutions (GELU) -> two-layer projection.

    Baseline: ordinary convolutions of `kernel` taps, defined in grid cells, so on a finer grid
    the same taps span a smaller physical neighbourhood. FRL: `AlignedConv`, the same taps read
    as a physical filter on every grid.
    """

    def __init__(self, dims: int, width: int, depth: int, kernel: int, rho0: int, frl: bool, *,
                 pe_count: int = 4, pe_coord: str = "index", residual: bool = True, **_unused) -> None:
        super().__init__(dims, width, frl, pe_count, pe_coord, residual)
        conv = nn.Conv1d if dims == 1 else nn.Conv2d
        if frl:
            self.convs = nn.ModuleList(AlignedConv(width, dims, rho0, kernel // 2) for _ in range(depth))
        else:
            self.convs = nn.ModuleList(conv(width, width, kernel, padding=kernel // 2, padding_mode="circular") for _ in range(depth))

    def body(self, h: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            h = h + F.gelu(conv(h))
        return h
