"""Reproduce swd_rl's claims: SWD against its reverse (old-first) control and uniform replay.

Smoke: Pendulum-v1, TD3, the three samplers at one seed (`--seed N`): the gradient-norm mechanism
is judged, the return claim is reported but not judged (it needs the full size). Every arm of a
seed starts from the same networks and warm-up data.

Full: the paper's TD3 setting (SimBa networks, T = 80,000, w_min = 0.1, 1M steps, 25k warm-up)
on HalfCheetah, Hopper, Walker2d and Ant (gymnasium v5, the `mujoco` extra), at UTD 1 and at a
high UTD of 4, plus SAC on the same tasks, five seeds each: 4 tasks x 2 algorithms x 2 UTDs x 3
samplers x 5 seeds = 240 trials, a cluster job.
"""

from orchestrator.sweep import Sweep, grid, seeds

SAMPLERS = ("reverse", "uniform", "swd")
TASKS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5")
FULL_SEEDS = 5
HIGH_UTD = 4


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(
            name="swd_rl_repro_smoke", workload="swd_rl", base="smoke", overrides={"seed": seed},
            space={"sampler": grid(*SAMPLERS)}, objective=("eval/return_late", "max"),
        )
    return Sweep(
        name="swd_rl_repro", workload="swd_rl", base="default",
        space={"env_id": grid(*TASKS), "algo": grid("td3", "sac"), "utd": grid(1, HIGH_UTD),
               "sampler": grid(*SAMPLERS), "seed": seeds(FULL_SEEDS, start=seed)},
        objective=("eval/return_late", "max"),
    )


sweep = build()
