"""PLoP: Precise LoRA Placement for Efficient Finetuning of Large Models (ICLR 2026) — https://arxiv.org/abs/2506.20629

plop: score every linear projection kind of a pretrained decoder (Llama/Qwen q, k, v, o, gate,
up, down; GPT-2 c_attn, attn.c_proj, c_fc, mlp.c_proj: the kinds that
`components.basemodel.projections` finds by asking the model) by its Normalized Feature Norm on
the task's data, in one no-grad forward pass with forward hooks (workloads.plop.nfn), put LoRA on
the types of lowest score (the least aligned with the task,
the paper's rule), and fine-tune. One trial trains one placement (PLoP, PLoP^-1, attention-only,
MLP-only or all modules) with per-type ranks that give every placement of the comparison the
same number of trainable parameters (workloads.plop.placement); every trial also reports the scores
on two disjoint samples of the task data and on a freshly initialised model of the same
architecture, the control. The task is one of tiny-local's built-in tasks (the CI default) or
supervised fine-tuning data from a file (`task_path`: prompt/answer records in JSONL or a datasets
save_to_disk folder, e.g. MetaMathQA, with GSM8K's test split as `eval_path`).

The claims, headline first: on every task PLoP's held-out accuracy is at least the best of the usual
placements (attention-only, MLP-only, all modules) at equal trainable parameters; the scores
separate on the pretrained model; the chosen types are the same on disjoint samples. The checks:
scores are about 1 on the random-init model, scoring is deterministic, the counts are equal.
"""

from workloads.plop.claims import CHECKS, CLAIMS, plot
from workloads.plop.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
