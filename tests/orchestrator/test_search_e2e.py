"""TPE sweeps of the synthetic curves workload end to end, on one local Ray and one MLflow store
shared by the module: TPE proposing and the collapse scheduler stopping (the study learns every
trial's end, the parent run records the search), and a sweep whose driver is killed mid-sweep
and resumed with its study (no finished trial trained again, every result in the study, the
proposals made after Tune's last save handed out again as the same trials).

Trials are tiny (a 100-step curve, 20 reports), so the cost is Tune's, Optuna's and MLflow's.
Three fields shape the final loss: lr, warmup and schedule (workloads/curves).
"""

from __future__ import annotations

import glob
import os
import pickle
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest

from conftest import LADDER, shifted, wait_for
from orchestrator.tracking import sink as tracking
from orchestrator.sweep import load_sweep_file
from orchestrator.sweeps.tune_run import run_sweep

STEPS, EVERY = 100, 5
SWEEP = """
from orchestrator.sweep import Sweep, choice, loguniform, seeds, uniform
common = {{"steps": {steps}, "report_every": {every}, "checkpoint_every": 20, "seed": {seed}}}
sweep = Sweep(name="{name}", workload="curves", base="smoke", overrides=common, space={space},
              search="{search}", seed={seed}, num_samples={n}, max_concurrent=2, scheduler="{scheduler}",
              scheduler_options={options}, objective=("eval/loss", "min"))
"""
SPACE = '{"lr": loguniform(1e-3, 1e-1), "warmup": uniform(0.0, 0.3), "schedule": choice("cosine", "linear", "constant")}'


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One local Ray and one folder (so one MLflow store) for the module, with the reference
    runs the collapse scheduler needs (two seeds of the default curve, run to the end)."""
    import ray

    work = tmp_path_factory.mktemp("search")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 object_store_memory=100 * 2**20)
        try:
            ref = write(work, "ref", space=f'{{"seed": seeds(2, start={shifted(0)})}}', search="random", n=1,
                        scheduler="fifo", options="{}")
            run_sweep(load_sweep_file(ref), progress=False)
            yield SimpleNamespace(work=work, client=tracking.client(tracking.tracking_uri()))
        finally:
            ray.shutdown()


def write(work, name: str, *, space: str = SPACE, search: str = "tpe", n: int = 8, scheduler: str, options: str):
    path = work / f"{name}.py"
    # The curves' noise and TPE's sampler take the test's seed, moved by LADDER_TEST_SEED_SHIFT (also
    # in the killed sweep's own process, which smoke()'s shift does not reach).
    path.write_text(SWEEP.format(name=name, steps=STEPS, every=EVERY, space=space, search=search, n=n,
                                 scheduler=scheduler, options=options, seed=shifted(0)))
    return path


def children(c, name: str) -> list:
    exp = c.get_experiment_by_name(name)
    return [r for r in c.search_runs([exp.experiment_id]) if "ladder.trial_id" in r.data.tags] if exp else []


def saved_search(folder) -> dict | None:
    """The searcher's state as Tune last saved it (its Optuna study, and which trial is which):
    the newest invocation's file, by the start time in its name, as Tune picks it."""
    paths = sorted(glob.glob(str(folder / "tune" / "searcher-state-*.pkl")))
    if not paths:
        return None
    with open(paths[-1], "rb") as f:
        return pickle.load(f)


def study_of_trials(state: dict) -> dict[str, object]:
    """Ladder trial id -> its Optuna trial, in a saved searcher state."""
    trials = {t.number: t for t in state["_ot_study"].trials}
    return {state["_root_of"][tid]: trials[number] for tid, number in state["_number_of"].items()}


def assert_study_has_every_end(c, runs, state) -> tuple[int, int]:
    """Every trial's end is in the study: a trial that trained to the end as COMPLETE with its
    final objective, one the scheduler stopped as PRUNED at the fraction it reached."""
    of = study_of_trials(state)
    done = stopped = 0
    for r in runs:
        tid = r.data.tags["ladder.trial_id"]
        trial = of[tid]
        assert set(trial.params) == {"lr", "warmup", "schedule"}, (tid, trial.params)
        assert float(r.data.params["lr"]) == pytest.approx(trial.params["lr"]), tid
        if r.data.tags.get("ladder.stopped_early") == "true":
            stopped += 1
            assert trial.state.name == "PRUNED", (tid, trial.state)
            # Where it was stopped (after a restart, maybe further than where Tune last stopped it).
            (step, value), = trial.intermediate_values.items()
            curve = {m.step: m.value for m in c.get_metric_history(r.info.run_id, "eval/loss")}
            assert step < 1000 and curve[round(step * STEPS / 1000)] == pytest.approx(value), (tid, step, value)
        else:
            done += 1
            assert trial.state.name == "COMPLETE", (tid, trial.state)
            assert trial.value == pytest.approx(r.data.metrics["eval/loss"]), tid
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in state["_ot_study"].trials) == len(runs)
    return done, stopped


