"""Reproduction sizes on a real local Ray: a bench reproduction interrupted with Ctrl-C is recorded as
interrupted, and `--resume` finishes it without running its finished trials again, then judges and
logs the claims as an uninterrupted one does. And every built-in bench reproduction builds and
passes `--size bench --check` (the bench runs themselves are run on demand, not in CI)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from conftest import LADDER, LR_CLAIM_SOURCE, run_cli, wait_for
from orchestrator.tracking import sink as tracking

CLAIMS = LR_CLAIM_SOURCE + "\n\nCLAIMS = [larger_lr_ends_lower]\nCHECKS = [losses_finite]\n"

# Bench trials are long enough (a few seconds each, one at a time) that Ctrl-C lands while one has
# finished and the next runs; the kill point is read from MLflow, not timed.
REPRO = '''
from orchestrator.sweep import Sweep, grid

STEPS = {"smoke": 40, "bench": 600, "full": 20000}


def build(*, size="full", seed=0):
    return Sweep(name="x", workload="lab.benchy", base="smoke",
                 overrides={"seed": seed, "steps": STEPS[size], "eval_every": 50, "checkpoint_every": 200},
                 space={"lr": grid(1e-4, 1e-2)}, max_concurrent=1)
'''


@pytest.mark.slow
def test_an_interrupted_bench_reproduction_resumes_without_rerunning_finished_trials(workdir, monkeypatch):
    from orchestrator.commands import scaffold

    folder, module = scaffold.new("benchy", workdir / "lab")
    with (folder / "__init__.py").open("a") as fh:
        fh.write(CLAIMS)
    (folder / "repro.py").write_text(REPRO)
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    c = tracking.client(f"sqlite:///{workdir / 'mlruns.db'}")

    def trial_runs() -> list:
        exp = c.get_experiment_by_name("repro-lab.benchy-bench")
        runs = c.search_runs([exp.experiment_id]) if exp else []
        return [r for r in runs if "ladder.trial_id" in r.data.tags]

    def one_done_one_running() -> bool:
        try:
            runs = trial_runs()
        except Exception:  # the store is being created
            return False
        return (any(r.info.status == "FINISHED" for r in runs) and any(r.info.status == "RUNNING" for r in runs))

    args = ["reproduce", module, "--size", "bench", "--seeds", "2"]
    proc = subprocess.Popen(LADDER + args, cwd=workdir, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(one_done_one_running, proc, poll=0.05)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, out[-2000:] + err[-3000:]
    assert f"Continue it: ladder reproduce {module} --size bench --seeds 2 --resume" in err, err[-3000:]
    assert "CLAIMS" not in out  # nothing was judged on part of the trials
    before = {r.data.tags["ladder.trial_id"]: r for r in trial_runs()}
    finished = {t: r for t, r in before.items() if r.info.status == "FINISHED"}
    assert finished and any(r.info.status == "KILLED" for r in before.values()), {
        t: r.info.status for t, r in before.items()}

    again = run_cli(args + ["--resume"], workdir, env={"PYTHONPATH": str(workdir)}, timeout=400)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "judged over 2 seeds (0, 1)" in again.stdout and "checks: 1/1 hold (2 seeds, 4 trials" in again.stdout
    after = {r.data.tags["ladder.trial_id"]: r for r in trial_runs()}
    assert len(after) == 4 and all(r.info.status == "FINISHED" for r in after.values())
    for trial_id, run in finished.items():  # not run again: the same MLflow run, untouched since it ended
        now = after[trial_id]
        assert now.info.run_id == run.info.run_id and now.info.end_time == run.info.end_time
        steps = [m.step for m in c.get_metric_history(now.info.run_id, "train/loss")]
        assert steps == sorted(set(steps)), "a finished trial recorded a step again"
    exp = c.get_experiment_by_name("repro-lab.benchy-bench")
    (parent,) = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("ladder.kind") == "reproduce"]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["ladder.size"] == "bench" and parent.data.tags["ladder.seeds"] == "0,1"
    assert parent.data.tags["ladder.processor"]  # a bench result is recorded with the machine it ran on
    assert {"claims.txt", "claims.json"} <= {a.path for a in c.list_artifacts(parent.info.run_id)}

    # the report reads it back as a bench record: its own row, the processor and wall time shown
    from orchestrator.reproduction import report

    monkeypatch.syspath_prepend(str(workdir))  # lab.benchy, imported in this process too
    page = report.build([module], size="bench", seeds=2, use_mlflow=True, out=workdir / "docs" / "r.md").read_text()
    assert f"| [`{module}`](#{module}-bench) | bench | 2 |" in page
    assert f"## {module}, bench size: " in page and parent.data.tags["ladder.processor"] in page
