"""Why Low-Precision Transformer Training Fails: An Analysis on Flash Attention (Qiu & Yao, ICLR 2026) — https://arxiv.org/abs/2510.04212

lowprec_attention: the paper's mechanism and its fix, measured. (a) The error-bias statistic: on
inputs whose attention row maxima are attained many times, the mean of the low-precision flash
attention output's error against float64, in units of its standard deviation, with and without
the fix (`stable_rounding`); with bf16 statistics a tied row's probabilities are exactly 1, the
row sums are integers that round the same way in every row, and the error is biased. (b) A small
low-precision training run of a decoder (the shared GPT of `components.lm.gpt`, celerity_lm's
model, with its attention replaced by `kernels.attention`) with each variant, reporting loss
curves: on a CPU the emulating reference (which honours `precision`), on a GPU the Triton kernel.
"""

from workloads.lowprec_attention.claims import BENCH_CHECKS, BENCH_CLAIMS, CHECKS, CLAIMS, plot
from workloads.lowprec_attention.workload import Config, smoke, train, validate

__all__ = ["BENCH_CHECKS", "BENCH_CLAIMS", "CHECKS", "CLAIMS", "Config", "plot", "smoke", "train", "validate"]
