"""A tiny workload for the trial path's unit tests (not a paper's method).

Registered the way a user's own workload is: by its dotted module path,
`tests.orchestrator.fake_workload`, which `orchestrator.runners.registry.load` accepts. Its Config
says what `train` does (how many steps, whether and how it fails), so that one module drives every
outcome of `run_trial`; it trains nothing, and a run of it takes milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NAME = "tests.orchestrator.fake_workload"
"""The name the tests hand to `TrialSpec` and `run_local`."""


@dataclass(frozen=True)
class Config:
    steps: int = 3
    """Steps to report `train/loss` at (1..steps); the loss at step s is 1/s."""
    fail: str = ""
    """'' (return), 'error' (raise RuntimeError after the steps) or 'interrupt' (KeyboardInterrupt)."""
    threads: int = 0
    """torch's CPU threads while training (0: the runner's choice)."""
    max_world_size: int = 1
    """The most workers `validate` accepts."""
    data_path: str = ""
    """A file `preflight` wants to exist ('' : none needed)."""
    widths: tuple[int, ...] = (4, 8)
    """A tuple field, to round-trip through a TrialSpec."""
    lr: float = 0.1
    """A float field, for sweeps over it."""


def smoke() -> Config:
    return Config()


def validate(cfg: Config, world_size: int) -> None:
    if world_size > cfg.max_world_size:
        raise ValueError(f"trains on at most {cfg.max_world_size} workers (max_world_size), got {world_size}")


def preflight(cfg: Config) -> None:
    import os

    if cfg.data_path and not os.path.exists(cfg.data_path):
        raise ValueError(f"data_path {cfg.data_path!r} does not exist")


def train(cfg: Config, run) -> dict[str, float]:
    state = run.restore() or {"step": 0}
    loss = float("nan")
    for step in range(state["step"] + 1, cfg.steps + 1):
        loss = 1.0 / step
        run.report({"train/loss": loss, "progress": step / cfg.steps}, step=step)
        run.save({"step": step})
    if cfg.fail == "error":
        raise RuntimeError("fake_workload failed on purpose")
    if cfg.fail == "interrupt":
        raise KeyboardInterrupt
    return {"train/loss": loss, "threads_seen": torch.get_num_threads(), "started_at": state["step"] + 1}
