"""Launching one training run: in-process (`LocalRun`) or under Ray Train (`TorchTrainer`).

Both paths create the MLflow run before training starts (params = flattened config, tags, config
JSON artifact), under Ray only once the cluster answered and holds the workers, so that a launch
refused records nothing and a run that starts is on record before it trains, and both write a `run.json` into the run folder that
names the workload, the config and the MLflow run; `--resume RUN_DIR` continues from it.
"""

from __future__ import annotations

import json
import logging
import contextlib
import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from orchestrator.runners import registry
from orchestrator.run import checkpoints
from orchestrator.tracking import outbox, sink as tracking
from orchestrator.runners.config import ConfigError, from_dict, to_dict

RUNS_DIR = "ladder-runs"


class ResourceError(RuntimeError):
    """The requested workers cannot be placed on the Ray cluster that would run them."""


@dataclass
class RunResult:
    workload: str
    metrics: dict[str, float]
    run_dir: Path
    mlflow_run_id: str | None
    tracking_uri: str | None
    wall_s: float
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: its MLflow run ends KILLED, its folder keeps its record and
    checkpoints, and `resume_command` continues it."""

    def __init__(self, run_dir: Path, *, local: bool) -> None:
        super().__init__(str(run_dir))
        self.run_dir = run_dir
        self.resume_command = f"ladder run --resume {run_dir}" + (" --local" if local else "")

    @classmethod
    @contextlib.contextmanager
    def naming(cls, run_dir: Path, *, local: bool) -> Iterator[None]:
        """A Ctrl-C inside becomes a RunInterrupted naming `run_dir`."""
        try:
            yield
        except KeyboardInterrupt as exc:
            if isinstance(exc, cls):
                raise
            raise cls(run_dir, local=local) from exc


def new_run_dir(workload: str, base: str | os.PathLike | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(base or os.getcwd()).resolve() / RUNS_DIR / workload / f"{stamp}-{secrets.token_hex(3)}"


def load_run_record(run_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise ConfigError(
            f"cannot resume {str(run_dir)!r}: no run.json there. Pass the folder a previous "
            f"`ladder run` printed (under ./{RUNS_DIR}/<workload>/)"
        )
    return json.loads(path.read_text())


def _record_of(run_dir: str | os.PathLike, name: str) -> dict[str, Any]:
    """The run record of `run_dir`, refused when it is another workload's run."""
    record = load_run_record(run_dir)
    if record["workload"] != name:
        raise ConfigError(f"{run_dir} is a run of {record['workload']!r}, not {name!r}")
    return record


def local_cpus() -> float:
    return float(os.environ.get("LADDER_NUM_CPUS") or os.cpu_count() or 1)


