"""swd_rl on the DeepMind Control Suite: the paper's SimBa-SAC setting on DMC Humanoid (where it
claims the state of the art) and Dog, run and walk, at the update-to-data ratios 1, 2 and 5, with
SWD against uniform replay and the reverse (old-first, SWA) control.

The setting is the defaults of the paper's code (`train_sac.py` and its DMC wrapper; the paper's
own hyperparameter tables were not available): SAC with SimBa networks
(critic 512 x 2 residual blocks, actor 128 x 1), a fixed temperature of 0.2, step size 1e-4,
batches of 256, 5,000 random steps before the first update, 1M agent steps with each action
repeated twice (2M simulator steps, 2,000 episodes of 500 agent steps), a replay buffer that keeps
all of them, T = 80,000 and w_min = 0.1, observations normalised by running statistics. One
difference: at UTD > 1 every update here draws its own batch, where that code reuses one batch
for the updates of a step. The seeds are ours: 5 per arm (the paper reports IQMs over its own).
4 tasks x 3 UTDs x 3 samplers x 5 seeds = 180 trials.

The tasks come through shimmy (`dm_control/<domain>-<task>-v0`) from dm_control's suite, whose
models ship with the package: install the `mujoco` extra (`pip install -e ".[mujoco]"`) where the
trials run; nothing is downloaded. `ladder sweep sweeps/repro/swd_rl_dmc.py --check` validates it
and says what this machine lacks.

What it needs: one GPU and 2 CPUs a trial. An update is about 20 GFLOP (the critic's two
512-wide Q networks with 2048-wide residual blocks, target, forward and backward on 256
transitions, and every second update the actor's): 0.44 s measured on one CPU thread, so a trial
on one CPU thread would take 5 days at UTD 1 and nearly a month at UTD 5. On a GPU we estimate
3 to 5 ms an update (launch-bound) and 1.3 ms an agent step in the simulator (two humanoid steps
of 0.64 ms measured on one CPU thread; a dog step takes 1.1 ms): about 2 hours a trial at UTD 1,
3 at UTD 2 and 6 to 8 at UTD 5, some 700 GPU hours in all (estimates, not measured on a GPU).
Checkpoints keep the replay buffer: about 0.6 GB a humanoid trial, 1.9 GB a dog trial.
"""

from orchestrator.sweep import Sweep, grid, seeds

TASKS = ("dm_control/humanoid-run-v0", "dm_control/humanoid-walk-v0", "dm_control/dog-run-v0",
         "dm_control/dog-walk-v0")
UTDS = (1, 2, 5)
SAMPLERS = ("reverse", "uniform", "swd")
SEEDS = 5
SETTING = {
    "algo": "sac", "action_repeat": 2, "total_steps": 1_000_000, "learning_starts": 5_000, "buffer_size": 1_000_000,
    "decay_steps": 80_000, "min_weight": 0.1, "batch_size": 256, "lr": 1e-4, "gamma": 0.99, "tau": 0.005,
    "policy_delay": 2, "sac_alpha": 0.2, "sac_autotune": False, "network": "simba", "critic_width": 512,
    "critic_depth": 2, "actor_width": 128, "actor_depth": 1, "obs_norm": True, "eval_every": 10_000,
    "eval_episodes": 10,
}
"""The paper's code's SAC on DMC; step counts are agent steps (each two simulator steps)."""


sweep = Sweep(
    name="swd_rl_dmc", workload="swd_rl", base="default", overrides=SETTING,
    space={"env_id": grid(*TASKS), "utd": grid(*UTDS), "sampler": grid(*SAMPLERS), "seed": seeds(SEEDS)},
    scheduler="fifo", objective=("eval/return_late", "max"), cpus_per_worker=2, gpus_per_worker=1,
)
