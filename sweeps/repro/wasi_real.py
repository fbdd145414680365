"""WASI in the paper's setting: ImageNet-21k-pretrained ViT-B/32 fine-tuned on CIFAR-10, every
parameter trained, vanilla against WASI (threshold 0.8), with the paper's training recipe (SGD,
lr 0.05, no momentum, weight decay 1e-4, batch 128, gradient clip 2.0, 50 epochs: 19,500 steps of
the 50,000 training images), tested on CIFAR-10's 10,000 test images.

ladder downloads nothing. Fetch once, where the internet is reachable (docs/datasets.md):

    python -c "import datasets; datasets.load_dataset('uoft-cs/cifar10').save_to_disk('$LADDER_DATA/cifar10')"
    hf download google/vit-base-patch32-224-in21k      # into the Hugging Face cache (HF_HOME)

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in; `VIT` may instead name a
folder written by `save_pretrained`. `ladder sweep sweeps/repro/wasi_real.py --check` says what is
missing. Images are kept at CIFAR's 32x32 (augmented there) and resized to the model's 224x224.
The activation ranks are ours: the paper picks them per layer under a memory budget. One GPU per
trial; the measured step (saved bytes, flops) is of batch 128 at 224x224.
"""

from __future__ import annotations

import os

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
VIT = os.environ.get("LADDER_VIT", "google/vit-base-patch32-224-in21k")

sweep = Sweep(
    name="wasi_real",
    workload="wasi",
    base="default",
    overrides={
        "data_path": str(DATA / "cifar10"), "model": VIT, "transfer": "none", "pretrain_steps": 0,
        "image_size": 32, "finetune_steps": 19_500, "batch_size": 128, "optimizer": "sgd", "lr": 0.05,
        "momentum": 0.0, "weight_decay": 1e-4, "grad_clip": 2.0, "threshold": 0.8, "act_ranks": (32, 16, 64),
        "eval_every_frac": 0.1, "checkpoint_every_frac": 0.05, "log_every": 50, "threads": 0,
    },
    points=({"method": "vanilla"}, {"method": "wasi"}),
    space={"seed": seeds(3)},
    scheduler="fifo",
    objective=("eval/acc", "max"),
    cpus_per_worker=8,
    gpus_per_worker=1,
)
