"""Three Forward, One Backward: Memory-Efficient Full-Rank Fine-Tuning of Large Models via Extra Forward Passes (LMAO, ICLR 2026) — https://openreview.net/forum?id=373rsDQsq4

lmao: fine-tune a pre-trained causal LM by alternating, on the same minibatch, a first-order LoRA
step (one forward, one backward, Adam on A and B, base frozen) with a MeZO zeroth-order step on
every base parameter (theta +- eps z, two forwards, g = (L+ - L-) / 2 eps, theta <- theta - lr g z,
z regenerated from one seed and never stored). Each update costs three forwards and one backward;
the base update is full rank and keeps no gradient or optimizer state.

One trial trains one method ('lmao', 'lora' alone, 'mezo' alone, or 'full': full first-order
fine-tuning, AdamW on every base parameter, the paper's reference) on a task that needs a high-rank
update: a random bijection pi over a set of words, `a -> pi(a)` (the default, from tiny-local's
vocabulary), or, from a task file (`task_path`: JSONL or a datasets save_to_disk folder), a
classification task through the LM as MeZO and LMAO run SST-2: a prompt template around the record's
text and a verbalizer word per label, trained on the label word's answer-token loss and scored by
the label word of highest mean log-probability. It reports `train/loss`, the loss and accuracy over
all pairs (or the held-out records) `eval/loss`, `eval/acc`, and what hooks counted: forwards and
backwards per step (min and max over steps), how many base parameters held a gradient after a
step, and the training memory a step holds, counted from its tensors (`memory.py`: parameters,
gradients, optimizer state, saved activations, zeroth-order noise; `mem/peak_train_bytes`).
`sweeps/repro/lmao_real.py` runs OPT-13B on SST-2.

The claims: LMAO's accuracy is comparable to full fine-tuning's (the headline); LMAO's final loss ends
below both LoRA of the same rank and MeZO alone. The checks: every LMAO step is exactly three forwards
and one backward; no base parameter ever holds a gradient; LMAO's training memory is below full
fine-tuning's.
"""

from workloads.lmao.claims import CHECKS, CLAIMS, plot
from workloads.lmao.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
