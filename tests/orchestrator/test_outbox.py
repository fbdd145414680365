"""The outbox (`orchestrator.tracking.outbox`): what the tracking server has not acknowledged,
kept on disk and delivered later. Deliveries go to a real MLflow on SQLite; an unreachable server is
a loopback port where nothing listens (refused at once, no network)."""

from __future__ import annotations

import shutil

import pytest
import requests

from conftest import free_port
from orchestrator.tracking import outbox, sink as tracking
from orchestrator.tracking.outbox import Outbox, guarded, is_unreachable, pending, sync


@pytest.fixture(scope="module")
def store(tmp_path_factory, ladder_cache) -> str:
    root = tmp_path_factory.mktemp("outbox-store")
    uri = f"sqlite:///{root / 'm.db'}"
    tracking.client(uri).create_experiment("outbox", artifact_location=(root / "artifacts").as_uri())
    return uri


def _new_run(store: str) -> str:
    return tracking.start_run("outbox", run_name="r", tags={}, uri=store)


def _history(store: str, run_id: str, key: str = "train/loss") -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracking.client(store).get_metric_history(run_id, key))


def _down() -> str:
    """A tracking server that does not answer: a loopback port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"


def test_records_points_and_max_step_follow_the_appends(tmp_path):
    box = Outbox(tmp_path / "box", "run1", "http://tracking:5000")
    assert box.records() == [] and box.max_step() is None and box.points() == 0
    box.append("metrics", [["train/loss", 1.0, 1000, 1], ["progress", 0.1, 1000, 1]])
    box.append("tags", {"a": "b"})
    box.append("metrics", [["train/loss", 0.5, 2000, 7]], sync=False)
    box.append("end", "FINISHED")
    assert box.path == tmp_path / "box" / "run1.jsonl"
    assert [r["kind"] for r in box.records()] == ["metrics", "tags", "metrics", "end"]
    assert {r["run_id"] for r in box.records()} == {"run1"} and {r["uri"] for r in box.records()} == {"http://tracking:5000"}
    assert box.records()[1]["payload"] == {"a": "b"}
    assert box.points() == 3 and box.max_step() == 7


def test_a_line_cut_short_by_a_crash_is_skipped(tmp_path):
    box = Outbox(tmp_path, "run1", "http://tracking:5000")
    box.append("metrics", [["train/loss", 1.0, 1000, 3]])
    with open(box.path, "a") as fh:
        fh.write('{"run_id": "run1", "kind": "metr')
    assert len(box.records()) == 1 and box.max_step() == 3


def test_deliver_replays_every_record_in_order_and_removes_the_file(store, tmp_path):
    run_id = _new_run(store)
    box = Outbox(tmp_path, run_id, store)
    box.append("metrics", [["train/loss", 1.0, 1000, 1], ["train/loss", 0.5, 1001, 2]])
    box.append("tags", {"ladder.note": "kept"})
    box.append("metrics", [["train/loss", 0.25, 1002, 3]])
    box.append("final", {"train/loss": 0.25})
    box.append("end", "FINISHED")
    assert box.deliver() == 3
    assert not box.path.exists()
    assert _history(store, run_id) == [(1, 1.0), (2, 0.5), (3, 0.25)]
    run = tracking.client(store).get_run(run_id)
    assert run.data.tags["ladder.note"] == "kept" and run.info.status == "FINISHED"
    assert tracking.get_final(run, store) == {"train/loss": 0.25}
    # Delivered once: a second delivery has nothing to send and records nothing twice.
    assert box.deliver() == 0
    assert _history(store, run_id) == [(1, 1.0), (2, 0.5), (3, 0.25)]


def test_a_batch_delivered_twice_is_stored_once(store, tmp_path):
    """A delivery cut off after some batches reached the server sends them again on the next try;
    the points keep their timestamps, and the store keeps one of each."""
    run_id = _new_run(store)
    box = Outbox(tmp_path, run_id, store)
    box.append("metrics", [["train/loss", 1.0, 1000, 1], ["train/loss", 0.5, 1001, 2]])
    copy = tmp_path / "copy.jsonl"
    shutil.copy(box.path, copy)
    assert box.deliver() == 2
    shutil.copy(copy, box.path)
    assert box.deliver() == 2
    assert _history(store, run_id) == [(1, 1.0), (2, 0.5)]


def test_more_points_than_one_batch_holds_are_all_delivered(store, tmp_path):
    run_id = _new_run(store)
    box = Outbox(tmp_path, run_id, store)
    box.append("metrics", [["train/loss", float(s), 1000 + s, s] for s in range(1, 911)])
    assert box.deliver() == 910
    assert [s for s, _ in _history(store, run_id)] == list(range(1, 911))


def test_delivering_to_a_server_that_is_down_raises_and_keeps_the_file(tmp_path):
    box = Outbox(tmp_path, "run1", _down())
    box.append("metrics", [["train/loss", 1.0, 1000, 1]])
    before = box.path.read_text()
    with pytest.raises(Exception) as err:
        box.deliver()
    assert is_unreachable(err.value)
    assert box.path.read_text() == before


# ---------------------------------------------------------------- guarded sends

def test_guarded_keeps_the_record_when_the_server_is_unreachable(tmp_path, capsys):
    uri = _down()

    def send():
        raise requests.exceptions.ConnectionError("connection refused")

    assert guarded(tmp_path, "run1", uri, "end", "FINISHED", send) is False
    (record,) = Outbox(tmp_path, "run1", uri).records()
    assert record == {"run_id": "run1", "uri": uri, "kind": "end", "payload": "FINISHED"}
    err = capsys.readouterr().err
    assert f"tracking server {uri} unreachable: end of run run1 kept in {tmp_path / 'run1.jsonl'}" in err
    assert "ladder sync" in err


def test_guarded_sends_what_waits_first_and_keeps_the_new_record_after_it(tmp_path):
    """With records already waiting, a new one is sent only once they are: while the server stays
    down it goes to the outbox after them, in the order things happened."""
    uri = _down()
    box = Outbox(tmp_path, "run1", uri)
    box.append("metrics", [["train/loss", 1.0, 1000, 1]])
    sent = []
    assert guarded(tmp_path, "run1", uri, "final", {"train/loss": 1.0}, lambda: sent.append("final")) is False
    assert sent == []
    assert [r["kind"] for r in box.records()] == ["metrics", "final"]


def test_guarded_raises_what_is_not_unreachability(tmp_path):
    def send():
        raise ValueError("RESOURCE_DOES_NOT_EXIST: no run with id run1")

    with pytest.raises(ValueError, match="RESOURCE_DOES_NOT_EXIST"):
        guarded(tmp_path, "run1", _down(), "end", "FINISHED", send)
    assert not (tmp_path / "run1.jsonl").exists()


@pytest.mark.parametrize("outbox_dir_given, uri", [(True, "sqlite:///x.db"), (False, "http://127.0.0.1:9")])
def test_guarded_without_an_outbox_or_a_server_just_sends(tmp_path, outbox_dir_given, uri):
    """A local store has no outage to wait out, and no outbox folder means nowhere to keep it:
    the send happens as it is, errors included."""
    sent = []
    assert guarded(tmp_path if outbox_dir_given else None, "run1", uri, "end", "FINISHED", lambda: sent.append(1))
    assert sent == [1]

    def send():
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError):
        guarded(tmp_path if outbox_dir_given else None, "run1", uri, "end", "FINISHED", send)
    assert list(tmp_path.iterdir()) == []


def test_guarded_delivers_now_when_the_send_works(tmp_path):
    sent = []
    assert guarded(tmp_path, "run1", _down(), "tags", {"a": "b"}, lambda: sent.append(1)) is True
    assert sent == [1] and not (tmp_path / "run1.jsonl").exists()


# ---------------------------------------------------------------- what counts as unreachable

class MlflowLike(Exception):
    """MLflow's wrapping of a transport error: only its text survives."""


