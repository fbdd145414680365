"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

Curves over training fraction: validation of (progress, loss) arrays, the trailing moving average,
normalization by the final loss, and Qiu et al.'s collapse deviation.

The paper normalizes by the final training loss with no offset (L-hat = 0): l(t) = L(t) / L(T),
over t = tokens seen / token budget. Qiu et al. (https://arxiv.org/abs/2507.02119) subtract an
irreducible loss L0 first; `irreducible` gives that form. All functions are pure numpy.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def as_curve(progress: ArrayLike, loss: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(progress, loss) as float arrays of one shape, sorted by progress (stable, so ties keep
    their report order)."""
    p = np.asarray(progress, dtype=float).reshape(-1)
    y = np.asarray(loss, dtype=float).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"progress and loss differ in length: {p.size} vs {y.size}")
    if p.size and np.any(np.diff(p) < 0):
        order = np.argsort(p, kind="stable")
        p, y = p[order], y[order]
    return p, y


def smooth(progress: ArrayLike, loss: ArrayLike, window: float) -> np.ndarray:
    """Trailing moving average over `window` of training fraction: point i averages the finite
    losses with progress in (p_i - window, p_i].

    Trailing, not centered, so that a live run and a finished reference are smoothed alike (a
    live run has no future points); the lag it adds cancels when both curves get the same window.
    Non-finite values are skipped rather than propagated: divergence is judged on raw values.
    """
    p, y = as_curve(progress, loss)
    if window <= 0 or p.size == 0:
        return y.copy()
    finite = np.isfinite(y)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, y, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    lo = np.searchsorted(p, p - window, side="right")
    hi = np.arange(1, p.size + 1)
    n = counts[hi] - counts[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (sums[hi] - sums[lo]) / np.maximum(n, 1), np.nan)


def final_loss(progress: ArrayLike, loss: ArrayLike, *, smooth_window: float = 0.0) -> float:
    """The last finite value of the (optionally smoothed) curve: the paper's L(T)."""
    y = smooth(progress, loss, smooth_window)
    finite = y[np.isfinite(y)]
    if finite.size == 0:
        raise ValueError("curve has no finite loss")
    return float(finite[-1])


def normalize(
    progress: ArrayLike,
    loss: ArrayLike,
    *,
    final: float | None = None,
    irreducible: float = 0.0,
    smooth_window: float = 0.0,
) -> np.ndarray:
    """l(t) = (L(t) - L_hat) / (L(T) - L_hat), L(T) the curve's own final loss unless given.

    L_hat = 0 is the paper's choice ("consistently found" to align best); a positive
    `irreducible` is Qiu et al.'s form. Smoothing, when asked, happens before L(T) is read so that
    a noisy last step does not set the scale of the whole curve.
    """
    y = smooth(progress, loss, smooth_window)
    if final is None:
        final = final_loss(progress, y)
    denom = final - irreducible
    if not denom > 0:
        raise ValueError(f"final loss {final} must exceed the irreducible loss {irreducible}")
    return (y - irreducible) / denom


def collapse_deviation(
    curves: list[tuple[ArrayLike, ArrayLike]],
    at: ArrayLike,
    *,
    irreducible: float = 0.0,
    smooth_window: float = 0.0,
) -> np.ndarray:
    """Qiu et al.'s Eq. 2: std over curves of the normalized loss, over its mean, at fractions
    `at`. Given seeds of one model it is their noise floor (Eq. 3); given a family, its spread.
    """
    if len(curves) < 2:
        raise ValueError("collapse deviation needs at least two curves")
    t = np.asarray(at, dtype=float)
    rows = []
    for progress, loss in curves:
        p, y = as_curve(progress, loss)
        ell = normalize(p, y, irreducible=irreducible, smooth_window=smooth_window)
        rows.append(np.interp(t, p, ell, left=np.nan))
    m = np.vstack(rows)
    return m.std(axis=0, ddof=1) / m.mean(axis=0)
