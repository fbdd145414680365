"""The Ray Train `Run`: the same `train(cfg, run)` inside a `TorchTrainer` worker (Train V2).

Every worker calls `train`; `report` and `save` go through `ray.train.report`, which is a
barrier, so workloads call them at the same steps on every rank (they do: steps are global).
Rank 0 alone writes to MLflow, prints progress and writes checkpoint files; Ray Train copies the
checkpoint folder into the run's storage and hands it back through `ray.train.get_checkpoint()`
when a failed worker group restarts or the same run name is fitted again. When the config asks
for ZeRO (`orchestrator.runners.zero`), `prepare` builds a DeepSpeed engine and every rank also writes
its shard of the engine's state, and its own state dict (its data position), into the checkpoint
it reports; Ray merges the ranks' folders into one, and each rank restores its own part.
"""

from __future__ import annotations

import os
import math
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from orchestrator.run import checkpoints
from orchestrator.runners import zero as zero_engine
from orchestrator.run import check_metrics
from orchestrator.runners.zero import ZeroSpec

if TYPE_CHECKING:  # torch is imported where a worker uses it: a sweep's driver never trains
    import torch


def forward_to_ray(metrics: Mapping[str, float]) -> bool:
    """Which reports reach Ray (and so Tune's schedulers): evaluations and the final one.

    Every report goes to MLflow and the console from rank 0 directly. Ray's controller consumes
    one report per health-check poll and `ray.train.report` blocks until it does, so sending
    every training-loss report would pace the loop at Ray's poll interval.
    """
    return any(k.startswith("eval/") for k in metrics) or metrics.get("progress", 0.0) >= 1.0 - 1e-9


