"""MoM: Linear Sequence Modeling with Mixture-of-Memories (ICLR 2026) — https://arxiv.org/abs/2502.13685

mom: a linear sequence model whose layer keeps several memory matrices instead of one. A router
sends each token to its top-k memories (renormalised softmax weights); each memory has its own key
and value projections (and, with the gated delta rule, its own write strength beta and decay) and
only the memories a token is routed to are updated; a shared memory sees every token. The token
reads q^T sum_e w_e S_e, then a gated RMSNorm and the output projection. A Switch-style
load-balancing loss keeps the router from collapsing. `memory.py` holds the recurrence twice: a
token-by-token reference and the chunked form used in training (tested equal, gradients too).

Baselines at matched parameter count: the same layer with a single memory and no router
('single': single-memory linear attention with the same update rule and per-memory state), and
softmax attention ('softmax'), both given an MLP wide enough to match MoM's parameters.

Tasks: multi-query associative recall generated locally (value-before-key pairs by default, see
`Config.mqar_order`) (`eval/recall_T<len>`: the fraction of
queries answered at each evaluation length), and byte-level language modelling on the standard
library's source, the corpus `celerity_lm` reads (`eval/loss`, nats per byte). Every run also
measures the bytes of inference state carried from one generated token to the next at several
prefix lengths (`eval/state_bytes_T<len>`).

The claims: MoM recalls more than single-memory linear attention at the same state per memory
and parameter count, and its lead does not shrink with more pairs. The checks: its inference state
stays constant in sequence length while the softmax model's key/value cache grows with it, and
the parameter counts match.
"""

from workloads.mom.claims import CHECKS, CLAIMS, plot
from workloads.mom.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
