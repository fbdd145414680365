"""The Ray Train `Run`: the same `train(cfg, run)` inside a `TorchTrainer` worker (Train V2).

Every worker calls `train`; `report` and `save` go through `ray.train.report`, which is a
barrier, so workloads call them at the same steps on every rank (they do: steps are global).
Rank 0 alone writes to MLflow, prints progress and writes checkpoint files; Ray Train copies the
checkpoint folder into the run's storage and hands it back through `ray.train.get_checkpoint()`
when a failed worker group restarts or the same run name is fitted again.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Mapping

import torch

from orchestrator import checkpoints
from orchestrator.run import check_metrics


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
    """

    def __init__(self, api: Any, *, sinks: list[Any], writes_checkpoints: bool, identity: dict[str, Any] | None = None) -> None:
        self.api = api  # the module `ray.train` or `ray.tune`
        self.sinks = sinks
        self.writes_checkpoints = writes_checkpoints
        self._last: dict[str, float] = {}
        self._pending: dict[str, float] | None = None
        self.identity = identity
        self._announced = False

    def report(self, metrics: Mapping[str, float], *, step: int) -> None:
        clean = check_metrics(metrics)
        self._last = {**self._last, **clean, "step": float(step)}
        if "progress" in clean:
            self._last["progress_pct"] = 100.0 * clean["progress"]  # ASHA/median rungs in percent
        for sink in self.sinks:
            sink.log_metrics(clean, int(step))
        if forward_to_ray(clean):
            self.flush()
            self._pending = dict(self._last)

    def flush(self) -> None:
        """Send a held report to Ray (without a checkpoint)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.api.report(pending)

    def save(self, state: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.flush()
        if self._pending is not None and self._pending.get("step") != float(state["step"]):
            self.flush()
        metrics = {**(self._pending or self._last), "step": float(state["step"])}
        self._pending = None
        if not self.writes_checkpoints:
            self.api.report(metrics)  # ranks other than 0 still meet the barrier
            return
        with tempfile.TemporaryDirectory(prefix="ladder-ckpt-") as tmp:
            checkpoints.write_checkpoint(tmp, state, keep=1, identity=self.identity)
            self.api.report(metrics, checkpoint=self.api.Checkpoint.from_directory(tmp))

    def restore(self) -> dict[str, Any] | None:
        ckpt = self.api.get_checkpoint()
        if ckpt is None:
            return None
        with ckpt.as_directory() as folder:
            state = checkpoints.load_latest(folder, self.identity)
        if state is not None and self.writes_checkpoints and not self._announced:
            self._announced = True
            print(f"ladder: restored from the checkpoint of step {int(state['step'])}", file=sys.stderr, flush=True)
        return state


class RayTrainRun:
    def __init__(self, *, sinks: list[Any], cpus_per_worker: float, identity: dict[str, Any] | None = None) -> None:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.device = ray.train.torch.get_device()
        self.sinks = sinks if self.rank == 0 else []
        self._ray = RayReports(ray.train, sinks=self.sinks, writes_checkpoints=self.rank == 0, identity=identity)
        self.report, self.flush, self.save, self.restore = (
            self._ray.report, self._ray.flush, self._ray.save, self._ray.restore)
        # Ray caps OMP threads of an actor at its CPU reservation; torch must agree or a
        # 2-CPU worker trains on one thread.
        torch.set_num_threads(max(1, int(cpus_per_worker)))

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
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


def worker_entry(loop_config: dict[str, Any]) -> dict[str, float]:
    """`train_loop_per_worker` for TorchTrainer: rebuild the config, wire the sinks, train."""
    import ray.train

    from orchestrator import registry
    from orchestrator.config import from_dict

    workload = registry.load(loop_config["workload"])
    cfg = from_dict(workload.Config, loop_config["config"])
    sinks: list[Any] = []
    if ray.train.get_context().get_world_rank() == 0:
        from orchestrator.console import ProgressSink
        from orchestrator.tracking import MlflowSink

        if loop_config.get("mlflow_run_id"):
            from orchestrator.tracking import last_recorded_step

            run_id, uri = loop_config["mlflow_run_id"], loop_config["tracking_uri"]
            sink = MlflowSink(run_id, uri, skip_through=last_recorded_step(run_id, uri),
                              outbox_dir=loop_config.get("outbox_dir"))
            # Recorded from inside the worker group: what ran, not what was asked for.
            ctx = ray.train.get_context()
            sink.set_tags({"ladder.world_size": str(ctx.get_world_size()), "ladder.backend": _backend()})
            sinks.append(sink)
        if loop_config.get("progress", True):
            sinks.append(ProgressSink(loop_config["workload"]))
    from orchestrator.checkpoints import identity

    run = RayTrainRun(sinks=sinks, cpus_per_worker=loop_config["cpus_per_worker"],
                      identity=identity(loop_config["workload"], loop_config["config"]))
    final = workload.train(cfg, run)
    run.flush()
    for sink in run.sinks:
        sink.flush()
    return {k: float(v) for k, v in final.items()}  # rank 0's becomes Result.return_value
