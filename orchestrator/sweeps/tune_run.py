"""Running a `Sweep` on Ray Tune: one Tune trial per parameter set, one MLflow child run per trial.

A trial of one worker runs `train(cfg, run)` inside the Tune trial with `TuneRun`; a trial of
several workers is the Train driver that current Ray prescribes: the trial function builds a
`TorchTrainer` and fits it, and `TuneReportCallback` forwards rank 0's reports to Tune. Either
way the trial's MLflow child run hangs under one parent run per sweep invocation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from orchestrator.tracking import outbox, sink as tracking
from orchestrator.runners import zero
from orchestrator.runners.config import apply_overrides, to_dict
from orchestrator.runners.console import environ, quiet_tune, stop_reason
from orchestrator.runners.ray_train import RayReports
from orchestrator.sweep import MODEL_BASED_CONCURRENCY, Sweep, SweepError
from orchestrator.sweeps.summary import log_sweep_summary
from orchestrator.runners.trial import (STATUS_FINISHED, STATUS_KILLED, TrialSpec, ending_run, finish_run, open_run,
                                        open_sweep_run, run_trial, trial_tags)

SWEEPS_DIR = "ladder-runs/sweeps"
RUNS_DIR_ENV = "LADDER_RUNS_DIR"
"""Where sweeps keep their state and checkpoints instead of ./ladder-runs: on a cluster of several
nodes, a folder every node mounts (Ray Train and Tune write checkpoints from the node that trained)."""


@dataclass(frozen=True)
class SweepSpec:
    """What every trial of one sweep invocation needs, and nothing it must look up: handed to each
    Tune trial (`trial_main`) and to the driver's bookkeeping."""

    sweep: str
    """The sweep's name, which is also its MLflow experiment."""
    sweep_id: str
    """This invocation: `<sweep>-<stamp>`, the `ladder.sweep_id` tag of its runs."""
    workload: str
    base: Mapping[str, Any]
    """The base Config (`config.to_dict`) the trials' params override."""
    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    in_trial: bool
    """The trial trains in its own process (`TuneRun`); False: it drives a Ray Train worker group."""
    parent_run_id: str | None
    tracking_uri: str | None
    storage: str
    """Where multi-worker trials keep their Ray Train runs."""
    outbox_dir: str | None
    wandb: bool = False
    verbose: bool = False


class TuneRun:
    """`Run` inside a single-worker Tune trial: reports to MLflow and Tune, checkpoints via Tune."""

    def __init__(self, *, sinks: list[Any], identity: dict[str, Any] | None = None) -> None:
        import ray.tune
        import torch

        self.device = torch.device("cpu")
        self.rank = 0
        self.world_size = 1
        self.sinks = sinks
        self._ray = RayReports(ray.tune, sinks=sinks, writes_checkpoints=True, identity=identity,
                               hold_past_ray=True)
        self.report, self.flush, self.save, self.restore = (
            self._ray.report, self._ray.flush, self._ray.save, self._ray.restore)

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        return model.to(self.device), optimizer

    def log_artifact(self, path: str | os.PathLike) -> None:
        for sink in self.sinks:
            sink.log_artifact(str(path))


def _child_run(spec: SweepSpec, trial_id: str, cfg: Any, params: Mapping[str, Any]) -> tuple[str | None, dict | None]:
    """The trial's MLflow child run, reused when the trial restarts, and its final metrics when
    it had already finished (a driver killed before Tune recorded the trial as done)."""
    if not spec.parent_run_id:
        return None, None
    uri = spec.tracking_uri
    c = tracking.client(uri)
    exp = c.get_experiment_by_name(spec.sweep)
    found = c.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`ladder.trial_id` = '{trial_id}' and tags.`ladder.sweep_id` = '{spec.sweep_id}'",
        max_results=1,
    )
    if found:
        run = found[0]
        if run.info.status == "FINISHED" and tracking.FINAL_TAG in run.data.tags:
            return run.info.run_id, tracking.get_final(run, uri)
        c.update_run(run.info.run_id, status="RUNNING")
        return run.info.run_id, None
    run_id = open_run(spec.workload, cfg, experiment=spec.sweep, run_name=f"{spec.sweep}-{trial_id}",
                      uri=uri, parent_run_id=spec.parent_run_id, tags=trial_tags(trial_id, spec.sweep_id, params))
    return run_id, None


def quiet_exit(hook: Any) -> Any:
    """`sys.unraisablehook` that drops a SystemExit and passes anything else to `hook`. Ray's SIGTERM
    handler raises SystemExit in a trial being stopped (Ctrl-C on the sweep); when the signal lands in a
    finalizer (a weakref callback), Python cannot raise it and prints it as "Exception ignored in ...",
    with a traceback, into the sweep's console: the process is ending, which is no error."""

    def unraisable(args: Any) -> None:
        if isinstance(args.exc_value, SystemExit):
            return
        hook(args)

    unraisable.ladder_quiet_exit = True  # type: ignore[attr-defined]
    return unraisable


