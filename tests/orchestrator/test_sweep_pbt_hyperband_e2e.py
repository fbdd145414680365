"""HyperBand and Population Based Training (scheduler='hyperband', 'pbt') run real sweeps of the
synthetic curves workload end to end, on one local Ray and one MLflow store shared by the module;
bad options are refused before Ray starts.

Every trial of a sweep here takes the same noise seed unless the sweep sets it, so at every report
the trials' losses stand in the ratio of their noise-free final losses (workloads/curves
`final_loss`): which trial is better at a rung does not depend on the seed. Trials are tiny (a
100-step curve, a report and a checkpoint every 10 steps), so the cost is Tune's and MLflow's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

from conftest import run_cli

from orchestrator.sweep import Sweep, SweepError, loguniform, uniform
from orchestrator.sweeps.tune_run import run_sweep
from orchestrator.tracking import sink as tracking
from workloads.curves import final_loss, smoke

STEPS, EVERY = 100, 10
OVERRIDES = {"steps": STEPS, "report_every": EVERY, "checkpoint_every": EVERY}


def refused(sweep: Sweep, match: str, workdir, monkeypatch) -> None:
    """`run_sweep` refuses `sweep` with `match` in its message, before Ray is started and before
    anything is recorded."""
    import orchestrator.runners.launch as launch

    def no_ray(*args, **kwargs):
        raise AssertionError("the sweep started Ray before refusing its options")

    monkeypatch.setattr(launch, "init_ray", no_ray)
    with pytest.raises(SweepError) as caught:
        run_sweep(sweep, progress=False)
    assert match in str(caught.value), str(caught.value)
    assert not (workdir / "mlruns.db").exists() and not (workdir / "ladder-runs").exists()


@pytest.mark.parametrize("options,match", [
    ({"mutate": ("lr",), "perturbation_intervall": 0.5},
     "unknown scheduler option 'perturbation_intervall' for scheduler='pbt'; did you mean 'perturbation_interval'?"),
    ({"mutate": ("lrr",)}, "names 'lrr', which is not a field of the sweep's space; did you mean 'lr'?"),
    ({"mutate": ("warmup",)}, "names 'warmup', which is not a field of the sweep's space"),
    ({}, "scheduler='pbt' needs scheduler_options={'mutate': (FIELD, ...)}"),
    ({"mutate": ("lr",), "perturbation_interval": 25}, "perturbation_interval of scheduler='pbt' is a fraction in (0, 1)"),
])
def test_bad_pbt_options_are_refused_before_ray_starts(workdir, monkeypatch, options, match):
    sweep = Sweep(name="bad_pbt", workload="curves", base="smoke", space={"lr": loguniform(1e-3, 1e-1)},
                  num_samples=2, scheduler="pbt", scheduler_options=options)
    refused(sweep, match, workdir, monkeypatch)


@pytest.mark.parametrize("options,match", [
    ({"reduction_factr": 3}, "unknown scheduler option 'reduction_factr' for scheduler='hyperband'; did you mean "
                             "'reduction_factor'?"),
    ({"max_t": 50}, "every scheduler compares trials on their training fraction, up to its end"),
    ({"reduction_factor": 1}, "reduction_factor of scheduler='hyperband' must be a number above 1"),
    ({"brackets": 8}, "would compare trials before 1% of training: give at most brackets=5"),
])
def test_bad_hyperband_options_are_refused_before_ray_starts(workdir, monkeypatch, options, match):
    sweep = Sweep(name="bad_hb", workload="curves", base="smoke", points=({"lr": 1e-2}, {"lr": 1e-1}),
                  scheduler="hyperband", scheduler_options=options)
    refused(sweep, match, workdir, monkeypatch)


def test_the_builders_take_the_tables_defaults_and_keep_pbt_within_the_space():
    from orchestrator.sweep import HYPERBAND_OPTIONS, PBT_OPTIONS, choice
    from orchestrator.sweeps import schedulers

    hb = schedulers.build("hyperband", {}, metric="eval/loss", mode="min")
    assert (hb._eta, hb._s_max_1) == (HYPERBAND_OPTIONS["reduction_factor"].default, HYPERBAND_OPTIONS["brackets"].default)
    assert [hb._get_r0(s) for s in range(hb._s_max_1)] == [100, 33, 11]  # each bracket's first rung, in percent
    space = {"lr": loguniform(1e-3, 1e-1), "schedule": choice("cosine", "linear")}
    pbt = schedulers.build("pbt", {"mutate": ("lr", "schedule")}, metric="eval/loss", mode="min", space=space)
    assert pbt._perturbation_interval == 100 * PBT_OPTIONS["perturbation_interval"].default
    assert (pbt._quantile_fraction, pbt._resample_probability, pbt._synch) == (
        PBT_OPTIONS["quantile_fraction"].default, PBT_OPTIONS["resample_probability"].default, PBT_OPTIONS["synch"].default)
    assert pbt._hyperparam_mutations["params"]["schedule"] == ["cosine", "linear"]
    # Ray multiplies a continuous field by a perturbation factor with no bound; ladder clips it to the domain.
    clip = pbt._custom_explore_fn
    assert clip({"params": {"lr": 0.12, "schedule": "linear"}})["params"] == {"lr": 0.1, "schedule": "linear"}
    assert clip({"params": {"lr": 8e-4}})["params"]["lr"] == 1e-3
    assert clip({"params": {"lr": 0.05}})["params"]["lr"] == 0.05


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One local Ray and one folder (so one MLflow store) for both sweeps."""
    import ray

    work = tmp_path_factory.mktemp("pbt_hyperband")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.delenv("LADDER_RUNS_DIR", raising=False)
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 object_store_memory=100 * 2**20)
        try:
            yield SimpleNamespace(work=work, client=tracking.client(tracking.tracking_uri()))
        finally:
            ray.shutdown()


