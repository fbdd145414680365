"""Three Forward, One Backward: Memory-Efficient Full-Rank Fine-Tuning of Large Models via Extra Forward Passes (LMAO, ICLR 2026) — https://openreview.net/forum?id=373rsDQsq4

lmao: fine-tune a pre-trained causal LM by alternating, on the same minibatch, a first-order LoRA
step (one forward, one backward, Adam on A and B, base frozen) with a MeZO zeroth-order step on
every base parameter (theta +- eps z, two forwards, g = (L+ - L-) / 2 eps, theta <- theta - lr g z,
z regenerated from one seed and never stored). Each update costs three forwards and one backward;
the base update is full rank and keeps no gradient or optimizer state.

One trial trains one method ('lmao', 'lora' alone, 'mezo' alone) on a task that needs a high-rank
update: a random bijection pi over a set of words, `a -> pi(a)`. It reports `train/loss`, the loss
and accuracy over all pairs `eval/loss`, `eval/acc`, and what hooks counted: forwards and
backwards per step (min and max over steps) and how many base parameters held a gradient after a
step.

The claims: LMAO's final loss ends below both LoRA of the same rank and MeZO alone; every LMAO step
is exactly three forwards and one backward; no base parameter ever holds a gradient.
"""

from workloads.lmao.claims import CHECKS, CLAIMS, plot
from workloads.lmao.workload import MAX_WORKERS, Config, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "smoke", "train", "validate"]
