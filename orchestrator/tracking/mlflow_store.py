"""The MLflow store underneath `orchestrator.tracking.sink` and `orchestrator.tracking.outbox`: where runs are
stored (the tracking URI), a client of it, the embedded SQLite store's fast creation, and how a
run's final metrics are written. Both modules build on this one; neither imports the other's
internals through it, so there is no import cycle between them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

DEFAULT_DB = "mlruns.db"
DEFAULT_ARTIFACTS = "mlartifacts"


def tracking_uri(base: str | os.PathLike | None = None) -> str:
    """`MLFLOW_TRACKING_URI` if set, else the SQLite store in `base` (default: the current folder)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    root = Path(base or os.getcwd()).resolve()
    return f"sqlite:///{root / DEFAULT_DB}"


def artifact_root(base: str | os.PathLike | None = None) -> str | None:
    """Absolute artifact location for new experiments on a local store; a server chooses its own."""
    uri = tracking_uri(base)
    if uri.startswith(("http://", "https://", "databricks")):
        return None
    return (Path(base or os.getcwd()).resolve() / DEFAULT_ARTIFACTS).as_uri()


def client(uri: str | None = None):
    import mlflow  # deferred: importing mlflow costs ~1 s and workloads never need it

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow prints "View run ... / View experiment ..." on stdout for every run ended on a server:
    # one pair per trial in a sweep's or a job's log. ladder prints the sweep's own address once.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        new_sqlite_store(Path(uri[len("sqlite:///"):]))
    return mlflow.MlflowClient(tracking_uri=uri)


def _store_template() -> Path:
    """An empty SQLite store migrated by the installed MLflow, kept in the ladder cache (built once,
    under a file lock, by whichever process needs it first)."""
    import mlflow
    from filelock import FileLock

    from components.cache import cache_root

    template = cache_root() / "mlflow" / f"empty-store-{mlflow.__version__}.db"
    if template.is_file():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(template) + ".lock"):
        if not template.is_file():
            part = template.with_name(f"{template.name}.{os.getpid()}.part")
            part.unlink(missing_ok=True)
            mlflow.MlflowClient(tracking_uri=f"sqlite:///{part}").search_experiments()  # creates and migrates it
            os.replace(part, template)
    return template


def new_sqlite_store(path: Path) -> None:
    """Create the SQLite store at `path` when it does not exist yet, as a copy of the migrated empty
    store in the cache: MLflow's own creation runs its whole migration history, 5-10 s on a small
    machine, at the first run in every new folder. The copy's Default experiment gets the artifact
    location MLflow itself would give it (`./mlruns/0` of this process). Anything unexpected leaves
    the store to MLflow, which then creates it as usual."""
    import shutil
    import sqlite3

    if path.exists() or not path.parent.is_dir():
        return
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        shutil.copyfile(_store_template(), part)
        now = int(time.time() * 1000)
        with sqlite3.connect(part) as db:
            db.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                       "WHERE experiment_id = 0", (str(Path.cwd().resolve() / "mlruns" / "0"), now, now))
        db.close()
        try:
            os.link(part, path)  # never replaces a store that another process created meanwhile
        except FileExistsError:
            pass
    except Exception:
        pass  # MLflow creates the store itself
    finally:
        part.unlink(missing_ok=True)


FINAL_TAG = "ladder.final"
FINAL_TAG_MAX = 5000  # MLflow caps a tag value at 8000 characters; larger finals live in final.json only


def write_final(c: Any, run_id: str, final: Mapping[str, float]) -> None:
    """Write a run's final metrics with the client `c`: `final.json`, and the tag when small."""
    text = json.dumps(dict(final))
    c.log_text(run_id, text, "final.json")
    c.set_tag(run_id, FINAL_TAG, text if len(text) <= FINAL_TAG_MAX else "final.json")


def warn(msg: str) -> None:
    print(f"ladder: {msg}", file=sys.stderr)