def runs_by_trial(c, name: str) -> dict:
    exp = c.get_experiment_by_name(name)
    return {r.data.tags["ladder.trial_id"]: r for r in c.search_runs([exp.experiment_id])
            if "ladder.trial_id" in r.data.tags}


def curve(c, run, key: str = "eval/loss") -> dict[int, float]:
    """step -> value; every step reported once."""
    history = c.get_metric_history(run.info.run_id, key)
    steps = [m.step for m in history]
    assert len(steps) == len(set(steps)), (key, steps)
    return {m.step: m.value for m in history}


@pytest.mark.slow
def test_hyperband_stops_the_worse_trials_of_a_bracket_at_its_rung_and_lets_the_best_finish(shared):
    # reduction_factor 3, brackets 2: trials fill bracket 0 (2 trials, never stopped), then bracket
    # 1 (sized for 3, one rung at int(100/3) = 33% of training, which keeps the best 1 of 3).
    lrs = (5e-3, 2e-2, 1e-2, 1e-1, 5e-2)
    sweep = Sweep(name="hyperband", workload="curves", base="smoke", overrides=OVERRIDES,
                  points=tuple({"lr": lr} for lr in lrs), scheduler="hyperband",
                  scheduler_options={"reduction_factor": 3, "brackets": 2}, objective=("eval/loss", "min"))
    result = run_sweep(sweep, progress=False)
    assert not [t for t in result.trials if t["error"]], result.trials
    state = {t["params"]["lr"]: t for t in result.trials}
    assert {lr for lr, t in state.items() if t["state"] == "stopped"} == {1e-1, 5e-2}, result.trials
    assert {lr for lr, t in state.items() if t["state"] == "finished"} == {5e-3, 2e-2, 1e-2}, result.trials
    runs = runs_by_trial(shared.client, "hyperband")
    assert len(runs) == len(lrs)
    for lr, t in state.items():
        run = runs[t["trial_id"]]
        assert run.info.status == "FINISHED", (lr, run.info.status)
        steps = sorted(curve(shared.client, run))
        if t["state"] == "stopped":
            # Stopped at the first report past the rung, and recorded so, with the rung in the reason.
            assert t["progress"] == pytest.approx(0.4) and run.data.tags["ladder.stopped_at"] == "0.4000", lr
            assert run.data.tags["ladder.stopped_early"] == "true"
            assert t["why"] == "hyperband: not in the best 1 of 3 at rung 33% of bracket 1", t["why"]
            assert steps == list(range(EVERY, 41, EVERY)), (lr, steps)
        else:  # paused at the rung (lr 1e-2) or never compared (bracket 0): the whole curve, and the final metrics
            assert t["progress"] == 1.0 and run.data.tags.get("ladder.stopped_early") != "true", lr
            assert tracking.FINAL_TAG in run.data.tags, lr
            assert steps == list(range(EVERY, STEPS + 1, EVERY)), (lr, steps)
    # The kept trial of bracket 1 waited at the rung for the others, and continued from its checkpoint there.
    assert runs[state[1e-2]["trial_id"]].data.tags.get("ladder.restored_step") == "40"


