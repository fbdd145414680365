"""A load sweep: 200 short trials of the synthetic curves workload under the collapse scheduler.

Each trial reports 50 points (200 steps, a report every 4), so the sweep sends the scheduler
10,000 results; 4 of the trials diverge (NaN from 30% of training) and must be stopped and marked
diverged while the others go on. It measures the orchestration itself (scheduling, Tune, MLflow,
checkpoints), not training: run `sweeps/curves_reference.py` first.
"""

from orchestrator.sweep import Sweep

LRS = [10 ** (-3 + 2 * i / 49) for i in range(50)]  # 1e-3 .. 1e-1, the best at 1e-2
DIVERGING = {7, 61, 123, 177}

sweep = Sweep(
    name="curves_load",
    workload="curves",
    base="smoke",
    overrides={"steps": 200, "report_every": 4, "checkpoint_every": 100},
    points=tuple(
        {"lr": LRS[i % 50], "seed": i // 50, "diverge_at": 0.3 if i in DIVERGING else 0.0} for i in range(200)
    ),
    scheduler="collapse",
    scheduler_options={"reference": {"experiment": "curves_reference"}, "rungs": (0.2, 0.4), "keep_quantile": 0.5},
    objective=("eval/loss", "min"),
)
