"""A tau (weight-decay) sweep of celerity_lm with collapse early stopping.

Each trial's final loss is predicted at rungs of training fraction from its prefix, aligned with
the reference curve of its own tau (from `celerity_reference.py`, which must run first); trials
predicted worse than the kept half at a rung are stopped.
"""

from orchestrator.sweep import Sweep, grid

sweep = Sweep(
    name="celerity_tuning",
    workload="celerity_lm",
    base="smoke",
    overrides={"eval_every_frac": 0.05, "eval_tokens": 8192, "width": 64, "seed": 7},
    space={"tau": grid(0.05, 0.2, 0.8)},
    scheduler="collapse",
    scheduler_options={
        "reference": {"experiment": "celerity_reference", "kind": "empirical"},
        "rungs": (0.2, 0.3),
        "keep_quantile": 0.5,
    },
    objective=("eval/loss", "min"),
)
