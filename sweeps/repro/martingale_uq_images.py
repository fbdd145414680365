"""Martingale posteriors in the paper's image setting (its Exp C): a generator trained on CIFAR-10,
frozen, with deployed images from CIFAR-10's test split (in distribution) or SVHN's (out of
distribution). The paper's generator is a pretrained DDPM and its metric a CLIP score; here the
generator is a small PixelCNN trained in the trial on CIFAR-10's 50,000 training images (6 residual
blocks of 96 channels, about 0.6M parameters, 20,000 Adam steps of 64 images), and the deployed
metric is its own NLL in bits per dim, of the deployed images and of 1,000 of its samples (the
text setting's GPT-2-scores-its-own-generations, for images; generator and metric are ours). As
in the released image code: a truth pool of 1,000 deployed images, alpha from the n trial images
with c = 1.0, a 100-step forward urn, n from 5 to 100.

ladder downloads nothing. Fetch once, where the internet is reachable (docs/datasets.md):

    python -c "import datasets; datasets.load_dataset('uoft-cs/cifar10').save_to_disk('$LADDER_DATA/cifar10')"
    python -c "import datasets; datasets.load_dataset('ufldl-stanford/svhn', 'cropped_digits').save_to_disk('$LADDER_DATA/svhn')"

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in. Every trial trains its own
generator (the ID and OOD trials of a seed train the same one); `generator_path` may name one saved
by a trial's `generator_save` instead. `ladder sweep sweeps/repro/martingale_uq_images.py --check`
says what is missing. Training and sampling (one forward pass per sub-pixel) want a GPU; the
coverage loop runs on the CPU.
"""

from __future__ import annotations

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()
CIFAR10, SVHN = str(DATA / "cifar10"), str(DATA / "svhn")

sweep = Sweep(
    name="martingale_uq_images",
    workload="martingale_uq",
    base="default",
    overrides={
        "generator": "pixels", "metric": "nll", "generator_data": CIFAR10, "generator_split": "train",
        "image_split": "test", "image_size": 32, "image_levels": 256,
        "pixel_hidden": 96, "pixel_layers": 6, "pixel_steps": 20_000, "pixel_batch": 64, "lr": 1e-3, "log_every": 100,
        "real_images": 1000, "prior_draws": 1000, "lm_batch": 500, "alpha_c": 1.0, "alpha_holdout": 0,
        "horizon": 100, "ns": (5, 10, 20, 50, 100), "repetitions": 1000, "draws": 500,
    },
    points=(
        {"image_data": CIFAR10},  # in distribution: CIFAR-10's test images
        {"image_data": SVHN},  # out of distribution: SVHN's test digits, same generator
    ),
    space={"seed": seeds(3)},
    scheduler="fifo",
    objective=("eval/coverage/exact/n20", "max"),
    cpus_per_worker=4,
    gpus_per_worker=1,
)
