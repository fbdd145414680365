"""The smallest sweep that exercises a Ray cluster: two one-CPU celerity_lm trials (two seeds of
a ~70k-parameter model, about 70 steps each) that Ray places wherever CPUs are free. Submit it
to a new cluster to check the whole path, job to MLflow (see docs/cluster.md):

    ray job submit --working-dir . -- ladder sweep sweeps/cluster_smoke.py
"""

from orchestrator.sweep import Sweep, seeds

sweep = Sweep(
    name="cluster_smoke",
    workload="celerity_lm",
    base="smoke",
    overrides={"tpp": 1.0, "max_bytes": 300_000, "eval_tokens": 2048},
    space={"seed": seeds(2)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
)
