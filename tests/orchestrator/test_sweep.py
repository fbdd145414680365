"""Sweep definitions are checked against the workload's Config before anything launches."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from orchestrator.commands.cli import main
from orchestrator.sweep import Sweep, SweepError, choice, grid, load_sweep_file, loguniform, seeds


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.py"
    path.write_text("from orchestrator.sweep import *\n" + body)
    return path


@pytest.mark.parametrize(
    "body,expected",
    [
        ("sweep = Sweep(name='x', workload='celerity_lm', space={'widht': grid(1, 2)})", "did you mean 'width'"),
        ("sweep = Sweep(name='x', workload='celerity_lm', space={'width': grid('wide')})", "width expects an int"),
        ("sweep = Sweep(name='x', workload='celerity_lm', space={'width': grid()})", "has no values"),
        ("sweep = Sweep(name='x', workload='celerity_lm', num_samples=0)", "num_samples must be at least 1"),
        ("sweep = Sweep(name='x', workload='celerity_lm', scheduler='ashaa')", "did you mean 'asha'"),
        ("sweep = Sweep(name='x', workload='celerty_lm')", "Closest match: 'celerity_lm'"),
        ("sweep = Sweep(name='x', workload='celerity_lm', space={'lr': loguniform(0, 1)})", "positive bounds"),
        ("sweep = Sweep(name='x', workload='celerity_lm', objective=('eval/loss', 'lowest'))", "'min' or 'max'"),
    ],
)
def test_bad_sweeps_are_refused_with_the_fix(tmp_path, body, expected):
    with pytest.raises(SweepError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_sweep_file(_write(tmp_path, body)).check()


def test_absent_data_is_refused_at_launch_not_by_check(tmp_path):
    # Data lives where the sweep runs (a cluster's shared storage): the file is valid anywhere,
    # and the machine that would run it refuses it before anything starts.
    s = load_sweep_file(_write(tmp_path, "sweep = Sweep(name='x', workload='celerity_lm', space={'data': '/no/such/dir'})"))
    s.check()
    with pytest.raises(SweepError, match="data folder '/no/such/dir' does not exist"):
        s.preflight()


def test_syntax_error_names_file_and_line(tmp_path):
    path = _write(tmp_path, "sweep = Sweep(name='x',\n  workload='celerity_lm' space={})\n")
    with pytest.raises(SweepError, match=r"s\.py:3: syntax error"):
        load_sweep_file(path)


def test_file_without_a_sweep(tmp_path):
    with pytest.raises(SweepError, match="must assign a Sweep"):
        load_sweep_file(_write(tmp_path, "x = 1\n"))


def test_trials_cross_grids_with_samples_deterministically():
    s = Sweep(name="x", workload="celerity_lm", base="smoke", num_samples=3,
              space={"tau": grid(0.1, 0.2), "seed": seeds(2), "lr": loguniform(1e-3, 1e-1), "activation": choice("gelu", "relu2")})
    trials = s.trial_params()
    assert len(trials) == s.trial_count() == 12
    assert {(t["tau"], t["seed"]) for t in trials} == {(0.1, 0), (0.1, 1), (0.2, 0), (0.2, 1)}
    assert all(1e-3 <= t["lr"] <= 1e-1 and t["activation"] in ("gelu", "relu2") for t in trials)
    assert trials == s.trial_params()  # same seed, same trials: what makes --resume safe
    assert trials != Sweep(**{**s.__dict__, "seed": 1}).trial_params()


@pytest.mark.parametrize("path", sorted((REPO / "sweeps").rglob("*.py")), ids=lambda p: p.name)
def test_shipped_sweeps_are_valid(path):
    if path.name == "__init__.py":
        pytest.skip("package marker")
    load_sweep_file(path).check()


def test_cli_refuses_before_starting_anything(workdir, capsys):
    import ray

    path = _write(workdir, "sweep = Sweep(name='x', workload='celerity_lm', space={'widht': grid(1)})")
    assert main(["sweep", str(path)]) == 2
    assert "did you mean 'width'" in capsys.readouterr().err
    ok = _write(workdir, "sweep = Sweep(name='never_ran', workload='celerity_lm', base='smoke')")
    assert main(["sweep", str(ok), "--resume"]) == 2
    assert "cannot resume sweep 'never_ran'" in capsys.readouterr().err
    assert not ray.is_initialized() and not (workdir / "mlruns.db").exists()
