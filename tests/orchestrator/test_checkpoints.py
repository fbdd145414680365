from __future__ import annotations

import pytest
import torch

from orchestrator.run import checkpoints


def test_newest_checkpoint_wins_and_old_ones_are_pruned(tmp_path):
    for step in (10, 20, 30):
        checkpoints.write_checkpoint(tmp_path, {"step": step, "w": torch.full((2,), float(step))}, keep=2)
    files = checkpoints.list_checkpoints(tmp_path)
    assert [checkpoints._step_of(p) for p in files] == [20, 30]
    state = checkpoints.load_latest(tmp_path)
    assert state["step"] == 30 and torch.equal(state["w"], torch.full((2,), 30.0))
    assert not list(tmp_path.glob(".tmp-*"))


def test_truncated_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    checkpoints.write_checkpoint(tmp_path, {"step": 1, "w": torch.ones(1000)}, keep=3)
    newest = checkpoints.write_checkpoint(tmp_path, {"step": 2, "w": torch.ones(1000)}, keep=3)
    newest.write_bytes(newest.read_bytes()[:100])
    state = checkpoints.load_latest(tmp_path)
    assert state["step"] == 1
    assert "unreadable" in capsys.readouterr().err


def test_all_unreadable_is_a_clear_error(tmp_path):
    (tmp_path / "step-000000005.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(checkpoints.CheckpointError, match="no readable checkpoint"):
        checkpoints.load_latest(tmp_path)


def test_empty_folder_means_fresh_start(tmp_path):
    assert checkpoints.load_latest(tmp_path / "missing") is None


def test_state_without_step_is_refused(tmp_path):
    with pytest.raises(ValueError, match="step"):
        checkpoints.write_checkpoint(tmp_path, {"w": 1})


class _RunsCode:
    """A pickle payload that would create a file when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoints_load_without_unpickling_arbitrary_objects(tmp_path):
    import torch

    marker = tmp_path / "pwned"
    folder = tmp_path / "ckpt"
    checkpoints.write_checkpoint(folder, {"step": 1, "w": torch.ones(2)})
    evil = folder / "step-000000002.pt"
    torch.save({"ladder_checkpoint": 1, "state": {"step": 2, "x": _RunsCode(str(marker))}}, evil)
    with pytest.raises(checkpoints.CheckpointError, match="does not unpickle arbitrary objects"):
        checkpoints.read_checkpoint(evil)
    assert not marker.exists()
    state = checkpoints.load_latest(folder)  # falls back to the good one, still without running the payload
    assert state["step"] == 1 and not marker.exists()


def test_checkpoint_of_another_workload_or_config_is_refused_by_name(tmp_path):
    from orchestrator.run.checkpoints import CheckpointMismatch, identity, load_latest, write_checkpoint

    mine = identity("celerity_lm", {"width": 64, "depth": 2})
    write_checkpoint(tmp_path, {"step": 3}, identity=mine)
    assert load_latest(tmp_path, mine)["step"] == 3
    assert load_latest(tmp_path)["step"] == 3  # a caller without an identity reads it as before
    with pytest.raises(CheckpointMismatch, match="belongs to a run of 'celerity_lm', not 'frl'"):
        load_latest(tmp_path, identity("frl", {"width": 64, "depth": 2}))
    with pytest.raises(CheckpointMismatch, match="width: 64 in the checkpoint, 128 now"):
        load_latest(tmp_path, identity("celerity_lm", {"width": 128, "depth": 2}))


def test_resume_with_a_changed_config_is_refused_before_anything_starts(workdir):
    import json

    from conftest import run_cli

    out = run_cli(["run", "tubal_fgd", "--smoke", "--local", "--no-track", "--set", "steps=200", "log_every=50"], workdir)
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = (workdir / "ladder-runs" / "tubal_fgd").iterdir()
    assert list((run_dir / "checkpoints").glob("step-*.pt"))
    record = json.loads((run_dir / "run.json").read_text())
    record["config"]["factor_rank"] = 4  # someone edits the record: the checkpoints no longer fit it
    (run_dir / "run.json").write_text(json.dumps(record))
    out = run_cli(["run", "--resume", str(run_dir), "--local", "--no-track"], workdir)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "was written with another tubal_fgd config (factor_rank: 16 in the checkpoint, 4 now)" in out.stderr
    assert "Traceback" not in out.stderr
