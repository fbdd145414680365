"""How many trials of a sweep run at once, and why a sweep could not launch from here
(`orchestrator.sweeps.tune_run.resolve_concurrency`, `launch_problems`): pure arithmetic over a
`Sweep` of the tiny workload (tests/orchestrator/fake_workload.py), no Ray."""

from __future__ import annotations

import pytest

from orchestrator.sweep import MODEL_BASED_CONCURRENCY, Sweep, SweepError, choice, grid, loguniform
from orchestrator.sweeps.tune_run import launch_problems, resolve_concurrency

NAME = "tests.orchestrator.fake_workload"


def sweep(**kw) -> Sweep:
    return Sweep(**{"name": "conc", "workload": NAME, "base": "smoke", "space": {"lr": grid(0.1, 0.2, 0.3)}, **kw})


def tpe(**kw) -> Sweep:
    return sweep(search="tpe", num_samples=12, space={"lr": loguniform(1e-3, 1e-1), "steps": choice(2, 3)}, **kw)


def test_the_test_sweeps_are_valid():
    assert sweep().check().steps == 3
    assert sweep(workers=2, cpus_per_worker=0.5, max_concurrent=2).trial_resources() == {"CPU": 1.0}
    assert tpe().check() is not None and tpe().model_based and not sweep().model_based


@pytest.mark.parametrize("workers, cpus_per_worker, cpus, expected", [
    (1, 1.0, 8, 8),
    (2, 1.0, 8, 4),
    (2, 1.5, 8, 2),     # 3 CPUs a trial: two fit in 8
    (1, 0.5, 3, 6),     # fractional CPUs
    (3, 1.0, 3, 1),     # exactly one
    (1, 1.0, 7.9, 7),   # a fraction of a trial is no trial
])
def test_as_many_trials_as_the_cpus_hold(workers, cpus_per_worker, cpus, expected):
    assert resolve_concurrency(sweep(workers=workers, cpus_per_worker=cpus_per_worker), cpus) == expected


def test_a_trial_that_does_not_fit_is_refused_with_its_numbers_and_the_fix():
    with pytest.raises(SweepError) as err:
        resolve_concurrency(sweep(workers=4, cpus_per_worker=1.5), 5, where="this machine (local Ray)")
    msg = str(err.value)
    assert "a trial needs 6 CPUs (4 workers x 1.5) but this machine (local Ray) has 5" in msg
    assert "lower workers or cpus_per_worker in the sweep" in msg
    with pytest.raises(SweepError, match=r"but the cluster has 0\.5"):
        resolve_concurrency(sweep(), 0.5)


def test_gpus_bound_the_trials_and_their_absence_is_named():
    s = sweep(workers=2, gpus_per_worker=0.5)  # one GPU a trial
    assert resolve_concurrency(s, cpus=16, gpus=3) == 3
    assert resolve_concurrency(s, cpus=4, gpus=3) == 2  # then the CPUs bind
    with pytest.raises(SweepError, match=r"a trial needs 1 GPUs \(2 workers x 0\.5\) but the cluster has 0\.5: .*gpus_per_worker=0"):
        resolve_concurrency(s, cpus=16, gpus=0.5)
    assert resolve_concurrency(sweep(), cpus=4, gpus=0) == 4  # a CPU sweep ignores GPUs


def test_an_explicit_concurrency_caps_what_fits_and_never_exceeds_it():
    assert resolve_concurrency(sweep(max_concurrent=3), 16) == 3
    assert resolve_concurrency(sweep(max_concurrent=32), 16) == 16
    assert resolve_concurrency(sweep(max_concurrent=1, workers=2), 16) == 1


def test_a_model_based_search_runs_a_few_trials_at_once_unless_told():
    assert MODEL_BASED_CONCURRENCY == 4
    assert resolve_concurrency(tpe(), 64) == MODEL_BASED_CONCURRENCY
    assert resolve_concurrency(tpe(), 3) == 3  # fewer CPUs than the cap
    assert resolve_concurrency(tpe(max_concurrent=10), 64) == 10  # the sweep's own number wins over the cap
    assert resolve_concurrency(tpe(max_concurrent=10), 6) == 6
    assert resolve_concurrency(sweep(), 64) == 64  # an expanded search is not capped


# ---------------------------------------------------------------- launch problems

def test_a_sweep_that_can_launch_here_has_no_problems(monkeypatch):
    monkeypatch.setenv("LADDER_NUM_CPUS", "4")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert launch_problems(sweep(workers=2, cpus_per_worker=2)) == []


def test_launch_problems_name_the_missing_data_and_the_cpus(monkeypatch, tmp_path):
    monkeypatch.setenv("LADDER_NUM_CPUS", "2")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    missing = tmp_path / "absent.bin"
    problems = launch_problems(sweep(workers=3, overrides={"data_path": str(missing)}))
    assert len(problems) == 2, problems
    data, cpus = problems
    assert f"data_path {str(missing)!r} does not exist" in data and "sweep 'conc'" in data
    assert "a trial needs 3 CPUs (3 workers x 1) but this machine (local Ray) has 2" in cpus


def test_every_distinct_missing_dataset_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("LADDER_NUM_CPUS", "8")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    b.write_bytes(b"")
    c = tmp_path / "c.bin"
    (problem,) = launch_problems(sweep(space={"data_path": grid(str(a), str(b), str(c))}))
    assert str(a) in problem and str(c) in problem and str(b) not in problem


def test_on_a_cluster_the_cpus_here_are_not_a_problem(monkeypatch):
    """With RAY_ADDRESS the trials run on the cluster: this machine's size says nothing about them."""
    monkeypatch.setenv("LADDER_NUM_CPUS", "1")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert launch_problems(sweep(workers=8)) == []