@pytest.mark.slow
def test_tpe_proposes_and_collapse_stops(shared):
    started = time.monotonic()
    options = '{"reference": {"experiment": "ref"}, "rungs": (0.2, 0.4), "keep_quantile": 0.5}'
    sweep = load_sweep_file(write(shared.work, "tpe", scheduler="collapse", options=options))
    result = run_sweep(sweep, progress=False)
    c = shared.client
    assert not [t for t in result.trials if t["error"]], result.trials
    runs = children(c, "tpe")
    assert len(runs) == len(result.trials) == 8 and all(r.info.status == "FINISHED" for r in runs)
    done, stopped = assert_study_has_every_end(c, runs, saved_search(result.storage))
    # margin: trials stopped, worst 2 over seeds 1-5 (3, 7, 4, 2, 4; TPE's seed and the curves' moved
    # together by LADDER_TEST_SEED_SHIFT), threshold 1. (Which trials TPE proposes sets it: the
    # curves of one sweep share one noise draw.)
    assert stopped == sum(t["stopped"] for t in result.trials) >= 1, "the collapse scheduler stopped no trial"
    assert len({(t["params"]["lr"], t["params"]["warmup"]) for t in result.trials}) == 8
    # The parent run: the search, its settings, and the best trial that trained to the end.
    parent = c.get_run(result.parent_run_id)
    assert parent.data.tags["ladder.search"] == "tpe"
    assert {k: v for k, v in parent.data.params.items() if k.startswith("sweep.search")} == {
        "sweep.search": "tpe", "sweep.search.seed": str(shifted(0)), "sweep.search.max_concurrent": "2",
        "sweep.search.sampler": "optuna.samplers.TPESampler", "sweep.search.proposals": "8",
        "sweep.search.n_startup_trials": "2", "sweep.search.seeds_per_proposal": "1"}
    finished = [t for t in result.trials if t["state"] == "finished"]
    best = min(finished, key=lambda t: t["objective"])
    assert parent.data.metrics["eval/loss"] == pytest.approx(best["objective"])
    assert parent.data.tags["ladder.best_trial"] == best["trial_id"]
    print(f"tpe + collapse: 8 trials, {done} trained to the end, {stopped} stopped, best eval/loss "
          f"{best['objective']:.4f}, {time.monotonic() - started:.1f} s")


@pytest.mark.slow
def test_killed_tpe_sweep_resumes_with_its_study(shared):
    """SIGKILL of the sweep's driver once four proposals are made (two at a time: at least two
    trials have ended, one trained to the end) and one of them since Tune last saved the
    searcher; then --resume."""
    started = time.monotonic()
    c = shared.client
    options = '{"reference": {"experiment": "ref"}, "rungs": (0.2, 0.4), "keep_quantile": 0.5}'
    path = write(shared.work, "tpe_resume", n=6, scheduler="collapse", options=options)
    folder = shared.work / "ladder-runs" / "sweeps" / "tpe_resume"
    journal = folder / "proposals.jsonl"

    def kill_point() -> bool:
        """Four proposals made, one of them since Tune last saved the searcher, and a trial trained
        to the end (files first, MLflow last: the trials are short, and the sweep must not end
        between two looks)."""
        made = journal.read_text().count("\n") if journal.is_file() else 0
        state = saved_search(folder) if made >= 4 else None
        return (state is not None and made > len(state["_root_of"])
                and any(r.info.status == "FINISHED" for r in children(c, "tpe_resume")))

    proc = subprocess.Popen(LADDER + ["sweep", str(path)], cwd=shared.work, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(kill_point, proc, poll=0.02, frozen=True)  # Tune must not save the searcher after the look
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    at_death = saved_search(folder)
    lost = journal.read_text().count("\n") - len(at_death["_root_of"])
    done_before = {r.data.tags["ladder.trial_id"]: (r.info.end_time, len(c.get_metric_history(r.info.run_id, "train/loss")))
                   for r in children(c, "tpe_resume") if r.info.status == "FINISHED"}
    assert lost >= 1 and 1 <= len(done_before) < 6, (lost, done_before)

    result = run_sweep(load_sweep_file(path), resume=True, progress=False)
    assert not [t for t in result.trials if t["error"]], result.trials
    runs = children(c, "tpe_resume")
    assert len(runs) == len(result.trials) == 6, "a trial got a second MLflow run, or one was lost"
    assert all(r.info.status == "FINISHED" for r in runs)
    for r in runs:
        tid = r.data.tags["ladder.trial_id"]
        if tid in done_before:
            points = len(c.get_metric_history(r.info.run_id, "train/loss"))
            assert (r.info.end_time, points) == done_before[tid], f"{tid} finished before the kill and trained again"
    after = saved_search(result.storage)
    done, stopped = assert_study_has_every_end(c, runs, after)
    # The study went on from what Tune had saved: the same trials under the same numbers, those
    # told before the kill with the same ends; the lost proposals came back as the same trials.
    final = {t.number: t for t in after["_ot_study"].trials}
    for t in at_death["_ot_study"].trials:
        assert final[t.number].params == t.params
        if t.state.name != "RUNNING":
            assert (final[t.number].state, final[t.number].value) == (t.state, t.value)
    handed_again = {root for tid, root in after["_root_of"].items() if root != tid}
    assert len(handed_again) == lost and handed_again <= {r.data.tags["ladder.trial_id"] for r in runs}
    assert c.get_run(result.parent_run_id).info.status == "FINISHED"
    print(f"tpe + collapse, driver SIGKILL: {len(done_before)} trials had trained to the end (none again), {lost} "
          f"proposals made after Tune's last save (handed out again as the same trials); after --resume {done} "
          f"trained to the end, {stopped} stopped, {len(after['_ot_study'].trials)} trials in the study, "
          f"{time.monotonic() - started:.1f} s")
