"""The Power of Small Initialization in Noisy Low-Tubal-Rank Tensor Recovery (ICLR 2026) — https://arxiv.org/abs/2603.02729

tubal_fgd: recover a low-tubal-rank PSD tensor X* = X * X^T in R^{n x n x k} (t-product: slice-wise
products after an FFT along the third mode) from noisy Gaussian linear measurements, by
factorized gradient descent on U in R^{n x R x k} with the tubal rank over-estimated (R > r).
One trial runs one initialisation at one R: small random (entries N(0, alpha^2 / R)) or
spectral (the top-R factor of (1/m) M*(y)). It reports the training loss
f(U) = (1/4m)||y - M(U * U^T)||^2 as `train/loss`, the relative error
||U * U^T - X*||_F^2 / ||X*||_F^2 as `eval/rse`, the held-out loss that drives early stopping
as `eval/val_loss`, and returns the best iterate's error, the early-stopped iterate's (argmin
of the held-out loss) and the last one's, with the error curve at log-spaced iterations.

The claims: with small initialisation the best and the early-stopped errors do not depend on R;
with spectral initialisation the error grows with R; early stopping lands near the best iterate;
and without it, small initialisation eventually over-fits the noise.
"""

from workloads.tubal_fgd.claims import CHECKS, CLAIMS, plot
from workloads.tubal_fgd.workload import Config, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "Config", "plot", "smoke", "train", "validate"]
