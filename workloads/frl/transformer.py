"""The third backbone: a Galerkin Transformer operator, as a baseline and with FRL.

Baseline: "Choose a Transformer: Fourier or Galerkin" (Shuhao Cao, NeurIPS 2021),
https://arxiv.org/abs/2105.14995. Its Galerkin-type attention has no softmax: per head,

    z = Q (LN(K)^T LN(V)) / n,

with Q, K, V linear maps of the grid points' features and LN a layer norm over each head's
channels. The 1/n makes K^T V a quadrature of the integral of k(x) v(x) over the domain, so the
same weights define the same operator on any grid: the model runs at every resolution. Its grid
points carry their physical coordinate as a positional encoding (Cao concatenates the coordinate;
on the periodic box that is sin x, cos x per axis, the same function on every grid), and its
operator-learning models decode the attention encoder's features with a spectral-convolution
regressor (FNO-style layers of a fixed number of modes), the layout kept here.

FRL-recon of it (the paper applies FRL to a Transformer but publishes no layers): the regressor's
mode tables become `FRLSpectralConv` (a weight that is a function of the physical wavenumber,
applied to every mode) and the FRL frequency input channels are added, as for the FNO. The
attention is left as it is: it is already a quadrature, whose resolution dependence is the
content of its input, not its weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from workloads.frl.model import _Backbone, spectral_body, spectral_layers


def physical_coordinates(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """sin x, cos x of the physical coordinate x in [0, 2 pi) per axis. [2 * len(shape), *shape]"""
    chans = []
    for axis, n in enumerate(shape):
        x = torch.arange(n, dtype=dtype, device=device) * (2 * math.pi / n)
        view = [1] * len(shape)
        view[axis] = n
        for c in (torch.sin(x), torch.cos(x)):
            chans.append(c.view(view).expand(*shape))
    return torch.stack(chans, dim=0)


class GalerkinAttention(nn.Module):
    """Cao's Galerkin-type attention: z = Q (LN(K)^T LN(V)) / n per head, linear in the number of points n."""

    def __init__(self, width: int, heads: int = 4) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width={width} must be a multiple of heads={heads}")
        self.heads, self.dh = heads, width // heads
        self.qkv = nn.Linear(width, 3 * width)
        self.norm_k = nn.LayerNorm(self.dh)
        self.norm_v = nn.LayerNorm(self.dh)
        self.out = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, n, W] -> [B, n, W]
        b, n, w = h.shape
        q, k, v = self.qkv(h).view(b, n, 3, self.heads, self.dh).unbind(2)  # each [B, n, H, d]
        k, v = self.norm_k(k), self.norm_v(v)
        kv = torch.einsum("bnhd,bnhe->bhde", k, v) / n  # the quadrature of k v over the domain
        z = torch.einsum("bnhd,bhde->bnhe", q, kv)
        return self.out(z.reshape(b, n, w))


class GalerkinTransformer(_Backbone):
    """lift (input, physical coordinates, and FRL's frequency channels when frl) -> depth/2 blocks of
    (Galerkin attention, pointwise feed-forward), each residual -> depth/2 spectral-regressor blocks
    (spectral conv + 1x1 conv, GELU between, as the FNO's) -> projection.

    Baseline: the regressor is a `SpectralConv` table of `modes` modes. FRL: `FRLSpectralConv`.
    """

    def __init__(self, dims: int, width: int, depth: int, modes: int, rho0: int, frl: bool, *,
                 pe_count: int = 4, pe_coord: str = "index", residual: bool = True, heads: int = 4, **frl_kw) -> None:
        super().__init__(dims, width, frl, pe_count, pe_coord, residual, coord_channels=2 * dims)
        # `depth` blocks in all, as the FNO's: the first half attention, the rest the spectral regressor.
        n_attn = max(1, depth // 2)
        n_reg = max(1, depth - n_attn)
        self.attn = nn.ModuleList(GalerkinAttention(width, heads) for _ in range(n_attn))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
                                 for _ in range(n_attn))
        self.spectral, self.pointwise = spectral_layers(dims, width, n_reg, modes, rho0, frl, **frl_kw)

    def coordinates(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return physical_coordinates(shape, dtype, device)

    def body(self, h: torch.Tensor) -> torch.Tensor:  # [B, W, *grid]
        shape = h.shape
        t = h.flatten(2).transpose(1, 2)  # [B, n, W]: every grid point is a token
        for attn, ffn in zip(self.attn, self.ffn):
            t = t + attn(t)
            t = t + ffn(t)
        return spectral_body(t.transpose(1, 2).reshape(shape), self.spectral, self.pointwise)
