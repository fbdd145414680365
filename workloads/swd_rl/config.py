"""swd_rl: Config, the smoke size and the checks run before anything is launched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workloads.swd_rl import envs


MAX_WORKERS = 1
"""swd_rl runs one actor-learner loop on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config:
    env_id: str = "HalfCheetah-v5"
    """gymnasium environment with a Box action space and a time limit (MuJoCo tasks need the
    `mujoco` extra; Pendulum-v1 needs nothing more), or a DeepMind Control Suite task as
    'dm_control/<domain>-<task>-v0' (e.g. dm_control/humanoid-run-v0; the `mujoco` extra, through
    shimmy), whose dict observations are flattened into one vector."""
    action_repeat: int = 1
    """Environment steps per agent step: each action is repeated this many times and the rewards
    summed (the paper's DMC runs use 2). Every step count here counts agent steps."""
    algo: Literal["td3", "sac"] = "td3"
    """Off-policy learner: TD3 (the paper's MuJoCo experiments) or SAC (its DMC ones)."""
    sampler: Literal["swd", "reverse", "uniform"] = "swd"
    """Replay sampling by age a: 'swd' w = max(w_min, 1 - a/T) (the method), 'reverse'
    w = min(1, w_min + a/T) (the paper's old-first control, SWA), 'uniform'."""
    decay_steps: int = 80_000
    """T of the age weights, in environment steps (the paper's code: linear_decay_steps)."""
    min_weight: float = 0.1
    """w_min, the floor (swd) or the start (reverse) of the age weights."""
    total_steps: int = 1_000_000
    """Environment steps."""
    learning_starts: int = 25_000
    """Steps of uniformly random actions before the first update."""
    buffer_size: int = 1_000_000
    """Replay capacity (FIFO); at least total_steps keeps every transition, as in the paper."""
    utd: int = 1
    """Update-to-data ratio: gradient updates per environment step (the paper's replay_ratio)."""
    batch_size: int = 256
    """Transitions per update; the critic and the actor use the same batch."""
    lr: float = 3e-4
    """Adam step size of actor, critic (and SAC's temperature)."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak rate of the target networks."""
    policy_delay: int = 2
    """Actor update (TD3: with the target updates) every this many critic updates."""
    policy_noise: float = 0.2
    """TD3 target smoothing noise std, as a fraction of the action half-range."""
    noise_clip: float = 0.5
    """TD3 clip of the target smoothing noise, same units."""
    exploration_noise: float = 0.1
    """TD3 Gaussian exploration noise std, as a fraction of the action half-range."""
    sac_alpha: float = 1.0
    """SAC's initial entropy temperature (fixed when sac_autotune is False)."""
    sac_autotune: bool = True
    """SAC: tune the temperature towards the entropy target -dim(A)."""
    network: Literal["simba", "mlp"] = "simba"
    """Encoders: 'simba' (residual blocks with LayerNorm, the paper's code) or a ReLU 'mlp'."""
    critic_width: int = 512
    """Hidden width of each Q network."""
    critic_depth: int = 2
    """Residual blocks (simba) or hidden layers (mlp) of each Q network."""
    actor_width: int = 128
    """Hidden width of the actor."""
    actor_depth: int = 1
    """Residual blocks (simba) or hidden layers (mlp) of the actor."""
    obs_norm: bool = True
    """Normalise observations by running mean/std. Here the statistics are updated from every
    observation the environment returns; the paper's code also folds in the sampled batches,
    which makes them depend on the sampler (a reconstruction choice)."""
    eval_every: int = 10_000
    """Evaluate the deterministic policy and the diagnostics every this many steps (and at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation (each evaluation starts from the same seeded initial states)."""
    late_frac: float = 0.25
    """'Late in training': the last fraction of steps over which the training critic-gradient norm
    and the evaluation return are averaged into the final metrics."""
    grad_every: int = 10
    """Record the critic-gradient statistics every this many updates."""
    probe_batches: int = 10
    """Paired gradient probe: at each evaluation, the mean critic-gradient norm over this many
    batches drawn by each sampler from this run's own buffer and networks (no update)."""
    diag_batch: int = 128
    """States for the feature-rank and NTK-rank diagnostics (drawn uniformly from the buffer)."""
    rank_delta: float = 0.01
    """delta of the effective rank srank_delta (the share of the singular-value sum left out)."""
    log_every: int = 1_000
    """Report training metrics every this many steps."""
    checkpoint_every_frac: float = 0.1
    """Checkpoint at the first episode end after every multiple of this training fraction, and at
    the end; episode ends make a resumed run continue exactly (no mid-episode simulator state)."""
    checkpoint_buffer: bool = True
    """Keep the replay buffer in the checkpoint. False keeps checkpoints small (a 1e6 MuJoCo buffer
    is 0.2-0.9 GB); a run resumed without it refills learning_starts steps with its restored policy
    before it updates again, with ages counted from the restart."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Seed of the networks, the environment's episodes, exploration and sampling."""


