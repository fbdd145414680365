"""Reference runs for `curves_load.py`: three seeds of the synthetic curves workload at its best
learning rate, run to the end; their normalized curves become the collapse reference."""

from orchestrator.sweep import Sweep, seeds

sweep = Sweep(
    name="curves_reference",
    workload="curves",
    base="smoke",
    overrides={"steps": 200, "report_every": 2, "checkpoint_every": 100},
    space={"seed": seeds(3)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
)
