"""The block-size anomaly on a pretrained LLM, the paper's own observation: Qwen2.5-0.5B (and
Llama-3.2-1B, Qwen2.5-1.5B) in float32, every linear layer but the head quantized to FP4 E2M1 at
block sizes 256 down to 8, for each scale format, with the relative error of its weights and of
its linear layers' inputs and its loss increase on WikiText-2 raw's test text (W4 and W4A4).

ladder downloads nothing. Fetch once, where the internet is reachable (docs/datasets.md):

    python -c "import datasets; datasets.load_dataset('Salesforce/wikitext', 'wikitext-2-raw-v1').save_to_disk('$LADDER_DATA/wikitext-2-raw')"
    hf download Qwen/Qwen2.5-0.5B      # and the other ids below, into the Hugging Face cache (HF_HOME)

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in. `LADDER_LLMS` (comma-separated
hub ids or save_pretrained folders) replaces the models. `ladder sweep sweeps/repro/mx_anomaly_real.py
--check` says what is missing. One GPU per trial; the synthetic tensors are measured as in
`sweeps/repro/mx_anomaly.py`.
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
LLMS = tuple(os.environ.get("LADDER_LLMS", "Qwen/Qwen2.5-0.5B,meta-llama/Llama-3.2-1B,Qwen/Qwen2.5-1.5B").split(","))
SCALES = (
    {"scale_format": "ue4m3", "global_scale": False},  # NVFP4 single-level scaling: the anomaly
    {"scale_format": "ue4m3", "global_scale": True},  # NVFP4 with its per-tensor FP32 scale
    {"scale_format": "ue5m3", "global_scale": False},  # the paper's fix
    {"scale_format": "e8m0", "global_scale": False},  # OCP MX
)

sweep = Sweep(
    name="mx_anomaly_real",
    workload="mx_anomaly",
    base="default",
    overrides={"text_path": str(DATA / "wikitext-2-raw"), "text_split": "test", "hf_seq_len": 1024,
               "eval_tokens": 65536, "lm_narrow_std": 0.0},
    points=tuple({"hf_model": llm, **scale} for llm in LLMS for scale in SCALES),
    scheduler="fifo",
    objective=("eval/llm_loss_fp", "min"),
    cpus_per_worker=4,
    gpus_per_worker=1,
)
