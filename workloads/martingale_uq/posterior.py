"""The prequential blend, the minimax alpha and the interval draws: martingale posterior and bootstrap.

Everything here works on metric values, not on raw data: `z` holds h(x_i) of the real samples,
one row per repetition ([R, n]), and `prior` holds h(y_j) of draws y_j from the frozen generator Q
(a fixed pool: the paper's practice of estimating theta(Q) from many model draws; a draw from Q
is a draw from the pool). A draw function returns [R, B]: B posterior (or bootstrap) values of
the metric per repetition.

The maths (notes, section 6; derivation of the exact limit ours):
- forecast rule P_i = (1 - lambda_i) F_i + lambda_i Q with lambda_i = alpha / (i + alpha), so
  theta(P_i) = (i zbar_i + alpha theta(Q)) / (i + alpha) is a martingale under forward sampling;
- forward sampling (Algorithm 1) is a Polya urn whose limit is
  P_inf = W_0 G_0 + sum_i W_i delta_{x_i}, W ~ Dir(alpha, 1, ..., 1), G_0 ~ DP(alpha, Q),
  i.e. P_inf ~ DP(alpha + n, (alpha Q + sum_i delta_{x_i}) / (alpha + n));
- the released code's shortcut replaces theta(G_0) (variance Var_Q(h) / (alpha + 1)) by one
  draw h(Z_0), Z_0 ~ Q (variance Var_Q(h)): its posterior is wider by alpha^2 Var_Q(h) / (A (A + 1)),
  A = alpha + n, in variance.
"""

from __future__ import annotations

import math

import numpy as np

Array = np.ndarray


def blend_weight(alpha: float, i: int | Array) -> float | Array:
    """lambda_i = alpha / (i + alpha): the generator's weight in the forecast after i real samples."""
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    return alpha / (np.asarray(i, dtype=float) + alpha)


def forecast_metrics(z: Array, theta_q: float, alpha: float) -> Array:
    """theta(P_i) for i = 0..n along one sequence of metric values z [n]: the blend's running metric."""
    z = np.asarray(z, dtype=float)
    i = np.arange(len(z) + 1, dtype=float)
    lam = blend_weight(alpha, i)
    zbar = np.concatenate([[0.0], np.cumsum(z) / np.maximum(i[1:], 1.0)])
    return (1.0 - lam) * zbar + lam * theta_q


def minimax_alpha(
    z: Array, theta_q: float, *, c: float = 1.64, alpha_min: float = 5.0, alpha_max: float = 200.0,
) -> Array:
    """alpha* = sigma^2 / Delta^2 with plug-ins, per row of z [R, n]: the small-n minimax rule.

    sigma from the real metric values (ddof = 1; 0 with one sample), Delta = |theta(Q) - zbar| plus
    c sigma / sqrt(n), the released code's pad for the uncertainty of zbar, clipped to
    [alpha_min, alpha_max]. With c > 0, alpha <= n / c^2 before the clip.
    """
    z = np.atleast_2d(np.asarray(z, dtype=float))
    n = z.shape[-1]
    zbar = z.mean(-1)
    sigma = z.std(-1, ddof=1) if n > 1 else np.zeros(z.shape[0])
    delta = np.abs(theta_q - zbar) + c * sigma / math.sqrt(n)
    # sigma = 0: the data alone are certain (alpha takes its floor); Delta = 0 < sigma (c = 0 and
    # zbar = theta(Q)): nothing tells the prior from the data (alpha takes its ceiling).
    ratio = np.where(sigma > 0, np.inf, 0.0)
    np.divide(sigma**2, delta**2, out=ratio, where=delta > 0)
    return np.clip(ratio, alpha_min, alpha_max)


def dirichlet_weights(rng: np.random.Generator, alpha: Array, n: int, draws: int) -> tuple[Array, Array]:
    """(W_0 [R, B], W_1..n [R, B, n]) with (W_0, ..., W_n) ~ Dir(alpha_r, 1, ..., 1), via Gammas."""
    alpha = np.asarray(alpha, dtype=float)
    g0 = rng.standard_gamma(alpha[:, None], size=(len(alpha), draws))
    gi = rng.standard_exponential(size=(len(alpha), draws, n))
    total = g0 + gi.sum(-1)
    return g0 / total, gi / total[..., None]


def stick_count(alpha: float, tol: float) -> int:
    """Sticks K with E[mass left after K sticks] = (alpha / (alpha + 1))^K <= tol."""
    return max(1, math.ceil(math.log(tol) / math.log(alpha / (alpha + 1.0))))


