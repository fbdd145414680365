"""What the tracking server has not acknowledged yet, kept on local disk until it has.

A run pointed at an MLflow server keeps training when the server goes away. Its metric points,
its final metrics and its end status are appended to one JSON-lines file per run in the outbox
folder (`./ladder-runs/outbox/<run_id>.jsonl` by default) from the moment a request fails, and
the file is delivered and removed when the server answers again: by the run itself, which
retries with a growing interval, or by `ladder sync` once the run has ended.

Requests to a server fail fast here (no retries inside MLflow, a short timeout): a server that
is down must cost the training loop one refused connection per retry, not MLflow's default of
several minutes of back-off.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

OUTBOX_DIR = "ladder-runs/outbox"
REQUEST_TIMEOUT_S = 5
"""Seconds a tracking request may take before the server counts as unreachable."""


def default_dir(base: str | os.PathLike | None = None) -> Path:
    return Path(base or os.getcwd()).resolve() / OUTBOX_DIR


def is_remote(uri: str | None) -> bool:
    return bool(uri) and uri.startswith(("http://", "https://"))


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` says the server could not be reached (as opposed to refusing the request)."""
    import requests

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError)):
            return True
        text = str(e)
        # MLflow wraps transport errors in an MlflowException carrying only their text.
        if "failed with exception" in text and ("Connection" in text or "Max retries exceeded" in text or "timed out" in text):
            return True
        if "TEMPORARILY_UNAVAILABLE" in text or "failed with error code 50" in text:
            return True  # a proxy in front of a server that is down, or a server starting up
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """MLflow requests inside this block give up after one try and a short timeout."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)}
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Outbox:
    """The undelivered records of one run: `metrics` batches, `final` metrics, `tags`, `end` status."""

    def __init__(self, folder: str | os.PathLike, run_id: str, uri: str) -> None:
        self.path = Path(folder) / f"{run_id}.jsonl"
        self.run_id = run_id
        self.uri = uri

    def append(self, kind: str, payload: Any, *, sync: bool = True) -> None:
        """Add a record; `sync=False` leaves it in the OS's hands (it survives the process, not
        the machine), for points spooled while the server answers."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"run_id": self.run_id, "uri": self.uri, "kind": kind, "payload": payload})
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            if sync:
                os.fsync(fh.fileno())

    def records(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash mid-write: its points were never acknowledged
        return out

    def max_step(self) -> int | None:
        steps = [p[3] for r in self.records() if r["kind"] == "metrics" for p in r["payload"]]
        return max(steps) if steps else None

    def points(self) -> int:
        return sum(len(r["payload"]) for r in self.records() if r["kind"] == "metrics")

    def deliver(self) -> int:
        """Send every record in order, then remove the file; returns the metric points sent.

        Raises when the server is still unreachable; the file is then left as it was. A batch that
        reached the server before a failure is sent again on the next try, which the server
        stores once: its points carry their original timestamps, and MLflow keys a metric point
        by (key, step, timestamp, value).
        """
        from mlflow.entities import Metric

        from orchestrator.tracking.mlflow_store import client, write_final

        records = self.records()
        if not records:
            self.path.unlink(missing_ok=True)
            return 0
        sent = 0
        with fail_fast():
            c = client(self.uri)
            waiting: list[Any] = []  # consecutive metric records go in batches of up to 900 points

            def send_waiting() -> None:
                for i in range(0, len(waiting), 900):
                    c.log_batch(self.run_id, metrics=waiting[i : i + 900])
                waiting.clear()

            for rec in records:
                kind, payload = rec["kind"], rec["payload"]
                if kind == "metrics":
                    waiting.extend(Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in payload)
                    sent += len(payload)
                    continue
                send_waiting()
                if kind == "final":
                    write_final(c, self.run_id, payload)
                elif kind == "tags":
                    for k, v in payload.items():
                        c.set_tag(self.run_id, k, str(v))
                elif kind == "end":
                    c.set_terminated(self.run_id, status=payload)
            send_waiting()
        self.path.unlink(missing_ok=True)
        return sent


def guarded(outbox_dir: str | os.PathLike | None, run_id: str, uri: str, kind: str, payload: Any, send) -> bool:
    """Call `send()`; when the server is unreachable, keep `payload` in the run's outbox instead.

    Returns whether it was delivered now. Records already waiting in the outbox go first, so the
    server sees them in the order they happened.
    """
    if not is_remote(uri) or outbox_dir is None:
        send()
        return True
    box = Outbox(outbox_dir, run_id, uri)
    try:
        with fail_fast():
            if box.path.is_file():
                box.deliver()
            send()
        return True
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        box.append(kind, payload)
        warn_kept(uri, f"{kind} of run {run_id}", box.path)
        return False


def warn_kept(uri: str, what: str, path: Path) -> None:
    from orchestrator.tracking.mlflow_store import warn

    warn(f"tracking server {uri} unreachable: {what} kept in {path}; send it with `ladder sync` when the server is back")


def pending(folder: str | os.PathLike | None = None) -> list[Outbox]:
    """The outboxes waiting in `folder` (default ./ladder-runs/outbox)."""
    root = Path(folder) if folder else default_dir()
    boxes = []
    for path in sorted(root.glob("*.jsonl")):
        recs = Outbox(root, path.stem, "").records()
        if recs:
            boxes.append(Outbox(root, path.stem, recs[0]["uri"]))
        else:
            path.unlink(missing_ok=True)
    return boxes


def sync(folder: str | os.PathLike | None = None, *, echo=print) -> int:
    """`ladder sync`: deliver every waiting outbox. Returns how many are still waiting."""
    boxes = pending(folder)
    if not boxes:
        echo(f"nothing to send: no outbox in {Path(folder) if folder else default_dir()}")
        return 0
    left = 0
    for box in boxes:
        n = box.points()
        started = time.monotonic()
        try:
            sent = box.deliver()
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            left += 1
            echo(f"run {box.run_id}: {box.uri} still unreachable; {n} points wait in {box.path}")
            continue
        echo(f"run {box.run_id}: sent {sent} points to {box.uri} in {time.monotonic() - started:.1f} s")
    return left


def metric_rows(metrics: list[Any]) -> list[list[Any]]:
    """MLflow Metric entities as JSON rows [key, value, timestamp, step]."""
    return [[m.key, m.value, m.timestamp, m.step] for m in metrics]


def as_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in tags.items()}
