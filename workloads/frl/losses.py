"""The training objectives: the shared fit term and FRL's two spectral-consistency terms.

FRL's loss is written L = L_std + lambda |F - u_hat|^2_freq, plus a cross-scale term; the norm of
the spectral term is not published. Normalised by the total spectral energy it would equal the
relative L2 fit term (Parseval) and add nothing, so it is reconstructed here as octave-balanced:
each octave of |k| contributes its own relative error, so the top octave below each grid's
Nyquist, where the blind zone of the next grid starts, weighs as much as the energetic low modes.
"""

from __future__ import annotations

import torch

from workloads.frl.model import mode_grid
from workloads.frl.solver import truncate


def rel_mse(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of |p - y|^2 / |y|^2 (scale-free, so every resolution and sample weighs alike)."""
    num = (p - y).flatten(1).pow(2).sum(1)
    den = y.flatten(1).pow(2).sum(1).clamp_min(1e-12)
    return (num / den).mean()


def octaves(n: int, dims: int, device: torch.device) -> list[torch.Tensor]:
    """Masks over the rfft coefficients of an n-point grid: |k| < 2, [2, 4), [4, 8), ... below Nyquist."""
    k, keep = mode_grid(n, dims, device)
    masks, lo, hi = [], 0.0, 2.0
    while lo < n / 2:
        m = (k >= lo) & (k < hi) & keep
        if m.any():
            masks.append(m)
        lo, hi = hi, 2 * hi
    return masks


def spectral_loss(p: torch.Tensor, y: torch.Tensor, dims: int) -> torch.Tensor:
    """Mean over octaves (and the batch) of sum_{k in octave} |p_hat - y_hat|^2 / sum_{k in octave} |y_hat|^2."""
    fft = torch.fft.rfft if dims == 1 else torch.fft.rfft2
    ph, yh = fft(p), fft(y)
    d = (ph - yh).abs().pow(2)
    e = yh.abs().pow(2)
    terms = []
    for m in octaves(p.shape[-1], dims, p.device):
        num = (d * m).flatten(1).sum(1)
        den = (e * m).flatten(1).sum(1)
        # An octave the target leaves (almost) empty has no relative error to speak of: floor it
        # at a millionth of the sample's energy instead of dividing by ~0.
        den = den + 1e-6 * e.flatten(1).sum(1)
        terms.append((num / den).mean())
    return torch.stack(terms).mean()


def cross_scale_loss(p_fine: torch.Tensor, p_coarse: torch.Tensor, y_coarse: torch.Tensor, dims: int) -> torch.Tensor:
    """|T_{rho/2} F(u_rho) - F(T_{rho/2} u_rho)|^2 / |T_{rho/2} y|^2: the model's answer on the coarse
    grid must be the truncation of its answer on the fine one."""
    down = truncate(p_fine, p_coarse.shape[-1], dims)
    num = (down - p_coarse).flatten(1).pow(2).sum(1)
    den = y_coarse.flatten(1).pow(2).sum(1).clamp_min(1e-12)
    return (num / den).mean()
