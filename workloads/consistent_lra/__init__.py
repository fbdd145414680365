"""Consistent Low-Rank Approximation (Woodruff & Zhou, ICLR 2026) — https://arxiv.org/abs/2603.02148

consistent_lra: rows of A arrive one at a time and after each row the algorithm outputs a rank-k
subspace V^(t). Two things are measured at every t: the cost ||A^(t) - A^(t) P_V||_F^2 over the
optimal rank-k cost OPT_t of the prefix, and the recourse, the running sum of ||P_V(t) -
P_V(t-1)||_F^2 (the paper's definition), and the count the paper's experiments use, k per
recomputation of the output. Five algorithms: recompute the best subspace at every row (the
baseline), the Frequent Directions sketch's top-k subspace (Liberty 2013, Ghashami et al. 2016: the
paper's streaming baseline), the additive-error lazy rule (recompute only when ||A^(t)||_F^2 has grown by a factor 1 + eps; cost
<= OPT + eps ||A||_F^2), the multiplicative variant (an online ridge-leverage-score sample of the
rows, recomputed from when it finds the current subspace more than (1 + a) times its optimum;
cost <= (1 + eps) OPT), and its refinement 'heavy_light' (the paper's Algorithm 2, reconstructed:
only the bottom sqrt(k) directions are recomputed while that keeps the bound). Streams: 'flip'
(k interleaved alternating pairs, the best subspace changes at every row), 'gaussian' (i.i.d.
rows with a near tie), 'emerging' (nearly rank k, a new direction at the onset), 'randint' (the
paper's random integers), 'file' (the first rows of a table in its published format: the
paper's UCI Rice and Skin, SuiteSparse's Landmark; `data.py`) and 'bundled' (real tables shipped
inside scikit-learn, offline: UCI digits, integers 0..16, and UCI breast cancer). `train/loss` is
cost/||A^(t)||_F^2.
"""

from workloads.consistent_lra.claims import CHECKS, CLAIMS, plot
from workloads.consistent_lra.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
