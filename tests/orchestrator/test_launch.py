"""Launching one run (`orchestrator.runners.launch`) without Ray: the resource check that refuses
a launch Ray would wait on forever, the run folder and its record, and a local run of the tiny
workload (tests/orchestrator/fake_workload.py) that writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.run.checkpoints import CheckpointMismatch
from orchestrator.runners import launch, registry
from orchestrator.runners.config import ConfigError, to_dict
from orchestrator.runners.launch import ResourceError, check_resources, load_run_record, local_cpus, new_run_dir

NAME = "tests.orchestrator.fake_workload"


# ---------------------------------------------------------------- resources

def test_more_cpus_than_the_machine_has_are_refused_with_the_fix():
    with pytest.raises(ResourceError) as err:
        check_resources(3, 1.5, available=4)
    msg = str(err.value)
    assert "3 workers x 1.5 CPU need 4.5 CPUs" in msg
    assert "this machine (local Ray) has 4." in msg
    assert "Use --workers 2 or fewer" in msg  # 2 x 1.5 fits in 4
    assert "--cpus-per-worker" in msg and "RAY_ADDRESS" in msg


def test_exactly_enough_cpus_are_accepted():
    check_resources(2, 2.0, available=4)
    check_resources(3, 0.1, available=0.3)  # 3 x 0.1 is 0.30000000000000004 in floats
    check_resources(1, 4.0, available=4)


def test_the_refusal_names_where_it_looked():
    with pytest.raises(ResourceError, match=r"need 16 CPUs, but the Ray cluster at RAY_ADDRESS has 8\. Use --workers 4"):
        check_resources(8, 2, available=8, where="the Ray cluster at RAY_ADDRESS")


def test_one_worker_larger_than_the_machine_is_refused():
    with pytest.raises(ResourceError, match=r"1 worker x 8 CPU need 8 CPUs, but this machine \(local Ray\) has 2\. "
                       r"Use --cpus-per-worker 2 or less"):
        check_resources(1, 8, available=2)


@pytest.mark.parametrize("workers, cpus, match", [(0, 1.0, "--workers must be at least 1, got 0"),
                                                  (2, 0.0, "--cpus-per-worker must be positive, got 0")])
def test_nonsense_requests_are_refused(workers, cpus, match):
    with pytest.raises(ResourceError, match=match):
        check_resources(workers, cpus, available=64)


def test_the_machine_size_comes_from_ladder_num_cpus(monkeypatch):
    monkeypatch.setenv("LADDER_NUM_CPUS", "3")
    assert local_cpus() == 3.0
    check_resources(3, 1.0)  # against LADDER_NUM_CPUS when no `available` is given
    with pytest.raises(ResourceError, match="has 3"):
        check_resources(2, 2.0)
    monkeypatch.delenv("LADDER_NUM_CPUS")
    import os

    assert local_cpus() == float(os.cpu_count() or 1)


# ---------------------------------------------------------------- run folders and records

def test_a_new_run_dir_is_a_fresh_absolute_folder_under_ladder_runs(tmp_path):
    first, second = new_run_dir("wl", tmp_path), new_run_dir("wl", tmp_path)
    assert first != second
    for d in (first, second):
        assert d.is_absolute() and d.parent == tmp_path.resolve() / "ladder-runs" / "wl"
        assert not d.exists()  # a name only; the run creates it


def test_a_run_dir_defaults_to_the_current_folder(workdir):
    assert new_run_dir("wl").parent == workdir.resolve() / "ladder-runs" / "wl"


def test_a_folder_without_a_record_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_run_record(tmp_path)
    assert f"cannot resume {str(tmp_path)!r}: no run.json there" in str(err.value)
    assert "ladder-runs" in str(err.value)


def test_a_local_run_returns_its_metrics_and_writes_its_record(workdir):
    w = registry.load(NAME)
    cfg = w.Config(steps=4, widths=(2, 3))
    result = launch.run_local(w, cfg, track=False, progress=False)
    assert result.workload == NAME and result.mlflow_run_id is None and result.tracking_uri is None
    assert result.metrics["train/loss"] == pytest.approx(0.25) and result.metrics["started_at"] == 1.0
    assert [step for step, _ in result.history] == [1, 2, 3, 4]
    assert result.run_dir.parent == workdir.resolve() / "ladder-runs" / NAME
    record = load_run_record(result.run_dir)
    assert record == {"workload": NAME, "config": json.loads(json.dumps(to_dict(cfg))), "mlflow_run_id": None,
                      "tracking_uri": None, "mode": "local", "workers": 1}
    assert (result.run_dir / "checkpoints").is_dir()
    assert not (workdir / "mlruns.db").exists()  # track=False records nothing in MLflow


def test_a_local_run_accepts_a_workload_name(workdir):
    result = launch.run_local(NAME, registry.load(NAME).Config(steps=2), track=False, progress=False)
    assert result.metrics["train/loss"] == 0.5


def test_a_resumed_local_run_continues_from_its_checkpoint_with_the_recorded_config(workdir):
    w = registry.load(NAME)
    first = launch.run_local(w, w.Config(steps=3), track=False, progress=False)
    # The config passed in is ignored for a resumed run: the recorded one (steps=3) continues
    # after its last checkpoint (step 3), so nothing is trained again.
    again = launch.run_local(w, w.Config(steps=10), resume=first.run_dir, track=False, progress=False)
    assert again.run_dir == first.run_dir.resolve()
    assert again.metrics["started_at"] == 4.0 and again.history == []


def test_resuming_a_folder_whose_checkpoints_belong_to_another_config_is_refused(workdir):
    w = registry.load(NAME)
    first = launch.run_local(w, w.Config(steps=3), track=False, progress=False)
    record = json.loads((first.run_dir / "run.json").read_text())
    record["config"]["steps"] = 5
    (first.run_dir / "run.json").write_text(json.dumps(record))
    with pytest.raises(CheckpointMismatch):
        launch.run_local(w, w.Config(), resume=first.run_dir, track=False, progress=False)


def test_resuming_another_workloads_run_names_both(workdir):
    w = registry.load(NAME)
    run_dir = workdir / "other"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"workload": "curves", "config": to_dict(w.Config())}))
    with pytest.raises(ConfigError, match=rf"is a run of 'curves', not '{NAME}'"):
        launch._prepare(w, w.Config(), run_dir, False, "local", {})
    # run_local reads the record before _prepare does: the same message, not an unknown field of curves'.
    (run_dir / "run.json").write_text(json.dumps({"workload": "curves", "config": {"best_lr": 0.01}}))
    with pytest.raises(ConfigError, match=rf"is a run of 'curves', not '{NAME}'"):
        launch.run_local(w, w.Config(), resume=run_dir, track=False, progress=False)
