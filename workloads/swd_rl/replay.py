"""The replay buffer with age-weighted sampling: SWD's linear decay, its reverse, and uniform.

Every transition is stamped with the clock at its `add`; the clock ticks once per `add` (one
environment here). At sampling time a transition of age a = clock - stamp (the newest has age 1)
gets the weight

    swd:      w(a) = max(w_min, 1 - a / T)         (recent data first: the paper's rule)
    reverse:  w(a) = min(1, w_min + a / T)         (old data first: the control, "SWA")
    uniform:  w(a) = 1

and is drawn with probability w(a) / sum_j w(a_j), with replacement. In the paper's code the sign
of T selects the rule (T > 0 swd, T < 0 reverse, T = 0 uniform); here the rule is named and T > 0.

Sampling is exact without forming the probability vector (which costs O(buffer) per batch, too
slow for 1e6 entries at a high update-to-data ratio): w(a) = w_min + (1 - w_min) g(a) with
g(a) = max(0, 1 - a/L) (swd) or min(1, a/L) (reverse), L = T (1 - w_min), so p is a mixture of
a uniform over all ages (mass w_min N) and g's shape (mass (1 - w_min) sum g, closed form); g is
drawn by rejection from a uniform proposal over its support, accepted with probability g(a).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch

Sampler = Literal["swd", "reverse", "uniform"]
SAMPLERS: tuple[str, ...] = ("reverse", "uniform", "swd")


def age_weights(ages: np.ndarray, sampler: str, decay_steps: float, min_weight: float) -> np.ndarray:
    """w(a) of every age under `sampler` (the specification the sampler is tested against)."""
    ages = np.asarray(ages, dtype=np.float64)
    if sampler == "uniform":
        return np.ones_like(ages)
    if sampler == "swd":
        return np.maximum(min_weight, 1.0 - ages / decay_steps)
    if sampler == "reverse":
        return np.minimum(1.0, min_weight + ages / decay_steps)
    raise ValueError(f"unknown sampler {sampler!r}: use one of {SAMPLERS}")


def age_probabilities(n: int, sampler: str, decay_steps: float, min_weight: float) -> np.ndarray:
    """p(a) for ages 1..n (index a - 1): what `sample_ages` draws from."""
    w = age_weights(np.arange(1, n + 1), sampler, decay_steps, min_weight)
    return w / w.sum()


def _shape_support_and_mass(n: int, sampler: str, ramp: float) -> tuple[int, float]:
    """(largest age where g > 0 within 1..n, sum of g over 1..n) for g of the mixture."""
    if sampler == "swd":  # g(a) = 1 - a/L for a < L
        m = min(n, max(0, math.ceil(ramp) - 1))
        return m, m - m * (m + 1) / (2 * ramp)
    m = min(n, math.floor(ramp))  # reverse: g(a) = a/L up to L, then 1
    return n, m * (m + 1) / (2 * ramp) + (n - m)


def sample_ages(rng: np.random.Generator, n: int, size: int, sampler: str, decay_steps: float,
                min_weight: float) -> np.ndarray:
    """`size` ages in 1..n drawn with probability proportional to w(a), with replacement."""
    if n < 1:
        raise ValueError("cannot sample from an empty buffer")
    if sampler == "uniform":
        return rng.integers(1, n + 1, size=size)
    if sampler not in ("swd", "reverse"):
        raise ValueError(f"unknown sampler {sampler!r}: use one of {SAMPLERS}")
    ramp = decay_steps * (1.0 - min_weight)
    if ramp <= 0:  # w_min = 1: every weight is 1
        return rng.integers(1, n + 1, size=size)
    support, shape_mass = _shape_support_and_mass(n, sampler, ramp)
    flat_mass = min_weight * n
    from_shape = rng.random(size) * (flat_mass + (1.0 - min_weight) * shape_mass) >= flat_mass
    ages = rng.integers(1, n + 1, size=size)
    need = int(from_shape.sum())
    drawn: list[np.ndarray] = []
    while need > 0:  # rejection: acceptance is the mean of g over its support (about 1/2 or more)
        proposal = rng.integers(1, support + 1, size=2 * need + 8)
        g = (1.0 - proposal / ramp) if sampler == "swd" else np.minimum(1.0, proposal / ramp)
        accepted = proposal[rng.random(proposal.size) < g][:need]
        drawn.append(accepted)
        need -= accepted.size
    if drawn:
        ages[from_shape] = np.concatenate(drawn)
    return ages


class ReplayBuffer:
    """A FIFO ring buffer of (obs, action, reward, next_obs, terminated) with add-time stamps."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int) -> None:
        self.capacity = capacity
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.actions = np.zeros((capacity, act_dim), dtype=np.float32)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.stamps = np.zeros(capacity, dtype=np.int64)
        self.ptr = 0
        self.size = 0
        self.clock = 0

    def add(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray,
            terminated: bool) -> None:
        i = self.ptr
        self.obs[i], self.actions[i], self.next_obs[i] = obs, action, next_obs
        self.rewards[i], self.terminated[i] = reward, float(terminated)
        self.stamps[i] = self.clock
        self.clock += 1
        self.ptr = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def ages(self) -> np.ndarray:
        """Age of every stored entry, in storage order (the newest has age 1)."""
        return self.clock - self.stamps[: self.size]

    def index_of_age(self, ages: np.ndarray) -> np.ndarray:
        # One add per tick: the entry of age a sits a slots behind the write pointer.
        return (self.ptr - ages) % self.capacity

    def sample(self, rng: np.random.Generator, size: int, sampler: str, decay_steps: float,
               min_weight: float) -> np.ndarray:
        """Storage indices of a batch drawn by `sampler`."""
        return self.index_of_age(sample_ages(rng, self.size, size, sampler, decay_steps, min_weight))

    def batch(self, idx: np.ndarray, device: torch.device) -> dict[str, torch.Tensor]:
        def t(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(x[idx]).to(device)
        return {"obs": t(self.obs), "actions": t(self.actions), "rewards": t(self.rewards),
                "next_obs": t(self.next_obs), "terminated": t(self.terminated)}

    def state_dict(self) -> dict[str, Any]:
        """The stored part only, as tensors (checkpoints load tensors, never pickled arrays)."""
        n = self.size
        return {"obs": torch.from_numpy(self.obs[:n].copy()), "next_obs": torch.from_numpy(self.next_obs[:n].copy()),
                "actions": torch.from_numpy(self.actions[:n].copy()), "rewards": torch.from_numpy(self.rewards[:n].copy()),
                "terminated": torch.from_numpy(self.terminated[:n].copy()),
                "stamps": torch.from_numpy(self.stamps[:n].copy()),
                "ptr": self.ptr, "size": n, "clock": self.clock, "capacity": self.capacity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"checkpointed buffer has capacity {state['capacity']}, this run {self.capacity}")
        n = int(state["size"])
        for name in ("obs", "next_obs", "actions", "rewards", "terminated", "stamps"):
            getattr(self, name)[:n] = state[name].numpy()
        self.ptr, self.size, self.clock = int(state["ptr"]), n, int(state["clock"])