@pytest.mark.slow
def test_pbt_moves_the_worse_trial_onto_the_better_ones_checkpoint_with_mutated_hyperparameters(shared):
    # Two trials: lr 1e-2 (better at every report, whatever their warmup draws) and 1e-1, each with
    # its own noise seed. At 50% the worse one exploits the better: it continues from the better
    # one's checkpoint of step 50 (its config, noise state included) with warmup mutated within the space.
    sweep = Sweep(name="pbt", workload="curves", base="smoke", overrides=OVERRIDES,
                  points=({"lr": 1e-2, "seed": 0}, {"lr": 1e-1, "seed": 1}),
                  space={"warmup": uniform(0.0, 0.2)}, num_samples=1, scheduler="pbt",
                  scheduler_options={"mutate": ("warmup",), "perturbation_interval": 0.5},
                  objective=("eval/loss", "min"))
    result = run_sweep(sweep, progress=False)
    assert not [t for t in result.trials if t["error"]], result.trials
    assert [t["state"] for t in result.trials] == ["finished", "finished"], result.trials
    runs = runs_by_trial(shared.client, "pbt")
    # Identified by what they started with (a run's params are its first config).
    good = next(t for t in result.trials if runs[t["trial_id"]].data.params["seed"] == "0")
    bad = next(t for t in result.trials if runs[t["trial_id"]].data.params["seed"] == "1")
    good_run, bad_run = runs[good["trial_id"]], runs[bad["trial_id"]]
    assert "ladder.pbt.exploits" not in good_run.data.tags, "the better trial exploited the worse"
    exploits = json.loads(bad_run.data.tags["ladder.pbt.exploits"])
    assert len(exploits) == 1 and exploits[0]["from"] == good["trial_id"], exploits
    assert exploits[0]["at"] == pytest.approx(0.5) and exploits[0]["from_step"] == 50, exploits
    assert bad_run.data.tags["ladder.restored_step"] == "50"
    # Its config: the better trial's, warmup mutated within the space.
    started_warmup = float(bad_run.data.params["warmup"])
    assert good["params"]["warmup"] == pytest.approx(float(good_run.data.params["warmup"]))  # unchanged
    assert bad["params"]["lr"] == 1e-2 and bad["params"]["seed"] == 0, bad["params"]
    assert 0.0 <= bad["params"]["warmup"] <= 0.2, bad["params"]
    assert bad["params"]["warmup"] not in (started_warmup, good["params"]["warmup"]), (bad["params"], started_warmup)
    assert bad["params"]["warmup"] == pytest.approx(exploits[0]["params"]["warmup"])

    # Mechanism: curves reports final_loss(cfg) * shape(progress) * noise, the noise drawn from the
    # seed's stream, which the checkpoint carries. Divided by final_loss, the worse trial's curve
    # is its own stream (seed 1) up to step 50, then the better trial's stream (seed 0) from its
    # checkpoint on, under the new config.
    base = smoke()
    cfg_good = dataclasses.replace(base, **OVERRIDES, **good["params"])
    cfg_bad_before = dataclasses.replace(base, **OVERRIDES, lr=1e-1, seed=1, warmup=started_warmup)
    cfg_bad_after = dataclasses.replace(base, **OVERRIDES, **bad["params"])
    g, b = curve(shared.client, good_run), curve(shared.client, bad_run)
    assert sorted(b) == sorted(g) == list(range(EVERY, STEPS + 1, EVERY)), (sorted(b), sorted(g))
    for step in b:
        if step <= 50:
            assert b[step] / final_loss(cfg_bad_before) != pytest.approx(g[step] / final_loss(cfg_good), rel=1e-6)
        else:
            assert b[step] / final_loss(cfg_bad_after) == pytest.approx(g[step] / final_loss(cfg_good), rel=1e-9), step
    assert math.isclose(bad["objective"], b[STEPS]) and tracking.FINAL_TAG in bad_run.data.tags


