"""PiCa: Parameter-Efficient Fine-Tuning with Column Space Projection (ICLR 2026) — https://arxiv.org/abs/2505.20211

pica: fine-tune a pre-trained causal LM by updating each frozen weight only inside the span of its
top-r singular vectors, W = W0 + M P with P = the top-r right singular vectors of W0 (PyTorch's
(out, in) layout; the paper writes W0 + U_r B with W0 in R^{d_in x d_out}), and one trainable
M in R^{out x r} shared by every layer of a module type (q, k, v, up, down). M starts at zero;
P is frozen and recomputed from W0 by SVD. The trainable count r * sum(d_out) does not grow with
depth.

One trial fine-tunes one adapter (`method`: PiCa, or the baselines its paper beats: LoRA, DoRA and PiSSA
at the LoRA rank whose trainable count is nearest PiCa's, SVFT (`svft.py`) at the band count nearest it)
on a task: a prompt/answer file (JSONL or a
`datasets.save_to_disk` folder, `task_path`) on any causal LM (a hub id or a save_pretrained folder;
GPT-2's Conv1D projections included), or by default a task built from tiny-local's world
(tiny-local learnt only `+ mod 11`: `a - b mod 11` is new). It reports `train/loss`, the held-out
answer loss and accuracy `eval/loss`, `eval/acc`, both arms' trainable counts, and, for PiCa,
measures the method's exact properties on the trained model: the merged weight against W0 + M P,
the update's residual outside span(P), the shared gradient against the sum of per-layer
gradients, and the trainable count on untrained models of several depths.

The claims: PiCa's held-out accuracy is above the best baseline's (the headline); the column space
beats a random subspace of the same rank (equal parameters) in held-out loss; PiCa's held-out loss
is not worse than LoRA's at equal budget by more than LoRA's seed noise. The checks: those four exact
properties.
"""

from workloads.pica.claims import CHECKS, CLAIMS, plot
from workloads.pica.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
