"""Reproduce "Frozen Priors, Fluid Forecasts": coverage of the martingale posterior's 90% intervals
(exact long-run draw, the single-atom shortcut, the forward urn) and of the bootstrap, over n.

The smoke size is the tabular scenario: a GMM prior fitted on historical records, the alert rate
over a threshold (3.7% deployed) with the prior over-stating it (shift +0.3, the claims' case)
and under-stating it (shift -0.3, reported), and the mean score; n in {5, 10, 20, 50}, 200
repetitions of every n, three trials of about two CPU seconds each. The full size adds the byte
model (NLL per byte and the high-NLL alert rate of held-out standard-library texts), n up to 200,
1,000 repetitions and three seeds.
"""

from orchestrator.sweep import Sweep, seeds

SMOKE_SIZE = {"ns": (5, 10, 20, 50), "repetitions": 200, "draws": 400}
TABULAR = (
    {"generator": "gmm", "metric": "alert_rate", "shift": 0.3},
    {"generator": "gmm", "metric": "alert_rate", "shift": -0.3},
    {"generator": "gmm", "metric": "mean_score", "shift": 0.3},
)
# Generation is the byte model's costly part: 4,000 texts stand for Q (the released text
# experiment used 200 generations).
TEXT = (
    {"generator": "bytes", "metric": "nll", "prior_draws": 4000},
    {"generator": "bytes", "metric": "alert_rate", "prior_draws": 4000},
)


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(
            name="martingale_uq_repro", workload="martingale_uq", base="default",
            overrides={**SMOKE_SIZE, "seed": seed}, points=TABULAR,
            objective=("eval/coverage/exact/n20", "max"),
        )
    return Sweep(
        name="martingale_uq_repro", workload="martingale_uq", base="default",
        overrides={"ns": (5, 10, 20, 50, 100, 200), "repetitions": 1000},
        points=TABULAR + ({"generator": "gmm", "metric": "mean_score", "shift": -0.3},) + TEXT,
        space={"seed": seeds(3, start=seed)}, objective=("eval/coverage/exact/n20", "max"),
    )


sweep = build()
