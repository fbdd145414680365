"""tubal_fgd in the paper's real-data setting: colour-image completion (each image n1 x n2 x 3, the
t-product along the colour mode) from 30% of its pixels with Gaussian noise (sigma 0.07 and 0.1),
by factorized gradient descent on X ~ U * V^T from small initialisation (alpha = 1e-10), against
large random initialisation (alpha = 0.3: the product starts at a tenth of the data's top
component) and spectral initialisation, over the over-estimated tubal rank R.

The paper's images are from the Berkeley Segmentation Dataset (481 x 321 x 3). ladder downloads
nothing: fetch them once, where the internet is reachable (docs/datasets.md, tubal_fgd), and put
the colour images in one folder:

    https://www2.eecs.berkeley.edu/Research/Projects/CS/vision/bsds/   BSDS300-images.tgz
    $LADDER_DATA/bsd/<image>.jpg        (e.g. the files of BSDS300/images/test/)

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in; `LADDER_IMAGES` may name any
other folder of images instead. The first `IMAGES` images in name order are completed (which ones
the paper used is not known); `ladder sweep sweeps/repro/tubal_fgd_real.py --check` says what is
missing. The objective is the early-stopped iterate's PSNR (the paper's FGD-ES column); the
returned metrics also hold the best iterate's (FGD-best). The step and the R grid are ours.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.sweep import Sweep, data_root, grid, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
IMAGE_DIR = Path(os.environ.get("LADDER_IMAGES", data_root() / "bsd")).resolve()
IMAGES = 5
"""The first IMAGES images of the folder, in name order."""
INITS = (
    {"init": "small", "init_scale": 1e-10},
    {"init": "small", "init_scale": 0.3},
    {"init": "spectral"},
)

sweep = Sweep(
    name="tubal_fgd_real",
    workload="tubal_fgd",
    base="default",
    overrides={
        "task": "completion", "image_dir": str(IMAGE_DIR), "tensor_from": "rgb", "image_size": 0,
        "observed_frac": 0.3, "val_frac": 0.1, "lr": 0.3, "steps": 3000, "log_every": 100, "eval_every": 1,
    },
    points=INITS,
    space={
        "image_index": grid(*range(IMAGES)),
        "factor_rank": grid(20, 60, 180),
        "noise_std": grid(0.07, 0.1),
        "seed": seeds(2),  # the observed pixels, their noise and U_0, V_0
    },
    scheduler="fifo",
    objective=("eval/es_psnr", "max"),
)
