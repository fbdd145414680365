"""swd_rl: the actor-learner loop (see the package docstring)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np
import torch

from orchestrator.run import devices
from workloads.swd_rl.learners import Learner, actor_step, critic_loss, make_learner, soft_update
from workloads.swd_rl.config import Config, preflight, require_env, smoke, validate
from workloads.swd_rl.diagnostics import feature_rank, grad_stats, ntk_rank
from workloads.swd_rl.envs import make_env
from workloads.swd_rl.replay import SAMPLERS, ReplayBuffer

__all__ = ["Config", "preflight", "smoke", "train", "validate"]

CURVES = ("return", "grad_l1", "grad_l2", "feature_rank", "ntk_rank")
"""Per-evaluation curves kept in the final metrics as `curve/<name>/<step>`, for the plot."""


class RunningNorm:
    """Running mean/variance of observations (count starts at 1e-4, as in SimBa's normaliser)."""

    def __init__(self, dim: int, enabled: bool) -> None:
        self.enabled = enabled
        self.mean, self.var, self.count = np.zeros(dim), np.ones(dim), 1e-4

    def update(self, x: np.ndarray) -> None:
        if not self.enabled:
            return
        delta, total = x - self.mean, self.count + 1
        self.mean = self.mean + delta / total
        self.var = (self.var * self.count + delta**2 * self.count / total) / total
        self.count = total

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        mean = torch.as_tensor(self.mean, dtype=x.dtype, device=x.device)
        std = torch.as_tensor(np.sqrt(self.var + 1e-4), dtype=x.dtype, device=x.device)
        return (x - mean) / std

    def state_dict(self) -> dict[str, Any]:
        return {"mean": torch.from_numpy(self.mean), "var": torch.from_numpy(self.var), "count": self.count}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.mean, self.var, self.count = s["mean"].numpy().copy(), s["var"].numpy().copy(), float(s["count"])


class Mean:
    """Running sums of named values (an interval's or a window's means)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums}

    def state(self) -> dict[str, Any]:
        return {"sums": dict(self.sums), "counts": dict(self.counts)}

    def load(self, s: dict[str, Any]) -> None:
        self.sums, self.counts = dict(s["sums"]), dict(s["counts"])


def _episode_seed(seed: int, episode: int) -> int:
    return int(np.random.SeedSequence([seed, episode]).generate_state(1)[0])


def _batch(buffer: ReplayBuffer, idx: np.ndarray, norm: RunningNorm, device: torch.device) -> dict[str, torch.Tensor]:
    b = buffer.batch(idx, device)
    b["obs"], b["next_obs"] = norm(b["obs"]), norm(b["next_obs"])
    return b


def evaluate(learner: Learner, env: Any, norm: RunningNorm, cfg: Config, device: torch.device) -> float:
    """Mean return of the deterministic policy over eval_episodes seeded episodes."""
    total = 0.0
    for i in range(cfg.eval_episodes):
        obs, _ = env.reset(seed=_episode_seed(cfg.seed, 10**6 + i))
        done = False
        while not done:
            with torch.no_grad():
                a = learner.actor(norm(torch.as_tensor(obs, dtype=torch.float32, device=device)[None]))[0]
            obs, r, term, trunc, _ = env.step(a.cpu().numpy())
            total += float(r)
            done = term or trunc
    return total / cfg.eval_episodes


def probe(learner: Learner, buffer: ReplayBuffer, norm: RunningNorm, cfg: Config, rng: np.random.Generator,
          device: torch.device) -> dict[str, float]:
    """Paired diagnostics on this run's own networks and buffer, without updating anything: the
    mean critic-gradient norms of batches drawn by every sampler, the feature and NTK ranks."""
    out: dict[str, float] = {}
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):  # the training stream of random numbers stays untouched
        torch.manual_seed(int(rng.integers(2**31)))
        for name in SAMPLERS:
            l1 = l2 = 0.0
            for _ in range(cfg.probe_batches):
                b = _batch(buffer, buffer.sample(rng, cfg.batch_size, name, cfg.decay_steps, cfg.min_weight), norm, device)
                learner.critic.zero_grad(set_to_none=True)
                critic_loss(learner, b, cfg).backward()
                g = grad_stats(learner.critic.parameters())
                l1, l2 = l1 + g["l1"], l2 + g["l2"]
            out[f"diag/probe_l1/{name}"] = l1 / cfg.probe_batches
            out[f"diag/probe_l2/{name}"] = l2 / cfg.probe_batches
        learner.critic.zero_grad(set_to_none=True)
        b = _batch(buffer, buffer.sample(rng, cfg.diag_batch, "uniform", 1, 0.0), norm, device)
        with torch.no_grad():
            out["diag/feature_rank"] = float(feature_rank(learner.critic.q1.features(b["obs"], b["actions"]), cfg.rank_delta))
        out["diag/ntk_rank"] = float(ntk_rank(learner.critic.q1, (b["obs"], b["actions"]), cfg.rank_delta))
    return out


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    require_env(cfg.env_id)
    device = run.device
    env, eval_env = make_env(cfg.env_id, cfg.action_repeat), make_env(cfg.env_id, cfg.action_repeat)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low.astype(np.float64), env.action_space.high.astype(np.float64)
    torch.manual_seed(cfg.seed)
    learner = make_learner(cfg, obs_dim, act_dim, torch.as_tensor(low, dtype=torch.float32),
                       torch.as_tensor(high, dtype=torch.float32), device)
    buffer = ReplayBuffer(cfg.buffer_size, obs_dim, act_dim)
    norm = RunningNorm(obs_dim, cfg.obs_norm)
    rngs = {k: np.random.default_rng([cfg.seed, i]) for i, k in enumerate(("act", "sample", "probe"))}
    late_start = cfg.total_steps - round(cfg.late_frac * cfg.total_steps)
    saves = [max(1, round(j * cfg.checkpoint_every_frac * cfg.total_steps))
             for j in range(1, math.ceil(1 / cfg.checkpoint_every_frac) + 1)]
    interval, late, since_eval = Mean(), Mean(), Mean()
    curves: dict[str, dict[int, float]] = {k: {} for k in CURVES}
    evals: dict[str, float] = {}
    recent_returns: deque[float] = deque(maxlen=10)
    start, episode, updates, fill_needed = 0, 0, 0, cfg.batch_size

    state = run.restore()
    if state is not None:
        learner.load_state_dict(state["learner"])
        norm.load_state_dict(state["norm"])
        if state.get("buffer") is not None:
            buffer.load_state_dict(state["buffer"])
        else:  # documented in Config.checkpoint_buffer: refill before updating again
            fill_needed = max(cfg.batch_size, min(cfg.learning_starts, cfg.buffer_size))
        for k, g in rngs.items():
            g.bit_generator.state = state["rngs"][k]
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        for meter, key in ((interval, "interval"), (late, "late"), (since_eval, "since_eval")):
            meter.load(state[key])
        curves = {k: {int(s): float(v) for s, v in c.items()} for k, c in state["curves"].items()}
        evals, recent_returns = dict(state["evals"]), deque(state["recent_returns"], maxlen=10)
        start, episode, updates = int(state["step"]), int(state["episode"]), int(state["updates"])
        saves = [s for s in saves if s > start]

    def save(step: int) -> None:
        run.save({
            "step": step, "episode": episode, "updates": updates, "learner": learner.state_dict(),
            "buffer": buffer.state_dict() if cfg.checkpoint_buffer else None, "norm": norm.state_dict(),
            "rngs": {k: g.bit_generator.state for k, g in rngs.items()}, "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "interval": interval.state(), "late": late.state(), "since_eval": since_eval.state(),
            "curves": curves, "evals": evals, "recent_returns": list(recent_returns),
        })

    obs, _ = env.reset(seed=_episode_seed(cfg.seed, episode))
    if state is None:  # a checkpoint's statistics already hold this first observation
        norm.update(obs)
    ep_return, window_start, window_steps = 0.0, devices.clock(device), 0
    scale = (high - low) / 2
    for step in range(start + 1, cfg.total_steps + 1):
        if step <= cfg.learning_starts:
            action = rngs["act"].uniform(low, high)
        else:
            with torch.no_grad():
                o = norm(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
                if cfg.algo == "td3":
                    action = learner.actor(o)[0].cpu().numpy().astype(np.float64)
                    action = np.clip(action + rngs["act"].normal(0.0, cfg.exploration_noise * scale), low, high)
                else:
                    action = learner.actor.sample(o)[0][0].cpu().numpy().astype(np.float64)
        next_obs, reward, terminated, truncated, _ = env.step(action.astype(env.action_space.dtype))
        buffer.add(obs, action, float(reward), next_obs, bool(terminated))
        norm.update(next_obs)
        ep_return += float(reward)
        window_steps += 1

        if step > cfg.learning_starts and buffer.size >= fill_needed:
            for _ in range(cfg.utd):
                idx = buffer.sample(rngs["sample"], cfg.batch_size, cfg.sampler, cfg.decay_steps, cfg.min_weight)
                b = _batch(buffer, idx, norm, device)
                loss = critic_loss(learner, b, cfg)
                learner.critic_opt.zero_grad(set_to_none=True)
                loss.backward()
                if updates % cfg.grad_every == 0:
                    g = grad_stats(learner.critic.parameters())
                    stats = {"grad_l1": g["l1"], "grad_l2": g["l2"], "grama": g["grama"]}
                    for meter in (interval, since_eval) + ((late,) if step > late_start else ()):
                        meter.add(stats)
                interval.add({"loss": float(loss.detach())})
                learner.critic_opt.step()
                updates += 1
                if cfg.algo == "sac":
                    soft_update(learner.critic_target, learner.critic, cfg.tau)
                if updates % cfg.policy_delay == 0:
                    interval.add(actor_step(learner, b["obs"]))
                    if cfg.algo == "td3":
                        soft_update(learner.critic_target, learner.critic, cfg.tau)
                        soft_update(learner.actor_target, learner.actor, cfg.tau)

        episode_over = terminated or truncated
        if episode_over:
            recent_returns.append(ep_return)
            episode += 1
            obs, _ = env.reset(seed=_episode_seed(cfg.seed, episode))
            norm.update(obs)
            ep_return = 0.0
        else:
            obs = next_obs

        if step % cfg.eval_every == 0 or step == cfg.total_steps:
            ret = evaluate(learner, eval_env, norm, cfg, device)
            diag = probe(learner, buffer, norm, cfg, rngs["probe"], device)
            grads = since_eval.means()
            since_eval = Mean()
            for key, value in (("return", ret), ("grad_l1", grads.get("grad_l1", math.nan)),
                               ("grad_l2", grads.get("grad_l2", math.nan)),
                               ("feature_rank", diag["diag/feature_rank"]), ("ntk_rank", diag["diag/ntk_rank"])):
                curves[key][step] = value
            evals = {"eval/return": ret, **diag}
            run.report({**evals, "progress": step / cfg.total_steps}, step=step)
        if step % cfg.log_every == 0 or step == cfg.total_steps:
            now = devices.clock(device)
            m = interval.means()
            interval = Mean()
            metrics = {f"train/{'critic_' if k.startswith('grad') else ''}{k}": v for k, v in m.items()}
            if recent_returns:
                metrics["train/episode_return"] = float(np.mean(recent_returns))
            metrics["perf/steps_per_s"] = window_steps / max(now - window_start, 1e-9)
            window_start, window_steps = now, 0
            run.report({**metrics, "progress": step / cfg.total_steps}, step=step)
        if (episode_over and saves and step >= saves[0]) or step == cfg.total_steps:
            while saves and step >= saves[0]:
                saves.pop(0)
            save(step)
    env.close()
    eval_env.close()
    return _final(cfg, curves, evals, late, recent_returns, late_start)


def _final(cfg: Config, curves: dict[str, dict[int, float]], evals: dict[str, float], late: Mean,
           recent_returns: deque[float], late_start: int) -> dict[str, float]:
    late_returns = [v for s, v in curves["return"].items() if s > late_start]
    grads = late.means()
    out = {
        **evals,
        "eval/return_late": float(np.mean(late_returns)) if late_returns else math.nan,
        "train/episode_return": float(np.mean(recent_returns)) if recent_returns else math.nan,
        "train/grad_l1_late": grads.get("grad_l1", math.nan),
        "train/grad_l2_late": grads.get("grad_l2", math.nan),
        "train/grama_late": grads.get("grama", math.nan),
    }
    for name, curve in curves.items():
        out.update({f"curve/{name}/{s}": float(v) for s, v in sorted(curve.items())})
    return {k: float(v) for k, v in out.items()}
