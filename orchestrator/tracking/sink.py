"""MLflow tracking: the system of record for every run and sweep.

The embedded default is a SQLite store `./mlruns.db` with artifacts in `./mlartifacts`, both
resolved to absolute paths when a run starts (Ray workers and trials run in other folders, and
MLflow would otherwise put artifacts under Ray's temporary session folder). `MLFLOW_TRACKING_URI`
points everything at a server instead. Only the driver and rank 0 write.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from orchestrator.tracking.mlflow_store import (  # the store layer, re-exported: callers need only `tracking`
    DEFAULT_ARTIFACTS,
    DEFAULT_DB,
    FINAL_TAG,
    FINAL_TAG_MAX,
    artifact_root,
    client,
    new_sqlite_store,
    tracking_uri,
    warn,
    write_final,
)

def git_commit() -> str:
    """The commit of the ladder source tree in use, or 'unknown' outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _git(folder: Path, *args: str) -> str | None:
    """`git -C folder ARGS`'s output, or None when git is missing, slow or says no. Read-only: no
    optional locks (`git status` would otherwise refresh the index of a checkout someone works in)."""
    try:
        out = subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def source_provenance(source: str) -> dict[str, str]:
    """Where the code at `source` (a module's file, or a package's folder) comes from, as run tags:
    `workload.source` (the path), and when it lies in a git checkout `workload.git.commit` (the
    checkout's HEAD, with '-dirty' when a tracked file differs from it or a .py file of `source`
    is not tracked: code the commit does not hold) and `workload.git.path` (`source` inside the
    checkout). Read once per process: what a process imported does not change under it."""
    path = Path(source).resolve()
    tags = {"workload.source": str(path)}
    folder = path if path.is_dir() else path.parent
    head = _git(folder, "rev-parse", "--show-toplevel", "HEAD")
    lines = head.split() if head else []
    if len(lines) != 2:  # not a checkout, or one without a commit yet
        return tags
    root, commit = Path(lines[0]), lines[1]
    changed = _git(folder, "status", "--porcelain", "--untracked-files=no")
    untracked = _git(folder, "ls-files", "--others", "--exclude-standard", "--", str(path))
    dirty = changed is None or bool(changed.strip()) or any(
        line.endswith(".py") for line in (untracked or "").splitlines())
    tags["workload.git.commit"] = commit + ("-dirty" if dirty else "")
    try:
        tags["workload.git.path"] = path.relative_to(root.resolve()).as_posix() or "."
    except ValueError:
        pass
    return tags


def ladder_version() -> str:
    try:
        from importlib.metadata import version

        return version("ladder")
    except Exception:
        return "unknown"


EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
"""MLflow's experiment kind for model training: its UI shows such an experiment's runs, metrics
and charts (its "Machine learning" view), not the GenAI view of traces and evaluations."""


def ensure_experiment(name: str, uri: str | None = None, base: str | os.PathLike | None = None) -> str:
    """Id of the experiment `name`, created (with an absolute artifact root, of MLflow's
    model-training kind) when missing."""
    c = client(uri)
    found = c.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            c.restore_experiment(found.experiment_id)
        if not found.tags.get("mlflow.experimentKind"):  # made by an earlier ladder; a kind chosen in the UI stays
            for key, value in EXPERIMENT_KIND.items():
                c.set_experiment_tag(found.experiment_id, key, value)
        return found.experiment_id
    root = artifact_root(base) if (uri is None or uri.startswith("sqlite")) else None
    try:
        return c.create_experiment(name, artifact_location=root, tags=EXPERIMENT_KIND)
    except Exception:
        # Another process created it between our lookup and create.
        found = c.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


UI_PAGE = "#/experiments?workflowType=machine_learning"
"""The MLflow UI's experiment list in its model-training view (MLflow 3's UI starts in its GenAI
view, whatever an experiment's kind, until the GenAI/ML switch is flipped in that browser)."""