class RayReports:
    """Reports, checkpoints and restores through one Ray API: `ray.train` inside a Train worker,
    `ray.tune` inside a Tune trial (the two are not interchangeable under Train V2).

    Every report goes to the sinks; those that `forward_to_ray` selects are held for one call,
    so that a checkpoint of the same step travels with it in one Ray round trip.

    With `hold_past_ray` (a Tune trial, which a scheduler may stop at any report) the sinks are
    held back too: they get a point only once Ray has been sent the report of its step or a later
    one. So a trial stopped at a report ends its recorded curve at the report the decision saw;
    what it trained past that (at most one report's worth, computed while the report waited) is
    never recorded. Without it, the sinks get every point at once.
    """

    def __init__(self, api: Any, *, sinks: list[Any], writes_checkpoints: bool, identity: dict[str, Any] | None = None,
                 hold_past_ray: bool = False) -> None:
        self.api = api  # the module `ray.train` or `ray.tune`
        self.sinks = sinks
        self.writes_checkpoints = writes_checkpoints
        self._last: dict[str, float] = {}
        self._pending: dict[str, float] | None = None
        self.identity = identity
        self._announced = False
        self.hold_past_ray = hold_past_ray
        self._held: list[tuple[dict[str, float], int]] = []
        """Points not yet in the sinks (`hold_past_ray`): steps past the last report sent to Ray."""

    def report(self, metrics: Mapping[str, float], *, step: int) -> None:
        clean = check_metrics(metrics)
        self._last = {**self._last, **clean, "step": float(step)}
        if "progress" in clean:
            self._last["progress_pct"] = 100.0 * clean["progress"]  # ASHA/median rungs in percent
        if self.hold_past_ray:
            self._held.append((clean, int(step)))
        else:
            for sink in self.sinks:
                sink.log_metrics(clean, int(step))
        if forward_to_ray(clean):
            self.flush()
            self._pending = dict(self._last)

    def _release(self, upto: float) -> None:
        """Hand the sinks the held points of steps up to `upto` (inf: all of them)."""
        keep = []
        for metrics, step in self._held:
            if step <= upto:
                for sink in self.sinks:
                    sink.log_metrics(metrics, step)
            else:
                keep.append((metrics, step))
        self._held = keep

    def flush(self) -> None:
        """Send a held report to Ray (without a checkpoint). The sinks get its step's points first,
        so that what a scheduler decides on is recorded; with no report waiting, they get them all."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._release(pending["step"])
            self.api.report(pending)
        else:
            self._release(math.inf)

    def save(self, state: dict[str, Any], *, shards: Callable[[Path], None] | None = None) -> None:
        """Report `state` as a checkpoint. `shards(folder)`, when given, runs on every rank and
        writes that rank's part of a sharded state into the folder it reports; Ray merges the
        ranks' folders into one checkpoint."""
        if self._pending is not None and self._pending.get("step") != float(state["step"]):
            self.flush()
        metrics = {**(self._pending or self._last), "step": float(state["step"])}
        self._pending = None
        self._release(float(state["step"]))
        for sink in self.sinks:  # the checkpoint's points recorded before it exists (a resume skips them)
            sink.flush()
        if not self.writes_checkpoints and shards is None:
            self.api.report(metrics)  # ranks other than 0 still meet the barrier
            return
        with tempfile.TemporaryDirectory(prefix="ladder-ckpt-") as tmp:
            if shards is not None:
                shards(Path(tmp))
            if self.writes_checkpoints:
                checkpoints.write_checkpoint(tmp, state, keep=1, identity=self.identity)
            self.api.report(metrics, checkpoint=self.api.Checkpoint.from_directory(tmp))

    def restore(self, *, shards: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """The latest checkpoint's state; `shards(folder, state)`, when given, loads the sharded
        part saved with it while the folder is at hand and returns this rank's state."""
        ckpt = self.api.get_checkpoint()
        if ckpt is None:
            return None
        with ckpt.as_directory() as folder:
            state = checkpoints.load_latest(folder, self.identity)
            if state is not None and shards is not None:
                state = shards(Path(folder), state)
        if state is not None and self.writes_checkpoints and not self._announced:
            self._announced = True
            print(f"ladder: restored from the checkpoint of step {int(state['step'])}", file=sys.stderr, flush=True)
        return state


class RayTrainRun:
    def __init__(self, *, sinks: list[Any], zero: ZeroSpec | None = None, identity: dict[str, Any] | None = None,
                 cpus_per_worker: float = 0) -> None:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.device = ray.train.torch.get_device()
        self.sinks = sinks if self.rank == 0 else []
        self._ray = RayReports(ray.train, sinks=self.sinks, writes_checkpoints=self.rank == 0, identity=identity)
        self.report, self.flush = self._ray.report, self._ray.flush
        self.zero = zero or ZeroSpec()
        self.engine: Any = None  # the DeepSpeed engine, once prepare built one
        if cpus_per_worker:  # a caller without a TrialSpec (whose `threads` otherwise sets this)
            # Ray caps OMP threads of an actor at its CPU reservation; torch must agree or a
            # 2-CPU worker trains on one thread.
            import torch

            torch.set_num_threads(max(1, int(cpus_per_worker)))

    def save(self, state: dict[str, Any]) -> None:
        if self.engine is None:
            return self._ray.save(state)

        def shards(folder: Path) -> None:
            zero_engine.save_engine(self.engine, folder, int(state["step"]))
            if self.rank > 0:
                # Without model and optimizer the state is small, and each rank's is its own (its
                # data position): every rank keeps it, so all of them resume where they were.
                checkpoints.write_checkpoint(folder / f"rank-{self.rank}", state, keep=1)

        self._ray.save(state, shards=shards)

    def restore(self) -> dict[str, Any] | None:
        if not self.zero.enabled:
            state = self._ray.restore()
        elif self.engine is None:
            raise RuntimeError("zero_stage > 0: call run.prepare(model, optimizer) before run.restore(), so that "
                               "the DeepSpeed engine exists to load the sharded state into")
        else:
            def shards(folder: Path, state: dict[str, Any]) -> dict[str, Any]:
                zero_engine.load_engine(self.engine, folder, int(state["step"]))
                own = folder / f"rank-{self.rank}"
                return (checkpoints.load_latest(own) or state) if self.rank > 0 and own.is_dir() else state

            state = self._ray.restore(shards=shards)
        if state is not None:
            # On record: a restarted worker group continued from this step, not from the start.
            for sink in self.sinks:
                if hasattr(sink, "set_tags"):
                    sink.set_tags({"ladder.restored_step": str(int(state["step"]))})
        return state

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        if self.zero.enabled:
            self.engine, optimizer = zero_engine.build_engine(model, optimizer, self.zero, self.device)
            return self.engine, optimizer
        if self.world_size > 1:
            import ray.train.torch

            return ray.train.torch.prepare_model(model), optimizer
        return model.to(self.device), optimizer

    def log_artifact(self, path: str | os.PathLike) -> None:
        for sink in self.sinks:
            sink.log_artifact(str(path))


def _backend() -> str:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"


def _quiet_train_reports() -> None:
    """Ray Train logs each report of each worker at INFO ("Reporting training result N:
    TrainingReport(...)"), under a logger named by its file's path: warnings only."""
    import logging

    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray layout: its lines show, nothing else changes
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def worker_entry(loop_config: dict[str, Any]) -> dict[str, float]:
    """`train_loop_per_worker` for TorchTrainer: run the trial of `loop_config["spec"]` on this
    worker (`trial.run_trial`); rank 0 reports to the sinks, the others only to Ray."""
    import ray.train

    from orchestrator.runners.trial import run_trial

    spec = loop_config["spec"]
    if not loop_config.get("verbose"):
        _quiet_train_reports()
    ctx = ray.train.get_context()
    # Recorded from inside the worker group: what ran, not what was asked for.
    tags = {"ladder.world_size": str(ctx.get_world_size()), "ladder.backend": _backend()}
    spec = replace(spec, tags={**spec.tags, **tags})
    final, _ = run_trial(spec, lambda sinks, cfg: RayTrainRun(sinks=sinks, zero=zero_engine.spec_of(cfg),
                                                              identity=spec.identity),
                         with_sinks=ctx.get_world_rank() == 0)
    return final  # rank 0's becomes Result.return_value


def trainer(spec: Any, *, workers: int, cpus_per_worker: float, name: str, storage: str, gpus_per_worker: float = 0,
            max_failures: int = 0, callbacks: list[Any] | None = None, verbose: bool = False,
            entry: Callable[[dict[str, Any]], Any] = worker_entry) -> Any:
    """The TorchTrainer that runs `spec` (a `trial.TrialSpec`) on `workers` workers: gloo on CPU,
    NCCL between GPU workers. Its run `name` under `storage` is deterministic, so fitting the same
    name again resumes from its checkpoints. `entry` is what each worker runs, given
    `{"spec", "verbose"}`: `worker_entry`, or a check's own loop (`ladder check --ray`)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        entry,
        train_loop_config={"spec": replace(spec, threads=max(1, int(cpus_per_worker))), "verbose": verbose},
        torch_config=TorchConfig(backend="nccl" if gpus_per_worker else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers,
            use_gpu=bool(gpus_per_worker),
            resources_per_worker={"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})},
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage,
            callbacks=callbacks or [],
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
        ),
    )
