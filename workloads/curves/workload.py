"""curves: Config and the loop that draws and reports a synthetic training curve (see the package docstring)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

SHAPE_EPS = 0.01
SHAPE_POWER = 0.1
SCHEDULES = {"cosine": 0.0, "linear": 0.02, "constant": 0.1}
"""Final-loss rise of each `schedule` over the best one."""


MAX_WORKERS = 1
"""curves runs on one worker (it trains nothing): the runner refuses more."""


@dataclass(frozen=True)
class Config:
    lr: float = 1e-2
    """Learning rate: the final loss is lowest at `best_lr` and rises with the squared log distance from it."""
    best_lr: float = 1e-2
    """Learning rate with the lowest final loss."""
    floor: float = 2.0
    """Final loss at `best_lr`."""
    sensitivity: float = 0.25
    """Final-loss rise per squared decade away from `best_lr`."""
    warmup: float = 0.05
    """Warmup fraction: the final loss also rises with the squared distance from `best_warmup` (a search-space knob; the curve's shape is unchanged)."""
    best_warmup: float = 0.05
    """Warmup fraction with the lowest final loss."""
    warmup_sensitivity: float = 0.1
    """Final-loss rise per squared 0.1 of warmup away from `best_warmup`."""
    schedule: str = "cosine"
    """LR schedule, a categorical knob: 'cosine' (lowest final loss), 'linear' (+0.02) or 'constant' (+0.1)."""
    steps: int = 1000
    """Training steps of the curve."""
    report_every: int = 10
    """Report train/loss, eval/loss and progress every this many steps."""
    checkpoint_every: int = 250
    """Save a checkpoint every this many steps (and at the end)."""
    noise: float = 0.005
    """Relative std of the multiplicative Gaussian noise on each reported loss."""
    diverge_at: float = 0.0
    """Training fraction from which the loss is NaN (0: never diverges)."""
    step_time_s: float = 0.0
    """Wall time each step sleeps, to stand in for real work (0: as fast as it goes)."""
    seed: int = 0
    """Seed of the noise."""


def smoke() -> Config:
    """A 200-step curve, a fraction of a second."""
    return Config(steps=200, report_every=5, checkpoint_every=50)


def validate(cfg: Config, world_size: int = 1) -> None:
    for name in ("steps", "report_every", "checkpoint_every"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.lr <= 0 or cfg.best_lr <= 0:
        raise ValueError(f"lr and best_lr must be positive, got lr={cfg.lr}, best_lr={cfg.best_lr}")
    if cfg.noise < 0 or cfg.step_time_s < 0:
        raise ValueError("noise and step_time_s must be >= 0")
    if not 0.0 <= cfg.warmup < 1.0 or not 0.0 <= cfg.best_warmup < 1.0 or cfg.warmup_sensitivity < 0:
        raise ValueError(f"warmup and best_warmup are fractions in [0, 1) and warmup_sensitivity >= 0, got "
                         f"{cfg.warmup}, {cfg.best_warmup}, {cfg.warmup_sensitivity}")
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {cfg.schedule!r}")
    if not 0.0 <= cfg.diverge_at <= 1.0:
        raise ValueError(f"diverge_at is a training fraction in [0, 1] (0: never), got {cfg.diverge_at}")


def shape(progress: np.ndarray | float) -> np.ndarray:
    """The shared normalized curve s(t), s(1) = 1: a power law in training fraction."""
    t = np.clip(np.asarray(progress, dtype=float), 0.0, 1.0)
    return ((1.0 + SHAPE_EPS) / (t + SHAPE_EPS)) ** SHAPE_POWER


def final_loss(cfg: Config) -> float:
    """The noise-free final loss of a trial with this config."""
    return (cfg.floor + cfg.sensitivity * math.log10(cfg.lr / cfg.best_lr) ** 2
            + cfg.warmup_sensitivity * ((cfg.warmup - cfg.best_warmup) / 0.1) ** 2 + SCHEDULES[cfg.schedule])


def train(cfg: Config, run: Any) -> dict[str, float]:
    validate(cfg)
    state = run.restore()
    start = int(state["step"]) if state else 0
    rng = np.random.default_rng(cfg.seed)
    if state:
        rng.bit_generator.state = _rng_state(state)
    target = final_loss(cfg)
    loss = math.nan
    for step in range(start + 1, cfg.steps + 1):
        if cfg.step_time_s:
            time.sleep(cfg.step_time_s)
        if step % cfg.report_every and step != cfg.steps:
            continue
        progress = step / cfg.steps
        noise = 1.0 + cfg.noise * float(rng.standard_normal())
        loss = target * float(shape(progress)) * noise
        if cfg.diverge_at and progress >= cfg.diverge_at:
            loss = math.nan
        run.report({"train/loss": loss, "eval/loss": loss, "progress": progress}, step=step)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            run.save({"step": step, "rng": _rng_tensor(rng)})
    return {"train/loss": loss, "eval/loss": loss, "eval/final_expected": target}


def _rng_tensor(rng: np.random.Generator) -> dict[str, Any]:
    # Plain numbers only: checkpoints load with weights_only.
    s = rng.bit_generator.state
    return {"state": int(s["state"]["state"]), "inc": int(s["state"]["inc"]),
            "has_uint32": int(s["has_uint32"]), "uinteger": int(s["uinteger"])}


def _rng_state(state: dict[str, Any]) -> dict[str, Any]:
    r = state["rng"]
    return {"bit_generator": "PCG64", "state": {"state": int(r["state"]), "inc": int(r["inc"])},
            "has_uint32": int(r["has_uint32"]), "uinteger": int(r["uinteger"])}