@pytest.mark.parametrize("exc", [
    requests.exceptions.ConnectionError("refused"),
    requests.exceptions.ReadTimeout("read timed out"),
    ConnectionRefusedError(111, "Connection refused"),
    TimeoutError("timed out"),
    MlflowLike("API request to http://h/api failed with exception HTTPConnectionPool: Max retries exceeded"),
    MlflowLike("API request to http://h/api failed with exception ReadTimeoutError: timed out"),
    MlflowLike("TEMPORARILY_UNAVAILABLE: the server is starting"),
    MlflowLike("API request to endpoint /api/2.0/mlflow/runs/log-batch failed with error code 503 != 200"),
])
def test_what_says_the_server_could_not_be_reached(exc):
    assert is_unreachable(exc)


@pytest.mark.parametrize("exc", [
    ValueError("RESOURCE_DOES_NOT_EXIST: run abc not found"),
    MlflowLike("API request to endpoint /api/2.0/mlflow/runs/get failed with error code 404 != 200"),
    MlflowLike("INVALID_PARAMETER_VALUE: Connection is a bad key"),  # the word alone is not an outage
    RuntimeError("failed"),
])
def test_what_says_the_server_refused_the_request(exc):
    assert not is_unreachable(exc)


def test_an_outage_wrapped_in_other_errors_is_found_through_the_chain():
    try:
        try:
            raise ConnectionRefusedError("refused")
        except ConnectionRefusedError as inner:
            raise RuntimeError("could not log") from inner
    except RuntimeError as outer:
        assert is_unreachable(outer)
    try:
        try:
            raise TimeoutError("slow")
        except TimeoutError:
            raise KeyError("while handling it")  # implicit context
    except KeyError as outer:
        assert is_unreachable(outer)


