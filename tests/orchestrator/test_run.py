from __future__ import annotations

import math

import pytest

from orchestrator.run import LocalRun, MetricError, Run, check_metrics, fraction_steps, pinned_threads


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


def test_fraction_steps_land_on_every_multiple_and_the_last_step():
    assert fraction_steps(10, 0.25) == {2, 5, 8, 10}  # 2.5 and 7.5 round to even
    assert fraction_steps(100, 0.3) == {30, 60, 90, 100}
    assert fraction_steps(3, 0.1) == {1, 2, 3}  # never before step 1, one entry per distinct step
    assert fraction_steps(7, 0) == {7}


def test_pinned_threads_restores_the_setting_also_when_the_block_raises():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with pytest.raises(RuntimeError):
            with pinned_threads(1):
                assert torch.get_num_threads() == 1
                raise RuntimeError("inside")
        assert torch.get_num_threads() == 3
        with pinned_threads(0):  # 0 leaves torch's setting
            assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
