"""A local run lands in the embedded MLflow store with params, step metrics, tags and config."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from orchestrator.runners import launch, registry
from orchestrator.tracking import sink as tracking


@pytest.mark.slow
def test_local_run_is_recorded(workdir):
    w = registry.load("celerity_lm")
    result = launch.run_local("celerity_lm", w.smoke(), progress=False)
    assert result.tracking_uri == f"sqlite:///{workdir / 'mlruns.db'}"
    c = tracking.client(result.tracking_uri)
    run = c.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["width"] == "48" and run.data.params["tpp"] == "4.0"
    tags = run.data.tags
    assert tags["workload"] == "celerity_lm" and tags["paper"].startswith("Scaling with Collapse")
    assert len(tags["git.commit"]) in (40, 7) or tags["git.commit"] == "unknown"
    history = c.get_metric_history(result.mlflow_run_id, "train/loss")
    steps = [m.step for m in history]
    assert steps == sorted(set(steps)) and len(steps) == len([1 for s, m in result.history if "train/loss" in m])
    # It trained. margin: last/first train/loss worst 0.507 over seeds 1-5 (0.496, 0.498, 0.507, 0.481,
    # 0.486; seed 0: 0.513), threshold 0.7.
    assert history[-1].value < 0.7 * history[0].value
    # Artifacts live in ./mlartifacts, not in a temporary folder.
    exp = c.get_experiment(run.info.experiment_id)
    assert exp.artifact_location == (workdir / "mlartifacts").as_uri()
    local = c.download_artifacts(result.mlflow_run_id, "config.json", str(workdir))
    assert json.loads(Path(local).read_text())["width"] == 48


def test_tracking_uri_env_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking.tracking_uri(tmp_path) == "http://127.0.0.1:5999"
    assert tracking.artifact_root(tmp_path) is None
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlruns.db'}"


@pytest.mark.slow
def test_wandb_offline_second_logger(workdir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(workdir))
    w = registry.load("celerity_lm")
    launch.run_local("celerity_lm", w.smoke(), progress=False, wandb=True)
    runs = list((workdir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert any(p.suffix == ".wandb" and p.stat().st_size > 1000 for p in runs[0].iterdir())


@pytest.mark.slow
def test_runs_reach_an_mlflow_server_when_pointed_at_one(workdir, monkeypatch):
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from conftest import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    server = subprocess.Popen(["bash", str(REPO / "infra/mlflow/server.sh"), str(workdir / "srv"), str(port)],
                              cwd=workdir, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).read() == b"OK":
                    break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "server did not come up"
                time.sleep(0.5)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        result = launch.run_local("celerity_lm", registry.load("celerity_lm").smoke(), progress=False)
        assert result.tracking_uri == url
        c = tracking.client(url)
        assert c.get_run(result.mlflow_run_id).info.status == "FINISHED"
        assert len(c.get_metric_history(result.mlflow_run_id, "train/loss")) > 10
        assert not (workdir / "mlruns.db").exists()  # nothing went to the embedded store
        assert list((workdir / "srv" / "artifacts").rglob("config.json"))  # artifacts on the server's store
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.parametrize("keys", [3, 400])
def test_final_metrics_round_trip_past_the_tag_limit(workdir, keys):
    """A run's final metrics come back whole, also when they are too long for an MLflow tag."""
    uri = tracking.tracking_uri()
    run_id = tracking.start_run("finals", run_name="r", tags={}, uri=uri)
    final = {f"eval/rel_mse/some_long_tensor_name/b{i}": 1.0 / (i + 1) for i in range(keys)}
    tracking.set_final(run_id, final, uri=uri)
    run = tracking.client(uri).get_run(run_id)
    assert tracking.get_final(run, uri) == final
    assert (run.data.tags[tracking.FINAL_TAG] == "final.json") == (keys == 400)


def _schema(db: Path) -> tuple[list, list]:
    import sqlite3

    with sqlite3.connect(db) as con:
        # Each statement as the set of its lines: MLflow's migrations recreate tables with their
        # constraints in an order that differs from one process to the next (two stores MLflow
        # made itself differ so), which changes nothing in the schema.
        tables = sorted(((kind, name, tuple(sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())))
                         for kind, name, sql in con.execute("SELECT type, name, sql FROM sqlite_master")), key=str)
        version = con.execute("SELECT version_num FROM alembic_version").fetchall()
    con.close()
    return tables, version


def test_a_new_sqlite_store_is_a_copy_of_the_migrated_empty_one(workdir, ladder_cache):
    """A first run in a new folder starts from the empty store in the cache, not from MLflow's
    whole migration history; the store is the one MLflow itself makes, and one already there is
    never replaced."""
    import mlflow

    made_by_mlflow = workdir / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{made_by_mlflow}").search_experiments()
    c = tracking.client(tracking.tracking_uri())
    ours = workdir / tracking.DEFAULT_DB
    template = ladder_cache / "mlflow" / f"empty-store-{mlflow.__version__}.db"
    assert ours.is_file() and template.is_file()
    assert _schema(ours) == _schema(made_by_mlflow)
    (default,) = c.search_experiments()
    assert default.name == "Default" and default.artifact_location == str(workdir / "mlruns" / "0")
    run_id = tracking.start_run("store", run_name="r", tags={"workload": "curves"}, params={"lr": "0.1"})
    sink = tracking.MlflowSink(run_id, tracking.tracking_uri())
    sink.log_metrics({"train/loss": 1.5}, step=3)
    sink.flush()
    tracking.end_run(run_id, "FINISHED")
    assert [(m.step, m.value) for m in c.get_metric_history(run_id, "train/loss")] == [(3, 1.5)]
    # A store that exists is left as it is.
    before = ours.read_bytes()
    tracking.new_sqlite_store(ours)
    assert ours.read_bytes() == before


def test_experiments_are_of_mlflows_model_training_kind(workdir):
    """MLflow 3's UI opens an experiment without a kind in its GenAI view (traces); ladder's are
    training experiments. One made before gets the kind; one whose kind was chosen in the UI keeps it."""
    uri = tracking.tracking_uri()
    c = tracking.client(uri)
    tracking.start_run("made_now", run_name="r", tags={}, uri=uri)
    assert c.get_experiment_by_name("made_now").tags["mlflow.experimentKind"] == "custom_model_development"
    older = c.create_experiment("made_before")
    chosen = c.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development"})
    tracking.start_run("made_before", run_name="r", tags={}, uri=uri)
    tracking.start_run("chosen", run_name="r", tags={}, uri=uri)
    assert c.get_experiment(older).tags["mlflow.experimentKind"] == "custom_model_development"
    assert c.get_experiment(chosen).tags["mlflow.experimentKind"] == "genai_development"


def test_ctrl_c_during_a_store_write_is_delivered_after_it():
    """`uninterrupted`: a SIGINT that arrives during a write is held until the write is done, then
    reaches the handler that was installed (Python's: KeyboardInterrupt), which is restored."""
    import signal

    # Python's own handler, as a command has it (a pytest-xdist worker ignores SIGINT).
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = []
        with pytest.raises(KeyboardInterrupt):
            with tracking.uninterrupted():
                signal.raise_signal(signal.SIGINT)
                done.append("the write went on past the signal")
        assert done and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with tracking.uninterrupted():  # no signal, nothing raised
            done.append("a plain write")
        assert len(done) == 2
        # Where SIGINT is ignored, a write changes nothing: the signal stays ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with tracking.uninterrupted():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)
