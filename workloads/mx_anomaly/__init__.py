"""Is Finer Better? The Limits of Microscaling Formats in LLMs (Fasoli et al., ICLR 2026) — https://arxiv.org/abs/2601.19026

mx_anomaly: the paper's block-size anomaly at small scale. One trial fixes a scale format
(E8M0, UE4M3 with or without NVFP4's per-tensor FP32 global scale, UE5M3) and sweeps the block
size from 256 down to 8, quantizing to FP4 E2M1 with `kernels.mx`:

- synthetic Gaussian (or Laplace) tensors of controlled width sigma: relative quantization MSE;
- the weights and the linear-layer inputs of a trained Celerity-shaped LM (pre-trained once and
  cached by `components.lm.pretrain`, celerity_lm's loop step for step, or read from a
  `ladder run celerity_lm` run folder): relative MSE, and the held-out loss increase with
  weights (W4) and with weights and activations (W4A4) fake-quantized.

The claims: with UE4M3 scales and no global scale, narrow distributions get worse as blocks
shrink below a threshold (the scale falls into UE4M3's subnormal range, where its step is
coarse); with UE5M3 scales the error does not rise as blocks shrink.
"""

from workloads.mx_anomaly.claims import CHECKS, CLAIMS, plot
from workloads.mx_anomaly.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