def dp_functional(rng: np.random.Generator, alpha: Array, prior: Array, draws: int, *, tol: float = 1e-3) -> Array:
    """theta(G_0) = int h dG_0 for G_0 ~ DP(alpha_r, Q), [R, B], by stick-breaking.

    K sticks with V_k ~ Beta(1, alpha) and atoms from Q; the mass left after them (expected
    <= tol) goes to one more term drawn with the remainder's exact mean theta(Q) and variance
    Var_Q(h) / (alpha + 1), so the first two moments of the draw are exact whatever tol.
    """
    alpha = np.asarray(alpha, dtype=float)
    R = len(alpha)
    k = stick_count(float(alpha.max()), tol)
    v = -np.expm1(np.log(rng.random((R, draws, k))) / alpha[:, None, None])  # 1 - U^(1/alpha) ~ Beta(1, alpha)
    left = np.cumprod(1.0 - v, axis=-1)  # [R, B, K] mass left after each stick
    sticks = v * np.concatenate([np.ones((R, draws, 1)), left[..., :-1]], axis=-1)
    atoms = prior[rng.integers(0, len(prior), size=(R, draws, k))]
    theta_q, var_q = float(prior.mean()), float(prior.var())
    rest = theta_q + np.sqrt(var_q / (alpha[:, None] + 1.0)) * rng.standard_normal((R, draws))
    return np.einsum("rbk,rbk->rb", sticks, atoms) + left[..., -1] * rest


def exact_long_run(rng: np.random.Generator, z: Array, alpha: Array, prior: Array, draws: int, *, tol: float = 1e-3) -> Array:
    """Draws of theta_inf = W_0 theta(G_0) + sum_i W_i z_i: the urn's exact limit, [R, B]."""
    w0, w = dirichlet_weights(rng, alpha, z.shape[-1], draws)
    return w0 * dp_functional(rng, alpha, prior, draws, tol=tol) + np.einsum("rbn,rn->rb", w, z)


def single_atom_shortcut(rng: np.random.Generator, z: Array, alpha: Array, prior: Array, draws: int) -> Array:
    """The released code's Dirichlet-weight shortcut: theta = W_0 h(Z_0) + sum_i W_i z_i, one Z_0 ~ Q per draw."""
    w0, w = dirichlet_weights(rng, alpha, z.shape[-1], draws)
    atom = prior[rng.integers(0, len(prior), size=w0.shape)]
    return w0 * atom + np.einsum("rbn,rn->rb", w, z)


def forward_urn(rng: np.random.Generator, z: Array, alpha: Array, prior: Array, draws: int, horizon: int) -> Array:
    """Algorithm 1: run the forecast `horizon` steps ahead; the mean over the n + horizon values, [R, B].

    At step t the next value is a fresh generator draw with probability alpha / (n + t + alpha),
    else a uniform copy of the n + t values so far. Its target is the metric over the n samples
    seen and the next `horizon` deployed ones; as horizon grows it tends to the exact limit.
    """
    R, n = z.shape
    alpha = np.repeat(np.asarray(alpha, dtype=float), draws)  # [R*B]
    pool = np.empty((R * draws, n + horizon))
    pool[:, :n] = np.repeat(z, draws, axis=0)
    rows = np.arange(R * draws)
    for t in range(horizon):
        size = n + t
        fresh = rng.random(R * draws) * (size + alpha) < alpha
        copied = pool[rows, (rng.random(R * draws) * size).astype(np.int64)]
        pool[:, size] = np.where(fresh, prior[rng.integers(0, len(prior), size=R * draws)], copied)
    return pool.mean(-1).reshape(R, draws)


def bootstrap(rng: np.random.Generator, z: Array, draws: int) -> Array:
    """Non-parametric bootstrap: means of n values resampled with replacement, [R, B]."""
    R, n = z.shape
    idx = rng.integers(0, n, size=(R, draws, n)) + (np.arange(R) * n)[:, None, None]
    return z.ravel()[idx].mean(-1)


def interval(draws: Array, level: float) -> tuple[Array, Array]:
    """Equal-tailed interval of the draws along the last axis (the empirical 5% and 95% at level 0.9)."""
    lo, hi = np.quantile(draws, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=-1)
    return lo, hi


def exact_variance(z: Array, alpha: float, theta_q: float, var_q: float) -> float:
    """Var(theta_inf | data) = Var_G(h) / (A + 1), G = (alpha Q + sum_i delta_{z_i}) / A, A = alpha + n."""
    z = np.asarray(z, dtype=float)
    a = alpha + len(z)
    mean = (alpha * theta_q + z.sum()) / a
    second = (alpha * (var_q + theta_q**2) + (z**2).sum()) / a
    return (second - mean**2) / (a + 1.0)


def shortcut_excess_variance(n: int, alpha: float, var_q: float) -> float:
    """Var(shortcut) - Var(exact) = E[W_0^2] Var_Q(h) alpha / (alpha + 1) = alpha^2 Var_Q(h) / (A (A + 1))."""
    a = alpha + n
    return alpha**2 * var_q / (a * (a + 1.0))
