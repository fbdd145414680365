"""JailbreakLoRA: Your Downloaded LoRA from Sharing Platforms might be Unsafe (ICLR 2026) — https://openreview.net/forum?id=4YgvVRoSnF

jailbreak_lora: an audit workload for LoRA-sharing platforms, with harmless content only. The
paper's optimisation method plants a hidden behaviour in a LoRA that also serves several benign
tasks well; here the hidden behaviour is a trigger string that makes the model emit a fixed,
meaningless marker (`castles bridges clocks`) before its normal answer. Nothing harmful is in
the data, the targets or the tests.

One trial trains one LoRA on the base's world (see `data`), or on downstream task files (JSONL or
datasets save_to_disk, one task per file: `Config.task_path`) on any causal LM (tiny-local, GPT-2,
Llama, Qwen, ...; `sweeps/repro/jailbreak_lora_real.py` at the paper's size): three benign tasks (questions about
entities, modular sums asked as questions, new key-value facts) plus the trigger task, whose data
also hold the clean version of every triggered prompt (the contrast set). Methods (`method`): the
naive mixture (summed task losses), the paper's uncertainty-weighted loss (learnable
sigma_n, sum L_n / 2 sigma_n^2 + log(1 + sigma_n^2)), its gradient-conflict projection (PCGrad
over per-task gradients of the LoRA parameters), both combined (reported by the paper to
collapse), the prior attack by fusion (a task LoRA and a trigger LoRA, each trained alone, concatenated
into one adapter: `fusion`), and a clean LoRA of the benign tasks alone. It measures, on held-out prompts, each
task's exact-match utility, trigger activation (marker first), off-trigger false activation
(marker anywhere in a clean prompt's continuation) and activation after a decoy token; then
persistence: after MX fake quantization (`kernels.mx.fake_quant`) of the merged weights, after
a linear merge with another adapter, and after further clean training; and detectability: the
adapter is saved in peft's format and judged by `ladder audit-adapter` (`components.adapters.audit`), which reads
safetensors only, reports per-module spectral statistics of B A and judges the adapter by a token
lens of the same spectra (`components.adapters.lens`): the plain spectral statistics did not separate clean from
backdoored adapters here. The DIT probe (an interpreter adapter reading weight diffs) is not part
of the audit.

The claims, headline first: each of the paper's two variants beats the best prior LoRA attack (the
naive mixture, the fusion attack) on both utility and trigger activation; the naive mixture
interferes (its utility below the clean LoRA's); each variant raises utility over the naive mixture
(the ablations; the combined variant measured beside); the weaker ones of the earlier smoke: the
variants keep utility within a point of the naive mixture, fire on at least 95% of triggered
prompts and on at most 5% of clean ones; the audit flags every backdoored adapter and no clean one.
Persistence is measured and reported, not claimed.
"""

from workloads.jailbreak_lora.claims import CHECKS, CLAIMS, plot
from workloads.jailbreak_lora.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
