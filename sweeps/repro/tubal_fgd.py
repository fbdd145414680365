"""Reproduce tubal_fgd's claims: small vs large random vs spectral initialisation of factorized
gradient descent, over the over-estimated tubal rank R in {r, 2r, 4r, 8r}.

Every trial of one seed shares the target and the measurements (they are drawn from the seed
alone), so the comparison across R and init is paired. The full size is the paper's simulation:
n = 30, k = 3, r = 3, R up to 24 = 8r, alpha = 1e-10, 20 seeds per point. Large random init
is init='large' (alpha = large_init_scale, the same draw as small init's, scaled up).
"""

from orchestrator.sweep import Sweep, grid, seeds
from workloads.tubal_fgd import Config, smoke as smoke_config

RANK_MULTIPLES = (1, 2, 4, 8)
INITS = ("small", "large", "spectral")
FULL_SEEDS = 20


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    r = (smoke_config() if smoke else Config()).rank
    space = {"init": grid(*INITS), "factor_rank": grid(*(m * r for m in RANK_MULTIPLES))}
    if smoke:
        return Sweep(
            name="tubal_fgd_repro_smoke", workload="tubal_fgd", base="smoke",
            overrides={"seed": seed}, space=space, objective=("eval/es_rse", "min"),
        )
    return Sweep(
        name="tubal_fgd_repro", workload="tubal_fgd", base="default",
        space={**space, "seed": seeds(FULL_SEEDS, start=seed)}, objective=("eval/es_rse", "min"),
    )


sweep = build()
