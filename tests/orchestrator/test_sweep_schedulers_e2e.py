"""Ray Tune's own schedulers (asha, median) run real sweeps of the synthetic curves workload end to
end, on one local Ray and one MLflow store shared by the module: every trial is an MLflow child
run that ends FINISHED (stopped ones tagged so) with every point it reported, also when the
driver is killed mid-sweep and the sweep resumed (there, of a copy of curves that is the user's
own package, outside the repo); a cluster address that cannot be used is
refused within seconds, before anything is recorded.

Trials are tiny (a 100-step curve, 20 reports, microseconds per step), so the cost is Tune's and
MLflow's own. They are ordered best learning rate first, so that later trials are worse at every
rung and the schedulers have something to stop.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from conftest import REPO, run_cli
from orchestrator.tracking import sink as tracking
from orchestrator.sweep import load_sweep_file
from orchestrator.sweeps.tune_run import format_trials, run_sweep

STEPS, EVERY = 100, 5
SWEEP = """
from orchestrator.sweep import Sweep
# Best first: the final loss grows with the squared log distance from lr = 1e-2.
sweep = Sweep(name="{name}", workload="{workload}", base="smoke",
              overrides={{"steps": {steps}, "report_every": {every}, "checkpoint_every": 50}},
              points=tuple({{"lr": lr}} for lr in (1e-2, 2e-2, 5e-3, 5e-2, 2e-3, 1e-1)),
              scheduler="{scheduler}", scheduler_options={options}, objective=("eval/loss", "min"))
"""
OPTIONS = {"asha": '{"grace_period": 0.2, "reduction_factor": 2}', "median": '{"grace_period": 0.2}'}
TRIALS = 6


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One local Ray and one folder (so one MLflow store) for every sweep here: each `ladder
    sweep` would start a Ray of its own, and each new store costs its schema migrations."""
    import ray
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    work = tmp_path_factory.mktemp("schedulers")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setenv("WANDB_DIR", str(work))  # read by the trials, which Ray starts with this environment
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 object_store_memory=100 * 2**20)
        try:
            yield SimpleNamespace(work=work, address=ray.get_runtime_context().gcs_address,
                                  token=is_token_auth_enabled(), client=tracking.client(tracking.tracking_uri()))
        finally:
            ray.shutdown()


def write_sweep(work, name: str, scheduler: str, workload: str = "curves"):
    path = work / f"{name}.py"
    path.write_text(SWEEP.format(name=name, workload=workload, steps=STEPS, every=EVERY, scheduler=scheduler,
                                 options=OPTIONS[scheduler]))
    return path


def own_copy_of_curves(work, package: str) -> str:
    """The curves workload as a user's own package in the working folder, outside ladder: named by
    its module path, imported by the driver and by every trial process from there."""
    folder = work / package
    folder.mkdir()
    for name in ("__init__.py", "workload.py"):
        text = (REPO / "workloads" / "curves" / name).read_text()
        (folder / name).write_text(text.replace("workloads.curves.", f"{package}."))
    return package


def children(c, name: str) -> list:
    exp = c.get_experiment_by_name(name)
    return [r for r in c.search_runs([exp.experiment_id]) if "ladder.trial_id" in r.data.tags] if exp else []


def assert_whole_curves(c, runs, resumed: bool = False) -> tuple[int, int]:
    """Every run ended FINISHED; a stopped one is tagged with the progress at which Tune stopped
    it, and its curve runs from the first report to there, each step once. Returns (stopped
    runs, metric points recorded). After a resume (`resumed`), a trial may have reported past the
    point where Tune stopped it in the resumed sweep: in the invocation that died, before its
    last checkpoint reached Tune; those points stay, each once, without gaps."""
    stopped = points = 0
    for r in runs:
        tid = r.data.tags["ladder.trial_id"]
        assert r.info.status == "FINISHED", (tid, r.info.status)
        seen = STEPS  # the last step Tune saw
        if r.data.tags.get("ladder.stopped_early") == "true":
            stopped += 1
            seen = round(float(r.data.tags["ladder.stopped_at"]) * STEPS)
            assert seen < STEPS, (tid, r.data.tags["ladder.stopped_at"])
        else:  # trained to the end: what train returned is recorded too (a scheduler must not cut it off)
            assert tracking.FINAL_TAG in r.data.tags, (tid, "no final metrics", r.data.tags)
        whole = [list(range(EVERY, seen + 1, EVERY))]
        for key in ("train/loss", "eval/loss", "progress"):
            steps = [m.step for m in c.get_metric_history(r.info.run_id, key)]
            points += len(steps)
            # A report reaches Tune when the next one is made (so that a checkpoint of the same
            # step travels with it); the sinks get a step only once Tune has been sent its report:
            # a stopped trial's curve ends where Tune's view of it ends.
            if resumed and steps and steps[-1] > seen + EVERY:
                assert steps == list(range(EVERY, steps[-1] + 1, EVERY)), (tid, key, seen, steps)
                continue
            assert steps in whole, (tid, key, seen, steps)
    return stopped, points


