"""WASI's linear algebra: explained-variance rank, warm-started subspace iteration for the weight,
one-power-step Tucker (HOSVD) compression of the activation, and the custom autograd Function
that keeps only the compressed factors for the backward pass.

Shapes: the weight W is [out, in]; a WASI layer's input x is [B, N, C] (batch, tokens, channels,
C = in) and is kept as a Tucker core S [r1, r2, r3] with factors U1 [B, r1], U2 [N, r2],
U3 [C, r3], so that x ~ S x1 U1 x2 U2 x3 U3.
"""

from __future__ import annotations

import math

import torch
from torch.autograd import Function


def orthonormalize(a: torch.Tensor, fix_signs: bool = True) -> torch.Tensor:
    """Q of the thin QR of a [m, k], with the signs fixed so that diag(R) >= 0 when asked.

    LAPACK's Householder QR leaves the column signs of Q free; fixing them makes Q a function of
    the column space and of the order of a's columns, so a warm-started basis that barely moves
    between steps keeps its orientation (the `r_from='previous'` update relies on it). A Tucker
    factor needs no fix: the core is recomputed with the same factor, and x~ does not change."""
    q, r = torch.linalg.qr(a)
    if not fix_signs:
        return q
    signs = torch.sign(torch.diagonal(r))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return q * signs


