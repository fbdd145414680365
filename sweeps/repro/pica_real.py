"""pica at full size: PiCa (column space, one M per module kind shared across layers) against LoRA
and PiSSA (LoRA initialised from the top singular vectors, the SVD-based baseline) at the LoRA rank
whose trainable count is nearest PiCa's, on the paper's models and fine-tuning data, in bfloat16,
one GPU per trial. Every arm reports the held-out answer loss and exact-match accuracy
(`eval/loss`, `eval/acc`) and its trainable count (`diag/trainable`, PiCa's `diag/pica_trainable`).

The tasks are the paper's two SFT settings:

- commonsense: LLM-Adapters' commonsense_15k (`instruction` -> `answer`, the short label such as
  `true` or `option2`), 10% held out (the paper: 3 epochs, lr 1e-3, batch 64, r = 128 / 256).
  Held-out exact-match accuracy is the paper's measure.
- math: MetaMathQA-40K (`query` -> `response`), held out on GSM8K's test split (`question` ->
  `answer`) (the paper: 2 epochs, lr 1e-3, batch 64, r = 256 on Gemma-2B). Accuracy here is the exact
  match of the whole worked answer under teacher forcing (near 0 for every arm: the paper generates
  and checks the final number), so on this task read the held-out answer loss.

ladder downloads nothing. Fetch once, where the internet is reachable (docs/datasets.md, pica):

    python -c "import datasets; datasets.load_dataset('meta-math/MetaMathQA-40K').save_to_disk('$LADDER_DATA/metamathqa-40k')"
    python -c "import datasets; datasets.load_dataset('openai/gsm8k', 'main').save_to_disk('$LADDER_DATA/gsm8k')"
    # commonsense_15k.json of https://github.com/AGI-Edgerunners/LLM-Adapters (ft-training_set/), a JSON list:
    python -c "import json, sys; from components.basemodel import write_jsonl; write_jsonl(sys.argv[2], json.load(open(sys.argv[1])))" \
        commonsense_15k.json "$LADDER_DATA/commonsense_15k.jsonl"
    hf download google/gemma-2b        # and the other ids below, into the Hugging Face cache (HF_HOME)

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in. `LADDER_LLMS` (comma-separated
hub ids or save_pretrained folders) replaces the models: each then runs every task. `ladder sweep
sweeps/repro/pica_real.py --check` says what is missing.

Sizes: PiCa r = 256 on q, k, v, up, down (the paper's Gemma-2B math setting; LoRA / PiSSA then get
the nearest rank by count, e.g. r = 4 against PiCa's 6.3M on Llama-3-8B); the paper's optimiser (lr
1e-3, 10% warm-up, cosine decay, no weight decay) for every arm; batch 64 in micro-batches of 8;
about 3 epochs of commonsense_15k (700 steps) and 2 of MetaMathQA-40K (1250 steps); records over
512 tokens left out; PiSSA's SVD randomized (4 iterations); three seeds. The exact checks stay on
(PiCa's arm: a merged copy of the model, two in memory at most); their 1e-5 tolerances are float32
ones, so read them in bfloat16 as the size of the rounding, not as a verdict.
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
LLMS = tuple(os.environ.get("LADDER_LLMS", "google/gemma-2b,meta-llama/Meta-Llama-3-8B").split(","))
"""The paper's Gemma-2B (math) and LLaMA-3-8B (math, r = 32 in the paper)."""
ARMS = ({"method": "pica"}, {"method": "lora"}, {"method": "pissa"})
TASKS = {
    "commonsense": {"task_path": str(DATA / "commonsense_15k.jsonl"), "prompt_field": "instruction",
                    "answer_field": "answer", "heldout_frac": 0.1, "steps": 700},
    "math": {"task_path": str(DATA / "metamathqa-40k"), "task_split": "train", "prompt_field": "query",
             "answer_field": "response", "eval_path": str(DATA / "gsm8k"), "eval_split": "test",
             "eval_prompt_field": "question", "eval_answer_field": "answer", "steps": 1250},
}
SEEDS = 3

sweep = Sweep(
    name="pica_real",
    workload="pica",
    base="default",
    overrides={"rank": 256, "lr": 1e-3, "warmup_frac": 0.1, "batch": 64, "micro_batch": 8, "max_tokens": 512,
               "pissa_niter": 4, "dtype": "bfloat16", "threads": 0, "eval_every": 250, "log_every": 25,
               "count_depths": (1, 2, 8, 32)},
    points=tuple({"base": llm, **task, **arm} for llm in LLMS for task in TASKS.values() for arm in ARMS),
    space={"seed": seeds(SEEDS)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
    cpus_per_worker=4,
    gpus_per_worker=1,
)
