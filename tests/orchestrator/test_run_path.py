"""The path of one `ladder run --local`: the workload is loaded once and its config validated twice
(before anything launches, and where the trial runs); a resumed run validates the config it
recorded, not the defaults. A workload written by `ladder new`, in this process: about a second."""

from __future__ import annotations

import pytest

from orchestrator.commands import scaffold
from orchestrator.commands.cli import main
from orchestrator.runners import registry


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """A fresh workload module, and counters of `registry.load` and `Workload.validate` calls."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    scaffold.new("rp_counted", tmp_path / "lab")
    calls = {"load": 0, "validate": []}
    load, validate = registry.load, registry.Workload.validate

    def counting_load(name):
        calls["load"] += 1
        return load(name)

    def counting_validate(self, cfg, **kwargs):
        calls["validate"].append(cfg)
        return validate(self, cfg, **kwargs)

    monkeypatch.setattr(registry, "load", counting_load)
    monkeypatch.setattr(registry.Workload, "validate", counting_validate)
    return calls


def test_a_local_run_loads_once_and_validates_twice(counted, capsys):
    assert main(["run", "lab.rp_counted", "--smoke", "--local", "--no-track", "--set", "steps=30"]) == 0
    assert "lab.rp_counted: finished" in capsys.readouterr().out
    assert counted["load"] == 1
    assert len(counted["validate"]) == 2 and counted["validate"][0] == counted["validate"][1]
    assert counted["validate"][0].steps == 30


def test_a_resumed_run_validates_its_recorded_config(counted, tmp_path, capsys):
    assert main(["run", "lab.rp_counted", "--smoke", "--local", "--no-track", "--set", "steps=30"]) == 0
    [run_dir] = (tmp_path / "ladder-runs" / "lab.rp_counted").iterdir()
    counted["load"], counted["validate"] = 0, []
    assert main(["run", "--resume", str(run_dir), "--local", "--no-track"]) == 0
    assert "lab.rp_counted: finished" in capsys.readouterr().out
    assert counted["load"] == 1
    # Both validations see the recorded steps=30, not the smoke default.
    assert [c.steps for c in counted["validate"]] == [30, 30]