def qr_flops(m: int, k: int) -> int:
    """Flops of a Householder QR of an [m, k] matrix with the thin Q formed: 4 m k^2 - 4 k^3 / 3
    for m >= k (the factorisation and forming Q, about 2 m k^2 - 2 k^3 / 3 each).

    FlopCounterMode does not count linalg_qr; this is added by hand. It is the larger of the
    textbook counts (the paper's code uses 2 max(m, k) min(m, k)^2), so WASI is not flattered."""
    m, k = max(m, k), min(m, k)
    return int(4 * m * k * k - (4 * k**3) // 3)


def energy_rank(singular_values: torch.Tensor, threshold: float) -> int:
    """Smallest k with sum_{i<k} s_i^2 / sum_i s_i^2 >= threshold (at least 1, at most len(s))."""
    if not 0 < threshold <= 1:
        raise ValueError(f"explained-variance threshold must lie in (0, 1], got {threshold}")
    energy = singular_values.double().square()
    total = float(energy.sum())
    if total == 0:
        return 1
    cumulative = torch.cumsum(energy, 0) / total
    # A tolerance: a threshold equal to a cumulative value must select that k despite rounding.
    k = int(torch.searchsorted(cumulative, torch.tensor(threshold - 1e-12, dtype=cumulative.dtype))) + 1
    return max(1, min(k, singular_values.numel()))


def init_weight_factors(w: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    """First step: truncated SVD W = U S V^T, k by explained variance; L = U_k, R = S_k V_k^T."""
    u, s, vh = torch.linalg.svd(w.detach(), full_matrices=False)
    k = energy_rank(s, threshold)
    return u[:, :k].contiguous(), (s[:k, None] * vh[:k]).contiguous(), k


def subspace_step(w: torch.Tensor, l_prev: torch.Tensor, r_from: str = "new") -> tuple[torch.Tensor, torch.Tensor]:
    """One warm-started subspace-iteration step: q = W^T L_prev, L = orth(W q).

    r_from='new': R = L^T W, the orthogonal projection of W onto span(L), so L R = L L^T W;
    r_from='previous': R = q^T = L_prev^T W as in the paper's released code (one matmul fewer;
    L R = L L_prev^T W is a projection only while L stays close to L_prev)."""
    w = w.detach()
    q = w.t() @ l_prev  # [in, k]
    l_new = orthonormalize(w @ q)  # [out, k]
    r = q.t() if r_from == "previous" else l_new.t() @ w
    return l_new, r.contiguous()


def subspace_step_flops(out_f: int, in_f: int, k: int, r_from: str = "new") -> int:
    """Flops of `subspace_step` on an [out, in] weight at rank k (matmuls counted as 2 m n p)."""
    flops = 2 * in_f * out_f * k + 2 * out_f * in_f * k + qr_flops(out_f, k)
    if r_from == "new":
        flops += 2 * k * out_f * in_f
    return flops


def unfold(x: torch.Tensor, mode: int) -> torch.Tensor:
    """Mode-n unfolding X_(n): [I_n, prod of the other sizes]."""
    return x.movedim(mode, 0).reshape(x.shape[mode], -1)


def mode_product(x: torch.Tensor, u: torch.Tensor, mode: int) -> torch.Tensor:
    """x x_mode u^T: contract mode `mode` of x (size I) with u [I, r], the new mode in its place."""
    return torch.tensordot(x, u, dims=([mode], [0])).movedim(-1, mode)


def _cap(rank: int, size: int, rest: int) -> int:
    """The rank in effect: 0 (or a rank reaching the mode size) keeps the mode whole."""
    return size if rank <= 0 or rank >= size else min(rank, rest)


def tucker_power_step(
    x: torch.Tensor, ranks: tuple[int, ...], previous: list[torch.Tensor | None] | None,
    generator: torch.Generator | None = None, sequential: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Tucker compression of x by one power step per mode, warm-started from `previous`.

    Mode n: U_n = orth(Y_(n) Y_(n)^T U_n,prev) (warm) or orth(Y_(n) G) with G Gaussian (first
    call: a randomised range finder). Y is x itself for every mode (HOSVD, the paper's) or, with
    `sequential`, x already projected on the factors of the modes before n (ST-HOSVD: after the
    batch mode the other modes work on a tensor r1/B the size). A mode whose rank is 0 or at
    least its size is kept whole: its factor is None (the identity, neither computed nor stored).
    The core is S = x x1 U1^T x2 U2^T ... . Returns (S, [U_1, ..., U_d])."""
    x = x.detach()
    y = x
    factors: list[torch.Tensor | None] = []
    for mode, rank in enumerate(ranks):
        src = y if sequential else x
        size = src.shape[mode]
        rank = _cap(rank, size, src.numel() // size)
        if rank == size:
            factors.append(None)
            continue
        yn = unfold(src, mode)  # [I_n, rest]
        prev = None if previous is None else previous[mode]
        if prev is None or prev.shape != (size, rank):
            # Drawn where the generator lives (the CPU), so that every device starts from the same G.
            g = torch.randn(yn.shape[1], rank, generator=generator, dtype=x.dtype,
                            device=generator.device if generator is not None else x.device).to(x.device)
            u = orthonormalize(yn @ g, fix_signs=False)
        else:
            u = orthonormalize(yn @ (yn.t() @ prev), fix_signs=False)
        factors.append(u)
        if sequential:
            y = mode_product(y, u, mode)
    return (y if sequential else tucker_core(x, factors)), factors


def tucker_core(x: torch.Tensor, factors: list[torch.Tensor | None]) -> torch.Tensor:
    """S = x x1 U1^T x2 U2^T ... (a None factor leaves its mode), the largest reduction first."""
    for mode, u in enumerate(factors):
        if u is not None:
            x = mode_product(x, u, mode)
    return x


def tucker_restore(core: torch.Tensor, factors: list[torch.Tensor | None]) -> torch.Tensor:
    """x~ = S x1 U1 x2 U2 x3 U3 (for tests and diagnostics; training never rebuilds x)."""
    for mode, u in enumerate(factors):
        if u is not None:
            core = mode_product(core, u.t(), mode)
    return core


def tucker_power_step_flops(shape: tuple[int, ...], ranks: tuple[int, ...], warm: bool = True,
                            sequential: bool = False) -> int:
    """Flops of one `tucker_power_step`: per compressed mode 2 numel r_n for Y^T U (or Y G on the
    first call) and 2 numel r_n for Y (Y^T U), the QR, and 2 numel r_n to project the mode away
    (HOSVD: numel of x for the factors, the shrinking core for the projections)."""
    sizes, flops = list(shape), 0
    for mode, rank in enumerate(ranks):
        current = sizes if sequential else list(shape)
        numel = math.prod(current)
        r = _cap(rank, current[mode], numel // current[mode])
        if r == current[mode]:
            continue
        flops += (4 if warm else 2) * numel * r + qr_flops(current[mode], r)
        if sequential:
            flops += 2 * numel * r
            sizes[mode] = r
    if not sequential:  # the core: mode products in order, each on the already-shrunk tensor
        for mode, rank in enumerate(ranks):
            numel = math.prod(sizes)
            r = _cap(rank, shape[mode], math.prod(shape) // shape[mode])
            if r != shape[mode]:
                flops += 2 * numel * r
                sizes[mode] = r
    return flops


class WASILinearFunction(Function):
    """y = (x R^T) L^T + b; the backward keeps only (S, U1, U2, U3, L, R).

    Inputs: x [B, N, C]; weight [out, C], the dense parameter that receives grad_W (it is not used
    by the forward and not saved); bias [out] or None; L [out, k]; R [k, C]; the Tucker core and
    factors of x, computed outside (under no_grad) so that their warm-start state can live in the
    module. grad_x = (g L) R; grad_W = g^T x~ contracted with the factors, never rebuilding x~:
    Z = g x1 U1^T x2 U2^T [r1, r2, out], T = S x3 U3 [r1, r2, C], grad_W = Z^T T over (r1, r2)."""

    @staticmethod
    def forward(ctx, x, weight, bias, left, right, core, u1, u2, u3):  # noqa: D102
        ctx.save_for_backward(core, u1, u2, u3, left, right)
        ctx.has_bias = bias is not None
        y = (x @ right.t()) @ left.t()
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        core, u1, u2, u3, left, right = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (g @ left) @ right
        if ctx.needs_input_grad[1]:
            z = g  # a None factor is the identity: its mode stays whole in z and in the core
            if u1 is not None:
                z = torch.einsum("bno,bi->ino", z, u1)  # [r1, N, out]
            if u2 is not None:
                z = torch.einsum("ino,nj->ijo", z, u2)  # [r1, r2, out]
            t = core if u3 is None else torch.einsum("ijl,cl->ijc", core, u3)  # [r1, r2, C]
            grad_w = torch.einsum("ijo,ijc->oc", z, t)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(dim=(0, 1))
        return grad_x, grad_w, grad_b, None, None, None, None, None, None
