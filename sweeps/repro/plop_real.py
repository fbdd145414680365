"""plop at full size: NFN placement on the paper's models and supervised fine-tuning data, against
PLoP^-1, attention-only and MLP-only LoRA at exactly equal trainable parameters (the arms of
sweeps/repro/plop.py), in bfloat16, one GPU per trial.

The tasks are the paper's SFT settings:

- math: MetaMathQA (`query` -> `response`) fine-tuning, held out on GSM8K's test split
  (`question` -> `answer`); the paper's headline row is Qwen3-1.7B (r = 64), its NFN example
  Llama-3.2-1B. Held-out accuracy here is the exact match of the whole worked answer under teacher
  forcing (near 0 for every arm: the paper generates and checks the final number), so on this task
  the held-out answer loss (`eval/loss`) is the measure to read.
- commonsense: CommonsenseQA as prompt/answer JSONL (the question and its lettered choices -> the
  letter), held out on its validation split; the paper's row is Qwen2.5-7B. Here held-out accuracy
  is the paper's measure (the letter's exact match).

ladder downloads nothing. Fetch once, where the internet is reachable (docs/datasets.md, plop):

    python -c "import datasets; datasets.load_dataset('meta-math/MetaMathQA').save_to_disk('$LADDER_DATA/metamathqa')"
    python -c "import datasets; datasets.load_dataset('openai/gsm8k', 'main').save_to_disk('$LADDER_DATA/gsm8k')"
    python - <<'EOF'
    import datasets, json, os, pathlib
    out = pathlib.Path(os.environ.get("LADDER_DATA", "data"), "commonsense_qa"); out.mkdir(parents=True, exist_ok=True)
    for split, rows in datasets.load_dataset("tau/commonsense_qa").items():
        if split == "test":
            continue  # its answers are not published
        with open(out / f"{split}.jsonl", "w") as f:
            for r in rows:
                choices = " ".join(f"({l}) {t}" for l, t in zip(r["choices"]["label"], r["choices"]["text"]))
                f.write(json.dumps({"prompt": f"Question: {r['question']} Choices: {choices} Answer:",
                                    "answer": r["answerKey"]}) + "\\n")
    EOF
    hf download Qwen/Qwen3-1.7B        # and the other ids below, into the Hugging Face cache (HF_HOME)

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in. `LADDER_LLMS` (comma-separated
hub ids or save_pretrained folders) replaces the models: each then runs every task. `ladder sweep
sweeps/repro/plop_real.py --check` says what is missing.

Sizes: NFN on 200 training prompts per sample (the paper: about 200 suffice), in batches of 8;
n_types 3 and a nominal rank of 64 (the paper's GSM8K setting) with per-kind ranks matching every
arm's count; ours: 1000 AdamW steps of 16 records at lr 2e-4 from 20000 records drawn by the seed,
records over 512 tokens left out, three seeds.
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root, grid, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
PLACEMENTS = ("plop", "plop_inverse", "attention", "mlp", "all")
"""The arms of sweeps/repro/plop.py's full reproduction."""
TASKS = {
    "math": {"task_path": str(DATA / "metamathqa"), "task_split": "train", "prompt_field": "query",
             "answer_field": "response", "eval_path": str(DATA / "gsm8k"), "eval_split": "test",
             "eval_prompt_field": "question", "eval_answer_field": "answer"},
    "commonsense": {"task_path": str(DATA / "commonsense_qa" / "train.jsonl"), "prompt_field": "prompt",
                    "answer_field": "answer", "eval_path": str(DATA / "commonsense_qa" / "validation.jsonl")},
}
"""Each task's files and fields (the tests run the same loader on tiny files)."""
PAPER_MODELS = {
    "math": ("Qwen/Qwen3-1.7B", "meta-llama/Llama-3.2-1B"),
    "commonsense": ("Qwen/Qwen2.5-7B",),
}
"""The paper's model for each task (its SFT table's rows)."""
LLMS = tuple(m for m in os.environ.get("LADDER_LLMS", "").split(",") if m)
REAL = {
    "dtype": "bfloat16", "nfn_samples": 200, "nfn_batch": 8, "n_types": 3, "rank": 64, "rank_window": 3,
    "lr": 2e-4, "batch": 16, "steps": 1000, "task_limit": 20000, "max_tokens": 512, "eval_batch": 16,
    "eval_every": 250, "log_every": 25, "matched": PLACEMENTS, "threads": 4,
}
"""The overrides every trial shares."""

sweep = Sweep(
    name="plop_real",
    workload="plop",
    base="default",
    overrides=REAL,
    points=tuple({"base": model, **files} for task, files in TASKS.items() for model in (LLMS or PAPER_MODELS[task])),
    space={"placement": grid(*PLACEMENTS), "seed": seeds(3)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
    cpus_per_worker=4,
    gpus_per_worker=1,
)
