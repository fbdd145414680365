"""Reference runs for collapse early stopping: small celerity_lm models, trained to the end, whose
normalized curves become the reference of `celerity_tuning.py`.

The controls that set a curve's shape are the schedule, tpp and tau; the reference covers the
same tau values as the tuning sweep (a weight-decay sweep at fixed lr changes tau), two seeds
each so that seed noise is known.
"""

from orchestrator.sweep import Sweep, grid, seeds

TAUS = (0.05, 0.2, 0.8)

sweep = Sweep(
    name="celerity_reference",
    workload="celerity_lm",
    base="smoke",
    overrides={"eval_every_frac": 0.05, "eval_tokens": 8192},
    space={"tau": grid(*TAUS), "seed": seeds(2)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
)
