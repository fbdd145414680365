"""Ctrl-C and SIGTERM on real `ladder sweep` processes: an interruption is recorded as one (runs KILLED,
trials tagged interrupted, a non-zero exit with the resume command), never as a finish, and
`--resume` then completes the sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import LADDER, run_cli, wait_for
from orchestrator.tracking import sink as tracking

# Six synthetic `curves` trials, two at a time; each sleeps a little per step (6 s a trial) so that
# a signal lands while some have finished and others still run (the kill point is read from MLflow,
# not timed). Nothing here trains: the statuses and the exit are what is tested.
SWEEP = """
from orchestrator.sweep import Sweep, grid
sweep = Sweep(name="{name}", workload="curves", base="smoke",
              overrides={{"steps": 200, "report_every": 10, "checkpoint_every": 50, "step_time_s": 0.03}},
              space={{"lr": grid(0.01, 0.02, 0.004, 0.08, 0.001, 0.1)}}, scheduler="fifo",
              objective=("eval/loss", "min"))
"""


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(LADDER + args, cwd=cwd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _runs(c, name: str) -> tuple[list, list]:
    """(parent runs, trial runs) of experiment `name`."""
    exp = c.get_experiment_by_name(name)
    runs = c.search_runs([exp.experiment_id]) if exp else []
    return ([r for r in runs if r.data.tags.get("ladder.kind") == "sweep"],
            [r for r in runs if "ladder.trial_id" in r.data.tags])


def _interrupt_mid_sweep(workdir: Path, name: str, sig: int, *, group: bool) -> tuple[subprocess.CompletedProcess, object]:
    (workdir / f"{name}.py").write_text(SWEEP.format(name=name))
    c = tracking.client(f"sqlite:///{workdir / 'mlruns.db'}")
    proc = _start(["sweep", f"{name}.py"], workdir)

    def mid_way() -> bool:
        """A trial has finished and one that started after it is running: that one has a whole trial's
        steps ahead of it when the signal comes. (The first two trials start together, so the second
        of them may be a step from its end when the first finishes: a signal then can find nothing
        left to interrupt.)"""
        try:
            _, trials = _runs(c, name)
        except Exception:  # the store is being created
            return False
        ends = [r.info.end_time for r in trials if r.info.status == "FINISHED" and r.info.end_time]
        return bool(ends) and any(r.info.status == "RUNNING" and r.info.start_time >= min(ends) for r in trials)

    wait_for(mid_way, proc, poll=0.05)
    (os.killpg if group else os.kill)(proc.pid, sig)  # a terminal's Ctrl-C signals the whole group
    out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), c


@pytest.mark.slow
def test_ctrl_c_on_a_sweep_is_recorded_as_an_interruption_and_resume_finishes_it(workdir):
    done, c = _interrupt_mid_sweep(workdir, "cut", signal.SIGINT, group=True)
    assert done.returncode == 130, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ladder sweep cut.py --resume" in done.stderr and "Tuner.restore" not in done.stdout + done.stderr
    assert "finished in" not in done.stdout, done.stdout[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (parent,), trials = _runs(c, "cut")
    assert parent.info.status == "KILLED"
    statuses = {r.data.tags["ladder.trial_id"]: r.info.status for r in trials}
    assert set(statuses.values()) <= {"FINISHED", "KILLED"}, statuses
    killed = [r for r in trials if r.info.status == "KILLED"]
    finished = {r.data.tags["ladder.trial_id"] for r in trials if r.info.status == "FINISHED"}
    assert killed and finished, statuses
    for r in killed:
        assert r.data.tags.get("ladder.interrupted") == "true" and r.data.tags.get("ladder.stopped_early") != "true"
        # 1.0 is a trial whose last step was reported but whose run had not ended when Ctrl-C came:
        # it is still an interruption (its final metrics were never written), and --resume ends it.
        assert 0 <= float(r.data.tags["ladder.interrupted_at"]) <= 1
    best = parent.data.tags.get("ladder.best_trial")
    assert best is None or best in finished, (best, statuses)  # an unfinished trial is never the best
    table = {line.split()[0]: line for line in done.stdout.splitlines() if line.split() and line.split()[0] in statuses}
    for r in killed:
        assert "interrupted" in table[r.data.tags["ladder.trial_id"]].split()[2], done.stdout

    again = run_cli(["sweep", "cut.py", "--resume"], workdir, timeout=400)
    assert again.returncode == 0, again.stderr[-4000:]
    # Quiet without --verbose, in a pipe: the trials' lines that Ray forwards ("restored from the
    # checkpoint ...", when a trial had one when Ctrl-C came) carry no colour codes, Ray's token-auth
    # notice about its own local Ray and MLflow's "View run" lines are not printed.
    assert "\x1b[" not in again.stderr, again.stderr[-2000:]
    assert "Token authentication is enabled" not in again.stderr and "View run" not in again.stdout
    (parent,), trials = _runs(c, "cut")
    assert parent.info.status == "FINISHED" and len(trials) == 6
    assert all(r.info.status == "FINISHED" for r in trials), [(r.data.tags["ladder.trial_id"], r.info.status) for r in trials]
    assert parent.data.tags["ladder.best_trial"] in statuses


@pytest.mark.slow
def test_sigterm_on_a_sweep_driver_ends_it_killed_with_143(workdir):
    done, c = _interrupt_mid_sweep(workdir, "term", signal.SIGTERM, group=False)
    assert done.returncode == 143, done.stdout[-2000:] + done.stderr[-3000:]
    assert "interrupted by SIGTERM" in done.stderr and "ladder sweep term.py --resume" in done.stderr
    (parent,), trials = _runs(c, "term")
    assert parent.info.status == "KILLED"
    assert any(r.info.status == "KILLED" and r.data.tags.get("ladder.interrupted") == "true" for r in trials)
    assert not any(r.info.status == "RUNNING" for r in trials)


def test_a_stopped_trials_exit_in_a_finalizer_prints_no_traceback():
    """Ray's SIGTERM handler raises SystemExit; landing in a weakref callback, Python reports it through
    sys.unraisablehook. The trial's hook drops that one and passes every other exception on."""
    import sys
    import weakref

    from orchestrator.sweeps.tune_run import quiet_exit

    seen = []
    hook = quiet_exit(seen.append)

    class Thing:
        pass

    for exc in (SystemExit(1), ValueError("a real error")):
        previous = sys.unraisablehook
        sys.unraisablehook = hook
        try:
            def boom(_ref, exc=exc):
                raise exc

            obj = Thing()
            ref = weakref.ref(obj, boom)
            del obj  # the callback runs here and raises: Python hands it to the hook
        finally:
            sys.unraisablehook = previous
        assert ref() is None
    assert [type(a.exc_value) for a in seen] == [ValueError]
    # trial_main wraps the hook once per process: a reused trial actor finds it marked and leaves it be
    assert hook.ladder_quiet_exit is True and not hasattr(seen.append, "ladder_quiet_exit")


