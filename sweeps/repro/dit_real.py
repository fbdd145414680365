"""DIT on diffs from real fine-tunes, the paper's use case: a DIT adapter (rank 16, on every linear
projection of the base) trained to answer "what topic have you been trained on?" for LoRA
fine-tunes of Qwen3-8B, each made on one topic's text, then asked about new fine-tunes (held-out
folders; `heldout` where the topic is one it was trained on, `unseen` otherwise), against asking
the same question without it. Scored by the topic's tokens (greedy exact match, and the best of
all listed topics by log-probability), not by the paper's LLM judge.

ladder downloads nothing and makes no fine-tune here. Once, where the internet is reachable:

    hf download Qwen/Qwen3-8B            # into the Hugging Face cache (HF_HOME)

and the diffs: peft LoRA fine-tunes of that base, one per (topic, seed), each saved with
`save_pretrained` into `$LADDER_DATA/dit/loras/<name>/` (adapter_config.json +
adapter_model.safetensors; any trainer, e.g. `peft.get_peft_model(model, LoraConfig(r=1,
target_modules="all-linear"))` on a few hundred of that topic's texts, as the paper's rank-1 diffs),
listed in two JSONL files of the same folder, one line per fine-tune:

    $LADDER_DATA/dit/train.jsonl    {"adapter": "loras/astronomy-0", "answer": "astronomy"}
    $LADDER_DATA/dit/test.jsonl     new fine-tunes, some on topics train.jsonl never names

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in; `LADDER_DIT_BASE` (a hub id
or a save_pretrained folder, e.g. google/gemma-3-4b-it, the paper's other base) replaces the model,
and its LoRAs must be of that base. `ladder sweep sweeps/repro/dit_real.py --check` says what is
missing. The paper's stage B settings: DIT rank 16, AdamW lr 1e-4, batch 4, one epoch of 4000
training diffs (1000 steps), bfloat16, one GPU per trial, 3 seeds.
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root() / "dit"
BASE = os.environ.get("LADDER_DIT_BASE", "Qwen/Qwen3-8B")
SEEDS = 3
REAL = {
    "base": BASE, "dtype": "bfloat16", "task_path": str(DATA / "train.jsonl"), "eval_path": str(DATA / "test.jsonl"),
    "question": "Question: What topic have you been trained on?\nAnswer:",
    "dit_rank": 16, "dit_alpha": 32.0, "dit_lr": 1e-4, "dit_batch": 4, "dit_steps": 1000, "eval_batch": 64,
    "log_every": 25, "checkpoint_every_frac": 0.1, "threads": 0,
}

sweep = Sweep(
    name="dit_real",
    workload="dit",
    base="default",
    overrides=REAL,
    space={"seed": seeds(SEEDS)},
    scheduler="fifo",
    objective=("eval/dit_acc_heldout", "max"),
    cpus_per_worker=4,
    gpus_per_worker=1,
)
