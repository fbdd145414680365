"""Personalized Feature Translation on real expression frames: BioVid Heat Pain (part A, neutral
against the highest pain level) through a frozen ImageNet-pretrained ResNet-50, one trial per
held-out target subject, every arm of the synthetic reproduction.

ladder does not download BioVid (it is released on request) or the backbone: extract the frames
into `$LADDER_DATA/biovid/<subject>/<expression>/` (expression folders `neutral` and `pain4`;
default `./data/...`) and fetch the backbone once (`hf download microsoft/resnet-50`).
`ladder sweep sweeps/repro/pft_real.py --check` says what is missing. Features are extracted once
per frame set and backbone and cached; every trial after the first reads them.
"""

from __future__ import annotations

from orchestrator.sweep import Sweep, data_root, grid

DATA = data_root()

sweep = Sweep(
    name="pft_real",
    workload="pft",
    base="default",
    overrides={"data_dir": str(DATA / "biovid"), "backbone": "microsoft/resnet-50", "neutral_class": "neutral",
               "classes": 2, "dim": 0, "source_subjects": 60, "frames_per_class": 200, "source_eval_per_class": 50,
               "target_neutral_frames": 200, "target_eval_per_class": 200, "hidden": 512, "feat": 256,
               "translator_hidden": 512},
    space={"target": grid(*range(0, 87, 10))},  # nine of BioVid's 87 subjects as targets
    scheduler="fifo",
    objective=("eval/acc/pft", "max"),
)
