"""`ladder new NAME`: write a workload package that follows the contract, ready to run and sweep.

The package is the smallest complete workload: a documented frozen `Config`, `smoke()`, and a
visible PyTorch loop (a two-layer MLP fitting a fixed synthetic regression task) that reports,
checkpoints and resumes exactly; a test that runs `ladder check` on it; and a sweep file. It
passes `ladder check` as written, so whatever breaks the contract later is the last change.
"""

from __future__ import annotations

import keyword
import os
from pathlib import Path
from string import Template

from orchestrator.runners.config import ConfigError

INIT = '''"""$name: a two-layer MLP fitting y = sin(x @ w), the starting point of a ladder workload

`ladder list` and MLflow show this docstring's first line: make it your method's name (the
paper's title and link when there is one) once the loop in workload.py is yours.
"""

from .workload import Config, smoke, train  # relative: the package works under any name it is imported by

__all__ = ["Config", "smoke", "train"]
'''

WORKLOAD = '''"""$name: its Config, smoke() and the training loop (the workload contract: docs/own-workload.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# A workload whose trial cannot train on several Ray Train workers declares it once, as
# `MAX_WORKERS = 1` here, exported by __init__.py with Config: ladder then refuses `--workers 2`
# before launching, and again where the trial runs. This loop splits its batch over any number of
# DDP workers, so it sets no cap.


@dataclass(frozen=True)
class Config:
    # Every field has a type and a one-line docstring under it: `ladder show` prints them, sweeps
    # and `--set` are checked against them. The defaults are a full-size run.
    width: int = 256
    """Hidden units of the two-layer MLP."""
    lr: float = 3e-3
    """AdamW learning rate."""
    batch_size: int = 128
    """Examples per optimizer step, summed over the workers."""
    steps: int = 3000
    """Optimizer steps: the run's whole budget (progress = step / steps)."""
    eval_every: int = 100
    """Report eval/loss on the held-out set every this many steps."""
    checkpoint_every: int = 500
    """Save a checkpoint every this many steps (and at the end); a restarted run continues from the newest."""
    inputs: int = 16
    """Input features of the synthetic regression task."""
    seed: int = 0
    """Seed of the task, the initial weights and the batches."""
    threads: int = 1
    """Intra-op CPU threads of a trial, pinned by the runner while train runs (0 leaves torch's setting): more threads than cores slow small models down."""


def smoke() -> Config:
    """A CPU-sized run that finishes in about a second: what tests and `--smoke` use."""
    return Config(width=32, batch_size=32, steps=100, eval_every=10, checkpoint_every=25)


def task(cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed function to learn, y = sin(x @ w), as a teacher weight vector and a held-out set."""
    g = torch.Generator().manual_seed(cfg.seed)
    w = torch.randn(cfg.inputs, 1, generator=g) / cfg.inputs**0.5
    x_eval = torch.randn(1024, cfg.inputs, generator=g)
    return w, x_eval


def train(cfg: Config, run: Any) -> dict[str, float]:
    # `run` is the only thing the loop knows about the outside world (orchestrator.run.Run): it
    # reports, checkpoints and places the model, in-process or under Ray Train with N workers.
    if cfg.batch_size % run.world_size:
        raise ValueError(f"batch_size={cfg.batch_size} must divide over {run.world_size} workers")
    w, x_eval = task(cfg)
    y_eval = torch.sin(x_eval @ w)
    torch.manual_seed(cfg.seed)  # the same initial weights on every worker
    model = torch.nn.Sequential(torch.nn.Linear(cfg.inputs, cfg.width), torch.nn.GELU(), torch.nn.Linear(cfg.width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    model, optimizer = run.prepare(model, optimizer)  # DDP under several Ray Train workers
    # Batches come from their own generator, saved in every checkpoint: a resumed run draws the
    # batches the uninterrupted run would have (`ladder check` compares the two).
    batches = torch.Generator().manual_seed(cfg.seed + 1)

    start = 0
    state = run.restore()  # None on a fresh run; the newest checkpoint's dict on a restart
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        batches.set_state(state["batches"])
        start = int(state["step"])

    per_worker = cfg.batch_size // run.world_size
    train_loss = eval_loss = float("nan")
    for step in range(start + 1, cfg.steps + 1):
        # Every worker draws the same global batch and trains on its own slice of it.
        x = torch.randn(cfg.batch_size, cfg.inputs, generator=batches)
        x = x[run.rank * per_worker:(run.rank + 1) * per_worker].to(run.device)
        loss = F.mse_loss(model(x), torch.sin(x @ w.to(run.device)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        train_loss = loss.item()
        metrics = {"train/loss": train_loss, "progress": step / cfg.steps}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            # The sweep's objective: schedulers (ASHA, median, collapse) compare trials on it.
            with torch.no_grad():
                eval_loss = F.mse_loss(model(x_eval.to(run.device)), y_eval.to(run.device)).item()
            metrics["eval/loss"] = eval_loss
        run.report(metrics, step=step)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            # Plain tensors and numbers only: checkpoints load with torch.load(weights_only=True).
            run.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "batches": batches.get_state()})
    return {"train/loss": train_loss, "eval/loss": eval_loss}
'''