def trial_main(config: dict[str, Any], sweep: SweepSpec) -> None:
    """The Tune function trainable."""
    import logging

    import ray.tune

    if not getattr(sys.unraisablehook, "ladder_quiet_exit", False):  # a reused trial actor has it already
        sys.unraisablehook = quiet_exit(sys.unraisablehook)

    # One line per checkpoint per trial drowns the sweep's own console in a large sweep.
    logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)

    from orchestrator.runners import registry
    from orchestrator.runners.config import from_dict

    workload = registry.load(sweep.workload)
    base = from_dict(workload.Config, sweep.base)
    params = config["params"]
    cfg = apply_overrides(base, params)
    # A proposal that a resumed model-based search hands out again is the trial it was before.
    trial_id = config.get("trial_of") or ray.tune.get_context().get_trial_id()
    run_id, finished = _child_run(sweep, trial_id, cfg, params)
    uri = sweep.tracking_uri
    if finished is not None:
        ray.tune.report({**finished, "progress": 1.0, "progress_pct": 100.0})  # done before: not trained again
        return
    if run_id:
        # The node this trial's process runs on (a multi-worker trial's workers may be elsewhere).
        ctx = ray.get_runtime_context()
        tracking.set_tags(run_id, {"ladder.node_id": ctx.get_node_id(), "ladder.node_ip": ray.util.get_node_ip_address()},
                          uri=uri)
        exploits = (config.get("pbt") or {}).get("exploits")
        if exploits:  # the run's params are those it started with; PBT changed them since
            tracking.set_tags(run_id, {"ladder.pbt.exploits": _last_fitting(exploits)}, uri=uri)
    spec = TrialSpec.of(sweep.workload, cfg, run_id=run_id, tracking_uri=uri, skip_recorded=True,
                        outbox_dir=sweep.outbox_dir, spool=True,
                        wandb={"project": f"ladder-{sweep.sweep}", "name": f"{sweep.sweep}-{trial_id}",
                               "group": sweep.sweep_id} if sweep.wandb else None)
    if sweep.in_trial:
        run_trial(replace(spec, threads=max(1, int(sweep.cpus_per_worker))),
                  lambda sinks, _: _restoring_run(sinks, _trial_identity(spec, config)), loaded=(workload, cfg))
        return
    # Several workers: a Ray Train run inside the trial, whose workers report into the trial's
    # MLflow run; this process records the final metrics and ends the run.
    with ending_run(run_id, uri=uri, outbox_dir=sweep.outbox_dir):
        final = _fit_train(sweep, replace(spec, record_final=False, end_run=False), trial_id)
        if run_id:
            tracking.set_final(run_id, final, uri=uri, outbox_dir=sweep.outbox_dir)


def _trial_identity(spec: TrialSpec, config: Mapping[str, Any]) -> dict[str, Any]:
    """What the trial's checkpoints belong to. Under PBT, without the fields PBT mutates: a trial
    that exploits another continues that trial's checkpoint with changed hyperparameters (the
    rest of the config is the other trial's, which PBT copied)."""
    from orchestrator.run import checkpoints

    mutable = set((config.get("pbt") or {}).get("mutable", ()))
    if not mutable:
        return spec.identity
    return checkpoints.identity(spec.workload, {k: v for k, v in spec.config.items() if k not in mutable})


def _restoring_run(sinks: list[Any], identity: dict[str, Any]) -> TuneRun:
    """A TuneRun that tags its MLflow run `ladder.restored_step` when it restores (a trial that
    Tune paused and resumed, or that PBT moved onto another trial's checkpoint), as a Ray Train
    run does: the run's curve continues from that step."""
    run = TuneRun(sinks=sinks, identity=identity)
    restore = run.restore

    def restore_and_record() -> dict[str, Any] | None:
        state = restore()
        if state is not None:
            for sink in sinks:
                if hasattr(sink, "set_tags"):
                    sink.set_tags({"ladder.restored_step": str(int(state["step"]))})
        return state

    run.restore = restore_and_record
    return run


def _last_fitting(items: list[Any], limit: int = 5000) -> str:
    """`items` as JSON, the oldest left out until it fits in an MLflow tag."""
    for start in range(len(items)):
        text = json.dumps(items[start:], default=str)
        if len(text) <= limit:
            return text
    return "[]"


STOP_GRACE_S = 10.0
"""Seconds a trial that Tune stops may take to finish its own `finally` (flush its metrics, end its
MLflow and wandb runs) before its process goes."""


def _graceful(fn: Any) -> Any:
    """The function trainable `fn` as Tune's class, whose cleanup lets the trial's thread finish.

    Tune stops a function trainable by waking its training thread inside `report` (which then
    raises SystemExit) and ends the process without waiting for it: a trial stopped when no other
    trial waits for its process (the last ones of a sweep) lost the end of its curve and its wandb
    run. Tune keeps the name, so sweeps started before still resume."""
    from ray.tune.trainable.function_trainable import wrap_function

    base = wrap_function(fn)

    class Graceful(base):  # type: ignore[misc, valid-type]
        def cleanup(self) -> None:
            try:
                from ray.train._internal.session import get_session

                session = get_session()
                if session is not None and session.training_started:
                    session.finish(timeout=STOP_GRACE_S)
            except BaseException:  # what training raised is Tune's to report, in its own cleanup
                pass
            super().cleanup()

    return Graceful


def _fit_train(sweep: SweepSpec, spec: TrialSpec, trial_id: str) -> dict[str, float]:
    from ray.tune.integration.ray_train import TuneReportCallback

    from orchestrator.runners.ray_train import trainer

    # A deterministic name makes a Tune-level retry resume this Train run.
    fit = trainer(spec, workers=sweep.workers, cpus_per_worker=sweep.cpus_per_worker,
                  gpus_per_worker=sweep.gpus_per_worker or 0, name=f"train-{trial_id}", storage=sweep.storage,
                  callbacks=[TuneReportCallback()], verbose=sweep.verbose).fit()
    return dict(fit.return_value or {})


@dataclass
class SweepResult:
    """One sweep invocation's outcome. Each of `trials` holds its `trial_id`, `params`, `config`
    (the whole Config as a dict), `final` (the metrics `train` returned; None when it did not
    finish or nothing was tracked), `progress` and `objective` (its last report), `state`
    (finished, stopped, diverged, failed, interrupted), `stopped`, `diverged`, `predicted`,
    `error` and `why`."""

    name: str
    sweep_id: str
    parent_run_id: str | None
    tracking_uri: str | None
    trials: list[dict[str, Any]]
    wall_s: float
    storage: Path
    metric: str = "objective"
    mode: str = "min"


