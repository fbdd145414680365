"""Breaking Scale Anchoring: Frequency Representation Learning for Accurate High-Resolution Inference from Low-Resolution Training (Wang & Zhang, ICLR 2026) — https://arxiv.org/abs/2512.05132

frl: zero-shot super-resolution forecasting. A one-step forecaster u(t0) -> u(t0 + lag) is
trained at rho0 points per axis and run on grids 2x and 4x finer. The data come from
pseudo-spectral solvers run here (1-D viscous Burgers, 2-D Navier-Stokes in vorticity form); the
field at resolution rho is the DNS truncated to |k| < rho/2, so every grid sees the same physical
field at its own bandwidth.

Three backbones, a Fourier neural operator, a residual CNN and a Galerkin Transformer (Cao 2021,
arXiv 2105.14995; `transformer.py`), each as a baseline and with FRL-recon, a reconstruction of
Frequency Representation Learning (the paper has no public code):

1. multi-resolution data: the training pairs also at rho0/2, rho0/4 (`multires_levels`);
2. resolution-aligned frequency representations: spectral weights / convolution responses that
   are functions of the physical wavenumber on every grid, defined above the training Nyquist
   (`frl`, `frl_coord`), and frequency input channels sin/cos(2 pi m x / k_Nyq(rho)) (`pe_count`);
3. spectral consistency: an octave-balanced spectral loss and a cross-scale truncation term
   (`spectral_weight`, `cross_scale_weight`).

Errors are reported against the DNS reference (`eval/rel_l2/x{f}`, the claims' metric) and
against the truncated DNS on each grid (`eval/rel_l2_grid/x{f}`), with the blind band [rho0/2, rho/2)
measured on its own (the model's error there, how much of the input's band it passes on, and how
well copying the input's band would do) and, as a calibration control, the solver's own error at
each resolution. `claims.py` says when the baseline is anchored and when it is not.
"""

from workloads.frl.claims import CHECKS, CLAIMS, plot
from workloads.frl.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
