"""The Power of Small Initialization in Noisy Low-Tubal-Rank Tensor Recovery (ICLR 2026) — https://arxiv.org/abs/2603.02729

tubal_fgd: recover a low-tubal-rank PSD tensor X* = X * X^T in R^{n x n x k} (t-product: slice-wise
products after an FFT along the third mode) from noisy Gaussian linear measurements, by
factorized gradient descent on U in R^{n x R x k} with the tubal rank over-estimated (R > r).
One trial runs one initialisation at one R: small random (entries N(0, alpha^2 / R)), large
random (the same draw at alpha = large_init_scale, the size of X*) or spectral (the top-R factor
of (1/m) M*(y)). It reports the training loss
f(U) = (1/4m)||y - M(U * U^T)||^2 as `train/loss`, the relative error
||U * U^T - X*||_F^2 / ||X*||_F^2 as `eval/rse`, the held-out loss that drives early stopping
as `eval/val_loss`, and returns the best iterate's error, the early-stopped iterate's (argmin
of the held-out loss) and the last one's, with the error curve at log-spaced iterations.

The claims, headline first: with small initialisation the best and the early-stopped errors do
not depend on R, and stay within a stated factor of the minimax level n r k sigma^2 / m; with
large random and with spectral initialisation the error grows with R; early stopping lands near
the best iterate; and without it, small initialisation eventually over-fits the noise. The checks
(true by construction): the best iterate's error is the least, small init starts at X = 0, and
no trial diverged.

The paper's real-data setting is `task="completion"`: a real image (or a video's frames) read from
`image_dir` as a third-order tensor, a uniformly sampled part of its entries observed with noise,
and FGD on the asymmetric factorization U * V^T from small initialisation (completion.py, images.py).
It reports the held-out observed entries' loss as `eval/loss`, the relative error on all entries as
`eval/rse` and the PSNR as `eval/psnr`; `sweeps/repro/tubal_fgd_real.py` runs it on the paper's images.
"""

from workloads.tubal_fgd.claims import CHECKS, CLAIMS, plot
from workloads.tubal_fgd.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
