"""PALC against DPO on the paper's preference data: a logit calibrator (B = 256) on the frozen
paper base, and the DPO baseline (a LoRA policy on the same base, its reference the base with
the adapter disabled), each trained one epoch on HH-RLHF and on UltraFeedback-binarized and
scored on pairs of the test split: preference accuracy and mean margin of the aligned model and
of the base, the implicit reward's accuracy and margin, and for PALC the same over gamma, the
gamma-0 logit check and the per-token latency over the base's.

The paper's base is argsearch/llama-7b-sft-float32 (a Llama-7B fine-tuned on HH-RLHF, loaded
here in bfloat16) and its data Anthropic's HH-RLHF. ladder downloads nothing. Fetch once, where
the internet is reachable (docs/datasets.md, palc):

    hf download argsearch/llama-7b-sft-float32   # into the Hugging Face cache (HF_HOME)
    python -c "import datasets; datasets.load_dataset('Anthropic/hh-rlhf').save_to_disk('$LADDER_DATA/hh-rlhf')"
    python -c "import datasets; datasets.load_dataset('HuggingFaceH4/ultrafeedback_binarized').save_to_disk('$LADDER_DATA/ultrafeedback_binarized')"

HH-RLHF's records are whole dialogues (`chosen`, `rejected`): `prompt_field=""` splits each after
its last "\\n\\nAssistant:". UltraFeedback-binarized has a `prompt` and message lists whose last
message is the response. `$LADDER_DATA` defaults to `./data` of the folder the sweep starts in;
`LADDER_LLMS` (comma-separated hub ids or save_pretrained folders, e.g.
meta-llama/Meta-Llama-3-8B or mistralai/Mistral-7B-v0.1) replaces the base.
`ladder sweep sweeps/repro/palc_real.py --check` says what is missing.

Sizes: the paper's (released code's) PALC training, lr 1e-5, batches of 16 pairs (4 per forward,
gradients accumulated), 200 warm-up steps then cosine, rows of at most 1024 tokens, one epoch
(HH-RLHF's 160,800 training pairs: 10,050 steps; UltraFeedback-binarized's 61,135 `train_prefs`
pairs: 3,821 steps); gamma 1 is the reported calibration. DPO: beta 0.1 (the DPO paper's), LoRA
rank 8 on every projection, lr 5e-5 (a usual LoRA-DPO rate, not tuned here), the same batches and
steps. 500 held-out pairs: the first of each test split. One GPU per trial.
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
LLMS = tuple(os.environ.get("LADDER_LLMS", "argsearch/llama-7b-sft-float32").split(","))
DATASETS = (
    {"task_path": str(DATA / "hh-rlhf"), "task_split": "train", "eval_path": str(DATA / "hh-rlhf"),
     "eval_split": "test", "prompt_field": "", "steps": 10050},
    {"task_path": str(DATA / "ultrafeedback_binarized"), "task_split": "train_prefs",
     "eval_path": str(DATA / "ultrafeedback_binarized"), "eval_split": "test_prefs", "prompt_field": "prompt",
     "steps": 3821},
)
ARMS = (
    {"method": "palc", "lr": 1e-5, "bottleneck": 256},
    {"method": "dpo", "lr": 5e-5, "dpo_beta": 0.1, "dpo_targets": "all-linear", "lora_r": 8, "lora_alpha": 16.0},
)
REAL = {
    "dtype": "bfloat16", "batch": 16, "micro_batch": 4, "max_len": 1024, "warmup_steps": 200, "train_pairs": 0,
    "heldout_pairs": 500, "gamma_eval": 1.0, "latency_clock": "wall", "log_every": 50, "checkpoint_every": 500,
    "threads": 4,
}
"""The overrides every trial shares (the tests run the same code on a tiny GPT-2 and a JSONL file)."""

sweep = Sweep(
    name="palc_real",
    workload="palc",
    base="default",
    overrides=REAL,
    points=tuple({"base": llm, **data, **arm} for llm in LLMS for data in DATASETS for arm in ARMS),
    scheduler="fifo",
    objective=("eval/pref_acc", "max"),
    cpus_per_worker=8,
    gpus_per_worker=1,
)