def test_ctrl_c_on_a_local_run_prints_its_folder_and_the_command_that_resumes_it(workdir):
    """`ladder run` caught by Ctrl-C once it has a checkpoint: exit 130, its MLflow run KILLED, and the
    printed command (run as printed) continues it from that checkpoint to the end."""
    proc = _start(["run", "curves", "--smoke", "--local", "--set", "steps=200", "report_every=4",
                   "checkpoint_every=50", "step_time_s=0.01"], workdir)
    ckpts = lambda: list(workdir.glob("ladder-runs/curves/*/checkpoints/step-*.pt"))
    wait_for(lambda: len(ckpts()) >= 1, proc, poll=0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (run_dir,) = (workdir / "ladder-runs" / "curves").iterdir()
    command = f"ladder run --resume {run_dir} --local"
    assert f"the run's folder is {run_dir}; `{command}` continues it from its last checkpoint" in err, err[-2000:]
    record = json.loads((run_dir / "run.json").read_text())
    c = tracking.client(record["tracking_uri"])
    assert c.get_run(record["mlflow_run_id"]).info.status == "KILLED"

    saved = max(int(p.stem.split("-")[1]) for p in ckpts())
    again = run_cli(command.split()[1:], workdir, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    first = next(line for line in again.stderr.splitlines() if line.startswith("[curves] step"))
    assert int(first.split()[2].split("/")[0]) > saved >= 50, first  # continued from its checkpoint, not from 0
    run = c.get_run(record["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    steps = [m.step for m in c.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(steps) == list(range(4, 201, 4)), "a step is missing or recorded twice"
