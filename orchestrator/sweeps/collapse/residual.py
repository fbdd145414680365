"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

The deviation-from-collapse diagnostic (the paper's Sec. 4, App. A).

While a run trains its final loss is unknown, so it is normalized "early-aligned": by the divisor
that best matches the reference over t in [0.25, 0.5]. The collapse residual is then
r(t) = L(t) / c - l_ref(t); a run that tracks its family stays near zero, and a fault (a restart
onto different hardware, a numerics bug) shows as a sustained rise, well before the raw loss
looks wrong. The paper gives no threshold. Here it is calibrated from seed noise,
theta(t) = max(k * sigma_r(t), floor) with k = 3, where sigma_r is the residual's own seed
spread (`EmpiricalReference.residual_spread`), and a deviation is a trailing mean of r over
`window` reports above theta for `consecutive` reports in a row.

The floor (default 0.01, i.e. 1% of the final loss) keeps a threshold from collapsing to zero
where seed noise vanishes (inside the align window) or is underestimated from few seeds; 1% is
the size of the paper's parametric-reference error at 610M (MAE 1.07%), below which a residual
cannot be told apart from the reference's own misfit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.sweeps.collapse.curves import as_curve, smooth
from orchestrator.sweeps.collapse.divisor import fit_divisor
from orchestrator.sweeps.collapse.reference import EmpiricalReference

ALIGN = (0.25, 0.5)
"""The paper's early-align window."""


@dataclass(frozen=True)
class Residual:
    progress: np.ndarray
    residual: np.ndarray
    """r(t) = L(t) / divisor - l_ref(t); positive when the run is worse than its family."""
    divisor: float
    """The frozen early-align divisor (a prediction of the final loss)."""


def collapse_residual(
    progress: ArrayLike,
    loss: ArrayLike,
    reference: Callable[[np.ndarray], np.ndarray],
    *,
    align: tuple[float, float] = ALIGN,
    smooth_window: float | None = None,
    divisor: float | None = None,
) -> Residual:
    """The collapse residual with the divisor frozen from `align` (or given).

    `smooth_window=None` takes the reference's own smoothing window, so that run and reference
    carry the same moving-average lag.
    """
    p, y = as_curve(progress, loss)
    if smooth_window is None:
        smooth_window = float(getattr(reference, "smooth_window", 0.0))
    y = smooth(p, y, smooth_window)
    c = fit_divisor(p, y, reference, align) if divisor is None else float(divisor)
    return Residual(p, y / c - np.asarray(reference(p), dtype=float), c)


@dataclass(frozen=True)
class Threshold:
    """theta(t) = max(k * sigma(t), floor); where sigma is undefined, the floor."""

    sigma: Callable[[np.ndarray], np.ndarray]
    k: float = 3.0
    floor: float = 0.01

    def __call__(self, t: np.ndarray) -> np.ndarray:
        s = np.asarray(self.sigma(np.asarray(t, dtype=float)), dtype=float)
        return np.fmax(self.k * s, self.floor)  # fmax: a NaN sigma yields the floor


def seed_threshold(
    sigma: Callable[[np.ndarray], np.ndarray], *, k: float = 3.0, floor: float = 0.01
) -> Threshold:
    """A residual threshold from a seed-noise spread sigma(t) (see the module docstring)."""
    if k <= 0 or floor < 0:
        raise ValueError(f"need k > 0 and floor >= 0, got k={k}, floor={floor}")
    return Threshold(sigma, k, floor)


def calibrate_threshold(
    reference: EmpiricalReference,
    *,
    align: tuple[float, float] = ALIGN,
    k: float = 3.0,
    floor: float = 0.01,
) -> Threshold:
    """The threshold for residuals against an empirical reference of >= 2 seeds: k times the
    leave-one-out residual spread of its runs under the same early alignment."""
    return seed_threshold(reference.residual_spread(align), k=k, floor=floor)


def _rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    finite = np.isfinite(x)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, x, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    hi = np.arange(1, x.size + 1)
    lo = np.maximum(hi - window, 0)
    n = counts[hi] - counts[lo]
    return np.where(n > 0, (sums[hi] - sums[lo]) / np.maximum(n, 1), np.nan)


def detect_deviation(
    progress: ArrayLike,
    residual: ArrayLike,
    threshold: float | ArrayLike | Callable[[np.ndarray], np.ndarray],
    *,
    window: int = 10,
    consecutive: int = 5,
    start: float = 0.0,
    two_sided: bool = False,
) -> float | None:
    """The training fraction where a sustained deviation began, or None.

    A report breaches when the trailing mean of r over the last `window` reports exceeds
    theta(t) (|r| when `two_sided`; by default only a run worse than its family counts). The first
    run of `consecutive` breaching reports at t >= `start` is the deviation; its onset is dated
    back, within the first breach's averaging window, to the earliest report whose own residual
    exceeds theta, because the trailing mean lags the change it detects.

    Smoothed reports are not independent: with ~10 reports per smoothing window, `window=10,
    consecutive=5` fired on about 0.5% of seed-noise-only synthetic runs at k = 3, where
    `window=5, consecutive=3` fired on 1-3%. Scale both with the reports per smoothing window;
    `start` is normally the end of the align window, inside which r is zero by construction.
    """
    if window < 1 or consecutive < 1:
        raise ValueError(f"window and consecutive must be >= 1, got {window}, {consecutive}")
    p, r = as_curve(progress, residual)
    if callable(threshold):
        theta = np.asarray(threshold(p), dtype=float)
    else:
        theta = np.broadcast_to(np.asarray(threshold, dtype=float), p.shape)
    mean = _rolling_mean(r, window)
    size = np.abs if two_sided else (lambda v: v)
    with np.errstate(invalid="ignore"):
        breach = (size(mean) > theta) & (p >= start)
        raw = (size(r) > theta) & (p >= start)
    run = 0
    for i, b in enumerate(breach):
        run = run + 1 if b else 0
        if run == consecutive:
            first = i - consecutive + 1
            lookback = range(max(0, first - window + 1), first + 1)
            onset = next((j for j in lookback if raw[j]), first)
            return float(p[onset])
    return None
