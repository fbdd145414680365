from __future__ import annotations

import math

import pytest

from orchestrator.run import LocalRun, MetricError, Run, check_metrics


def test_local_run_satisfies_the_protocol(tmp_path):
    assert isinstance(LocalRun(tmp_path), Run)


def test_metrics_must_be_namespaced():
    with pytest.raises(MetricError, match="not namespaced"):
        check_metrics({"loss": 1.0})
    assert check_metrics({"train/loss": 1, "progress": 0.5}) == {"train/loss": 1.0, "progress": 0.5}


def test_progress_outside_unit_interval_is_refused():
    with pytest.raises(MetricError, match="progress"):
        check_metrics({"progress": 1.5})


def test_nan_is_recorded_not_dropped(tmp_path):
    run = LocalRun(tmp_path)
    run.report({"train/loss": float("nan")}, step=3)
    assert math.isnan(run.last("train/loss")) and run.history[0][0] == 3


def test_save_then_restore_in_a_new_run(tmp_path):
    LocalRun(tmp_path).save({"step": 7, "x": 1})
    again = LocalRun(tmp_path)
    assert again.restore() == {"step": 7, "x": 1} and again.restored_step == 7
