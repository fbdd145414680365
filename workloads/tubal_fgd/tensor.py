"""The t-product algebra of third-order tensors, through the FFT along the third mode.

A tensor is `[n1, n2, k]`: k frontal slices of n1 x n2. The t-product A * B is the slice-wise
matrix product in the Fourier domain (an FFT along mode 3). Real tensors have conjugate-symmetric
spectra, so only the first k // 2 + 1 Fourier slices are kept (`rfft`); `irfft(..., n=k)` gives
back a real tensor. In that domain the transpose is the slice-wise conjugate transpose and the
tubal rank is the largest rank among the slices.
"""

from __future__ import annotations

import torch


def to_fourier(a: torch.Tensor) -> torch.Tensor:
    """[n1, n2, k] real -> [n1, n2, k // 2 + 1] complex: the independent Fourier slices."""
    return torch.fft.rfft(a, dim=2)


def from_fourier(af: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of `to_fourier` for a tensor with k frontal slices."""
    return torch.fft.irfft(af, n=k, dim=2)


def _slices(af: torch.Tensor) -> torch.Tensor:
    """[n1, n2, kf] -> [kf, n1, n2]: the Fourier slices as a batch, for a batched matmul (on these
    small slices several times faster than the equivalent einsum)."""
    return af.permute(2, 0, 1)


def _unslice(cf: torch.Tensor) -> torch.Tensor:
    return cf.permute(1, 2, 0).contiguous()


def t_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A * B for A [n1, n2, k] and B [n2, n3, k] -> [n1, n3, k]."""
    if a.shape[1] != b.shape[0] or a.shape[2] != b.shape[2]:
        raise ValueError(f"t-product of {tuple(a.shape)} and {tuple(b.shape)}: inner sizes or tube lengths differ")
    cf = _slices(to_fourier(a)) @ _slices(to_fourier(b))
    return from_fourier(_unslice(cf), a.shape[2])


def t_transpose(a: torch.Tensor) -> torch.Tensor:
    """A^T: every frontal slice transposed, then slices 2..k in reverse order.

    Works on [n1, n2, k] and on batches [..., n1, n2, k].
    """
    at = a.transpose(-3, -2)
    return torch.cat([at[..., :1], at[..., 1:].flip(-1)], dim=-1)


def t_gram(u: torch.Tensor) -> torch.Tensor:
    """U * U^T for U [n, R, k] -> [n, n, k], symmetric and positive semidefinite in the t-sense."""
    uf = _slices(to_fourier(u))
    return from_fourier(_unslice(uf @ uf.mH), u.shape[2])


def t_identity(n: int, k: int, *, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> torch.Tensor:
    """The identity tensor: the n x n identity as the first frontal slice, zeros after."""
    eye = torch.zeros(n, n, k, dtype=dtype, device=device)
    eye[:, :, 0] = torch.eye(n, dtype=dtype, device=device)
    return eye


def tubal_rank(a: torch.Tensor, *, rtol: float = 1e-9) -> int:
    """The largest matrix rank among the Fourier slices (singular values above rtol * the largest)."""
    sv = torch.linalg.svdvals(to_fourier(a).permute(2, 0, 1))  # [kf, min(n1, n2)]
    top = sv.max()
    if top == 0:
        return 0
    return int((sv > rtol * top).sum(dim=1).max())


def _self_conjugate(l: int, k: int) -> bool:
    """Slice l of a real tensor's spectrum is real: the DC slice, and the Nyquist slice for even k."""
    return l == 0 or 2 * l == k


def top_factor(y: torch.Tensor, rank: int, *, by: str = "eig") -> torch.Tensor:
    """A factor U [n, rank, k] of the top-`rank` part of a t-symmetric Y, per Fourier slice.

    Each Fourier slice of a t-symmetric Y is Hermitian. `by="eig"` keeps the `rank` largest
    eigenpairs, negative eigenvalues clipped to zero (a Gram U * U^T cannot have them): U * U^T is
    the best rank-`rank` PSD approximation. `by="svd"` keeps the `rank` largest singular values
    (|eigenvalue|) with their singular vectors, U = V S^{1/2} from the truncated t-SVD, so that
    directions of negative eigenvalues enter with positive weight. The DC and
    Nyquist slices are real symmetric and are decomposed as such: a complex eigensolver may return
    their eigenvectors with an arbitrary phase, which `irfft` would silently drop.
    """
    n, n2, k = y.shape
    if n != n2:
        raise ValueError(f"top_factor needs square frontal slices, got {tuple(y.shape)}")
    if not 1 <= rank <= n:
        raise ValueError(f"rank must lie in 1..{n}, got {rank}")
    if by not in ("eig", "svd"):
        raise ValueError(f"by must be 'eig' or 'svd', got {by!r}")
    yf = to_fourier(y)
    uf = torch.zeros(n, rank, yf.shape[2], dtype=yf.dtype, device=y.device)
    for l in range(yf.shape[2]):
        s = yf[:, :, l]
        s = (s + s.conj().T) / 2  # Hermitian up to rounding; make it exact for eigh
        if _self_conjugate(l, k):
            evals, evecs = torch.linalg.eigh(s.real)
        else:
            evals, evecs = torch.linalg.eigh(s)
        if by == "svd":
            evals = evals.abs()
        order = evals.argsort(descending=True)[:rank]
        uf[:, :, l] = evecs[:, order] * evals[order].clamp(min=0).sqrt().to(evecs.dtype)
    return from_fourier(uf, k)


def t_outer(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """U * V^T for U [n1, R, k] and V [n2, R, k] -> [n1, n2, k] (the asymmetric factorization)."""
    if u.shape[1:] != v.shape[1:]:
        raise ValueError(f"U * V^T of {tuple(u.shape)} and {tuple(v.shape)}: ranks or tube lengths differ")
    uf, vf = _slices(to_fourier(u)), _slices(to_fourier(v))
    return from_fourier(_unslice(uf @ vf.mH), u.shape[2])


def top_pair(y: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors U [n1, rank, k], V [n2, rank, k] of the truncated t-SVD of Y [n1, n2, k]:
    U * V^T keeps the `rank` largest singular values of every Fourier slice, split evenly
    (U = A S^{1/2}, V = B S^{1/2}). The DC and Nyquist slices are real and are decomposed as such,
    so that no phase is lost to `irfft` (see `top_factor`)."""
    n1, n2, k = y.shape
    if not 1 <= rank <= min(n1, n2):
        raise ValueError(f"rank must lie in 1..{min(n1, n2)}, got {rank}")
    yf = to_fourier(y)
    uf = torch.zeros(n1, rank, yf.shape[2], dtype=yf.dtype, device=y.device)
    vf = torch.zeros(n2, rank, yf.shape[2], dtype=yf.dtype, device=y.device)
    for l in range(yf.shape[2]):
        s = yf[:, :, l].real if _self_conjugate(l, k) else yf[:, :, l]
        a, sv, bh = torch.linalg.svd(s, full_matrices=False)
        root = sv[:rank].sqrt()
        uf[:, :, l] = a[:, :rank] * root
        vf[:, :, l] = bh[:rank].conj().T * root
    return from_fourier(uf, k), from_fourier(vf, k)


def t_spectral_norm(a: torch.Tensor) -> float:
    """The largest singular value among the Fourier slices (the operator norm of A * .)."""
    return float(torch.linalg.matrix_norm(to_fourier(a).permute(2, 0, 1), ord=2).max())
