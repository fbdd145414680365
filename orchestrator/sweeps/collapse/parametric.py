"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

The paper's parametric reference curve (Eq. 4-5) and its fit.

    l_hat(t) = ((1 + e1) / (t + e1))^m + b * (eta(t) + e2)^q,   then divided by l_hat(1),

with m = 0.05, e1 = 0.001, e2 = 0.1 fixed, eta(t) the LR schedule normalized to a peak of 1, and
the two shape parameters set by the controls: b = b_const * tau^b_exp, q = q_const * TPP^q_exp.
The first term is the power-law progress of training, the second the excess loss that the LR
carries and sheds as it decays; larger tau (a smaller b) drops more early and less late.

The fit alternates grid searches over (b_const, b_exp) and (q_const, q_exp) until neither moves,
ignoring t < 0.2, as the paper does. Reconstructions (the paper states neither): the objective
is the mean absolute error in normalized units (the metric the paper reports), each curve
weighted equally; after the alternation converges on a grid, the grids are narrowed around the
optimum and the alternation repeated (`refine` times), so the answer is not limited to the
first grid's resolution. The paper's fitted constants are not published; there are no defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.sweeps.collapse.curves import as_curve, normalize

Schedule = Callable[[np.ndarray], np.ndarray]

M, EPS1, EPS2 = 0.05, 1e-3, 0.1
"""The paper's fixed constants of Eq. 4."""


@dataclass(frozen=True)
class LinearDecaySchedule:
    """eta(t) normalized to a peak of 1: linear warmup over `warmup_frac`, then linear decay to
    `final` at t = 1 (0: the paper's decay-to-zero)."""

    warmup_frac: float = 0.1
    """Fraction of training in linear warmup (Celerity: 10%)."""
    final: float = 0.0
    """LR at t = 1 relative to the peak."""

    def __call__(self, t: np.ndarray) -> np.ndarray:
        t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
        w = self.warmup_frac
        decay = self.final + (1.0 - self.final) * (1.0 - t) / (1.0 - w) if w < 1 else np.ones_like(t)
        if w <= 0:
            return decay
        return np.where(t < w, t / w, decay)


def _shape(t: np.ndarray, b: ArrayLike, q: ArrayLike, schedule: Schedule, m: float, eps1: float, eps2: float) -> np.ndarray:
    t = np.clip(np.asarray(t, dtype=float), 0.0, None)
    base = ((1.0 + eps1) / (t + eps1)) ** m
    at_end = 1.0 + b * (float(schedule(np.array([1.0]))[0]) + eps2) ** q  # base(1) = 1
    return (base + b * (schedule(t) + eps2) ** q) / at_end


@dataclass(frozen=True)
class ParametricReference:
    """Eq. 4 with given shape parameters b and q; l(1) = 1."""

    b: float
    q: float
    schedule: Schedule = field(default_factory=LinearDecaySchedule)
    m: float = M
    eps1: float = EPS1
    eps2: float = EPS2

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return _shape(t, self.b, self.q, self.schedule, self.m, self.eps1, self.eps2)

    @classmethod
    def from_controls(
        cls,
        tau: float,
        tpp: float,
        *,
        b_const: float,
        b_exp: float,
        q_const: float,
        q_exp: float,
        schedule: Schedule | None = None,
    ) -> "ParametricReference":
        """Eq. 5: b = b_const * tau^b_exp, q = q_const * tpp^q_exp."""
        return cls(b_const * tau**b_exp, q_const * tpp**q_exp, schedule or LinearDecaySchedule())


@dataclass(frozen=True)
class ParametricFit:
    """Fitted Eq. 5 constants: a `ReferenceFamily` giving the curve for any (tau, tpp)."""

    b_const: float
    b_exp: float
    q_const: float
    q_exp: float
    schedule: Schedule = field(default_factory=LinearDecaySchedule)
    m: float = M
    eps1: float = EPS1
    eps2: float = EPS2
    error: float = float("nan")
    """Objective at the optimum (mean absolute error of l over t >= t_min for 'mae')."""

    def b(self, tau: float) -> float:
        return self.b_const * tau**self.b_exp

    def q(self, tpp: float) -> float:
        return self.q_const * tpp**self.q_exp

    def for_controls(self, tau: float, tpp: float) -> ParametricReference:
        return ParametricReference(self.b(tau), self.q(tpp), self.schedule, self.m, self.eps1, self.eps2)

    def to_dict(self) -> dict[str, Any]:
        sched = self.schedule
        return {
            "kind": "parametric",
            "b_const": self.b_const,
            "b_exp": self.b_exp,
            "q_const": self.q_const,
            "q_exp": self.q_exp,
            "m": self.m,
            "eps1": self.eps1,
            "eps2": self.eps2,
            "error": self.error,
            "schedule": (
                {"warmup_frac": sched.warmup_frac, "final": sched.final}
                if isinstance(sched, LinearDecaySchedule)
                else None
            ),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any], schedule: Schedule | None = None) -> "ParametricFit":
        """Rebuild a fit; a custom schedule is not serializable and must be passed again."""
        if schedule is None:
            if state.get("schedule") is None:
                raise ValueError("this fit used a custom schedule: pass it as `schedule`")
            schedule = LinearDecaySchedule(**state["schedule"])
        keys = ("b_const", "b_exp", "q_const", "q_exp", "m", "eps1", "eps2", "error")
        return cls(schedule=schedule, **{k: float(state[k]) for k in keys})


@dataclass(frozen=True)
class ControlledCurve:
    """A finished curve with the controls that set its shape."""

    progress: ArrayLike
    loss: ArrayLike
    tau: float
    tpp: float


def _odd(n: int) -> int:
    return n if n % 2 else n + 1