def check_resources(workers: int, cpus_per_worker: float, available: float | None = None, *, where: str = "") -> None:
    """Fail before launch when `workers` x `cpus_per_worker` cannot fit (Ray would wait forever)."""
    if workers < 1:
        raise ResourceError(f"--workers must be at least 1, got {workers}")
    if cpus_per_worker <= 0:
        raise ResourceError(f"--cpus-per-worker must be positive, got {cpus_per_worker}")
    available = local_cpus() if available is None else available
    need = workers * cpus_per_worker
    if need > available + 1e-9:
        fit = int(available // cpus_per_worker)
        fix = (f"Use --workers {fit} or fewer, a smaller --cpus-per-worker," if fit >= 1
               else f"Use --cpus-per-worker {available:g} or less,")
        raise ResourceError(
            f"{workers} worker{'s' if workers != 1 else ''} x {cpus_per_worker:g} CPU need {need:g} CPUs, but "
            f"{where or 'this machine (local Ray)'} has {available:g}. {fix} or point RAY_ADDRESS at a cluster with more CPUs."
        )


def check_gpus(workers: int, gpus_per_worker: float, available: float | None = None, *, where: str = "") -> None:
    """Fail before launch when `workers` x `gpus_per_worker` GPUs are not there (Ray would wait
    forever for them)."""
    if gpus_per_worker < 0:
        raise ResourceError(f"--gpus-per-worker must be 0 (CPU workers) or more, got {gpus_per_worker:g}")
    if not gpus_per_worker:
        return
    if available is None:
        from orchestrator.run import devices

        available = float(devices.cuda_count())
    need = workers * gpus_per_worker
    if need > available + 1e-9:
        has = f"has {available:g}" if available else "has none"
        if not where:
            where, has = "this machine (local Ray)", has + ("" if available else " (torch sees no CUDA device)")
        fewer = f" use --workers {int(available // gpus_per_worker)} or fewer," if available >= gpus_per_worker else ""
        raise ResourceError(
            f"{workers} worker{'s' if workers != 1 else ''} x {gpus_per_worker:g} GPU need {need:g} GPU"
            f"{'s' if need != 1 else ''}, but {where} {has}. Drop --gpus-per-worker to train on CPUs,{fewer} or point "
            "RAY_ADDRESS at a cluster with GPU nodes (docs/cluster.md)")


def _open_tracking(workload: registry.Workload, cfg: Any, run_name: str, run_dir: Path, extra_tags: dict[str, str]) -> tuple[str, str]:
    from orchestrator.runners.trial import open_run

    uri = tracking.tracking_uri()
    run_id = open_run(workload.name, cfg, experiment=workload.name, run_name=run_name, uri=uri,
                      tags={"ladder.run_dir": str(run_dir), **extra_tags})
    return run_id, uri


def _write_record(run_dir: Path, record: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps(record, indent=2, default=str))


def _prepare(workload: registry.Workload, cfg: Any, resume: str | os.PathLike | None, track: bool, mode: str,
             tags: dict[str, str], workers: int = 1):
    name = workload.name
    if resume is not None:
        record = _record_of(resume, name)
        run_dir = Path(resume).resolve()
        cfg = from_dict(workload.Config, record["config"])
        # Refused here, before anything starts, rather than deep inside the restarted loop.
        checkpoints.load_latest(run_dir / "checkpoints", checkpoints.identity(name, to_dict(cfg)))
        run_id, uri = record.get("mlflow_run_id"), record.get("tracking_uri")
        if run_id:
            tracking.client(uri).update_run(run_id, status="RUNNING")
    else:
        run_dir = new_run_dir(name)
        run_id = uri = None
        if track:
            run_id, uri = _open_tracking(workload, cfg, run_dir.name, run_dir, {"ladder.mode": mode, **tags})
        _write_record(
            run_dir,
            {"workload": name, "config": to_dict(cfg), "mlflow_run_id": run_id, "tracking_uri": uri, "mode": mode,
             "workers": workers},
        )
    return cfg, run_dir, run_id, uri


def _loaded(workload: str | registry.Workload) -> registry.Workload:
    """The workload a caller names, or the one it already loaded (the CLI loads it once, to build the config)."""
    return workload if isinstance(workload, registry.Workload) else registry.load(workload)


def run_local(
    workload: str | registry.Workload,
    cfg: Any,
    *,
    resume: str | os.PathLike | None = None,
    track: bool = True,
    progress: bool = True,
    wandb: bool = False,
    tags: dict[str, str] | None = None,
    device: Any = None,
) -> RunResult:
    """Train `workload` (a name, or the Workload the caller loaded) in this process, on `device`
    (a `torch.device`, or what `devices.resolve` takes: None is CUDA when there is one, else the
    CPU); `cfg` was validated by the caller (a resumed run's is the recorded one). Exceptions mark
    the MLflow run FAILED (KILLED on Ctrl-C) and propagate."""
    from orchestrator.runners import zero
    from orchestrator.run import LocalRun, devices
    from orchestrator.runners.trial import TrialSpec, run_trial

    device = device if not isinstance(device, (str, type(None))) else devices.resolve(device)
    workload = _loaded(workload)
    name = workload.name
    if resume is not None:
        cfg = from_dict(workload.Config, _record_of(resume, name)["config"])
    zero.check_in_process(cfg)
    cfg, run_dir, run_id, uri = _prepare(workload, cfg, resume, track, "local", tags or {})
    spec = TrialSpec.of(name, cfg, run_id=run_id, tracking_uri=uri, skip_recorded=resume is not None,
                        outbox_dir=str(outbox.default_dir()), progress=name if progress else None,
                        wandb={"project": f"ladder-{name}", "name": run_dir.name} if wandb else None,
                        record_final=False, tags={"ladder.world_size": "1", "ladder.backend": "none"})
    started = time.monotonic()
    with RunInterrupted.naming(run_dir, local=True):
        metrics, run = run_trial(spec, lambda sinks, _: LocalRun(run_dir, sinks=sinks, identity=spec.identity,
                                                                 device=device), loaded=(workload, cfg))
    return RunResult(name, metrics, run_dir, run_id, uri, time.monotonic() - started, run.history)


class ClusterUnreachable(ResourceError):
    """RAY_ADDRESS names a cluster this machine cannot use: nothing listens there, or it wants a
    token this client does not send."""


PROBE_TIMEOUT_S = 3.0
"""Seconds each connection check may take (a TCP connect, then one GCS request)."""

_TOKEN_HELP = ("set RAY_AUTH_MODE=token and give this machine the cluster's token: the file ~/.ray/auth_token, "
               "a file named by RAY_AUTH_TOKEN_PATH, or the token itself in RAY_AUTH_TOKEN (docs/cluster.md, 'The token')")


def check_address(address: str) -> None:
    """Refuse, without a connection, a RAY_ADDRESS no driver can use: an http(s) URL is the
    dashboard's, where `ray job submit` sends jobs (the variable `ray job submit` reads too), not a
    cluster a driver joins; `ray.init` would fail on it with a traceback."""
    from urllib.parse import urlsplit

    scheme = address.split("://", 1)[0].lower() if "://" in address else ""
    if scheme not in ("http", "https"):
        return
    host = urlsplit(address).hostname or "HEAD_IP"
    raise ClusterUnreachable(
        f"RAY_ADDRESS={address} is the Ray dashboard's address, where `ray job submit` sends jobs, not one a driver "
        f"connects to. To run this command as a job on the cluster, unset RAY_ADDRESS here and submit it: `ray job "
        f"submit --address {address} --working-dir . -- ladder ...` (docs/cluster.md). To run it from here as a "
        f"driver, point RAY_ADDRESS at the head's GCS address, RAY_ADDRESS={host}:6379, or at its Ray Client "
        f"server, RAY_ADDRESS=ray://{host}:10001")


def check_cluster(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Refuse a cluster address that `ray.init` could not use, within seconds and naming the fix.

    `ray.init` retries a GCS address where nothing listens for minutes, printing only "Failed to
    get cluster ID", and takes half a minute to refuse a client without the cluster's token. A
    plain TCP connect, then the GCS request `ray.init` starts with (sent with the token Ray would
    send), answer both questions first. An http(s) URL, the dashboard's, is refused outright
    (`check_address`); other addresses that are not host:port (auto, ray://) are left to Ray; so
    is a GCS request this Ray cannot make (its private modules moved)."""
    import socket

    shown = f"RAY_ADDRESS={address}"
    check_address(address)
    if "://" in address or address in ("auto", "local") or ":" not in address:
        return
    host, _, port_text = address.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise ClusterUnreachable(f"{shown} is not host:port (the head's GCS address, e.g. 10.0.0.5:6379)") from None
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
            pass
    except socket.timeout:
        raise ClusterUnreachable(
            f"cannot reach the Ray cluster at {shown}: no answer within {timeout_s:g} s (a wrong host, or a firewall "
            "between here and the head). Point RAY_ADDRESS at the head's GCS address (HEAD_IP:6379, what `ray start "
            "--head` printed), or unset it to run on a local Ray") from None
    except OSError as exc:
        why = "nothing is listening there (connection refused)" if isinstance(exc, ConnectionRefusedError) else str(exc)
        raise ClusterUnreachable(
            f"cannot reach the Ray cluster at {shown}: {why}. Start the cluster (`ray start --head --port=6379` on "
            "the head) or point RAY_ADDRESS at its GCS address (HEAD_IP:6379), or unset RAY_ADDRESS to run on a "
            "local Ray") from None
    _check_gcs(address, shown, timeout_s)


def _check_gcs(address: str, shown: str, timeout_s: float) -> None:
    try:
        import grpc
        from ray._private.authentication.grpc_authentication_client_interceptor import (
            SyncAuthenticationMetadataClientInterceptor,
        )
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # a Ray whose private modules moved: ray.init answers, more slowly
        return
    mode = os.environ.get("RAY_AUTH_MODE") or "unset"
    channel = grpc.intercept_channel(grpc.insecure_channel(address), SyncAuthenticationMetadataClientInterceptor())
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            sent = ("the token this client sent was refused (a different cluster's token?)" if mode == "token"
                    else f"this client sends none (RAY_AUTH_MODE is {mode})")
            raise ClusterUnreachable(f"the Ray cluster at {shown} requires an authentication token and {sent}: "
                                     f"{_TOKEN_HELP}") from None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED):
            raise ClusterUnreachable(
                f"{shown} accepts connections but does not answer as a Ray head ({code.name}: {exc.details()}): "
                "point RAY_ADDRESS at the head's GCS port (6379 unless `ray start --head --port` said otherwise)"
            ) from None
        raise
    except Exception as exc:
        if type(exc).__name__ != "AuthenticationError":
            raise
        # RAY_AUTH_MODE=token, and no token where Ray looks for one.
        raise ClusterUnreachable(f"RAY_AUTH_MODE is token but this machine has no token for the Ray cluster at {shown}: "
                                 f"{_TOKEN_HELP}") from None
    finally:
        channel.close()


def init_ray(num_cpus: float | None = None, *, dashboard: bool = True) -> None:
    """Connect to `RAY_ADDRESS` when set (checked first: `check_cluster`), else start a local Ray
    sized to this machine, with its dashboard when `dashboard` (Ray Train needs it; a sweep whose
    trials train in the trial itself does not, and saves its start-up and its CPU)."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        check_cluster(os.environ["RAY_ADDRESS"])
    # Train V2's placement-group cleaner polls the State API, which the dashboard serves.
    # The dashboard costs about 3 s of start-up and a few busy processes on a 2-core machine.
    # Train's controller takes one report per health-check poll (2 s by default): poll faster.
    env = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")}
    # --wandb's mode and folder reach the trials and workers on every node (offline needs no account).
    env.update({k: os.environ[k] for k in ("WANDB_MODE", "WANDB_DIR") if os.environ.get(k)})
    if not sys.stderr.isatty():
        # Ray colours the `(trial_main pid=...)` prefix of the trials' lines it forwards: raw escape
        # codes in a log file or a pipe. Read where they are printed, in this process.
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    kwargs: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": True, "runtime_env": {"env_vars": env}}
    if os.environ.get("RAY_ADDRESS"):
        try:
            ray.init(address=os.environ["RAY_ADDRESS"], **kwargs)
        except ConnectionError as exc:
            raise ClusterUnreachable(f"could not connect to the Ray cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']}: "
                                     f"{exc}. If the cluster uses token authentication, {_TOKEN_HELP}") from exc
    else:
        # address="local": a new Ray of our own, never one that `ray start` left running on this machine.
        # Ray warns at every start of a local Ray that it enabled token authentication by default:
        # here that Ray is ladder's own, bound to 127.0.0.1 and gone with the command.
        # Ray Train's preemption watcher (an actor per run, a second or two of CPU to start) polls for
        # nodes being drained; this Ray's one node never is.
        env.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", os.environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0"))
        auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = auth_log.level
        auth_log.setLevel(logging.ERROR)
        try:
            ray.init(address="local", num_cpus=int(num_cpus or local_cpus()), include_dashboard=dashboard,
                     dashboard_host="127.0.0.1", **kwargs)
        finally:
            auth_log.setLevel(level)


def run_ray(
    workload: str | registry.Workload,
    cfg: Any,
    *,
    workers: int = 1,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    max_failures: int = 0,
    resume: str | os.PathLike | None = None,
    track: bool = True,
    progress: bool = True,
    wandb: bool = False,
    tags: dict[str, str] | None = None,
) -> RunResult:
    """Train under Ray Train with `workers` DDP workers (gloo on CPU; NCCL on `gpus_per_worker`
    GPUs each); with `wandb`, rank 0 also logs to Weights & Biases. `cfg` was validated by the
    caller; the workers validate it again."""
    from orchestrator.runners.trial import ending_run

    workload = _loaded(workload)
    name = workload.name
    if wandb:
        tracking.check_wandb()
    if not os.environ.get("RAY_ADDRESS"):
        check_resources(workers, cpus_per_worker)
        check_gpus(workers, gpus_per_worker)
    if resume is not None:
        from orchestrator.runners import zero

        record = _record_of(resume, name)
        zero.check_resume_workers(from_dict(workload.Config, record["config"]), record.get("workers"), workers)
    import ray

    # The cluster answers and holds the workers before anything is recorded.
    init_ray()
    if os.environ.get("RAY_ADDRESS"):
        held = ray.cluster_resources()
        check_resources(workers, cpus_per_worker, held.get("CPU", 0.0), where="the Ray cluster at RAY_ADDRESS")
        check_gpus(workers, gpus_per_worker, held.get("GPU", 0.0), where="the Ray cluster at RAY_ADDRESS")
    cfg, run_dir, run_id, uri = _prepare(workload, cfg, resume, track, f"ray-train x{workers}", tags or {},
                                         workers=workers)
    started = time.monotonic()
    with RunInterrupted.naming(run_dir, local=False), ending_run(run_id, uri=uri, outbox_dir=str(outbox.default_dir())):
        result = _fit_run(name, cfg, run_dir, run_id, uri, workers, cpus_per_worker, max_failures, progress, wandb,
                          gpus_per_worker)
    metrics = dict(result.return_value or {})
    return RunResult(name, metrics, run_dir, run_id, uri, time.monotonic() - started)


def _fit_run(name: str, cfg: Any, run_dir: Path, run_id: str | None, uri: str | None, workers: int,
             cpus_per_worker: float, max_failures: int, progress: bool, wandb: bool = False,
             gpus_per_worker: float = 0.0) -> Any:
    from orchestrator.runners.ray_train import trainer
    from orchestrator.runners.trial import TrialSpec

    # The MLflow run is this driver's to end; a restarted worker group skips the steps recorded.
    spec = TrialSpec.of(name, cfg, run_id=run_id, tracking_uri=uri, skip_recorded=True,
                        outbox_dir=str(outbox.default_dir()), progress=name if progress else None,
                        wandb={"project": f"ladder-{name}", "name": run_dir.name} if wandb else None,
                        record_final=False, end_run=False)
    # The run folder's name is the Train run name, so fitting it again resumes it.
    return trainer(spec, workers=workers, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
                   name=run_dir.name, storage=str(run_dir.parent.parent / "ray"), max_failures=max_failures).fit()


def summary(result: RunResult) -> str:
    m = result.metrics
    lines = [f"{result.workload}: finished in {result.wall_s:.1f} s"]
    for key in ("train/loss", "eval/loss", "perf/tokens_per_s", "tau", "tpp"):
        if key in m:
            lines.append(f"  {key:<18} {m[key]:.4g}")
    lines.append(f"  run folder         {result.run_dir}")
    if result.mlflow_run_id:
        lines.append("  mlflow             " + tracking.run_link(result.mlflow_run_id, result.tracking_uri))
    return "\n".join(lines)


def eprint(*args: Any) -> None:
    print(*args, file=sys.stderr)