# Ray's `pbt_function.py` shape, ported: a toy score grows by a rate set by the trial's learning rate
# (plus a `momentum` knob that PBT mutates), and a trial ends as soon as its score passes a bar, as
# Ray's example ends a trial whose accuracy passed its `done` bar.
BAR_WORKLOAD = '''
"""A score that grows each step; the trial ends once it passes `bar` (its own stopping rule)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    lr: float = 0.01
    """The score gains 10 * lr per step."""
    momentum: float = 0.0
    """Adds momentum * lr per step (the knob PBT mutates)."""
    steps: int = 20
    """Budget in steps."""
    bar: float = 10.0
    """The trial ends once its score passes this."""


def smoke() -> Config:
    return Config()


def train(cfg: Config, run) -> dict:
    state = run.restore()
    step, score = (int(state["step"]), float(state["score"])) if state else (0, 0.0)
    while step < cfg.steps and score <= cfg.bar:
        step += 1
        score += (10.0 + cfg.momentum) * cfg.lr
        run.report({"train/loss": -score, "eval/score": score, "progress": step / cfg.steps}, step=step)
        run.save({"step": step, "score": score})
    return {"eval/score": score}
'''


BAR_SWEEP = """
from orchestrator.sweep import Sweep, uniform
sweep = Sweep(name="pbt_bar", workload="bar", base="smoke",
              points=({"lr": 0.01}, {"lr": 0.02}, {"lr": 0.2}), space={"momentum": uniform(0.0, 1.0)},
              num_samples=1, scheduler="pbt", cpus_per_worker=2.0,
              scheduler_options={"mutate": ("momentum",), "perturbation_interval": 0.5},
              objective=("eval/score", "max"))
"""


