"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

The divisor fit: the final loss L(T) that best aligns a partial curve with a reference curve.

Dividing a run's prefix by the right L(T) lays it on the reference, l_ref(t) = L(t) / L(T), so the
divisor that aligns them *is* the predicted final loss (the paper's App. D, step 5). The paper does
not state its alignment objective; this module uses least squares in normalized units,
min_c sum_i (L_i / c - l_ref(t_i))^2, whose minimizer is the closed form
c* = sum(L_i^2) / sum(L_i * l_ref(t_i)).

The paper gives no uncertainty (it lists one as future work). `fit_divisor_with_uncertainty`
combines two independent sources, in quadrature:

* **Point noise**, by a seeded moving-block bootstrap over the window's points. Blocks, not single
  points, because smoothed or densely reported curves are autocorrelated and an i.i.d. bootstrap
  would understate the spread; with `block=1` it is the ordinary bootstrap.
* **Seed noise**, propagated from the seed-to-seed spread sigma(t) of normalized reference curves
  when one is given: a run's normalized curve differs from the reference mean by a deviation of
  size sigma(t) that is smooth in t, so it is taken as fully correlated over the window, giving a
  relative error sum(L_i sigma_i) / sum(L_i l_ref_i) (first order in sigma). It is usually the
  larger term once a window holds many points: the bootstrap cannot see a shape difference that
  is shared by every point of the window.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Callable

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.sweeps.collapse.curves import as_curve

ReferenceFn = Callable[[np.ndarray], np.ndarray]


def _window_points(
    progress: ArrayLike, loss: ArrayLike, reference: ReferenceFn, window: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = window
    if not lo < hi:
        raise ValueError(f"window must be (lo, hi) with lo < hi, got {window}")
    p, y = as_curve(progress, loss)
    inside = (p >= lo) & (p <= hi) & np.isfinite(y)
    p, y = p[inside], y[inside]
    ref = np.asarray(reference(p), dtype=float)
    ok = np.isfinite(ref) & (ref > 0)  # an empirical reference is NaN before its first point
    return p[ok], y[ok], ref[ok]


def fit_divisor(
    progress: ArrayLike, loss: ArrayLike, reference: ReferenceFn, window: tuple[float, float]
) -> float:
    """Predicted final loss: c* = sum(L^2) / sum(L * l_ref) over the points with progress in
    [lo, hi]. Raises ValueError when the window holds no usable point."""
    _, y, ref = _window_points(progress, loss, reference, window)
    if y.size == 0:
        raise ValueError(f"no finite points with a defined reference in window {window}")
    return float(np.dot(y, y) / np.dot(y, ref))


@dataclass(frozen=True)
class DivisorEstimate:
    """A predicted final loss with its uncertainty (standard deviations, in loss units)."""

    value: float
    """c*, the least-squares divisor."""
    std: float
    """Total standard deviation: bootstrap and seed terms in quadrature."""
    low: float
    """Lower end of the normal interval at `level`."""
    high: float
    """Upper end of the normal interval at `level`."""
    bootstrap_std: float
    """Spread of c* over block-bootstrap resamples of the window's points."""
    seed_std: float
    """Seed noise propagated from sigma(t); 0 when no sigma was given."""
    n_points: int
    """Points of the curve inside the window."""
    level: float
    """Coverage the interval aims at."""

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def fit_divisor_with_uncertainty(
    progress: ArrayLike,
    loss: ArrayLike,
    reference: ReferenceFn,
    window: tuple[float, float],
    *,
    sigma: ReferenceFn | None = None,
    n_boot: int = 200,
    block: int | None = None,
    level: float = 0.9,
    seed: int = 0,
) -> DivisorEstimate:
    """`fit_divisor` plus an uncertainty (see the module docstring for the method).

    `sigma(t)` is the seed-to-seed standard deviation of normalized curves, e.g.
    `EmpiricalReference.sigma`; `block` is the bootstrap block length in points (default: the
    cube root of the number of points, the usual rate for moving blocks); `seed` makes the
    bootstrap reproducible, so a restored scheduler reproduces the same numbers.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    p, y, ref = _window_points(progress, loss, reference, window)
    n = y.size
    if n == 0:
        raise ValueError(f"no finite points with a defined reference in window {window}")
    value = float(np.dot(y, y) / np.dot(y, ref))

    boot_std = 0.0
    if n >= 2 and n_boot >= 2:
        b = max(1, min(n, block if block is not None else round(n ** (1 / 3))))
        n_blocks = math.ceil(n / b)
        rng = np.random.default_rng(seed)
        starts = rng.integers(0, n - b + 1, size=(n_boot, n_blocks))
        idx = (starts[:, :, None] + np.arange(b)).reshape(n_boot, -1)[:, :n]  # [n_boot, n]
        yb, rb = y[idx], ref[idx]
        boots = np.einsum("ij,ij->i", yb, yb) / np.einsum("ij,ij->i", yb, rb)
        boot_std = float(boots.std(ddof=1))

    seed_std = 0.0
    if sigma is not None:
        s = np.asarray(sigma(p), dtype=float)
        s = np.where(np.isfinite(s), s, 0.0)
        seed_std = value * float(np.dot(y, s) / np.dot(y, ref))

    std = math.hypot(boot_std, seed_std)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return DivisorEstimate(value, std, value - z * std, value + z * std, boot_std, seed_std, n, level)
