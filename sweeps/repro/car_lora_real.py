"""CAR-LoRA at the paper's size: Llama-3.1-8B in bfloat16, GSM8K (or Alpaca instructions), plain
LoRA, CAR-LoRA and one adapter per in-set scheme, each evaluated under every fake compressor, the
held-out scheme, bitsandbytes NF4 and INT8, and a drifted base (the base continued on WikiText).

ladder downloads nothing. Fetch once, where the internet is reachable (docs/datasets.md):

    python -c "import datasets; datasets.load_dataset('openai/gsm8k', 'main').save_to_disk('$LADDER_DATA/gsm8k')"
    python -c "import datasets; datasets.load_dataset('tatsu-lab/alpaca').save_to_disk('$LADDER_DATA/alpaca')"
    python -c "import datasets; datasets.load_dataset('Salesforce/wikitext', 'wikitext-2-raw-v1').save_to_disk('$LADDER_DATA/wikitext-2-raw')"
    hf download meta-llama/Llama-3.1-8B      # into the Hugging Face cache (HF_HOME); or Qwen/Qwen2.5-7B
    pip install bitsandbytes                  # on the GPU machines, for bnb_schemes

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in. `LADDER_LLM` (a hub id or a
save_pretrained folder) replaces the model, e.g. `LADDER_LLM=Qwen/Qwen2.5-7B`; `LADDER_CAR_TASK=alpaca`
trains on Alpaca instead of GSM8K (one task per sweep: the claims compare adapters on one task).
`ladder sweep sweeps/repro/car_lora_real.py --check` says what is missing. One GPU per trial.

GSM8K: the 7,473 training problems, scored on the 1,319 test problems by the final `#### <number>`
of a greedy solution (256 tokens at most). The paper's epochs at batch 16: 5 for the plain and
per-scheme adapters (2,335 steps), 20 for CAR (`car_steps_factor` 4). Alpaca (52,002 instructions,
no test split): 2% held out (1,040) and scored by answer-token loss and exact match, 3,000 steps
(about one epoch; the paper names no instruction-tuning budget). LoRA r = 8, alpha = 16 on every
projection, lr 2e-4; the drift is the paper's recipe (LoRA r = 64, alpha = 128, lr 1e-4, merged),
1,000 steps of 8 x 256 tokens of WikiText-2 (about one epoch of its 2M tokens).
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root, grid, seeds
from workloads.car_lora import Config

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
LLM = os.environ.get("LADDER_LLM", "meta-llama/Llama-3.1-8B")
TASK = os.environ.get("LADDER_CAR_TASK", "gsm8k")
SEEDS = 3

TASKS = {
    "gsm8k": {"task_path": str(DATA / "gsm8k"), "task_split": "train", "task_format": "gsm8k",
              "eval_path": str(DATA / "gsm8k"), "eval_split": "test", "gen_tokens": 256, "steps": 2335},
    "alpaca": {"task_path": str(DATA / "alpaca"), "task_split": "train", "task_format": "instruction",
               "heldout_frac": 0.02, "steps": 3000},
}
if TASK not in TASKS:
    raise ValueError(f"LADDER_CAR_TASK={TASK!r}: choose among {sorted(TASKS)}")

sweep = Sweep(
    name=f"car_lora_real_{TASK}",
    workload="car_lora",
    base="default",
    overrides={"base": LLM, "dtype": "bfloat16", **TASKS[TASK], "lora_r": 8, "lora_alpha": 16.0, "batch": 16,
               "lr": 2e-4, "weight_decay": 0.0, "eval_batch": 16, "skip_layer": 24, "cache_compressed": False,
               "mx_impl": "auto", "bnb_schemes": ("nf4", "int8"), "drift_path": str(DATA / "wikitext-2-raw"),
               "drift_steps": 1000, "drift_lr": 1e-4, "drift_rank": 64, "drift_alpha": 128.0, "drift_batch": 8,
               "drift_seq_len": 256, "drift_schemes": False, "threads": 0},
    space={"adapter": grid("plain", "car", *Config().schemes), "seed": seeds(SEEDS)},
    scheduler="fifo",
    objective=("eval/acc/none", "max"),
    cpus_per_worker=8,
    gpus_per_worker=1,
)
