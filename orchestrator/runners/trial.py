"""One trial, run one way: the spec of a trial and the function that runs it.

Every place that trains a workload builds its `Run` and hands a `TrialSpec` to `run_trial`:
`ladder run` in this process (`launch.run_local`), each Ray Train worker (`ray_train.worker_entry`,
for `ladder run --workers N` and for multi-worker Tune trials), each single-worker Tune trial
(`tune_run.trial_main`) and each trial of a local reproduction (`reproduce`). `run_trial` does the
rest the same way everywhere: the config rebuilt from the spec, torch's CPU threads, the sinks
(MLflow, console progress, wandb), the workload's `train`, the flushes, the final metrics
recorded and the tracking run ended with its status. The spec is frozen and pickles to Ray's
workers as it is.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from orchestrator.runners import registry
from orchestrator.run import checkpoints
from orchestrator.tracking import sink as tracking
from orchestrator.runners.config import flatten, from_dict, redacted, to_dict, to_json

STATUS_FINISHED, STATUS_FAILED, STATUS_KILLED = "FINISHED", "FAILED", "KILLED"


@dataclass(frozen=True)
class TrialSpec:
    """Everything a process needs to run one trial of a workload, and nothing it must look up."""

    workload: str
    """A name `registry.load` accepts: built-in, plugin or module path."""
    config: Mapping[str, Any]
    """The workload's Config as `config.to_dict` gives it."""
    run_id: str | None = None
    """The MLflow run the trial reports into (opened by the caller); None: not tracked."""
    tracking_uri: str | None = None
    skip_recorded: bool = False
    """Steps the run already recorded are not sent again: a resumed run, a restarted trial or worker group."""
    outbox_dir: str | None = None
    """Where metrics wait while the tracking server cannot be reached (`outbox`)."""
    spool: bool = False
    """Metrics go through the outbox first (trials of a sweep, whose driver sends what is left)."""
    progress: str | None = None
    """The console progress line's label; None: no progress line."""
    wandb: Mapping[str, Any] | None = None
    """`{"project", "name", "group"}` of a Weights & Biases run to log to as well."""
    threads: int = 0
    """torch's CPU threads while training, unless the Config's own `threads` field sets them (0:
    leave torch's setting)."""
    record_final: bool = True
    """Record what `train` returned as the run's final metrics."""
    end_run: bool = True
    """End the MLflow run with the trial's status here (False where the caller ends it)."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """Tags the trial sets on its run when it starts."""

    @classmethod
    def of(cls, workload: str, cfg: Any, **fields: Any) -> TrialSpec:
        return cls(workload=workload, config=to_dict(cfg), **fields)

    @property
    def identity(self) -> dict[str, Any]:
        """What the trial's checkpoints belong to (`checkpoints.identity`)."""
        return checkpoints.identity(self.workload, dict(self.config))

    def load(self) -> tuple[registry.Workload, Any]:
        """The workload module and the Config, rebuilt (and checked) from the spec."""
        workload = registry.load(self.workload)
        return workload, from_dict(workload.Config, dict(self.config))


def trial_tags(trial_id: str, sweep_id: str, params: Mapping[str, Any]) -> dict[str, str]:
    """The tags that make a run one trial of one sweep (found again by them when the trial restarts)."""
    return {"ladder.trial_id": trial_id, "ladder.sweep_id": sweep_id,
            "ladder.trial_params": json.dumps(redacted(dict(params)), default=str)}


def open_run(workload: str, cfg: Any, *, experiment: str, run_name: str, uri: str | None,
             tags: Mapping[str, str] | None = None, parent_run_id: str | None = None) -> str:
    """A trial's MLflow run, opened the same way by every driver: the workload, its paper and
    where its code comes from (`workload_provenance`) as tags (with the driver's own `tags`), the
    flattened config as params and `config.json` as an artifact; a child of `parent_run_id` when
    given. Returns the run id for the TrialSpec."""
    run_id = tracking.start_run(
        experiment, run_name=run_name, uri=uri, parent_run_id=parent_run_id, params=flatten(cfg),
        tags={"workload": workload, "paper": registry.paper_title(workload), **workload_provenance(workload),
              **(tags or {})},
    )
    tracking.log_text(run_id, to_json(cfg), "config.json", uri=uri)
    return run_id


def workload_provenance(workload: str) -> dict[str, str]:
    """The tags that say which code of `workload` a run ran: its source path and, in a git
    checkout, that checkout's commit ('-dirty' when the files differ from it) and the path in it
    (`tracking.source_provenance`). Recorded for every workload, built-in ones too: one query
    answers for all runs, and a built-in workload's '-dirty' says what ladder's own `git.commit`
    does not. Empty when the source cannot be found."""
    source = registry.source_path(workload)
    return tracking.source_provenance(source) if source else {}


