"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

The Celerity recipe: from a small proxy's tuned hyperparameters to a model family whose loss
curves collapse. Tune once at the proxy (muP/CompleteP base LR, batch size, AdamW timescale
tau), then for every (width, depth) of the family at a chosen TPP (tokens per parameter):

* the token budget is D = TPP * N and the schedule (warmup fraction, linear decay to zero) is held
  fixed in training fraction;
* the peak LR is the base LR, muP-adjusted per hidden matrix: eta = lr * base_width / width;
* the batch grows with the dataset, B = B_proxy * (D / D_proxy)^0.5, independently of N;
* the timescale follows the optimal-tau law in TPP, tau = c_tau * TPP^m_tau (anchored at the
  proxy's tuned tau when one is given), and the weight decay is *solved* for it from
  tau = B / (eta * lambda * D), i.e. lambda = B / (eta * tau * D), B and D in tokens.

Holding TPP and tau fixed across sizes is what makes the normalized curves collapse.

Where the constants come from:

* B ∝ D^0.5, the schedule and the tau-from-lambda solve: the paper (Sec. 4, App. C.2). Its
  Table 2 batch sizes (176 ... 672 sequences for 300M ... 3.9B) scale as D^0.50.
* tau = 0.78 * TPP^-0.50: a reconstruction, the power law through Celerity's three TPP bands
  (20, 80, 234 TPP at tau = 0.175, 0.087, 0.051); the paper moves tau across TPP with the Power
  Lines law (Bergsma et al. 2025, https://arxiv.org/abs/2505.13738) but prints no prefactor.
* Power Lines' exponents, m_tau = -0.52 and B_opt ∝ D^0.383, come second-hand (they are not in
  its abstract); `ScalingLaws.power_lines()` uses them, its prefactor a reconstruction through
  Celerity's 20-TPP point.
* No depth correction to the LR (`lr_depth_exp = 0`): CompleteP (alpha = 1) scales residual
  branches by base_depth / depth and leaves Adam's hidden LR alone. A reconstruction, exposed
  as a parameter.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

ParamCount = Callable[[int, int], int]
"""(width, depth) -> the parameter count N that TPP is measured against."""

CELERITY_TAU_POINTS: tuple[tuple[float, float], ...] = ((20.0, 0.175), (80.0, 0.087), (234.0, 0.051))
"""Celerity's TPP bands and their tau (the paper's Sec. 4; 0.051 is the 1.8B model at 234 TPP)."""
CELERITY_SHAPES: tuple[tuple[int, int], ...] = ((640, 13), (896, 17), (1152, 23), (1536, 30), (2048, 40))
"""(width, depth) of Celerity 300M, 500M, 900M, 1.8B and 3.9B (the paper's Table 2)."""
CELERITY_BATCH_SIZES: tuple[int, ...] = (176, 240, 336, 464, 672)
"""Their batch sizes in sequences (Table 2)."""
POWER_LINES_TAU_EXP = -0.52
POWER_LINES_BATCH_EXP = 0.383


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(c, m) of y = c * x^m by least squares in log-log space."""
    m, log_c = np.polyfit(np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float)), 1)
    return float(np.exp(log_c)), float(m)


@dataclass(frozen=True)
class ScalingLaws:
    """The laws that move hyperparameters from the proxy to the family."""

    tau_coef: float = 0.78
    """c_tau of tau_opt = c_tau * TPP^tau_exp (a fit to Celerity's bands; used when the proxy
    has no tuned tau)."""
    tau_exp: float = -0.50
    """m_tau: how the optimal timescale falls with TPP."""
    batch_exp: float = 0.5
    """B ∝ D^batch_exp (Celerity's rule)."""
    lr_depth_exp: float = 0.0
    """Hidden LR ∝ (depth / base_depth)^lr_depth_exp (0 under CompleteP with Adam)."""

    @classmethod
    def power_lines(cls) -> "ScalingLaws":
        """Power Lines' exponents (m_tau = -0.52, B ∝ D^0.383); c_tau through tau(20) = 0.175."""
        return cls(
            tau_coef=0.175 * 20.0 ** -POWER_LINES_TAU_EXP,
            tau_exp=POWER_LINES_TAU_EXP,
            batch_exp=POWER_LINES_BATCH_EXP,
        )


@dataclass(frozen=True)
class Proxy:
    """The small model the base hyperparameters were tuned at."""

    width: int
    depth: int
    lr: float
    """Peak base LR (the LR at base width; muP rescales hidden matrices from it)."""
    batch_size: int
    """Batch in sequences per step."""
    seq_len: int
    tpp: float
    """The TPP the proxy was tuned at (sets the dataset size its batch size belongs to)."""
    tau: float | None = None
    """Tuned AdamW timescale at `tpp`; None takes tau from the law's prefactor instead."""
    warmup_frac: float = 0.1
    """Warmup as a fraction of training, held fixed across the family."""


@dataclass(frozen=True)
class ModelConfig:
    """One member of the family. Field names follow the workload `Config` where they overlap."""

    width: int
    depth: int
    params: int
    """N from the parameter-count function."""
    tpp: float
    """Tokens per parameter actually trained (tokens / params, after rounding to whole steps)."""
    tokens: int
    """D: steps * batch_tokens."""
    steps: int
    batch_size: int
    """Sequences per step."""
    seq_len: int
    batch_tokens: int
    """B in tokens: batch_size * seq_len."""
    lr: float
    """Peak base LR, the same for every member (what a muP workload takes)."""
    hidden_lr: float
    """The muP-adjusted peak LR of hidden matrices: the eta of tau = B / (eta * lambda * D)."""
    weight_decay: float
    """AdamW lambda on hidden matrices, solved so that the timescale equals `tau`."""
    tau: float
    warmup_frac: float
    base_width: int
    base_depth: int

    def to_dict(self, keys: Iterable[str] | None = None) -> dict[str, Any]:
        """As a plain dict; `keys` (e.g. a workload Config's field names) keeps only those."""
        d = asdict(self)
        if keys is None:
            return d
        wanted = set(keys)
        return {k: v for k, v in d.items() if k in wanted}


def gpt_params(width: int, depth: int, *, ffn_mult: int = 4, vocab: int = 0, tied_embeddings: bool = True) -> int:
    """Weights of a GPT-style decoder: per block 4 d^2 (attention) + 2 * ffn_mult * d^2 (MLP),
    plus the embedding (and an untied readout) of `vocab` rows. Biases and norms are ignored.
    With the default vocab = 0 it is the non-embedding count 12 d^2 L."""
    blocks = depth * (4 + 2 * ffn_mult) * width * width
    return int(blocks + (1 if tied_embeddings else 2) * vocab * width)


def celerity_params(width: int, depth: int) -> int:
    """Celerity's count: FFN 8x, Llama-3 vocabulary (128,256), untied embeddings; gives 0.27B,
    0.50B, 0.91B, 1.81B and 3.88B for its five shapes (nominally 300M ... 3.9B)."""
    return gpt_params(width, depth, ffn_mult=8, vocab=128_256, tied_embeddings=False)


def adamw_timescale(batch_tokens: float, lr: float, weight_decay: float, tokens: float) -> float:
    """tau = B / (eta * lambda * D), the EMA timescale of AdamW as a fraction of training (the
    paper's Eq. 2); eta must be the muP-adjusted LR."""
    return batch_tokens / (lr * weight_decay * tokens)


def weight_decay_for_tau(tau: float, batch_tokens: float, lr: float, tokens: float) -> float:
    """lambda = B / (eta * tau * D): the weight decay that gives timescale `tau`."""
    return batch_tokens / (lr * tau * tokens)


def mup_lr(base_lr: float, width: int, base_width: int, *, depth: int | None = None, base_depth: int | None = None, depth_exp: float = 0.0) -> float:
    """The hidden-matrix LR under muP (x base_width / width), optionally x (depth/base_depth)^depth_exp."""
    lr = base_lr * base_width / width
    if depth is not None and base_depth is not None and depth_exp:
        lr *= (depth / base_depth) ** depth_exp
    return lr


def optimal_tau(tpp: float, laws: ScalingLaws = ScalingLaws()) -> float:
    """tau_opt = c_tau * TPP^m_tau."""
    return laws.tau_coef * tpp**laws.tau_exp


def target_tau(tpp: float, proxy: Proxy, laws: ScalingLaws = ScalingLaws()) -> float:
    """The tau to train at `tpp`: the proxy's tuned tau moved along the law's exponent (its own
    prefactor wins over the law's, since it was measured on this setup), else the law."""
    if proxy.tau is None:
        return optimal_tau(tpp, laws)
    return proxy.tau * (tpp / proxy.tpp) ** laws.tau_exp


def scale(
    proxy: Proxy,
    width: int,
    depth: int,
    *,
    tpp: float,
    laws: ScalingLaws = ScalingLaws(),
    param_count: ParamCount = gpt_params,
    batch_multiple: int = 1,
    warmup_tokens_cap: float | None = None,
) -> ModelConfig:
    """One family member at `tpp`. `batch_multiple` rounds the batch (e.g. to the data-parallel
    world size); `warmup_tokens_cap` applies Celerity's min(10%, 375M tokens) warmup rule, which
    changes the warmup fraction with size and so costs some early collapse (off by default)."""
    if batch_multiple < 1:
        raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
    params = int(param_count(width, depth))
    proxy_tokens = proxy.tpp * param_count(proxy.width, proxy.depth)
    target_tokens = tpp * params
    batch = proxy.batch_size * (target_tokens / proxy_tokens) ** laws.batch_exp
    batch_size = max(batch_multiple, batch_multiple * round(batch / batch_multiple))
    batch_tokens = batch_size * proxy.seq_len
    steps = max(1, math.ceil(target_tokens / batch_tokens))
    tokens = steps * batch_tokens
    hidden_lr = mup_lr(proxy.lr, width, proxy.width, depth=depth, base_depth=proxy.depth, depth_exp=laws.lr_depth_exp)
    tau = target_tau(tpp, proxy, laws)
    warmup = proxy.warmup_frac if warmup_tokens_cap is None else min(proxy.warmup_frac, warmup_tokens_cap / tokens)
    return ModelConfig(
        width=width,
        depth=depth,
        params=params,
        tpp=tokens / params,
        tokens=tokens,
        steps=steps,
        batch_size=batch_size,
        seq_len=proxy.seq_len,
        batch_tokens=batch_tokens,
        lr=proxy.lr,
        hidden_lr=hidden_lr,
        weight_decay=weight_decay_for_tau(tau, batch_tokens, hidden_lr, tokens),
        tau=tau,
        warmup_frac=warmup,
        base_width=proxy.width,
        base_depth=proxy.depth,
    )


def family(
    proxy: Proxy,
    shapes: Sequence[tuple[int, int]],
    *,
    tpp: float,
    laws: ScalingLaws = ScalingLaws(),
    param_count: ParamCount = gpt_params,
    batch_multiple: int = 1,
    warmup_tokens_cap: float | None = None,
) -> list[ModelConfig]:
    """The family's configs, one per (width, depth), all at one TPP and its tau."""
    return [
        scale(
            proxy, w, d, tpp=tpp, laws=laws, param_count=param_count,
            batch_multiple=batch_multiple, warmup_tokens_cap=warmup_tokens_cap,
        )
        for w, d in shapes
    ]