@pytest.mark.slow
def test_synchronous_pbt_goes_on_when_a_trial_ends_before_the_sync_point(workdir):
    """Ray's default PBT is synchronous: trials wait at each perturbation point for every live
    trial behind it, and Ray perturbs when the last of them reports there. Here the last trial
    passes its bar and ends before that point, while the other two wait there; without ladder's
    release (`Pbt.choose_trial_to_run`) they would wait for ever. One trial runs at a time (2 CPUs
    each, on a `ladder sweep` of its own), in the order of `points`."""
    (workdir / "bar.py").write_text(BAR_WORKLOAD)
    (workdir / "pbt_bar.py").write_text(BAR_SWEEP)
    out = run_cli(["sweep", "pbt_bar.py"], workdir, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    c = tracking.client(f"sqlite:///{workdir / 'mlruns.db'}")
    runs = runs_by_trial(c, "pbt_bar")
    by_lr = {float(r.data.params["lr"]): r for r in runs.values()}
    slow, mid, fast = by_lr[0.01], by_lr[0.02], by_lr[0.2]
    assert all(r.info.status == "FINISHED" for r in runs.values()) and len(runs) == 3

    def progress(run) -> list:
        return c.get_metric_history(run.info.run_id, "progress")

    # Precondition: the fast trial started only once both others were paused at 50%, and ended below it.
    for run in (slow, mid):
        at_sync = [m for m in progress(run) if m.value == 0.5]
        assert at_sync and at_sync[0].timestamp <= fast.info.start_time, "the trials did not wait at 50% in order"
    assert max(m.value for m in progress(fast)) < 0.5  # 2 or more a step: past 10 by step 6
    # The two that waited were perturbed at 50% once it ended: the worse (lr 0.01) continued from the
    # better one's checkpoint of step 10 with momentum mutated, and both ran to the end.
    assert max(m.value for m in progress(slow)) == max(m.value for m in progress(mid)) == 1.0
    exploits = json.loads(slow.data.tags["ladder.pbt.exploits"])
    assert len(exploits) == 1 and exploits[0]["from"] == mid.data.tags["ladder.trial_id"], exploits
    assert exploits[0]["at"] == pytest.approx(0.5) and exploits[0]["from_step"] == 10, exploits
    assert 0.0 <= exploits[0]["params"]["momentum"] <= 1.0, exploits
    assert slow.data.tags["ladder.restored_step"] == "10"
    assert "ladder.pbt.exploits" not in mid.data.tags and "ladder.pbt.exploits" not in fast.data.tags


def test_pbt_on_a_workload_that_never_checkpoints_is_refused_before_anything_starts(workdir, monkeypatch, capsys):
    """Without checkpoints PBT exploits nothing (a random search that exits 0): refused by `--check`
    and at launch, before Ray starts, naming run.save. The same loop that saves passes the check."""
    from orchestrator.commands.cli import main

    monkeypatch.syspath_prepend(str(workdir))
    (workdir / "bar_nosave.py").write_text(BAR_WORKLOAD.replace('        run.save({"step": step, "score": score})\n', ""))
    (workdir / "bar_saves.py").write_text(BAR_WORKLOAD)
    (workdir / "s.py").write_text(BAR_SWEEP.replace('workload="bar"', 'workload="bar_nosave"'))
    assert main(["sweep", "s.py", "--check"]) == 2
    err = capsys.readouterr().err
    assert "workload 'bar_nosave' never calls run.save(state) (read from its source, bar_nosave.py)" in err, err
    assert not (workdir / "mlruns.db").exists()
    sweep = Sweep(name="nosave", workload="bar_nosave", base="smoke", space={"momentum": uniform(0.0, 1.0)},
                  num_samples=2, scheduler="pbt", scheduler_options={"mutate": ("momentum",)})
    refused(sweep, "PBT would exploit nothing and the sweep would be a random search", workdir, monkeypatch)
    dataclasses.replace(sweep, workload="bar_saves").check()


def test_a_scheduler_on_a_loop_that_only_returns_its_objective_is_refused(workdir, monkeypatch, capsys):
    """A loop that never calls run.report gives a scheduler no curve (every trial looked stopped, and
    the sweep had no best): refused for every scheduler but fifo, before anything starts. A loop
    that hands its run to a helper is not judged (the calls may be there)."""
    from orchestrator.commands.cli import main
    from orchestrator.runners import registry

    monkeypatch.syspath_prepend(str(workdir))
    returns_only = BAR_WORKLOAD.replace(
        '        run.report({"train/loss": -score, "eval/score": score, "progress": step / cfg.steps}, step=step)\n', "")
    (workdir / "bar_returns.py").write_text(returns_only)
    (workdir / "s.py").write_text("from orchestrator.sweep import Sweep, loguniform\n"
                                  "sweep = Sweep(name='r', workload='bar_returns', space={'lr': loguniform(1e-3, 1e-1)},\n"
                                  "              num_samples=4, scheduler='asha', objective=('eval/score', 'max'))\n")
    assert main(["sweep", "s.py", "--check"]) == 2
    err = capsys.readouterr().err
    assert ("scheduler='asha' decides on the curve each trial reports as it trains, and workload 'bar_returns' never "
            "calls run.report(metrics, step=step) (read from its source, bar_returns.py)") in err, err
    assert not (workdir / "mlruns.db").exists()
    fifo = Sweep(name="r", workload="bar_returns", space={"lr": loguniform(1e-3, 1e-1)}, num_samples=2)
    fifo.check()  # fifo needs no curve
    helper = BAR_WORKLOAD.replace("def train(cfg: Config, run) -> dict:\n", "def train(cfg: Config, run) -> dict:\n"
                                  "    return _loop(cfg, run)\n\n\ndef _loop(cfg, run):\n")
    (workdir / "bar_helper.py").write_text(helper)
    assert registry.run_calls(registry.import_workload("bar_helper").train, "report") is None
    (workdir / "bar_plain.py").write_text(BAR_WORKLOAD)
    report_line = next(i for i, text in enumerate(BAR_WORKLOAD.splitlines(), 1) if "run.report(" in text)
    assert registry.run_calls(registry.import_workload("bar_plain").train, "report") == [report_line]
