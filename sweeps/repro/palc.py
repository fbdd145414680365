"""Reproduce PALC's claims: a logit calibrator on a frozen base, trained on gentle-vs-blunt
preference pairs from the base's world, evaluated over gamma in {-1, 0, 0.5, 1, 2} on held-out
entities.

The smoke size is one trial on tiny-local (B = 16, 150 steps) at the given seed, which also runs
the test-time baselines (a Bradley-Terry reward head, best-of-N with N = 16, ARGS with k = 10 and
w = 1.5) on the same pairs and held-out prompts; `--seed N`
draws another entity split, other pairs and another calibrator init. The full size runs the same
code on a real checkpoint (`FULL_BASE`, from the Hugging Face cache or a local folder) with the
paper's B = 256, three seeds.
"""

from orchestrator.sweep import Sweep, seeds

FULL_BASE = "meta-llama/Llama-3.1-8B"
FULL_SEEDS = 3


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(name="palc_repro_smoke", workload="palc", base="smoke", space={"seed": seeds(1, start=seed)},
                     objective=("eval/pref_acc", "max"))
    return Sweep(
        name="palc_repro", workload="palc", base="default",
        overrides={"base": FULL_BASE, "dtype": "bfloat16", "bottleneck": 256, "steps": 1000, "batch": 16},
        space={"seed": seeds(FULL_SEEDS, start=seed)}, objective=("eval/pref_acc", "max"),
    )


sweep = build()
