"""Frozen Priors, Fluid Forecasts: Prequential Uncertainty for Low-Data Deployment with Martingale Posteriors (Ruiz-Mazo & Garg, ICLR 2026) — https://openreview.net/forum?id=3FCHmUPmhe

martingale_uq: uncertainty for a deployed metric theta = E_F[h(x)] from n real samples and a
frozen, misspecified generator Q. The forecast blends the empirical distribution with Q under
the Dirichlet schedule lambda_i = alpha / (i + alpha); resampling future forecasts (the
martingale posterior) gives intervals for the metric, with alpha from the small-n minimax rule
clip(sigma^2 / Delta^2, 5, 200). Three intervals are compared with the bootstrap:

- the exact long-run draw, theta_inf = W_0 theta(G_0) + sum_i W_i h(x_i) with
  W ~ Dir(alpha, 1, ..., 1) and G_0 ~ DP(alpha, Q) (the urn's limit);
- the released code's single-sample shortcut, which puts one draw h(Z_0), Z_0 ~ Q, where
  theta(G_0) belongs: its variance is Var_Q(h) instead of Var_Q(h) / (alpha + 1), so its
  intervals are wider;
- the forward urn run `horizon` steps (Algorithm 1), for the metric over the next deployed samples.

Frozen generators: a Gaussian mixture fitted on historical tabular records whose bulk score
sits `shift` sd above the deployed one (metrics: alert rate over a threshold, mean score); a
tiny autoregressive byte model trained on the standard-library corpus (metrics: NLL per byte of
a held-out text, and the rate of texts above an NLL threshold); and 'tiny_gpt2', the paper's
text setting at smoke size: transformers' GPT2LMHeadModel from a small GPT2Config, trained here on
the standard library's training files (cached per seed), frozen, its NLL per token of held-out
files' texts the metric and its own samples at `temperature` the prior. A trial fits the
generator, then for every n runs `repetitions` repetitions and reports each interval's coverage
of the true metric of the deployed distribution. The paper's own text setting is 'causal_lm': a
pretrained LM loaded by transformers' `from_pretrained` (GPT-2), frozen, scoring the texts of a
text file (WikiText-2 raw) and its own generations (`sweeps/repro/martingale_uq_real.py`).
Its image setting is 'pixels': a small PixelCNN trained on CIFAR-10 (or loaded, saved by
an earlier trial), frozen, whose bits per dim of deployed images (CIFAR-10's test split, or SVHN's
out of distribution) and of its own samples is the metric (`sweeps/repro/martingale_uq_images.py`;
the paper's generator there is a DDPM scored by CLIP).

The claims, at n = 20 and over every prior the smoke draws (none chosen by the sign of its
misspecification): the headline, in the paper's metric, the tiny GPT-2's NLL per token, with its
samples at temperatures 1.0 (under-stating the deployed NLL) and 1.1 (about on it): the exact
intervals cover near the nominal 90% (>= 0.85); pooled over every prior and metric, they cover
at least as often as the bootstrap's; for a rare alert rate (3.7%) with a prior over-stating it
(shift +0.3) and one under-stating it (shift -0.3), the exact intervals cover >= 0.85 and the
bootstrap's at most 0.63. With k = 0 alerts among the n samples (half the repetitions) the exact
interval's upper end is about the prior's own rate, so the under-stating prior leaves those
repetitions uncovered; each side's coverage is reported beside the pooled one. The check: the
shortcut's posterior is wider than the exact one.
"""

from workloads.martingale_uq.claims import CHECKS, CLAIMS, plot
from workloads.martingale_uq.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