def ui_command(uri: str, host: str, port: int, *, base: str | os.PathLike | None = None) -> tuple[list[str], dict[str, str]]:
    """The command serving the MLflow UI on the local store `uri`, and its environment.

    MLflow's web app runs under uvicorn with one worker, in one process started directly: `mlflow
    ui` would first import MLflow's whole command line (half of the start-up on 2 cores) and stay
    beside the server as a second process of ~250 MB. The server reads its store from the
    variables `mlflow ui` sets, whose names come from MLflow's own `server/constants.py`; an
    MLflow without that file gets `mlflow server` instead. No GenAI job runners (scorers, trace
    jobs): a training store has no use for them."""
    import importlib.util
    import runpy

    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    root = artifact_root(base)
    package = Path(importlib.util.find_spec("mlflow").origin).parent  # found, not imported: that costs seconds
    constants = package / "server" / "constants.py"
    names = runpy.run_path(str(constants)) if constants.is_file() else {}
    keys = ("BACKEND_STORE_URI_ENV_VAR", "ARTIFACT_ROOT_ENV_VAR", "SERVE_ARTIFACTS_ENV_VAR", "ARTIFACTS_DESTINATION_ENV_VAR")
    if not all(isinstance(names.get(k), str) for k in keys):
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host, "--port", str(port),
               "--workers", "1"]
        return cmd + (["--default-artifact-root", root] if root else []), env
    env[names["BACKEND_STORE_URI_ENV_VAR"]] = uri
    env[names["SERVE_ARTIFACTS_ENV_VAR"]] = "true"
    if root:
        env[names["ARTIFACT_ROOT_ENV_VAR"]] = root
        env[names["ARTIFACTS_DESTINATION_ENV_VAR"]] = root
    cmd = [sys.executable, "-m", "uvicorn", "--host", host, "--port", str(port), "--workers", "1", "--no-access-log"]
    log_config = package / "server" / "uvicorn_log_config.yaml"
    if log_config.is_file():
        cmd += ["--log-config", str(log_config)]
    return cmd + ["mlflow.server.fastapi_app:app"], env


class TrackingError(RuntimeError):
    """Tracking cannot start as asked (a server that does not answer, wandb missing); the message names the fix."""


class TrackingUnavailable(TrackingError):
    """The tracking server does not answer when a run or sweep is about to start."""


def start_run(
    experiment: str,
    *,
    run_name: str,
    tags: Mapping[str, str],
    params: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
    uri: str | None = None,
) -> str:
    """Create an MLflow run (child of `parent_run_id` when given) and return its id."""
    from mlflow.entities import Param, RunTag

    c = client(uri)
    try:
        from orchestrator.tracking.outbox import fail_fast

        with fail_fast():
            exp_id = ensure_experiment(experiment, uri)
    except Exception as exc:
        from orchestrator.tracking.outbox import is_unreachable

        if is_unreachable(exc):
            raise TrackingUnavailable(
                f"the MLflow tracking server {uri or tracking_uri()} does not answer: start it, or unset "
                "MLFLOW_TRACKING_URI to record into ./mlruns.db"
            ) from exc
        raise
    all_tags = {
        "ladder.version": ladder_version(),
        "git.commit": git_commit(),
        "mlflow.runName": run_name,
        **tags,
    }
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = c.create_run(exp_id, run_name=run_name, tags=all_tags)
    if params:
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            c.log_batch(run.info.run_id, params=items[i : i + 100], tags=[RunTag("ladder.params", "1")])
    return run.info.run_id


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A write to the store that Ctrl-C does not cut in half: a SIGINT that arrives during it is held,
    and delivered (to whatever handler was installed) once the write is done.

    A KeyboardInterrupt raised inside a SQLite write can leave its connection holding the
    database's write lock; the run's own end (KILLED) then waited for that lock until SQLite gave
    up ("database is locked", a minute later). Signals reach only the main thread: elsewhere, and
    where SIGINT is ignored, this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)


def end_run(run_id: str, status: str = "FINISHED", uri: str | None = None, *, outbox_dir: str | os.PathLike | None = None) -> None:
    """Mark the run ended; with `outbox_dir`, an unreachable server gets the status later (`ladder sync`)."""
    from orchestrator.tracking.outbox import guarded

    uri = uri or tracking_uri()
    with uninterrupted():
        guarded(outbox_dir, run_id, uri, "end", status, lambda: client(uri).set_terminated(run_id, status=status))


def set_tags(run_id: str, tags: Mapping[str, str], uri: str | None = None) -> None:
    c = client(uri)
    for k, v in tags.items():
        c.set_tag(run_id, k, str(v))


def log_text(run_id: str, text: str, artifact_file: str, uri: str | None = None) -> None:
    client(uri).log_text(run_id, text, artifact_file)


def set_final(run_id: str, final: Mapping[str, float], uri: str | None = None, *, outbox_dir: str | os.PathLike | None = None) -> None:
    """Record a run's final metrics (what `train` returned): `final.json`, and a tag when small.

    With `outbox_dir`, an unreachable server gets them later, from the run's outbox."""
    if outbox_dir is not None:
        from orchestrator.tracking.outbox import guarded

        uri = uri or tracking_uri()
        guarded(outbox_dir, run_id, uri, "final", dict(final), lambda: set_final(run_id, final, uri))
        return
    with uninterrupted():
        write_final(client(uri), run_id, final)


