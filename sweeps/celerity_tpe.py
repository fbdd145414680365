"""A model-based sweep of celerity_lm: Optuna's TPE proposes the learning rate, the AdamW
timescale tau and the warmup fraction from the trials that ended, and collapse early stopping
stops the trials whose curves predict a worse final loss (model-based proposals, curve-based
stopping, in the manner of BOHB).

Each trial's curve is compared with the reference curve of its own tau, from
`celerity_reference.py`, which must run first; tau is therefore a choice among the reference's
values. A trial the scheduler stops counts for TPE as pruned at the training fraction it reached.
CPU-sized: 16 trials of a small model, two at a time on two cores.
"""

from orchestrator.sweep import Sweep, choice, loguniform, uniform

sweep = Sweep(
    name="celerity_tpe",
    workload="celerity_lm",
    base="smoke",
    overrides={"eval_every_frac": 0.05, "eval_tokens": 8192, "width": 64, "seed": 7},
    space={
        "lr": loguniform(3e-3, 1e-1),
        "tau": choice(0.05, 0.2, 0.8),  # the taus of celerity_reference.py
        "warmup_frac": uniform(0.0, 0.2),
    },
    search="tpe",
    num_samples=16,
    seed=0,
    scheduler="collapse",
    scheduler_options={
        "reference": {"experiment": "celerity_reference", "kind": "empirical"},
        "rungs": (0.2, 0.3),
        "keep_quantile": 0.5,
    },
    objective=("eval/loss", "min"),
)
