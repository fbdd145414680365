"""The tabular scenario: deployed records, the historical records the prior is fitted on, a GMM.

Records are d-dimensional; the deployed model scores a record by s(x) = w.x with w = (1, ..., 1)
/ sqrt(d). The deployed (real) distribution F is a mixture of a bulk N(0, I) and a small risky
segment N(m w, r^2 I) of share pi, so the score is (1 - pi) N(0, 1) + pi N(m, r^2) and every
metric of F has a closed form: the "true metric" is computed from F itself, never from a sample
or from the generator.

The historical distribution S, on which the frozen generator is fitted, has the same risky
segment but its bulk sits `shift` score units higher, N(shift w, I): the scores were recorded
before the deployed scorer was recalibrated. A positive shift makes the prior over-state alerts
and the mean score, a negative one under-state them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class World:
    """The deployed distribution F and the historical S (they differ by the bulk's shift)."""

    dim: int
    risky_share: float
    risky_offset: float
    risky_sd: float
    shift: float

    @property
    def direction(self) -> np.ndarray:
        return np.full(self.dim, 1.0 / math.sqrt(self.dim))

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...], *, historical: bool = False) -> np.ndarray:
        """Records [*size, d] from F (or from S with historical=True)."""
        size = (size,) if isinstance(size, int) else tuple(size)
        risky = rng.random(size) < self.risky_share
        bulk_mean = self.shift if historical else 0.0
        center = np.where(risky, self.risky_offset, bulk_mean)[..., None] * self.direction
        sd = np.where(risky, self.risky_sd, 1.0)[..., None]
        return center + sd * rng.standard_normal(size + (self.dim,))

    def score(self, x: np.ndarray) -> np.ndarray:
        return x @ self.direction

    def true_metric(self, metric: str, threshold: float) -> float:
        """theta(F) in closed form: the score is (1 - pi) N(0, 1) + pi N(m, r^2)."""
        pi, m, r = self.risky_share, self.risky_offset, self.risky_sd
        if metric == "alert_rate":
            tail = lambda mu, sd: 0.5 * math.erfc((threshold - mu) / (sd * math.sqrt(2.0)))  # noqa: E731
            return (1.0 - pi) * tail(0.0, 1.0) + pi * tail(m, r)
        if metric == "mean_score":
            return pi * m
        raise ValueError(f"the tabular scenario has no metric {metric!r}: use alert_rate or mean_score")


def metric_values(scores: np.ndarray, metric: str, threshold: float) -> np.ndarray:
    """h(x) from a score: the alert indicator 1{s > threshold} or the score itself."""
    if metric == "alert_rate":
        return (scores > threshold).astype(float)
    if metric in ("mean_score", "nll"):
        return np.asarray(scores, dtype=float)
    raise ValueError(f"unknown metric {metric!r}")


# --- a Gaussian mixture fitted by EM -----------------------------------------------------------


def gmm_init(x: torch.Tensor, components: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Equal weights, means at distinct random records, every covariance the data's."""
    idx = torch.randperm(len(x), generator=gen)[:components]
    cov = torch.cov(x.T).reshape(x.shape[1], x.shape[1])
    return {"logits": torch.zeros(components, dtype=x.dtype), "means": x[idx].clone(),
            "covs": cov.expand(components, -1, -1).clone()}


def gmm_log_joint(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """log pi_k + log N(x | mu_k, Sigma_k), [N, K]."""
    chol = torch.linalg.cholesky(params["covs"])  # [K, d, d]
    diff = (x[:, None, :] - params["means"][None]).unsqueeze(-1)  # [N, K, d, 1]
    sol = torch.linalg.solve_triangular(chol, diff, upper=False).squeeze(-1)  # [N, K, d]
    logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)  # [K]
    log_norm = -0.5 * (sol.square().sum(-1) + logdet + x.shape[1] * LOG_2PI)
    return torch.log_softmax(params["logits"], 0) + log_norm


def em_step(params: dict[str, torch.Tensor], x: torch.Tensor, reg: float = 1e-6) -> tuple[dict[str, torch.Tensor], float]:
    """One EM step; returns the new parameters and the NLL per record of the old ones."""
    joint = gmm_log_joint(params, x)
    log_px = torch.logsumexp(joint, dim=1, keepdim=True)
    resp = torch.exp(joint - log_px)  # [N, K]
    mass = resp.sum(0) + 1e-12
    means = (resp.T @ x) / mass[:, None]
    diff = x[:, None, :] - means[None]  # [N, K, d]
    covs = torch.einsum("nk,nki,nkj->kij", resp, diff, diff) / mass[:, None, None]
    covs = covs + reg * torch.eye(x.shape[1], dtype=x.dtype)
    return {"logits": torch.log(mass / len(x)), "means": means, "covs": covs}, float(-log_px.mean())


def gmm_sample(params: dict[str, torch.Tensor], count: int, gen: torch.Generator) -> torch.Tensor:
    """Records [count, d] from the mixture."""
    comp = torch.multinomial(torch.softmax(params["logits"], 0), count, replacement=True, generator=gen)
    chol = torch.linalg.cholesky(params["covs"])[comp]  # [count, d, d]
    eps = torch.randn(count, params["means"].shape[1], 1, generator=gen, dtype=chol.dtype)
    return params["means"][comp] + (chol @ eps).squeeze(-1)
