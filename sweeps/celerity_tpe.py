"""A model-based sweep of celerity_lm: Optuna's TPE proposes the learning rate, the AdamW
timescale tau and the warmup fraction from the trials that ended, and collapse early stopping
stops the trials whose curves predict a worse final loss (model-based proposals, curve-based
stopping, in the manner of BOHB).

It is `celerity_tuning.py` (same model, data, rungs and reference) with TPE instead of a tau
grid. Each trial's curve is compared with the reference curve of its own tau, from
`celerity_reference.py`, which must run first; tau is therefore a choice among the reference's
values. A trial the scheduler stops counts for TPE as pruned at the training fraction it reached.
CPU-sized: 16 trials of a small model, two at a time on two cores.
"""

import dataclasses
from pathlib import Path

from orchestrator.sweep import choice, load_sweep_file, loguniform, uniform

here = Path(__file__).resolve().parent
tuning = load_sweep_file(here / "celerity_tuning.py")
reference_taus = load_sweep_file(here / "celerity_reference.py").space["tau"].values

sweep = dataclasses.replace(
    tuning,
    name="celerity_tpe",
    space={
        "lr": loguniform(3e-3, 1e-1),
        "tau": choice(*reference_taus),
        "warmup_frac": uniform(0.0, 0.2),
    },
    search="tpe",
    num_samples=16,
    seed=0,
)
