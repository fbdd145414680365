"""The `Run` contract: the only thing a workload knows about the outside world.

A workload's `train(cfg, run)` reports metrics, saves and restores checkpoints and asks `run` to
prepare its model and optimizer. Two implementations live in ladder: `LocalRun` (in-process, used
by tests and `ladder run --local`) and `RayTrainRun` (inside a Ray Train worker, see
`orchestrator.runners.ray_train`). Both write checkpoints with `checkpoints.write_checkpoint`, so a
checkpoint made by one can be resumed by the other.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:  # torch is imported where it is used: `ladder list` and the CLI's error handling stay free of it
    import torch

from orchestrator.run import checkpoints


@runtime_checkable
class Run(Protocol):
    """What a workload may call. Metric keys are namespaced (`train/loss`, `eval/<name>`,
    `perf/<name>`); a long loop also reports `progress`, the fraction of its budget done."""

    device: torch.device
    rank: int
    world_size: int

    def report(self, metrics: Mapping[str, float], *, step: int) -> None: ...

    def save(self, state: dict[str, Any]) -> None: ...

    def restore(self) -> dict[str, Any] | None: ...

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]: ...

    def log_artifact(self, path: str | os.PathLike) -> None: ...


class Sink(Protocol):
    """Where reported metrics go besides the in-memory history (MLflow, wandb, the console)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_artifact(self, path: str) -> None: ...

    def flush(self) -> None: ...


class MetricError(ValueError):
    """A workload reported something that is not a namespaced finite-or-nan number."""


_NAMESPACES = ("train/", "eval/", "perf/", "collapse/", "diag/", "claim/")
_BARE_KEYS = {"progress", "tau", "tpp", "step", "params", "tokens"}


def check_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Validate metric keys and convert values to float, so every sink sees the same thing."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key not in _BARE_KEYS and not key.startswith(_NAMESPACES):
            raise MetricError(
                f"metric key {key!r} is not namespaced: use train/..., eval/..., perf/... "
                f"(or one of {sorted(_BARE_KEYS)})"
            )
        if hasattr(value, "item") and not isinstance(value, (int, float)):  # a tensor or numpy scalar
            value = value.item()
        try:
            out[key] = float(value)
        except (TypeError, ValueError) as exc:
            raise MetricError(f"metric {key!r} has non-numeric value {value!r}") from exc
    if "progress" in out and not (0.0 <= out["progress"] <= 1.0 + 1e-9):
        raise MetricError(f"progress must lie in [0, 1], got {out['progress']}")
    return out


def fraction_steps(steps: int, frac: float) -> set[int]:
    """The steps at every multiple of `frac` of a `steps`-step run (rounded, never before step 1),
    the last step always among them; `frac <= 0` gives the last step alone. Workloads checkpoint
    and evaluate at these."""
    if frac <= 0:
        return {steps}
    return {min(steps, max(1, round(j * frac * steps))) for j in range(1, math.ceil(1 / frac) + 1)} | {steps}


@contextlib.contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """torch's intra-op CPU threads set to `threads` for the block (0 or less leaves torch's setting), and
    the previous setting restored afterwards, also when the block raises."""
    import torch

    previous = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class LocalRun:
    """In-process `Run`: rank 0 of 1, CPU (or the given device), checkpoints in `run_dir`.

    `run_dir` holds `checkpoints/` and is what makes a restart continue: a second `LocalRun` on
    the same folder restores the newest readable checkpoint.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        sinks: list[Sink] | None = None,
        device: str | torch.device = "cpu",
        keep_checkpoints: int = 2,
        on_report: Callable[[dict[str, float], int], None] | None = None,
        identity: dict[str, Any] | None = None,
    ) -> None:
        import torch

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.device = torch.device(device)
        self.rank = 0
        self.world_size = 1
        self.sinks = list(sinks or [])
        self.keep_checkpoints = keep_checkpoints
        self.history: list[tuple[int, dict[str, float]]] = []
        self.restored_step: int | None = None
        self._on_report = on_report
        self.identity = identity  # what its checkpoints belong to (checkpoints.identity)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def report(self, metrics: Mapping[str, float], *, step: int) -> None:
        clean = check_metrics(metrics)
        self.history.append((int(step), clean))
        for sink in self.sinks:
            sink.log_metrics(clean, int(step))
        if self._on_report is not None:
            self._on_report(clean, int(step))

    def save(self, state: dict[str, Any]) -> None:
        checkpoints.write_checkpoint(self.checkpoint_dir, state, keep=self.keep_checkpoints, identity=self.identity)
        for sink in self.sinks:
            sink.flush()

    def restore(self) -> dict[str, Any] | None:
        state = checkpoints.load_latest(self.checkpoint_dir, self.identity)
        if state is not None:
            self.restored_step = int(state.get("step", 0))
        return state

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        return model.to(self.device), optimizer

    def log_artifact(self, path: str | os.PathLike) -> None:
        for sink in self.sinks:
            sink.log_artifact(str(path))

    def last(self, key: str) -> float:
        """The newest reported value of `key` (nan when never reported)."""
        for _, metrics in reversed(self.history):
            if key in metrics:
                return metrics[key]
        return math.nan