def smoke() -> Config:
    """Pendulum-v1, TD3 with 32x2 MLPs, 1,000 steps (600 updates): about a second of CPU.

    The reproduction's smoke size (`sweeps/repro/swd_rl.py`) is larger: 4,000 steps with 64x2
    networks and batches of 256.
    """
    return Config(
        env_id="Pendulum-v1", total_steps=1000, learning_starts=400, buffer_size=1000, decay_steps=250,
        batch_size=64, network="mlp", critic_width=32, critic_depth=2, actor_width=32, actor_depth=2,
        obs_norm=False, eval_every=500, eval_episodes=1, grad_every=1, probe_batches=2, diag_batch=32,
        log_every=100, checkpoint_every_frac=0.25,
    )


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    if cfg.algo not in ("td3", "sac"):
        raise ValueError(f"algo must be 'td3' or 'sac', got {cfg.algo!r}")
    if cfg.sampler not in ("swd", "reverse", "uniform"):
        raise ValueError(f"sampler must be 'swd', 'reverse' or 'uniform', got {cfg.sampler!r} "
                         "(the paper's negative linear_decay_steps is sampler='reverse' here)")
    if cfg.network not in ("simba", "mlp"):
        raise ValueError(f"network must be 'simba' or 'mlp', got {cfg.network!r}")
    for name in ("total_steps", "buffer_size", "utd", "batch_size", "policy_delay", "critic_width", "critic_depth",
                 "actor_width", "actor_depth", "eval_every", "eval_episodes", "grad_every", "probe_batches",
                 "diag_batch", "log_every", "action_repeat"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.decay_steps < 1:
        raise ValueError(f"decay_steps must be a positive T, got {cfg.decay_steps}: choose the rule with sampler "
                         "('uniform' for the paper's T = 0, 'reverse' for its T < 0)")
    if not 0 <= cfg.min_weight <= 1:
        raise ValueError(f"min_weight must lie in [0, 1], got {cfg.min_weight}")
    if not 0 <= cfg.learning_starts < cfg.total_steps:
        raise ValueError(f"learning_starts={cfg.learning_starts} must lie in [0, total_steps={cfg.total_steps})")
    if max(cfg.learning_starts, 1) < cfg.batch_size:
        raise ValueError(f"learning_starts={cfg.learning_starts} is below batch_size={cfg.batch_size}: the first "
                         "update would sample more transitions than the buffer holds; raise learning_starts")
    if cfg.buffer_size < cfg.batch_size:
        raise ValueError(f"buffer_size={cfg.buffer_size} is below batch_size={cfg.batch_size}")
    if not (cfg.lr > 0 and 0 <= cfg.gamma < 1 and 0 < cfg.tau <= 1):
        raise ValueError(f"need lr > 0, 0 <= gamma < 1, 0 < tau <= 1; got lr={cfg.lr}, gamma={cfg.gamma}, tau={cfg.tau}")
    if cfg.policy_noise < 0 or cfg.noise_clip < 0 or cfg.exploration_noise < 0:
        raise ValueError("policy_noise, noise_clip and exploration_noise must be non-negative")
    if not cfg.sac_alpha > 0:
        raise ValueError(f"sac_alpha must be positive, got {cfg.sac_alpha}")
    if not 0 < cfg.late_frac <= 1:
        raise ValueError(f"late_frac must lie in (0, 1], got {cfg.late_frac}")
    if cfg.total_steps - cfg.late_frac * cfg.total_steps < cfg.learning_starts:
        raise ValueError(f"the late window starts before learning_starts={cfg.learning_starts}: lower late_frac")
    if cfg.diag_batch > cfg.eval_every:
        raise ValueError(f"diag_batch={cfg.diag_batch} exceeds the buffer at the first evaluation (eval_every="
                         f"{cfg.eval_every}): lower diag_batch")
    if not 0 < cfg.rank_delta < 1:
        raise ValueError(f"rank_delta must lie in (0, 1), got {cfg.rank_delta}")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")
    _check_env(cfg.env_id)


def _check_env(env_id: str) -> None:
    import gymnasium as gym

    if envs.dmc_task(env_id) is not None:  # the form here; the task itself where dm_control is installed
        # A sweep's driver may lack dm_control while its workers have it: `preflight` and train()
        # refuse a run without it, with the fix.
        if envs.dmc_installed():
            envs.check_dmc(env_id)
        return

    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise ValueError(f"env_id {env_id!r} is not a registered gymnasium environment ({exc}); e.g. Pendulum-v1, "
                         "HalfCheetah-v5, Hopper-v5, Walker2d-v5, Ant-v5") from None
    if spec.max_episode_steps is None:
        raise ValueError(f"env_id {env_id!r} has no time limit: checkpoints are taken at episode ends")
    if "mujoco" in str(spec.entry_point):
        # gymnasium's MuJoCo tasks all have Box actions and flat observations; building one here would
        # compile its model (and MuJoCo writes its warnings to ./MUJOCO_LOG.TXT). A sweep's driver may
        # also lack MuJoCo while its workers have it: train() refuses a run without it, with the fix.
        return
    env = gym.make(env_id)
    try:
        if not isinstance(env.action_space, gym.spaces.Box) or len(env.observation_space.shape or ()) != 1:
            raise ValueError(f"env_id {env_id!r} has action space {env.action_space} and observations "
                             f"{env.observation_space}: TD3 and SAC here need a Box action and a flat Box observation")
    finally:
        env.close()


def mujoco_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mujoco") is not None


def require_env(env_id: str) -> None:
    """Before a run (`preflight`) and at the start of training: a DeepMind Control Suite task
    without dm_control or not in its suite, or a MuJoCo task without MuJoCo, is refused with the fix."""
    import gymnasium as gym

    if envs.dmc_task(env_id) is not None:
        envs.check_dmc(env_id)
        return
    if "mujoco" in str(gym.spec(env_id).entry_point) and not mujoco_available():
        raise ValueError(f"env_id {env_id!r} needs MuJoCo: pip install 'ladder[mujoco]'")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it, before anything is launched: the packages its
    environment needs are installed and a DMC task exists in the suite (see `require_env`)."""
    require_env(cfg.env_id)
