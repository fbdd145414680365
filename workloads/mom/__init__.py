"""MoM: Linear Sequence Modeling with Mixture-of-Memories (ICLR 2026) — https://arxiv.org/abs/2502.13685

mom: a linear sequence model whose layer keeps several memory matrices instead of one. A router
sends each token to its top-k memories (renormalised softmax weights); each memory has its own key
and value projections (and, with the gated delta rule, its own write strength beta and decay) and
only the memories a token is routed to are updated; a shared memory sees every token. The token
reads q^T sum_e w_e S_e, then a gated RMSNorm and the output projection. A Switch-style
load-balancing loss keeps the router from collapsing. `memory.py` holds the recurrence twice: a
token-by-token reference and the chunked form used in training (tested equal, gradients too).

Baselines at matched parameter count (each model's MLP sized to the largest one's count):
- linear models of equal state, one memory holding as many numbers as all of MoM's memories
  ('single_expanded', the paper's Table 4 control), with MoM's update rule, with a data-dependent
  decay gate ('gated': GLA / Mamba-2 with a scalar gate, arXiv 2312.06635 / 2405.21060) and with
  the gated delta rule (Gated DeltaNet, arXiv 2412.06464, the paper's main linear baseline);
- the same layer with a single memory and no router ('single': one memory the size of one of
  MoM's, the same update rule: a fifth of MoM's state);
- softmax attention ('softmax', the paper's Transformer++).

Tasks: multi-query associative recall generated locally (value-before-key pairs by default, see
`Config.mqar_order`) (`eval/recall_T<len>`: the fraction of
queries answered at each evaluation length), and byte-level language modelling on the standard
library's source, the corpus `celerity_lm` reads (`eval/loss`, nats per byte). Every run also
measures the bytes of inference state carried from one generated token to the next at several
prefix lengths (`eval/state_bytes_T<len>`).

The claims, headline first: MoM recalls more than every linear model of equal state; its recall
is comparable to softmax attention's; it recalls more than single-memory linear attention at the
same state per memory; and that lead does not shrink with more pairs. The checks: its inference
state stays constant in sequence length while the softmax model's key/value cache grows with it,
the parameter counts match, and the equal-state baselines hold exactly MoM's number of memory
numbers.
"""

from workloads.mom.claims import CHECKS, CLAIMS, plot
from workloads.mom.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
