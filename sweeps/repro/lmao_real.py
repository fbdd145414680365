"""LMAO against its two halves at the paper's scale: OPT-13B fine-tuned on SST-2, classification
through the LM as MeZO and LMAO do it (the prompt `<sentence> It was`, answered by `terrible` or
`great`; accuracy is the label word the model scores highest), three arms at their own step counts:

- `lmao`: per step a LoRA step (r = 8, alpha = 16 on q_proj and v_proj, Adam 1e-5, linear decay)
  then a MeZO step on every base parameter (SGD 1e-6, eps 5e-3), batch 8, 1,000 steps (the
  paper's OPT setting; its README gives 1e-5 / 1e-6 or 1e-6 / 1e-7 for OPT-13B, eps 5e-3);
- `lora`: the LoRA step alone at the same rate, batch and steps (the ablation without the
  zeroth-order half);
- `mezo`: MeZO alone on every parameter, SGD 1e-7, eps 1e-3, batch 16, 20,000 steps (MeZO's
  OPT-13B setting).

Data as the OPT runs of MeZO and LMAO draw it: 1,000 training records sampled from SST-2's train
split per seed, evaluated on SST-2's validation split (872 records: GLUE's test labels are hidden,
-1, and are refused). No model selection on a dev set is made: every arm reports its last step.
Three seeds (the records drawn, the batches, the LoRA init and the perturbations). float16, as
MeZO and LMAO load OPT: bfloat16 rounds away most zeroth-order updates (1e-7 * g against weights
of order 1e-2). One GPU per trial (OPT-13B in float16 is 26 GB; a zeroth-order trial's checkpoint
holds every parameter, 26 GB each at 25 % steps).

ladder downloads nothing. Fetch once, where the internet is reachable (docs/datasets.md):

    python -c "import datasets; datasets.load_dataset('stanfordnlp/sst2').save_to_disk('$LADDER_DATA/sst2')"
    hf download facebook/opt-13b      # into the Hugging Face cache (HF_HOME)

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in. `LADDER_LLMS` (comma-separated
hub ids or save_pretrained folders) replaces the model, e.g. `facebook/opt-1.3b` (the paper's
hyper-parameters for it: LoRA 1e-5, base 1e-6, eps 1e-2, batch 8, 1,000 steps). `ladder sweep
sweeps/repro/lmao_real.py --check` says what is missing.

Not reached here: the paper's RoBERTa-large rows (SST-2 k = 16: LMAO 92.8, LoRA 91.4, MeZO
90.5). RoBERTa-large is a masked LM: `AutoModelForCausalLM` loads it as `RobertaForCausalLM`, a
left-to-right decoder its weights were never trained as, while the paper fills a `<mask>` with
both sides visible (LM-BFF's prompts). Its projection kinds (query, key, value, ...) would load,
but the numbers would not be the paper's setting.
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
LLMS = tuple(os.environ.get("LADDER_LLMS", "facebook/opt-13b").split(","))
SEEDS = 3
TASK = {
    "task_path": str(DATA / "sst2"), "task_split": "train", "eval_path": str(DATA / "sst2"), "eval_split": "validation",
    "template": "{sentence} It was", "label_field": "label", "label_words": ("terrible", "great"),
    "n_train": 1000, "n_eval": 0,
}
LORA = {"lora_targets": ("q_proj", "v_proj"), "lora_rank": 8, "lora_alpha": 16.0, "lora_lr": 1e-5,
        "lora_schedule": "linear"}
ARMS = (
    {"method": "lmao", **LORA, "zo_lr": 1e-6, "zo_eps": 5e-3, "batch": 8, "steps": 1000, "eval_every": 100,
     "log_every": 10},
    {"method": "lora", **LORA, "batch": 8, "steps": 1000, "eval_every": 100, "log_every": 10},
    {"method": "mezo", "zo_lr": 1e-7, "zo_eps": 1e-3, "batch": 16, "steps": 20000, "eval_every": 2000,
     "log_every": 100},
)

sweep = Sweep(
    name="lmao_real",
    workload="lmao",
    base="default",
    overrides={**TASK, "dtype": "float16", "threads": 0, "eval_chunk": 32},
    points=tuple({"base": llm, **arm} for llm in LLMS for arm in ARMS),
    space={"seed": seeds(SEEDS)},
    scheduler="fifo",
    objective=("eval/acc", "max"),
    cpus_per_worker=4,
    gpus_per_worker=1,
)
