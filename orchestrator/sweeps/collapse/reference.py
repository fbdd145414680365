"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

Reference curves: the universal normalized curve l_ref(t) a family's runs collapse onto.

Every reference is a callable from an array of training fractions to normalized loss. Two kinds:

* `EmpiricalReference` — small finished runs under the family's controls (schedule, tau, TPP),
  normalized, averaged over seeds and interpolated (the paper's App. D, steps 2-3).
* `ParametricReference` (in `parametric.py`) — the paper's Eq. 4-5 surrogate, whose shape
  depends on tau and TPP.

A shape only predicts runs that share its controls: a reference fitted at one tau ranks a
weight-decay sweep worse than the current loss does. When trials differ in tau or TPP, pass a
*family* (`ReferenceFamily`: `ParametricFit` or `ReferenceTable`) that returns the reference for
each trial's controls.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.sweeps.collapse.curves import as_curve, normalize
from orchestrator.sweeps.collapse.divisor import fit_divisor


@runtime_checkable
class Reference(Protocol):
    """A normalized reference curve: l_ref(t) for an array of training fractions t."""

    def __call__(self, t: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class ReferenceFamily(Protocol):
    """References indexed by the controls that set a curve's shape."""

    def for_controls(self, tau: float, tpp: float) -> Reference: ...


def resolve_reference(
    reference: Reference | ReferenceFamily, tau: float | None = None, tpp: float | None = None
) -> Reference:
    """The reference for one run: a family is asked for its controls, a plain reference is used
    as is."""
    if isinstance(reference, ReferenceFamily):
        if tau is None or tpp is None:
            raise ValueError("this reference depends on tau and tpp: give both for the run")
        return reference.for_controls(float(tau), float(tpp))
    return reference


class EmpiricalReference:
    """The mean normalized curve of finished reference runs (seeds of one small model, or a few
    small sizes under one set of controls).

    Each run is smoothed by a trailing moving average of `smooth_window` training fraction,
    divided by its own final value, and interpolated onto a common grid. Compare runs to it with
    the same smoothing (the collapse functions read `smooth_window` off the reference for that).
    """

    smooth_window: float
    irreducible: float

    def __init__(
        self,
        runs: Sequence[tuple[ArrayLike, ArrayLike]],
        *,
        smooth_window: float = 0.02,
        irreducible: float = 0.0,
        grid_points: int = 401,
        min_final_progress: float = 0.99,
    ) -> None:
        if len(runs) == 0:
            raise ValueError("an empirical reference needs at least one finished run")
        curves = []
        for i, (progress, loss) in enumerate(runs):
            p, y = as_curve(progress, loss)
            ell = normalize(p, y, irreducible=irreducible, smooth_window=smooth_window)
            ok = np.isfinite(ell)
            p, ell = p[ok], ell[ok]
            if p.size < 2:
                raise ValueError(f"reference run {i} has fewer than two finite points")
            if p[-1] < min_final_progress:
                # normalizing by a loss that is not the final one would misplace the whole shape
                raise ValueError(
                    f"reference run {i} ends at progress {p[-1]:.3f} < {min_final_progress}: "
                    "references must be finished runs"
                )
            curves.append((p, ell))
        lo = max(p[0] for p, _ in curves)
        hi = min(p[-1] for p, _ in curves)
        grid = np.linspace(lo, hi, grid_points)
        matrix = np.vstack([np.interp(grid, p, ell) for p, ell in curves])  # [runs, grid]
        self._setup(grid, matrix, smooth_window, irreducible)

    def _setup(self, grid: np.ndarray, matrix: np.ndarray, smooth_window: float, irreducible: float) -> None:
        self.grid = np.asarray(grid, dtype=float)
        self.curves = np.atleast_2d(np.asarray(matrix, dtype=float))
        self.mean = self.curves.mean(axis=0)
        self.std = self.curves.std(axis=0, ddof=1) if self.n_runs >= 2 else None
        self.smooth_window = float(smooth_window)
        self.irreducible = float(irreducible)

    @property
    def n_runs(self) -> int:
        return int(self.curves.shape[0])

    def __call__(self, t: np.ndarray) -> np.ndarray:
        # NaN before the first reference point, so fits skip what the reference does not cover;
        # flat after the last one, which is within rounding of t = 1 for finished runs
        return np.interp(np.asarray(t, dtype=float), self.grid, self.mean, left=np.nan)

    def sigma(self, t: np.ndarray) -> np.ndarray:
        """Seed-to-seed standard deviation of the runs' self-normalized curves at t (zero at
        t = 1 by construction). Needs at least two runs."""
        if self.std is None:
            raise ValueError("the seed-to-seed spread needs at least two reference runs")
        return np.interp(np.asarray(t, dtype=float), self.grid, self.std, left=np.nan)

    def residual_spread(
        self, align: tuple[float, float] = (0.25, 0.5), *, pool: float = 0.1
    ) -> Callable[[np.ndarray], np.ndarray]:
        """The seed noise of the collapse residual: the RMS over runs of each run's residual
        against the mean of the *other* runs, with the divisor frozen from `align`.

        This, not `sigma`, is what calibrates a residual threshold: the residual is normalized by
        an early-aligned divisor, so its seed noise is ~0 inside the align window and grows after
        it, the opposite of the self-normalized spread. Leaving each run out keeps a run from
        being compared with itself, which would shrink the spread by (n - 1) / n. The mean square
        is pooled over a centered window of `pool` training fraction: from a handful of seeds a
        pointwise estimate dips to near zero by chance, and a threshold must not. Needs >= 2 runs.
        """
        if self.n_runs < 2:
            raise ValueError("the residual spread needs at least two reference runs")
        squares = []
        for i in range(self.n_runs):
            others = np.delete(self.curves, i, axis=0).mean(axis=0)
            ref_i = lambda t, others=others: np.interp(t, self.grid, others, left=np.nan)  # noqa: E731
            c = fit_divisor(self.grid, self.curves[i], ref_i, align)
            squares.append(np.square(self.curves[i] / c - others))
        mean_square = np.mean(squares, axis=0)
        if pool > 0:
            lo = np.searchsorted(self.grid, self.grid - pool / 2, side="left")
            hi = np.searchsorted(self.grid, self.grid + pool / 2, side="right")
            sums = np.concatenate([[0.0], np.cumsum(mean_square)])
            mean_square = (sums[hi] - sums[lo]) / (hi - lo)
        rms = np.sqrt(mean_square)
        grid = self.grid
        return lambda t: np.interp(np.asarray(t, dtype=float), grid, rms, left=np.nan)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (grid, per-run normalized curves, smoothing) for shipping a
        reference to a sweep or logging it as an artifact."""
        return {
            "kind": "empirical",
            "grid": self.grid.tolist(),
            "curves": self.curves.tolist(),
            "smooth_window": self.smooth_window,
            "irreducible": self.irreducible,
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> "EmpiricalReference":
        ref = cls.__new__(cls)
        ref._setup(np.asarray(state["grid"]), np.asarray(state["curves"]), state["smooth_window"], state["irreducible"])
        return ref


class ReferenceTable:
    """References keyed by (tau, tpp), e.g. one `EmpiricalReference` per tau of a weight-decay
    sweep. `for_controls` returns the nearest entry in log space and refuses one further than a
    relative `rtol` in either control, because a reference at the wrong tau mis-ranks trials."""

    def __init__(self, entries: Mapping[tuple[float, float], Reference], *, rtol: float = 0.05) -> None:
        if not entries:
            raise ValueError("a reference table needs at least one entry")
        self.entries = {(float(tau), float(tpp)): ref for (tau, tpp), ref in entries.items()}
        self.rtol = rtol
        windows = {float(getattr(ref, "smooth_window", 0.0)) for ref in self.entries.values()}
        # runs are smoothed once, before their reference is known, so entries must agree
        if len(windows) > 1:
            raise ValueError(f"references in one table must share a smoothing window, got {sorted(windows)}")
        self.smooth_window = windows.pop()

    def for_controls(self, tau: float, tpp: float) -> Reference:
        def distance(key: tuple[float, float]) -> float:
            return math.hypot(math.log(key[0] / tau), math.log(key[1] / tpp))

        key = min(self.entries, key=distance)
        limit = math.log1p(self.rtol)
        if abs(math.log(key[0] / tau)) > limit or abs(math.log(key[1] / tpp)) > limit:
            known = ", ".join(f"(tau={a:g}, tpp={b:g})" for a, b in sorted(self.entries))
            raise KeyError(f"no reference within {self.rtol:.0%} of tau={tau:g}, tpp={tpp:g}; have {known}")
        return self.entries[key]