TEST = '''"""Tests of $name: the workload contract (what `ladder check` runs), then the method's own behaviour."""

from __future__ import annotations

from orchestrator.commands import check
from orchestrator.run import LocalRun

from . import smoke, train


def test_follows_the_workload_contract(tmp_path):
    report = check.check(__package__, tmp_path)  # this package, by the name pytest imported it under
    assert report.ok, check.format_report(report)


def test_smoke_run_learns(tmp_path):
    run = LocalRun(tmp_path)
    final = train(smoke(), run)
    first_eval = next(m["eval/loss"] for _, m in run.history if "eval/loss" in m)
    assert final["eval/loss"] < first_eval
'''

SWEEP = '''"""A sweep of $name: four learning rates at smoke size, ASHA stopping the worst early.

    ladder sweep $path --check    # validate only
    ladder sweep $path            # run on the local Ray (or the cluster at RAY_ADDRESS)
"""

from orchestrator.sweep import Sweep, grid

sweep = Sweep(
    name="$name",
    workload="$module",
    base="smoke",
    space={"lr": grid(1e-3, 3e-3, 1e-2, 3e-2)},
    scheduler="asha",
    objective=("eval/loss", "min"),
)
'''


IGNORED = ("ladder-runs/", "mlruns.db", "mlartifacts/", ".venv/")
"""What `ladder` and a virtualenv leave in the folder commands run from: run folders, the MLflow
store and its artifacts. Neither git nor `ray job submit --working-dir .` should take them."""

IGNORE_FILES = {
    ".gitignore": "# Written by `ladder new`: run folders, the MLflow store and its artifacts, the virtualenv.\n",
    ".rayignore": "# Written by `ladder new`: what `ray job submit --working-dir .` leaves behind (Ray reads this\n"
                  "# file as it reads .gitignore): run folders, the MLflow store and its artifacts, the virtualenv.\n",
}


def write_ignore_files(root: str | os.PathLike) -> tuple[list[str], dict[str, list[str]]]:
    """Write .gitignore and .rayignore listing `IGNORED` in `root` where they are absent (a file
    that exists is left as it is). Returns the files written, and for each existing file the
    entries of `IGNORED` it lacks."""
    written: list[str] = []
    lacking: dict[str, list[str]] = {}
    for name, header in IGNORE_FILES.items():
        path = Path(root) / name
        if not path.exists():
            path.write_text(header + "".join(f"{entry}\n" for entry in IGNORED))
            written.append(name)
            continue
        try:
            have = {line.strip().strip("/") for line in path.read_text(encoding="utf-8").splitlines()}
        except (OSError, UnicodeDecodeError):
            continue
        missing = [entry for entry in IGNORED if entry.strip("/") not in have]
        if missing:
            lacking[name] = missing
    return written, lacking


def module_path(folder: Path, cwd: Path) -> str | None:
    """The dotted module path that imports the package at `folder` from `cwd` (None when `folder`
    is not below `cwd`, or a folder on the way is not a valid Python name)."""
    try:
        parts = folder.resolve().relative_to(cwd.resolve()).parts
    except ValueError:
        return None
    return ".".join(parts) if parts and all(p.isidentifier() and not keyword.iskeyword(p) for p in parts) else None


def new(name: str, directory: str | os.PathLike = ".", *, cwd: str | os.PathLike | None = None) -> tuple[Path, str]:
    """Write the package `name` under `directory`; returns its folder and the module path that
    names it from `cwd` (or from `directory` when the package lies outside `cwd`)."""
    from orchestrator.runners import registry

    if not name.isidentifier() or keyword.iskeyword(name):
        raise ConfigError(f"workload name {name!r} is not a Python module name: use letters, digits and _ (e.g. "
                          f"{''.join(c if c.isalnum() else '_' for c in name).lstrip('0123456789') or 'my_method'!r})")
    if name in registry.WORKLOADS:
        raise ConfigError(f"{name!r} is a built-in workload's name: choose another, or the built-in one wins")
    parent = Path(directory)
    folder = parent / name
    if folder.exists():
        raise ConfigError(f"{folder} already exists: choose another name or --dir")
    cwd_path = Path(cwd or os.getcwd())
    module = module_path(folder, cwd_path) or name
    sweep_path = folder / "sweep.py"
    shown_sweep = os.path.relpath(sweep_path, cwd_path) if module != name or parent.resolve() == cwd_path.resolve() \
        else f"{name}/sweep.py"
    values = {"name": name, "module": module, "path": shown_sweep}
    folder.mkdir(parents=True)
    for filename, text in (("__init__.py", INIT), ("workload.py", WORKLOAD), (f"test_{name}.py", TEST),
                           ("sweep.py", SWEEP)):
        (folder / filename).write_text(Template(text).substitute(values))
    return folder, module