# ---------------------------------------------------------------- pending and sync

def test_pending_finds_the_outboxes_that_hold_records_and_drops_empty_files(tmp_path):
    Outbox(tmp_path, "b", "http://one:5000").append("end", "FINISHED")
    Outbox(tmp_path, "a", "http://two:5000").append("metrics", [["train/loss", 1.0, 1, 1]])
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "notes.txt").write_text("not an outbox")
    boxes = pending(tmp_path)
    assert [(b.run_id, b.uri) for b in boxes] == [("a", "http://two:5000"), ("b", "http://one:5000")]
    assert not (tmp_path / "empty.jsonl").exists() and (tmp_path / "notes.txt").exists()
    assert pending(tmp_path / "nowhere") == []


def test_pending_defaults_to_the_outbox_under_the_current_folder(workdir):
    Outbox(outbox.default_dir(), "r", "http://h:1").append("end", "KILLED")
    assert outbox.default_dir() == workdir.resolve() / "ladder-runs" / "outbox"
    assert [b.run_id for b in pending()] == ["r"]


def test_sync_delivers_what_waits_and_names_what_cannot_go_yet(store, tmp_path):
    run_id = _new_run(store)
    Outbox(tmp_path, run_id, store).append("metrics", [["train/loss", 0.5, 1000, 4], ["train/loss", 0.4, 1001, 5]])
    Outbox(tmp_path, run_id, store).append("end", "FINISHED")
    down = _down()
    Outbox(tmp_path, "zz-stuck", down).append("metrics", [["train/loss", 1.0, 1000, 1]])
    said: list[str] = []
    assert sync(tmp_path, echo=said.append) == 1  # one still waits
    assert _history(store, run_id) == [(4, 0.5), (5, 0.4)]
    assert tracking.client(store).get_run(run_id).info.status == "FINISHED"
    assert not (tmp_path / f"{run_id}.jsonl").exists() and (tmp_path / "zz-stuck.jsonl").exists()
    assert said[0].startswith(f"run {run_id}: sent 2 points to {store}")
    assert said[1] == f"run zz-stuck: {down} still unreachable; 1 points wait in {tmp_path / 'zz-stuck.jsonl'}"
    said.clear()
    assert sync(tmp_path / "empty", echo=said.append) == 0
    assert said == [f"nothing to send: no outbox in {tmp_path / 'empty'}"]
