"""A real local sweep: reference runs, then a tau sweep in which collapse stopping stops trials,
each trial an MLflow child run under the sweep's parent run. (A finished sweep resumed reruns
nothing: test_sweep_schedulers_e2e, on the module's shared Ray.)

The sweeps are the shipped `celerity_reference.py` and `celerity_tuning.py` (those `make demo`
runs), each narrowed to two of their three tau values: two seeds per tau still calibrate the
seed noise, and of two tuning trials collapse stops one, at two thirds of the demo's compute. The
tuning trials run one at a time: a rung compares a trial with those that reached it before, so the
better trial must get there first, whatever the machine's load (run side by side on a loaded
machine, the worse one reached both rungs first once and ran out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, run_cli
from orchestrator.tracking import sink as tracking


NARROW = """
import dataclasses as _dc
sweep = _dc.replace(sweep, space={**sweep.space, "tau": grid(0.05, 0.8)}, max_concurrent=1)
"""


@pytest.mark.slow
def test_reference_then_tuning_sweep_with_collapse_stopping(workdir):
    for name in ("celerity_reference", "celerity_tuning"):
        shipped = (REPO / "sweeps" / f"{name}.py").read_text()
        (workdir / f"{name}.py").write_text(shipped + NARROW)
    ref = run_cli(["sweep", "celerity_reference.py"], workdir, timeout=600)
    assert ref.returncode == 0, ref.stderr[-4000:]
    out = run_cli(["sweep", "celerity_tuning.py"], workdir, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    table = out.stdout
    assert table.count("finished") >= 1 and "%" in table, table  # someone ran out, someone was stopped

    c = tracking.client(f"sqlite:///{workdir / 'mlruns.db'}")
    exp = c.get_experiment_by_name("celerity_tuning")
    runs = c.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("ladder.kind") == "sweep"]
    children = [r for r in runs if "ladder.trial_id" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    stopped = [r for r in children if c.get_metric_history(r.info.run_id, "progress")[-1].value < 0.99]
    assert stopped, "collapse stopping stopped no trial"
    for r in children:
        steps = [m.step for m in c.get_metric_history(r.info.run_id, "train/loss")]
        assert steps == sorted(set(steps)), "a step was recorded twice"


FLAKY = '''
"""A workload of two trials, one of which always raises."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    broken: bool = False
    """Raise in train instead of training."""


def smoke() -> Config:
    return Config()


def train(cfg: Config, run) -> dict:
    if cfg.broken:
        raise RuntimeError("this trial is broken on purpose")
    run.report({"train/loss": 1.0, "eval/loss": 1.0, "progress": 1.0}, step=1)
    return {"eval/loss": 1.0}
'''


@pytest.mark.slow
def test_a_sweep_of_two_worker_trials_with_a_failed_trial_exits_1_naming_it(workdir):
    """Each trial is a Ray Train worker group of two inside Tune; one trial raises on both workers.
    The sweep names the failure and how to rerun it, records the trial that ran as a two-worker gloo
    group, and its driver imports none of the heavy packages it does not use."""
    (workdir / "flaky.py").write_text(FLAKY)
    (workdir / "two.py").write_text(
        "from orchestrator.sweep import Sweep\n"
        "sweep = Sweep(name='two', workload='flaky', base='smoke', search='grid',\n"
        "              points=({'broken': False}, {'broken': True}), max_failures=0, workers=2, cpus_per_worker=1.0)\n"
    )
    # The command's own process, asked at its exit which heavy packages it imported (DRIVER_MODULES).
    out = subprocess.run([sys.executable, "-c", DRIVER_MODULES, "sweep", "two.py"], cwd=workdir, capture_output=True,
                         text=True, timeout=400, env={**os.environ})
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    assert "1 of 2 trials failed after their retries" in out.stderr and "this trial is broken on purpose" in out.stderr, out.stderr[-3000:]
    assert "`ladder sweep two.py --resume` runs them again" in out.stderr
    assert "finished" in out.stdout and "error" in out.stdout  # the table still shows both
    # The trial that ran trained under Ray Train inside Tune, on two gloo workers, to the end.
    c = tracking.client(f"sqlite:///{workdir / 'mlruns.db'}")
    exp = c.get_experiment_by_name("two")
    (ran,) = [r for r in c.search_runs([exp.experiment_id]) if r.data.params.get("broken") == "False"]
    assert ran.info.status == "FINISHED" and "ladder.trial_id" in ran.data.tags
    assert ran.data.tags["ladder.world_size"] == "2" and ran.data.tags["ladder.backend"] == "gloo", ran.data.tags
    assert ran.data.metrics["progress"] == pytest.approx(1.0)
    # A sweep's driver trains nothing and logs nothing to W&B: it imports neither torch nor wandb (Ray
    # Tune's callback telemetry and its TensorBoard logger would import both), and Tune still writes
    # its own result files for each trial, TensorBoard's aside.
    imported = json.loads((workdir / "driver-modules.json").read_text())
    assert imported == [], f"the sweep's driver imported {imported}"
    trial_dirs = [p.parent for p in (workdir / "ladder-runs" / "sweeps" / "two" / "tune").glob("*/result.json")]
    (ran_dir,) = [d for d in trial_dirs if "broken_False" in d.name]
    assert len(trial_dirs) == 2 and (ran_dir / "progress.csv").is_file(), trial_dirs  # the broken one never reported
    assert not list((workdir / "ladder-runs" / "sweeps" / "two" / "tune").glob("*/events.out.tfevents*"))


DRIVER_MODULES = """
import atexit, json, sys
HEAVY = ("torch", "wandb", "tensorboardX")
atexit.register(lambda: open("driver-modules.json", "w").write(json.dumps([m for m in HEAVY if m in sys.modules])))
from orchestrator.commands.cli import main
sys.exit(main(sys.argv[1:]))
"""