@pytest.mark.slow
def test_median_sweep_runs_end_to_end_and_logs_each_trial_to_wandb(shared, capfd):
    started = time.monotonic()
    result = run_sweep(load_sweep_file(write_sweep(shared.work, "median", "median")), wandb=True)
    # The sweep's view, in plain lines (no terminal here): one per trial end, counted against all
    # six trials from the start (Tune creates them as it goes), and none of Ray Tune's own output.
    out = capfd.readouterr()
    ends = [line for line in out.err.splitlines() if line.startswith("ladder: trial ")]
    assert len(ends) == TRIALS and ends[0].endswith("[1/6 done]") and ends[-1].endswith("[6/6 done]"), out.err
    status = [line for line in out.err.splitlines() if line.startswith("ladder: sweep median: ")]
    assert status[-1].startswith("ladder: sweep median: 6/6 done ("), out.err  # trials' own lines may come later
    assert "tensorboard" not in (out.out + out.err).lower() and "Configuration for experiment" not in out.out + out.err
    assert not [t for t in result.trials if t["error"]], result.trials
    runs = children(shared.client, "median")
    assert len(runs) == TRIALS
    stopped, points = assert_whole_curves(shared.client, runs)
    # Not seed-dependent (mechanism): every trial takes smoke()'s seed, so one noise draw, and at each
    # report their losses stand in the ratio of their noise-free final losses (workloads/curves
    # final_loss), whatever the seed: lr 0.1 and 0.05 end 12.5% and 6.1% above lr 1e-2 at every seed.
    assert stopped == sum(t["stopped"] for t in result.trials) >= 1, "the median rule stopped no trial"
    assert shared.client.get_run(result.parent_run_id).info.status == "FINISHED"
    # What the parent run shows first: the best finished objective under the children's metric
    # name, a row per trial in trials.csv, the trials' curves; the experiment opens in MLflow's
    # model-training view.
    parent = shared.client.get_run(result.parent_run_id)
    finished = [t for t in result.trials if t["state"] == "finished"]
    assert parent.data.metrics["eval/loss"] == pytest.approx(min(t["objective"] for t in finished))
    assert all("eval/loss" in r.data.metrics for r in runs)
    # ... and optuna-dashboard's three study plots (orchestrator.sweeps.history_plots), as PNGs.
    logged = {a.path: a.file_size for a in shared.client.list_artifacts(parent.info.run_id)}
    assert {"trials.csv", "trial_curves.png", "trials.json", "optimization_history.png", "param_importances.png",
            "parallel_coordinate.png"} <= set(logged), sorted(logged)
    assert min(logged[n] for n in ("optimization_history.png", "param_importances.png", "parallel_coordinate.png")) > 5000
    rows = list(csv.DictReader(open(shared.client.download_artifacts(parent.info.run_id, "trials.csv", str(shared.work)))))
    assert sorted((r["trial"], r["state"]) for r in rows) == sorted((t["trial_id"], t["state"]) for t in result.trials)
    assert {r["why"] for r in rows if r["state"] == "stopped"} == {"median rule: worse than the other trials' median"}
    tags = shared.client.get_experiment_by_name("median").tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.ladder"])  # the runs table's columns for the UI
    assert view["orderByKey"] == "metrics.`eval/loss`" and {"metrics.`eval/loss`", "params.`lr`",
                                                            "tags.`ladder.stop_reason`"} <= set(view["selectedColumns"])
    # The view's search keeps the parent out of the trials' table: MLflow's own search returns the trials alone.
    exp_id = shared.client.get_experiment_by_name("median").experiment_id
    shown = {r.info.run_id for r in shared.client.search_runs([exp_id], filter_string=view["searchFilter"])}
    assert shown == {r.info.run_id for r in runs} and result.parent_run_id not in shown
    # Why each stopped trial stopped, on its run, with the rule and where (the end of its recorded curve).
    for r in runs:
        t = next(t for t in result.trials if t["trial_id"] == r.data.tags["ladder.trial_id"])
        if t["state"] == "stopped":
            assert r.data.tags["ladder.stop_rule"] == "median", r.data.tags
            assert r.data.tags["ladder.stop_reason"] == "median rule: worse than the other trials' median"
            assert float(r.data.tags["ladder.stop_rung"]) == pytest.approx(float(r.data.tags["ladder.stopped_at"]))
        else:
            assert not {"ladder.stop_rule", "ladder.stop_reason"} & set(r.data.tags), (t["state"], r.data.tags)
    # --wandb: an offline wandb run per trial (two for a trial that the median rule paused and resumed).
    logs = [p.read_bytes() for p in (shared.work / "wandb").glob("offline-run-*/run-*.wandb")]
    assert len(logs) >= TRIALS
    for t in result.trials:
        assert any(f"median-{t['trial_id']}".encode() in log for log in logs), t["trial_id"]
    print(f"median: {len(runs)} trials, {stopped} stopped, {points} points recorded, {time.monotonic() - started:.1f} s")


