"""Reproduce PFT's claims: on held-out target subjects, adapting only the latent translator on the
subject's unlabelled neutral frames beats the SFDA baselines SHOT and AaD adapted on the same
frames (the paper's headline), the unadapted source model and (a negative control) a plain
fine-tune of the source model towards 'neutral', L_exp is what keeps the translator from
collapsing onto 'neutral', and nothing but the translator changes.

Each trial is one target subject and runs every arm from one source model, so the comparison is
paired; the claims average over the trials of a setting. The smoke size is four target subjects
in each of two worlds (seeds `seed` and `seed + 1`: prototypes, source subjects and source model),
16-d; a world's source model sets how far a neutral-only correction can go, so two worlds keep
one unlucky world from deciding the verdict. The full size is ten target subjects in each of
three worlds, in the default 32-d world with 8 source subjects and in a 64-d world with 16.
"""

from orchestrator.sweep import Sweep, grid, seeds

SMOKE_TARGETS = 4
SMOKE_SEEDS = 2
FULL_TARGETS = 10
FULL_SEEDS = 3

FULL_SETTINGS = (
    {"dim": 32, "source_subjects": 8},
    {"dim": 64, "source_subjects": 16, "hidden": 256, "feat": 128, "translator_hidden": 256},
)


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(
            name="pft_repro_smoke", workload="pft", base="smoke",
            space={"target": grid(*range(SMOKE_TARGETS)), "seed": seeds(SMOKE_SEEDS, start=seed)},
            objective=("eval/acc/pft", "max"),
        )
    return Sweep(
        name="pft_repro", workload="pft", base="default", points=FULL_SETTINGS,
        space={"target": grid(*range(FULL_TARGETS)), "seed": seeds(FULL_SEEDS, start=seed)},
        objective=("eval/acc/pft", "max"),
    )


sweep = build()