def get_final(run: Any, uri: str | None = None, *, mlflow_client: Any = None) -> dict[str, float] | None:
    """The final metrics `set_final` recorded on an MLflow run (an entity from search_runs), or None."""
    tag = run.data.tags.get(FINAL_TAG)
    if tag is None:
        return None
    if tag != "final.json":
        return json.loads(tag)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ladder-final-") as tmp:
        path = (mlflow_client or client(uri)).download_artifacts(run.info.run_id, "final.json", tmp)
        with open(path) as fh:
            return json.load(fh)


def last_recorded_step(run_id: str, uri: str | None = None) -> int | None:
    """The highest step any metric of the run has recorded (None for a run with no metrics)."""
    c = client(uri)
    keys = list(c.get_run(run_id).data.metrics)
    steps = [m.step for key in keys for m in c.get_metric_history(run_id, key)]
    return max(steps) if steps else None


def run_link(run_id: str, uri: str | None = None) -> str:
    """Where to find a run: the URL on a server, the store and ids on a local store."""
    from orchestrator.tracking.outbox import fail_fast, is_unreachable

    store = uri or tracking_uri()
    c = client(uri)
    try:
        with fail_fast():
            run = c.get_run(run_id)
            exp = c.get_experiment(run.info.experiment_id)
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        return f"run {run_id} on {store} (unreachable now: what it could not send waits for `ladder sync`)"
    if store.startswith(("http://", "https://")):
        return f"{store.rstrip('/')}/#/experiments/{exp.experiment_id}/runs/{run_id}"
    return f"experiment {exp.name!r} (id {exp.experiment_id}), run {run_id} in {store} — open it with `ladder ui`"