class SweepInterrupted(Exception):
    """A sweep stopped by SIGINT or SIGTERM before its trials ended. Its parent run and every
    unfinished trial's run are KILLED (tagged `ladder.interrupted`), its state is kept for
    `ladder sweep FILE --resume`, and `result` holds what had been recorded (None when the
    interruption came before Tune had any trial to show)."""

    def __init__(self, name: str, signum: int, result: SweepResult | None = None):
        self.name, self.signum, self.result = name, signum, result
        super().__init__(f"sweep {name!r} interrupted by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process the signal ended: 130, 143


@contextlib.contextmanager
def _sigterm_as_sigint(received: list[int]) -> Iterator[None]:
    """Within it, SIGTERM does what SIGINT does (Tune's handler: stop the trials, save the
    experiment for a resume), and every signal seen is appended to `received`. Outside the main
    thread (where Python cannot set handlers) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        received.append(signum)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


class _TuneInterruptHints(logging.Filter):
    """Drops Tune's own interruption lines (its Tuner.restore hint, 'Trials did not complete'):
    ladder says what was interrupted and how to resume with `ladder sweep --resume`."""

    DROPPED = ("Experiment has been interrupted", "Trials did not complete", "Stop signal received")

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False
        """Tune's SIGINT handler ran (it logs 'Stop signal received'): the fit was interrupted."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("Stop signal received"):
            self.stopped = True
        return not message.startswith(self.DROPPED)


def runs_root() -> Path:
    """`$LADDER_RUNS_DIR` when set, else ./ladder-runs."""
    env = os.environ.get(RUNS_DIR_ENV)
    return Path(env).expanduser().resolve() if env else Path(os.getcwd()).resolve() / "ladder-runs"


def sweep_storage(sweep: Sweep) -> Path:
    return runs_root() / "sweeps"


def in_ray_job() -> bool:
    """True in the entrypoint of a `ray job submit` (the job supervisor sets this variable)."""
    return bool(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"))


def check_job_environment() -> None:
    """A job's working directory is a temporary copy that Ray deletes (and may unpack again under
    a running sweep): the defaults ./ladder-runs and ./mlruns.db would land there. Refuse them."""
    if not in_ray_job():
        return
    missing = [name for name in (RUNS_DIR_ENV, "MLFLOW_TRACKING_URI") if not os.environ.get(name)]
    if missing:
        raise SweepError(
            f"this sweep runs as a Ray job, whose working directory is temporary: set {' and '.join(missing)} in the "
            "job's environment, e.g. --runtime-env-json '{\"env_vars\": {\"LADDER_RUNS_DIR\": \"/mnt/shared/ladder-runs\", "
            "\"MLFLOW_TRACKING_URI\": \"http://mlflow:5000\"}}' (LADDER_RUNS_DIR: a folder every node mounts; see docs/cluster.md)"
        )


def local_gpus() -> float:
    """GPUs a local Ray started here would have."""
    from orchestrator.run import devices

    return float(devices.cuda_count())


def gpus_for(sweep: Sweep) -> float:
    """This machine's GPUs as far as `sweep` needs them: counting them imports torch (seconds of a
    driver's start-up), which a sweep that asks for none never pays."""
    return local_gpus() if sweep.gpus_per_worker else 0.0


def cluster_capacity() -> tuple[dict[str, float], str]:
    """The most the connected Ray cluster can offer, and where that number comes from: the
    autoscaler's maximum (every node group at its max count) when Ray publishes one, else what
    the nodes up now have. Ray Train runs the same check against the same source."""
    import ray

    try:
        from ray._private.state import state

        most = state.get_max_resources_from_cluster_config()
    except Exception:  # a private API: a Ray without it has no published maximum
        most = None
    if most:
        return {k: float(v) for k, v in most.items()}, "the Ray cluster at its autoscaling maximum"
    return {k: float(v) for k, v in ray.cluster_resources().items()}, "the Ray cluster at RAY_ADDRESS"


def resolve_concurrency(sweep: Sweep, cpus: float, gpus: float = 0.0, *, where: str = "the cluster") -> int:
    """Trials at once that `cpus` and `gpus` hold, at most the sweep's `max_concurrent` (a
    model-based search's default: `MODEL_BASED_CONCURRENCY`); SweepError naming the fix when
    not even one fits."""
    need = sweep.trial_resources()
    fit = int(cpus // need["CPU"])
    if fit < 1:
        raise SweepError(
            f"a trial needs {need['CPU']:g} CPUs ({sweep.workers} workers x {sweep.cpus_per_worker:g}) but {where} "
            f"has {cpus:g}: lower workers or cpus_per_worker in the sweep"
        )
    if "GPU" in need:
        gpu_fit = int(gpus // need["GPU"])
        if gpu_fit < 1:
            raise SweepError(
                f"a trial needs {need['GPU']:g} GPUs ({sweep.workers} workers x {sweep.gpus_per_worker:g}) but {where} "
                f"has {gpus:g}: run it on a cluster with GPU nodes (docs/cluster.md), or set gpus_per_worker=0"
            )
        fit = min(fit, gpu_fit)
    if sweep.max_concurrent:
        return min(fit, sweep.max_concurrent)
    return min(fit, MODEL_BASED_CONCURRENCY) if sweep.model_based else fit


def concurrency_here(sweep: Sweep) -> tuple[int | None, str]:
    """Trials at once the sweep would run if launched from here, and where that holds: on the local
    Ray, what `resolve_concurrency` gives for this machine (None when not one trial fits:
    `launch_problems` says why); with RAY_ADDRESS, the sweep's cap (None: none), which the cluster
    may not hold (it is not asked: checking connects to nothing)."""
    from orchestrator.runners.launch import local_cpus

    if os.environ.get("RAY_ADDRESS"):
        cap = sweep.max_concurrent or (MODEL_BASED_CONCURRENCY if sweep.model_based else None)
        return cap, "on the cluster at RAY_ADDRESS, if it holds as many"
    cpus, gpus = local_cpus(), gpus_for(sweep)
    try:
        n = resolve_concurrency(sweep, cpus, gpus, where="this machine (local Ray)")
    except SweepError:
        return None, "on this machine (local Ray)"
    held = f"{cpus:g} CPUs" + (f", {gpus:g} GPUs" if "GPU" in sweep.trial_resources() else "")
    return n, f"on this machine (local Ray, {held})"


def launch_problems(sweep: Sweep) -> list[str]:
    """Why the sweep could not launch from here, as messages (empty when it could): the data the
    trials read and the resources one trial needs, against this machine or RAY_ADDRESS's cluster."""
    from orchestrator.runners.launch import local_cpus

    problems = []
    try:
        sweep.preflight()
    except SweepError as exc:
        problems.append(str(exc))
    if not os.environ.get("RAY_ADDRESS"):
        try:
            resolve_concurrency(sweep, local_cpus(), gpus_for(sweep), where="this machine (local Ray)")
        except SweepError as exc:
            problems.append(str(exc))
    else:
        from orchestrator.runners.launch import ResourceError, check_address

        try:
            check_address(os.environ["RAY_ADDRESS"])  # a dashboard URL: refused before any connection
        except ResourceError as exc:
            problems.append(str(exc))
    return problems


def _state_file(sweep: Sweep) -> Path:
    return sweep_storage(sweep) / sweep.name / "sweep.json"


def run_sweep(sweep: Sweep, *, resume: bool = False, progress: bool = True, wandb: bool = False,
              verbose: bool = False) -> SweepResult:
    """Check, then run `sweep` on the local Ray (or `RAY_ADDRESS`), resuming when asked; with
    `wandb`, every trial also logs to a Weights & Biases run (project ladder-<sweep>, grouped by
    sweep invocation). `progress` shows the sweep's view (`console.SweepView`); Ray's own tables,
    hints and per-report lines show only when `verbose`."""
    from orchestrator.runners.launch import local_cpus

    if wandb:
        tracking.check_wandb()

    base = sweep.check()
    check_job_environment()
    sweep.preflight()
    state_file = _state_file(sweep)
    if resume and not state_file.is_file():
        raise SweepError(
            f"cannot resume sweep {sweep.name!r}: nothing recorded at {state_file}. "
            "Run it without --resume first"
        )
    if not resume and state_file.is_file():
        previous = json.loads(state_file.read_text())
        if not previous.get("finished"):
            raise SweepError(
                f"sweep {sweep.name!r} was interrupted ({state_file}): continue it with --resume, "
                "or rename the sweep to start a new one"
            )
        # A finished sweep run again is a new invocation: a new parent run in the same experiment.
        folder = state_file.parent
        folder.rename(folder.with_name(f"{folder.name}.{previous['sweep_id'][len(sweep.name) + 1:]}"))
    if not os.environ.get("RAY_ADDRESS"):
        concurrency = resolve_concurrency(sweep, local_cpus(), gpus_for(sweep), where="this machine (local Ray)")
    else:
        # The cluster answers and holds a trial before anything is recorded.
        from orchestrator.runners.launch import init_ray

        init_ray()
        capacity, where = cluster_capacity()
        concurrency = resolve_concurrency(sweep, capacity.get("CPU", 0.0), capacity.get("GPU", 0.0), where=where)
    metric, mode = sweep.objective
    uri = tracking.tracking_uri()

    reference = None
    if sweep.scheduler == "collapse":
        from orchestrator.sweeps.references import load_reference

        spec = sweep.scheduler_options.get("reference")
        if not isinstance(spec, Mapping) or "experiment" not in spec:
            raise SweepError(
                "the collapse scheduler needs scheduler_options={'reference': {'experiment': NAME}} naming the "
                "MLflow experiment of a finished reference sweep"
            )
        reference = load_reference(spec, metric=metric, uri=uri)

    if resume:
        record = json.loads(state_file.read_text())
        changed = (record.get("search_plan") != sweep.search_plan() if sweep.model_based
                   else record.get("trial_params") != json.loads(json.dumps(sweep.trial_params(), default=str)))
        if changed:
            raise SweepError(f"sweep {sweep.name!r} changed since it started: its trials differ; rename it to start anew")
        if record.get("parent_run_id"):
            tracking.client(uri).update_run(record["parent_run_id"], status="RUNNING")
    else:
        sweep_id, parent = open_sweep_run(
            sweep.name, sweep.workload, base, kind="sweep", uri=uri,
            tags={"ladder.scheduler": sweep.scheduler, "ladder.search": sweep.search},
            params={"sweep.trials": str(sweep.trial_count()), "sweep.scheduler": sweep.scheduler,
                    "sweep.objective": f"{metric}:{mode}", **sweep.search_settings(concurrency)},
        )
        record = {
            "sweep_id": sweep_id,
            "parent_run_id": parent,
            "tracking_uri": uri,
            # The trials of a search that draws them up front; a model-based one's are proposed as
            # results arrive, and what decides them is its plan.
            "trial_params": None if sweep.model_based else json.loads(json.dumps(sweep.trial_params(), default=str)),
            **({"search_plan": sweep.search_plan()} if sweep.model_based else {}),
        }
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(record, indent=2))

    spec = SweepSpec(
        sweep=sweep.name, sweep_id=record["sweep_id"], workload=sweep.workload, base=to_dict(base),
        workers=sweep.workers, cpus_per_worker=sweep.cpus_per_worker, gpus_per_worker=sweep.gpus_per_worker or 0.0,
        # A one-worker CPU trial trains in the trial itself; GPU trials train in a Ray Train worker
        # group, which places the GPU and sets the device, and so do trials that ask for ZeRO
        # (one DeepSpeed engine per worker, even of one).
        in_trial=sweep.workers == 1 and not sweep.gpus_per_worker and not any(
            zero.spec_of(apply_overrides(base, p)).enabled for p in sweep.param_examples()),
        parent_run_id=record["parent_run_id"], tracking_uri=uri,
        storage=str(sweep_storage(sweep) / sweep.name / "train"),
        outbox_dir=str(runs_root() / "outbox" if os.environ.get(RUNS_DIR_ENV) else outbox.default_dir()),
        wandb=bool(wandb), verbose=bool(verbose),
    )
    status = "FAILED"
    received: list[int] = []
    try:
        result = _fit(sweep, spec, base, record, reference, concurrency, resume, progress, received)
        if any(t["state"] == "interrupted" for t in result.trials):
            raise SweepInterrupted(sweep.name, received[0] if received else signal.SIGINT, result)
        status = "FINISHED"
        return result
    except KeyboardInterrupt:  # a second Ctrl-C, or one before Tune had started
        status = "KILLED"
        raise SweepInterrupted(sweep.name, received[0] if received else signal.SIGINT) from None
    except SweepInterrupted:
        status = "KILLED"
        raise
    finally:
        if status != "FINISHED" and record.get("parent_run_id"):
            # Not left RUNNING: the parent and the trials' runs say the invocation ended (with
            # every point the trials reported); --resume continues the sweep and reopens them.
            _end_open_runs(spec, status)


def scheduler_options(sweep: Sweep) -> dict[str, Any]:
    """The sweep's scheduler options with its table's defaults filled in."""
    from orchestrator.sweep import SCHEDULER_OPTIONS, resolved_options

    return resolved_options(sweep.scheduler_options, SCHEDULER_OPTIONS.get(sweep.scheduler, {}))


def _console_callback(sweep: Sweep, scheduler: Any) -> Any:
    """The sweep's live view (`console.SweepView`) fed from Tune's trials, instead of Tune's tables."""
    from ray import tune

    from orchestrator.runners.console import SweepView, stop_reason, trial_state

    metric, mode = sweep.objective
    kind, options = sweep.scheduler, scheduler_options(sweep)

    class Console(tune.Callback):
        view: Any = None

        def __getstate__(self) -> dict:
            return {}  # Tune pickles its callbacks; a resumed sweep gets a new view (_use_console)

        def _show(self, trial: Any, result: dict | None = None, status: str | None = None) -> None:
            if self.view is None:
                self.view = SweepView(sweep.name, sweep.trial_count(), metric, mode, scheduler=kind)
            last = result or trial.last_result or {}
            d = getattr(scheduler, "decisions", {}).get(trial.trial_id)
            # Tune calls on_trial_complete and on_trial_error before it changes the trial's status.
            state = trial_state(status or trial.status, last.get("progress", float("nan")), decision=d, scheduler=kind)
            why = stop_reason(kind, d, options) if state in ("stopped", "diverged") else ""
            if state == "failed":
                try:
                    error = str(trial.get_error() or "").strip().splitlines()
                except Exception:  # the error file is Tune's; the state alone still says failed
                    error = []
                why = error[-1][:120] if error else "failed"
            # A proposal a resumed search handed out again shows as the trial it was (its MLflow run's id).
            shown = trial.config.get("trial_of") or trial.trial_id
            self.view.update(shown, params=trial.config.get("params", {}), state=state,
                             progress=last.get("progress"), objective=last.get(metric),
                             predicted=(d or {}).get("predicted"), why=why)

        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
            if self.view is None:  # the trials a resumed sweep starts with, ended ones included
                for trial in trials:
                    self._show(trial)

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._show(trial, status="RUNNING")

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self._show(trial, result)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._show(trial, status="TERMINATED")

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._show(trial, status="ERROR")

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            if self.view is not None:
                self.view.tick()

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if self.view is not None:
                self.view.close()

    return Console()


def _endings_callback() -> Any:
    """A Tune callback that records which trials ended (finished, stopped by the scheduler, or
    failed) in this invocation or before it. After a Ctrl-C, Tune marks the trials it was running
    TERMINATED without ending them through its callbacks: the trials this one never saw end are
    the interrupted ones."""
    from ray import tune

    class Endings(tune.Callback):
        def __init__(self) -> None:
            self.ended: set[str] = set()
            self.started = False

        def __getstate__(self) -> dict:
            return {"ended": set(), "started": False}  # a resumed sweep gets a new one (_use_console)

        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
            if not self.started:  # the trials a resumed sweep restores as already ended
                self.started = True
                self.ended |= {t.trial_id for t in trials if t.status in ("TERMINATED", "ERROR")}

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.ended.add(trial.trial_id)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.ended.add(trial.trial_id)

    return Endings()


def _result_files() -> list:
    """Tune's own per-trial result files, result.json and progress.csv (what `ray.tune` users and
    `ResultGrid` read), without its third default logger, TensorBoard's: its events repeat what
    MLflow records, and tensorboardX imports torch into the driver (seconds of every sweep's
    start-up). Tune adds all three unless TUNE_DISABLE_AUTO_CALLBACK_LOGGERS is set while it runs
    (`_fit` sets it)."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [CSVLoggerCallback(), JsonLoggerCallback()]


_INTEGRATION_CALLBACKS = ("WandbLoggerCallback", "MLflowLoggerCallback", "CometLoggerCallback", "AimLoggerCallback")


def _light_callback_usage_tag() -> None:
    """Ray Tune records which callback classes a run uses (its usage telemetry) by importing its
    W&B, MLflow, Comet and Aim integrations to compare classes, and W&B's import alone is over a
    second of a sweep's start-up, in a sweep that logs nothing to W&B. Record the same tag by the
    classes' names; once W&B is imported (a sweep with --wandb), Ray's own function runs."""
    from ray.air._internal import usage

    original = usage.tag_callbacks
    if getattr(original, "ladder_light", False):
        return

    def tag_callbacks(callbacks: Any) -> bool:
        if "wandb" in sys.modules or not callbacks:
            return original(callbacks)
        from ray.tune import Callback
        from ray.tune.logger import LoggerCallback
        from ray.tune.utils.callback import DEFAULT_CALLBACK_CLASSES

        built_in = set(_INTEGRATION_CALLBACKS) | {cls.__name__ for cls in DEFAULT_CALLBACK_CLASSES}
        counts: dict[str, int] = {}
        for callback in callbacks:
            if not isinstance(callback, Callback):
                continue
            name = type(callback).__name__
            key = name if name in built_in else (
                "CustomLoggerCallback" if isinstance(callback, LoggerCallback) else "CustomCallback")
            counts[key] = counts.get(key, 0) + 1
        if counts:
            usage.record_extra_usage_tag(usage.TagKey.AIR_CALLBACKS, json.dumps(counts))
        return True

    tag_callbacks.ladder_light = True  # type: ignore[attr-defined]
    usage.tag_callbacks = tag_callbacks


def _fit(sweep: Sweep, spec: SweepSpec, base: Any, record: dict[str, Any], reference: Any, concurrency: int | None,
         resume: bool, progress: bool, received: list[int]) -> SweepResult:
    from ray import tune

    from orchestrator.sweeps import schedulers
    from orchestrator.runners.launch import init_ray

    metric, mode = sweep.objective
    _light_callback_usage_tag()
    # Single-worker trials train in the trial: no Ray Train, so no dashboard (its State API).
    init_ray(dashboard=not spec.in_trial)
    scheduler_state = sweep_storage(sweep) / sweep.name / "scheduler.json"
    diagnostics = None
    if sweep.scheduler == "collapse":
        from orchestrator.sweeps.schedulers.diagnostics import CollapseDiagnostics

        diagnostics = CollapseDiagnostics(experiment=sweep.name, sweep_id=record["sweep_id"], uri=spec.tracking_uri)
    scheduler = schedulers.build(sweep.scheduler, sweep.scheduler_options, metric=metric, mode=mode,
                                 state_path=scheduler_state, reference=reference, diagnostics=diagnostics,
                                 space=sweep.space)
    if sweep.scheduler in ("hyperband", "pbt"):
        # Their brackets and population are the trials Tune has created, and Tune creates no more
        # unfinished ones (paused ones count) than max_concurrent_trials: uncapped, every trial
        # exists from the start and the trials' CPUs alone cap how many run at once.
        concurrency = None
    # A single-worker trial trains in the trial itself; any other trial only drives Ray Train,
    # whose workers hold the CPUs (a CPU held by the driver too would starve them on small nodes).
    # Ray refuses an empty bundle, so the driver asks for a little memory instead of a CPU.
    resources = {"cpu": sweep.cpus_per_worker} if spec.in_trial else {"cpu": 0, "memory": 64 * 2**20}
    trainable = tune.with_resources(_graceful(tune.with_parameters(trial_main, sweep=spec)), resources)
    storage = str(sweep_storage(sweep) / sweep.name)
    started = time.monotonic()
    tune_path = os.path.join(storage, "tune")
    verbose = spec.verbose
    endings = _endings_callback()
    callbacks = [endings] + ([_console_callback(sweep, scheduler)] if progress else []) + _result_files()
    if progress and hasattr(scheduler, "announce"):
        scheduler.announce = False  # the view says why each trial stopped
    journal = Path(storage) / "proposals.jsonl"
    if resume and tune.Tuner.can_restore(tune_path):
        # Tune restores the search with the experiment: a model-based search's study as Tune last
        # saved it (orchestrator.sweeps.search: the proposals made since, it finds in its journal).
        tuner = tune.Tuner.restore(tune_path, trainable, resume_unfinished=True, resume_errored=True)
        _use_scheduler(tuner, scheduler)
        _use_console(tuner, callbacks, verbose)
        _use_journal(tuner, journal)
    else:
        searcher = None
        if sweep.model_based:
            from orchestrator.sweeps import search

            searcher = search.build(sweep, journal=journal, quiet=not verbose)
        tuner = tune.Tuner(
            trainable,
            # A model-based search proposes every trial's params itself, `num_samples` proposals.
            param_space={} if searcher else {"params": tune.grid_search(record["trial_params"])},
            # FIFO ranks nothing while trials run: without a metric, Tune does not demand the
            # objective in every report (a workload may compute it only at the end).
            tune_config=tune.TuneConfig(metric=None if sweep.scheduler == "fifo" else metric,
                                        mode=None if sweep.scheduler == "fifo" else mode, scheduler=scheduler,
                                        search_alg=searcher, num_samples=sweep.trial_count() if searcher else 1,
                                        max_concurrent_trials=concurrency, reuse_actors=bool(spec.in_trial)),
            run_config=tune.RunConfig(name="tune", storage_path=storage, verbose=1 if verbose else 0,
                                      callbacks=callbacks,
                                      failure_config=tune.FailureConfig(max_failures=sweep.max_failures)),
        )
    hints = _TuneInterruptHints()
    tune_log = logging.getLogger("ray.tune.tune")
    tune_log.addFilter(hints)
    try:
        # After Ray's start-up, which sets a SIGTERM handler of its own that aborts the driver.
        with quiet_tune(not verbose), _sigterm_as_sigint(received), environ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1"):
            results = tuner.fit()
    finally:
        tune_log.removeFilter(hints)
    # Tune returns normally after a Ctrl-C (it stops the trials and saves the experiment): then a
    # trial that did not end through Tune's callbacks was interrupted, not finished.
    tune_trials = getattr(getattr(results, "_experiment_analysis", None), "trials", None) or [None] * len(results)
    if diagnostics is not None:
        diagnostics.flush()
    decisions = getattr(scheduler, "decisions", {})
    if hasattr(scheduler, "checkpoint"):
        scheduler.checkpoint()
    if scheduler_state.is_file() or scheduler_state.with_suffix(".journal.jsonl").is_file():
        # On a resume, Tune ran its own unpickled copy of the scheduler: read what it recorded.
        from orchestrator.sweeps.schedulers.collapse import read_state

        decisions = read_state(scheduler_state).get("decisions", {})
    trials = []
    for r, tune_trial in zip(results, tune_trials):
        metrics = r.metrics or {}
        tid = str(metrics.get("trial_id", getattr(tune_trial, "trial_id", "?")))
        d = decisions.get(tid, {})
        tid = str((r.config or {}).get("trial_of") or tid)  # the trial a resumed search handed out again
        short = metrics.get("progress", 0) < 1 - 1e-9
        interrupted = (hints.stopped and tune_trial is not None and tune_trial.trial_id not in endings.ended
                       and not r.error)
        if interrupted:
            stopped = False
        elif sweep.scheduler in ("asha", "median", "hyperband"):
            # Ray's schedulers keep no record of their decisions (ours of HyperBand's covers this
            # invocation only, not a resumed sweep's earlier one): a trial that ended cleanly
            # short of its budget is one they stopped. PBT stops none.
            stopped = short and not r.error
        else:
            stopped = d.get("action") == "stop" and short
        state = ("failed" if r.error else "interrupted" if interrupted else "diverged" if d.get("diverged")
                 else "stopped" if stopped else "finished")
        params = (r.config or {}).get("params", {})
        trials.append(
            {
                "trial_id": tid,
                "params": params,
                "config": to_dict(apply_overrides(base, params)),
                "final": None,  # what `train` returned, read from the trial's run (`_close_child_runs`)
                "progress": metrics.get("progress", float("nan")),
                "objective": metrics.get(metric, float("nan")),
                "stopped": stopped,
                "diverged": bool(d.get("diverged")),
                "predicted": d.get("predicted"),
                "cutoff": d.get("cutoff") if state == "stopped" else None,
                "rung": (d.get("rung") if d.get("rung") is not None else metrics.get("progress")) if state == "stopped" else None,
                "rule": sweep.scheduler if state in ("stopped", "diverged") else None,
                "error": str(r.error) if r.error else "",
                "state": state,
                "why": (stop_reason(sweep.scheduler, d, scheduler_options(sweep)) if state in ("stopped", "diverged")
                        else str(r.error).strip().splitlines()[-1][:200] if r.error else ""),
            }
        )
    if spec.parent_run_id:
        _close_child_runs(spec, trials)
        try:
            log_sweep_summary(parent_run_id=spec.parent_run_id, uri=spec.tracking_uri, experiment=spec.sweep,
                              sweep_id=spec.sweep_id, trials=trials, metric=metric, mode=mode, space=sweep.space)
        except Exception as exc:  # the sweep's runs are recorded; only their summary is missing
            tracking.warn(f"could not log the sweep's summary (trials.csv, trial_curves.png): {type(exc).__name__}: {exc}")
        tracking.log_text(spec.parent_run_id, json.dumps(trials, indent=2, default=str), "trials.json",
                          uri=spec.tracking_uri)
    interrupted = any(t["state"] == "interrupted" for t in trials)
    if not interrupted:  # an interrupted sweep's parent is ended KILLED by run_sweep, its state kept for --resume
        finish_run(spec.parent_run_id, STATUS_FINISHED, uri=spec.tracking_uri)
        state_file = Path(storage) / "sweep.json"
        state_file.write_text(json.dumps({**record, "finished": True}, indent=2))
    return SweepResult(sweep.name, spec.sweep_id, spec.parent_run_id, spec.tracking_uri, trials,
                       time.monotonic() - started, Path(storage), metric, mode)


def _use_scheduler(tuner: Any, scheduler: Any) -> None:
    """Make a restored Tuner run `scheduler`, built now from the sweep file, instead of the copy
    pickled when the sweep began.

    The two hold the same configuration (the sweep's trials are checked unchanged; ASHA and the
    median rule keep no state that Tune restores; ours reads its decisions from its state file
    either way), but the pickled copy may come from an older ladder that built Ray's schedulers
    with their own metric, which Tune refuses next to TuneConfig's, and it is not the object whose
    decisions and diagnostics this driver reads after the fit."""
    internal = getattr(tuner, "_local_tuner", None)
    config = getattr(internal, "_tune_config", None)
    if config is not None:
        config.scheduler = scheduler


def _use_journal(tuner: Any, journal: Path) -> None:
    """A restored model-based search keeps its journal of proposals in this sweep's folder."""
    config = getattr(getattr(tuner, "_local_tuner", None), "_tune_config", None)
    searcher = getattr(config, "search_alg", None)
    if hasattr(searcher, "use_journal"):
        searcher.use_journal(journal)


def _use_console(tuner: Any, callbacks: list, verbose: bool) -> None:
    """A restored Tuner runs this invocation's console and verbosity, not those pickled when the sweep began."""
    run_config = getattr(getattr(tuner, "_local_tuner", None), "_run_config", None)
    if run_config is not None:
        run_config.callbacks = callbacks
        run_config.verbose = 1 if verbose else 0


def _end_open_runs(spec: SweepSpec, status: str) -> None:
    try:
        c = tracking.client(spec.tracking_uri)
        exp = c.get_experiment_by_name(spec.sweep)
        for run in c.search_runs([exp.experiment_id], filter_string=f"tags.`ladder.sweep_id` = '{spec.sweep_id}' "
                                 "and attributes.status = 'RUNNING'", max_results=50000):
            tracking.deliver_leftovers(spec.outbox_dir, run.info.run_id, spec.tracking_uri)
            finish_run(run.info.run_id, status, uri=spec.tracking_uri)
    except Exception as exc:  # the sweep's own failure is what the user must see
        tracking.warn(f"could not end the sweep's MLflow runs ({type(exc).__name__}: {exc})")
    finish_run(spec.parent_run_id, status, uri=spec.tracking_uri)


def stop_tags(trial: Mapping[str, Any]) -> dict[str, str]:
    """Why a stopped (or diverged) trial's run ended early, as MLflow tags: where (`ladder.stopped_at`,
    the training fraction of the last report the scheduler saw, which is where its recorded curve
    ends), the rule, the phrase the console showed, and the rule's numbers where it has them (the
    rung, the collapse prediction and the cutoff it was compared with)."""
    if trial.get("state") not in ("stopped", "diverged"):
        return {}
    num = lambda x: isinstance(x, (int, float)) and math.isfinite(x)  # noqa: E731
    tags = {"ladder.stop_rule": str(trial.get("rule") or ""), "ladder.stop_reason": str(trial.get("why") or "")}
    if num(trial.get("progress")):
        tags["ladder.stopped_at"] = f"{trial['progress']:.4f}"
    for key, name in (("rung", "ladder.stop_rung"), ("predicted", "ladder.stop_predicted"),
                      ("cutoff", "ladder.stop_cutoff")):
        if num(trial.get(key)):
            tags[name] = f"{trial[key]:.6g}"
    return {k: v for k, v in tags.items() if v}


def _close_child_runs(spec: SweepSpec, trials: list[dict[str, Any]]) -> None:
    """Send what the sweep's trials left in their outboxes, end the MLflow runs of trials that
    Tune stopped (their process may be gone before it can), and give each trial the final metrics
    its run recorded (`final`: what `train` returned; None for a trial that did not finish)."""
    c = tracking.client(spec.tracking_uri)
    exp = c.get_experiment_by_name(spec.sweep)
    by_id = {t["trial_id"]: t for t in trials}
    for run in c.search_runs([exp.experiment_id], filter_string=f"tags.`ladder.sweep_id` = '{spec.sweep_id}'",
                             max_results=50000):
        tid = run.data.tags.get("ladder.trial_id")
        trial = by_id.get(tid)
        if tid is not None:
            # Points a trial reported after its last flush, before Tune stopped it (or the driver died).
            tracking.deliver_leftovers(spec.outbox_dir, run.info.run_id, spec.tracking_uri)
        if trial is not None:
            trial["final"] = tracking.get_final(run, spec.tracking_uri, mlflow_client=c)
        # A stopped trial's process ends mid-loop: its run is left RUNNING, or FAILED when the
        # loop noticed; Tune's record says how the trial really ended.
        if trial is None:
            continue
        if run.info.status == "FINISHED":
            if stop_tags(trial):  # a run its trial ended itself still says why it stopped
                tracking.set_tags(run.info.run_id, stop_tags(trial), uri=spec.tracking_uri)
            continue
        if trial["state"] == "interrupted":
            progress = trial["progress"]
            if not (isinstance(progress, float) and math.isfinite(progress)):  # Tune had no report of it yet
                progress = run.data.metrics.get("progress", float("nan"))
            finish_run(run.info.run_id, STATUS_KILLED, uri=spec.tracking_uri,
                       tags={"ladder.stopped_early": "false",
                             **({"ladder.interrupted_at": f"{progress:.4f}"}
                                if isinstance(progress, float) and math.isfinite(progress) else {})})
            continue
        tags = {"ladder.stopped_early": str(bool(trial["stopped"])).lower(), **stop_tags(trial)}
        if trial["diverged"]:
            tags["ladder.diverged"] = "true"
        finish_run(run.info.run_id, "FAILED" if trial["error"] else STATUS_FINISHED, uri=spec.tracking_uri, tags=tags)


def _table_order(mode: str) -> Any:
    """Finished trials first, best objective first; then the others (stopped, interrupted, failed)
    in the same order; trial id breaks ties."""
    sign = 1.0 if mode == "min" else -1.0

    def key(t: Mapping[str, Any]) -> tuple:
        obj = t.get("objective")
        finite = isinstance(obj, (int, float)) and math.isfinite(obj)
        return (t.get("state") != "finished", not finite, sign * obj if finite else 0.0, t["trial_id"])

    return key


def format_trials(result: SweepResult) -> str:
    def num(x: Any) -> str:
        return "-" if x is None or (isinstance(x, float) and x != x) else f"{x:.4f}"

    metric = result.metric
    rows = [("trial", "params", "stopped at", "predicted final", f"final {metric}", f"{metric} when stopped")]
    for t in sorted(result.trials, key=_table_order(result.mode)):
        params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["params"].items())
        if t["state"] == "interrupted":
            stopped = f"interrupted @ {t['progress']:.0%}" if math.isfinite(t["progress"]) else "interrupted"
        elif t["diverged"]:
            stopped = f"diverged @ {t['progress']:.0%}"
        elif t["stopped"]:
            stopped = f"{t['progress']:.0%}"
        elif t["error"]:
            stopped = "error"
        else:
            stopped = "finished"
        done = stopped == "finished"
        rows.append((t["trial_id"], params, stopped, num(t["predicted"]), num(t["objective"]) if done else "-",
                     "-" if done else num(t["objective"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