def open_sweep_run(name: str, workload: str, base: Any, *, kind: str, uri: str | None,
                   tags: Mapping[str, str] | None = None, params: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The parent MLflow run of one invocation of sweep `name` (a Tune sweep or a local
    reproduction), opened the same way by both: the workload, its paper, where its code comes from
    (`workload_provenance`) and `ladder.kind` as tags, the base config as `base.*` params. Returns
    (sweep_id, run_id); the trials' runs are its children, tagged with the sweep_id (`trial_tags`)."""
    sweep_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_id = tracking.start_run(
        name, run_name=sweep_id, uri=uri,
        tags={"workload": workload, "paper": registry.paper_title(workload), "ladder.kind": kind,
              **workload_provenance(workload), **(tags or {})},
        params={**(params or {}), **{f"base.{k}": v for k, v in flatten(base).items()}},
    )
    return sweep_id, run_id


def finish_run(run_id: str | None, status: str, *, uri: str | None, outbox_dir: str | None = None,
               tags: Mapping[str, str] | None = None) -> None:
    """End `run_id` with `status` (FINISHED, FAILED or KILLED; a KILLED run is also tagged
    `ladder.interrupted`), after setting `tags`. Every driver ends its runs here; None: not tracked."""
    if not run_id:
        return
    tags = {**(tags or {}), **({"ladder.interrupted": "true"} if status == STATUS_KILLED else {})}
    if tags:
        try:
            tracking.set_tags(run_id, tags, uri=uri)
        except Exception as exc:  # the status matters more than the tags; never raised over the outcome
            tracking.warn(f"could not tag run {run_id} ({type(exc).__name__}: {exc})")
    tracking.end_run(run_id, status, uri=uri, outbox_dir=outbox_dir)


@contextmanager
def ending_run(run_id: str | None, *, uri: str | None, outbox_dir: str | None = None) -> Iterator[None]:
    """End `run_id` with the outcome of the block (`finish_run`): FINISHED when it returns, KILLED
    on Ctrl-C, FAILED on any other exception; the exception propagates."""
    status = STATUS_FAILED
    try:
        yield
        status = STATUS_FINISHED
    except KeyboardInterrupt:
        status = STATUS_KILLED
        raise
    finally:
        finish_run(run_id, status, uri=uri, outbox_dir=outbox_dir)


def sinks_for(spec: TrialSpec, cfg: Any) -> list[Any]:
    """The trial's sinks: its MLflow run (with the spec's tags set), the console progress line, wandb."""
    sinks: list[Any] = []
    if spec.run_id:
        skip = tracking.last_recorded_step(spec.run_id, spec.tracking_uri) if spec.skip_recorded else None
        sink = tracking.MlflowSink(spec.run_id, spec.tracking_uri, skip_through=skip, outbox_dir=spec.outbox_dir,
                                   spool=spec.spool)
        if spec.tags:
            sink.set_tags(dict(spec.tags))
        sinks.append(sink)
    if spec.progress:
        from orchestrator.runners.console import ProgressSink

        sinks.append(ProgressSink(spec.progress))
    if spec.wandb:
        w = spec.wandb
        sinks.append(tracking.WandbSink(w["project"], w["name"], flatten(cfg), group=w.get("group")))
    return sinks


def flush_quietly(sinks: list[Any]) -> None:
    """Flush every sink; a failure is reported, never raised over the trial's own outcome (the
    outbox keeps the points for the driver or `ladder sync`)."""
    for sink in sinks:
        try:
            sink.flush()
        except Exception as exc:
            tracking.warn(f"could not flush the trial's metrics ({type(exc).__name__}: {exc}); "
                          "they wait in the outbox for the sweep's driver or `ladder sync`")


def run_trial(spec: TrialSpec, make_run: Callable[[list[Any], Any], Any], *, with_sinks: bool = True,
              loaded: tuple[registry.Workload, Any] | None = None) -> tuple[dict[str, float], Any]:
    """Run one trial: `make_run(sinks, cfg)` builds the `Run` for where it trains (`with_sinks`
    False: a Ray Train worker of rank > 0, which reports nowhere itself). `loaded`: the workload and
    the Config the caller already holds in this process (a local run), instead of rebuilding them
    from the spec. The config is validated here, where the trial runs (with the Run's world size).
    Returns the final metrics and the Run. On an exception (or Ctrl-C, recorded KILLED) the run is
    ended FAILED and it propagates. Only the process that owns the sinks (`with_sinks`) records the
    final metrics and ends the run."""
    from orchestrator.run import pinned_threads

    owner = with_sinks  # a Ray Train worker of rank > 0 records nothing and ends nothing
    sinks: list[Any] = []
    status = STATUS_FAILED
    try:
        # Inside the try: a config, sink or Run that cannot be built ends the trial's run FAILED too.
        workload, cfg = loaded if loaded is not None else spec.load()
        if with_sinks:
            sinks = sinks_for(spec, cfg)
        run = make_run(sinks, cfg)
        for sink in sinks:  # where it trains, on its MLflow run
            if hasattr(sink, "set_tags"):
                from orchestrator.run import devices

                sink.set_tags(devices.tags(run.device))
        # MAX_WORKERS and ZeRO's precision, enforced where the trial runs
        workload.validate(cfg, world_size=run.world_size, gpus=getattr(run.device, "type", "cpu") == "cuda")
        # The workload's own `threads` field wins over the runner's choice (its CPU reservation).
        with pinned_threads(workload.threads(cfg) or spec.threads):
            final = {k: float(v) for k, v in workload.train(cfg, run).items()}
        if owner and spec.run_id and spec.record_final:
            # Before the last report reaches Ray: a scheduler may stop a Tune trial right there.
            tracking.set_final(spec.run_id, final, uri=spec.tracking_uri, outbox_dir=spec.outbox_dir)
        if hasattr(run, "flush"):
            run.flush()
        status = STATUS_FINISHED
    except KeyboardInterrupt:
        status = STATUS_KILLED
        raise
    finally:
        # Also when the loop raised, or Tune stopped the trial (SystemExit in its report).
        flush_quietly(sinks)
        tracking.finish_quietly(sinks)
        if owner and spec.end_run:
            finish_run(spec.run_id, status, uri=spec.tracking_uri, outbox_dir=spec.outbox_dir)
    return final, run