def fit_parametric(
    curves: Sequence[ControlledCurve | tuple[ArrayLike, ArrayLike, float, float]],
    *,
    schedule: Schedule | None = None,
    t_min: float = 0.2,
    objective: Literal["mae", "mse"] = "mae",
    smooth_window: float = 0.0,
    irreducible: float = 0.0,
    grid_size: int = 21,
    refine: int = 4,
    max_iter: int = 50,
    max_recentre: int = 50,
    points_per_curve: int = 100,
    b_const_range: tuple[float, float] = (1e-3, 10.0),
    b_exp_range: tuple[float, float] = (-2.0, 2.0),
    q_const_range: tuple[float, float] = (0.02, 20.0),
    q_exp_range: tuple[float, float] = (-1.5, 1.5),
    m: float = M,
    eps1: float = EPS1,
    eps2: float = EPS2,
) -> ParametricFit:
    """Fit b_const, b_exp, q_const, q_exp of Eq. 5 to finished curves (raw or normalized losses;
    each is normalized by its own final value) by alternating grid search.

    Each curve is resampled to `points_per_curve` evenly spaced fractions in [t_min, 1], so that
    densely logged runs do not outweigh sparse ones and the grids stay small. The constants are
    searched in log space (they are positive), the exponents linearly. b_exp is only identified
    when the curves span several tau, q_exp when they span several TPP; otherwise it is held at 0
    and the constant is the fitted b (or q) itself.
    """
    schedule = schedule or LinearDecaySchedule()
    items = [c if isinstance(c, ControlledCurve) else ControlledCurve(*c) for c in curves]
    if not items:
        raise ValueError("fit_parametric needs at least one curve")
    ts, ys, ks = [], [], []
    for k, c in enumerate(items):
        p, y = as_curve(c.progress, c.loss)
        ell = normalize(p, y, irreducible=irreducible, smooth_window=smooth_window)
        ok = np.isfinite(ell) & (p >= t_min)
        p, ell = p[ok], ell[ok]
        if p.size < 2:
            raise ValueError(f"curve {k} has fewer than two finite points at t >= {t_min}")
        grid = np.linspace(p[0], p[-1], min(points_per_curve, p.size))
        ts.append(grid)
        ys.append(np.interp(grid, p, ell))
        ks.append(np.full(grid.size, k))
    t, y, k = np.concatenate(ts), np.concatenate(ys), np.concatenate(ks)
    n_curves = len(items)
    weight = 1.0 / (np.bincount(k)[k] * n_curves)  # every curve counts once
    log_tau = np.log([c.tau for c in items])[k]
    log_tpp = np.log([c.tpp for c in items])[k]
    base = ((1.0 + eps1) / (t + eps1)) ** m
    lr = schedule(t) + eps2
    lr_end = float(schedule(np.array([1.0]))[0]) + eps2

    def error(b: np.ndarray, q: np.ndarray) -> np.ndarray:
        r = (base + b * lr**q) / (1.0 + b * lr_end**q) - y
        r = np.abs(r) if objective == "mae" else r * r
        return (r * weight).sum(axis=-1)

    def on_grid(log_const: np.ndarray, exp: np.ndarray, log_control: np.ndarray) -> np.ndarray:
        # the searched parameter at every (const, exp) pair and every point: [G, G, P]
        return np.exp(log_const[:, None, None] + exp[None, :, None] * log_control[None, None, :])

    g = _odd(grid_size)
    lo = np.array([np.log(b_const_range[0]), b_exp_range[0], np.log(q_const_range[0]), q_exp_range[0]])
    hi = np.array([np.log(b_const_range[1]), b_exp_range[1], np.log(q_const_range[1]), q_exp_range[1]])
    x = (lo + hi) / 2  # [log b_const, b_exp, log q_const, q_exp]
    span = hi - lo
    # an exponent is unidentified when its control does not vary: pin it at 0 rather than let
    # the search drift along the exact (const, exp) degeneracy
    free = np.array([True, np.ptp(log_tau) > 0, True, np.ptp(log_tpp) > 0])
    x[~free], span[~free] = 0.0, 0.0
    best = np.inf
    level = recentred = 0
    while level <= refine:
        grids = [np.linspace(c - s / 2, c + s / 2, g) for c, s in zip(x, span)]
        at = np.full(4, g // 2)
        for _ in range(max_iter):
            previous = at.copy()
            q = np.exp(x[2] + x[3] * log_tpp)
            e = error(on_grid(grids[0], grids[1], log_tau), q)
            at[0], at[1] = np.unravel_index(np.argmin(e), e.shape)
            x[0], x[1] = grids[0][at[0]], grids[1][at[1]]
            b = np.exp(x[0] + x[1] * log_tau)
            e = error(b, on_grid(grids[2], grids[3], log_tpp))
            at[2], at[3] = np.unravel_index(np.argmin(e), e.shape)
            x[2], x[3] = grids[2][at[2]], grids[3][at[3]]
            best = float(e[at[2], at[3]])
            if np.array_equal(at, previous):
                break
        if np.any(free & ((at == 0) | (at == g - 1))) and recentred < max_recentre:
            # b and q trade off along a narrow valley; an optimum on the grid's edge means the
            # search ran out of room, not that it converged, so move the grid before narrowing it
            recentred += 1
            continue
        span = span * 4 / (g - 1)  # the next grid spans +-2 steps of this one
        level += 1
    return ParametricFit(
        b_const=float(np.exp(x[0])),
        b_exp=float(x[1]),
        q_const=float(np.exp(x[2])),
        q_exp=float(x[3]),
        schedule=schedule,
        m=m,
        eps1=eps1,
        eps2=eps2,
        error=best,
    )