class DriverDies(RuntimeError):
    """The sweep's driver goes away mid-sweep (raised inside Tune's loop, which then kills the trials' processes)."""


def dies_at_third_trial(armed):
    """A Tune callback that kills the sweep when its third trial starts (one trial has ended by
    then, one runs, the others wait), once: Tune pickles callbacks with the sweep and runs them
    again on --resume, so `armed` (a file) says whether it still should."""
    from ray import tune

    class Dies(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            if armed.exists() and len(trials) > 2 and trial is trials[2]:
                armed.unlink()
                raise DriverDies("the driver died")

    return Dies()


@pytest.mark.slow
def test_asha_sweep_resumes_after_its_driver_dies(shared, monkeypatch):
    from ray.tune.error import TuneError

    import orchestrator.sweeps.tune_run as tune_run

    started = time.monotonic()
    # A workload of the user's own, outside the repo: Tune's restored trials must import it again.
    workload = own_copy_of_curves(shared.work, "mylab_curves")
    sweep = load_sweep_file(write_sweep(shared.work, "asha", "asha", workload=workload))
    assert sweep.load_workload().module.__file__.startswith(str(shared.work))
    armed = shared.work / "asha.armed"
    armed.touch()
    monkeypatch.setattr(tune_run, "_console_callback", lambda *args: dies_at_third_trial(armed))
    with pytest.raises(TuneError, match="DriverDies: the driver died"):  # Tune wraps what its loop raised
        run_sweep(sweep)
    before = children(shared.client, "asha")
    parent = shared.client.get_run(before[0].data.tags["mlflow.parentRunId"])
    assert parent.info.status == "FAILED", "the parent run of a sweep that died is left " + parent.info.status
    assert "RUNNING" not in {r.info.status for r in before}

    result = run_sweep(sweep, resume=True, progress=False)
    assert not [t for t in result.trials if t["error"]], result.trials
    runs = children(shared.client, "asha")
    assert len(runs) == TRIALS, "a trial got a second MLflow run"
    assert {r.data.tags["workload"] for r in runs} == {workload}
    stopped, points = assert_whole_curves(shared.client, runs, resumed=True)
    # Not seed-dependent: one noise draw for every trial (see the median test).
    assert stopped == sum(t["stopped"] for t in result.trials) >= 1, "ASHA stopped no trial"
    assert shared.client.get_run(result.parent_run_id).info.status == "FINISHED"
    assert "finished" in format_trials(result) and "%" in format_trials(result)
    # A finished sweep resumed again reruns nothing and records nothing new.
    again = run_sweep(sweep, resume=True, progress=False)
    assert not [t for t in again.trials if t["error"]], again.trials
    assert len(children(shared.client, "asha")) == TRIALS, "resuming a finished sweep started new trials"
    print(f"asha: the driver died with {len(before)} trials started ({sorted(r.info.status for r in before)}); after "
          f"--resume {len(runs)} trials, {stopped} stopped, {points} points recorded, {time.monotonic() - started:.1f} s")


def test_an_address_where_nothing_listens_is_refused_before_anything_is_recorded(workdir):
    started = time.monotonic()
    out = run_cli(["run", "curves", "--smoke", "--workers", "1"], workdir, timeout=60, env={"RAY_ADDRESS": "127.0.0.1:1"})
    took = time.monotonic() - started
    assert out.returncode == 2, out.stderr[-3000:]
    assert "RAY_ADDRESS=127.0.0.1:1: nothing is listening there" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert took < 15, took
    assert not (workdir / "mlruns.db").exists() and not (workdir / "ladder-runs").exists()
    print(f"RAY_ADDRESS=127.0.0.1:1: refused in {took:.1f} s")


@pytest.mark.parametrize("auth", [{"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}])
def test_a_token_cluster_without_its_token_is_refused_with_the_fix(shared, auth):
    if not shared.token:
        pytest.skip("the local Ray runs without token authentication (RAY_AUTH_MODE=disabled here)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    code = "import sys; from orchestrator.runners.launch import check_cluster; check_cluster(sys.argv[1])"
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, shared.address], env={**env, **auth}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and time.monotonic() - started < 15
    assert f"the Ray cluster at RAY_ADDRESS={shared.address} requires an authentication token" in out.stderr, out.stderr
    assert "RAY_AUTH_MODE=token" in out.stderr and "RAY_AUTH_TOKEN" in out.stderr