class MlflowSink:
    """Buffers step metrics and writes them to one MLflow run in batches.

    Batching keeps tracking off the training loop's critical path: one `log_batch` per
    `flush_every_s` seconds (and at every checkpoint and at the end) instead of one request per
    metric per step. When the run records to a server and the server stops answering, training
    goes on: undelivered points go to the run's outbox on disk (`orchestrator.tracking.outbox`), the
    console says so once, and the sink retries at a growing interval (up to a minute) until the
    server is back, then delivers everything and says so.

    With `spool=True` (sweep trials) every point also goes to the run's outbox file as it is
    reported, until it is sent: a trial that Tune stops between two flushes ends with its
    process, and the driver then delivers what its outbox holds (`deliver_leftovers`), so that a
    stopped, failed or killed trial keeps every point it reported.
    """

    RETRY_MAX_S = float(os.environ.get("LADDER_TRACKING_RETRY_MAX_S", "60"))
    """Longest wait between two tries to reach a server that stopped answering."""

    def __init__(
        self,
        run_id: str,
        uri: str | None = None,
        *,
        flush_every_s: float = 5.0,
        skip_through: int | None = None,
        outbox_dir: str | os.PathLike | None = None,
        spool: bool = False,
    ) -> None:
        from orchestrator.tracking import outbox

        self.run_id = run_id
        self.uri = uri or tracking_uri()
        self.flush_every_s = flush_every_s
        # A resumed run replays the steps between its checkpoint and the crash; the points the
        # crashed attempt already recorded are kept and the replayed ones dropped, so each step
        # is in the store exactly once.
        self.skip_through = skip_through
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._client = client(self.uri)
        self.spool = bool(spool and outbox_dir)
        self._box = (outbox.Outbox(outbox_dir, run_id, self.uri)
                     if outbox_dir and (self.spool or outbox.is_remote(self.uri)) else None)
        self._spooled = 0  # how many of self._buffer are already in the outbox file
        self._down_since: float | None = None
        self._retry_s = min(flush_every_s, self.RETRY_MAX_S)
        if self._box is not None and self._box.path.is_file():
            # An earlier attempt of this run left points undelivered: they go first, and a replay
            # of their steps must not record them twice (delivered now or later).
            waiting = self._box.max_step()
            try:
                with outbox.fail_fast():
                    self._box.deliver()
            except Exception as exc:
                if not outbox.is_unreachable(exc):
                    raise
                self._went_down(exc)
            if waiting is not None:
                self.skip_through = max(waiting, self.skip_through if self.skip_through is not None else waiting)

    @property
    def unreachable(self) -> bool:
        return self._down_since is not None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if self.skip_through is not None and step <= self.skip_through:
            return
        now_ms = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now_ms, int(step)) for k, v in metrics.items())
        if self.spool and not self.unreachable:
            self._spool(sync=False)
        if self.unreachable:
            self._spool()  # on disk at once: a crash during the outage loses nothing reported
            if time.monotonic() - self._last_flush > self._retry_s:
                self.flush()
        elif len(self._buffer) >= 900 or time.monotonic() - self._last_flush > self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        from orchestrator.tracking import outbox

        if self._box is None:
            self._send_buffer()
            self._last_flush = time.monotonic()
            return
        self._last_flush = time.monotonic()
        try:
            with outbox.fail_fast():
                if self._box.path.is_file():
                    self._box.deliver()  # the outage's points, in order, before the newer ones
                # The spooled points went with the outbox (or `ladder sync` already sent them).
                self._buffer, self._spooled = self._buffer[self._spooled :], 0
                self._send_buffer()
        except Exception as exc:
            if not outbox.is_unreachable(exc):
                raise
            self._spool()
            self._went_down(exc)
            return
        if self._down_since is not None:
            warn(f"tracking server {self.uri} is back after {time.monotonic() - self._down_since:.0f} s: "
                 f"the points kept meanwhile are recorded")
        self._down_since = None
        self._retry_s = min(self.flush_every_s, self.RETRY_MAX_S)

    def _send_buffer(self) -> None:
        while self._buffer:
            chunk = self._buffer[:900]
            with uninterrupted():
                self._client.log_batch(self.run_id, metrics=chunk)
                self._buffer = self._buffer[900:]

    def _spool(self, sync: bool = True) -> None:
        from orchestrator.tracking.outbox import metric_rows

        if self._box is not None and self._spooled < len(self._buffer):
            self._box.append("metrics", metric_rows(self._buffer[self._spooled :]), sync=sync)
            self._spooled = len(self._buffer)

    def _went_down(self, exc: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            warn(f"tracking server {self.uri} unreachable ({first}); training goes on, metrics are kept in "
                 f"{self._box.path if self._box else 'memory'} and sent when it is back (or with `ladder sync`)")
        else:
            self._retry_s = min(self.RETRY_MAX_S, self._retry_s * 2)

    def log_artifact(self, path: str) -> None:
        self._client.log_artifact(self.run_id, path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from orchestrator.tracking import outbox

        def send() -> None:
            with uninterrupted():
                for k, v in tags.items():
                    self._client.set_tag(self.run_id, k, str(v))

        if self._box is None:
            send()
        else:
            outbox.guarded(self._box.path.parent, self.run_id, self.uri, "tags", outbox.as_tags(tags), send)


def deliver_leftovers(outbox_dir: str | os.PathLike | None, run_id: str, uri: str | None = None) -> int:
    """Send what an ended run's outbox still holds (the points a stopped or killed trial had not
    flushed); returns the points sent. A point sent twice is stored once (MLflow keys a point by
    key, step, timestamp and value). A server that does not answer leaves them for `ladder sync`."""
    from orchestrator.tracking import outbox

    if outbox_dir is None:
        return 0
    box = outbox.Outbox(outbox_dir, run_id, uri or tracking_uri())
    if not box.path.is_file():
        return 0
    try:
        return box.deliver()
    except Exception as exc:
        if not outbox.is_unreachable(exc):
            raise
        outbox.warn_kept(box.uri, f"points of run {run_id}", box.path)
        return 0


class WandbSink:
    """Optional second logger. Honours `WANDB_MODE` (use `offline` without an account)."""

    def __init__(self, project: str, name: str, config: Mapping[str, Any], *, group: str | None = None) -> None:
        try:
            import wandb
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise RuntimeError("wandb logging asked for but wandb is not installed: pip install 'ladder[wandb]'") from exc
        self._wandb = wandb
        self._run = wandb.init(project=project, name=name, group=group, config=dict(config), reinit="create_new")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=int(step))

    def flush(self) -> None:
        pass

    def log_artifact(self, path: str) -> None:
        self._run.save(path, base_path=str(Path(path).parent))

    def finish(self) -> None:
        self._run.finish()


def check_wandb() -> None:
    """Refuse --wandb before anything starts when wandb is not installed."""
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        raise TrackingError("--wandb needs wandb: pip install 'ladder[wandb]' (set WANDB_MODE=offline without an account)")


def finish_quietly(sinks: list[Any]) -> None:
    """End the wandb runs among `sinks`; a failure to is reported, never raised over the run's own outcome."""
    for sink in sinks:
        if isinstance(sink, WandbSink):
            try:
                sink.finish()
            except Exception as exc:
                warn(f"could not finish the wandb run ({type(exc).__name__}: {exc})")
