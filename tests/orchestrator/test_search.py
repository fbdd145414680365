"""Model-based search (`Sweep(search="tpe")`): what `check()` refuses before anything starts, and
how the searcher proposes, learns from each trial's end and resumes. No Ray runs here: the
searcher is driven directly, as Tune would drive it."""

from __future__ import annotations

import inspect
import json
import math
import pickle

import pytest

from conftest import shifted
from orchestrator.commands.cli import main
from orchestrator.sweep import (MODEL_BASED_CONCURRENCY, TPE_OPTIONS, Grid, Sweep, SweepError, choice, grid,
                                load_sweep_file, loguniform, seeds, uniform)
from orchestrator.sweeps.tune_run import resolve_concurrency

SPACE = {"lr": loguniform(1e-3, 1e-1), "warmup": uniform(0.0, 0.3), "schedule": choice("cosine", "linear", "constant")}


def tpe(**kw) -> Sweep:
    return Sweep(**{"name": "t", "workload": "curves", "base": "smoke", "space": SPACE, "search": "tpe",
                    "num_samples": 8, "max_concurrent": 1, **kw})


@pytest.mark.parametrize(
    "kw,expected",
    [
        ({"search": "tpee"}, "unknown search 'tpee'; did you mean 'tpe'?"),
        ({"search": "bayes"}, "(known: random, grid, tpe)"),
        ({"space": {**SPACE, "floor": grid(1.0, 2.0)}},
         "search-space field 'floor': search='tpe' proposes values itself, and a grid(...) axis enumerates them: "
         "use choice(...) for a categorical field with TPE"),
        ({"points": ({"lr": 1e-2},)}, "points: search='tpe' proposes every field itself and cannot run explicit points"),
        ({"space": {**SPACE, "seed": seeds(2), "noise": seeds(2)}}, "repeats each proposal over one seeds(n) axis"),
        ({"space": {"lr": 1e-2, "seed": seeds(2)}}, "search='tpe' has nothing to search"),
        ({"search_options": {"n_startup": 3}}, "unknown search option 'n_startup' for search='tpe'; did you mean 'n_startup_trials'?"),
        ({"search_options": {"seed": 3}}, "the seed is Sweep.seed"),
        ({"search_options": {"n_startup_trials": -1}}, "n_startup_trials must be a whole number >= 0"),
        ({"max_concurrent": 0}, "max_concurrent must be at least 1"),
        ({"search": "grid"}, "search-space field 'lr': search='grid' enumerates every trial, and loguniform(...) is sampled"),
        ({"search": "random", "search_options": {"n_startup_trials": 3}}, "search='random' takes none"),
    ],
)
def test_a_domain_or_option_the_search_cannot_use_is_refused_with_the_alternative(kw, expected):
    with pytest.raises(SweepError) as err:
        tpe(**kw).check()
    assert expected in str(err.value)


def test_refused_by_ladder_sweep_check_before_anything_starts(workdir, capsys, monkeypatch):
    import ray

    monkeypatch.setenv("LADDER_NUM_CPUS", "8")  # more than the search's default of trials at once

    path = workdir / "s.py"
    path.write_text("from orchestrator.sweep import *\n"
                    "sweep = Sweep(name='s', workload='curves', base='smoke', search='tpe', space={'lr': grid(1e-3, 1e-2)})\n")
    assert main(["sweep", str(path), "--check"]) == 2
    assert "use choice(...) for a categorical field with TPE" in capsys.readouterr().err
    path.write_text("from orchestrator.sweep import *\n"
                    "sweep = Sweep(name='s', workload='curves', base='smoke', search='tpe', num_samples=12,\n"
                    "              space={'lr': loguniform(1e-3, 1e-1), 'seed': seeds(2)})\n")
    assert main(["sweep", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "is valid: 24 trials of curves" in out
    assert "search: TPE (Optuna, seed 0): 12 proposals, the first 4 random, each run over 2 seeds of seed; at most 4" in out
    assert not ray.is_initialized() and not (workdir / "mlruns.db").exists()


def test_the_default_search_is_todays_and_grid_draws_the_same_trials():
    space = {"lr": grid(1e-3, 1e-2), "seed": seeds(2)}
    today = Sweep(name="x", workload="curves", base="smoke", space=space)
    assert today.search == "random" and not today.model_based
    assert isinstance(seeds(2), Grid) and seeds(2).values == (0, 1)
    assert Sweep(**{**today.__dict__, "search": "grid"}).trial_params() == today.trial_params()
    with pytest.raises(SweepError, match="no list of them up front"):
        tpe().trial_params()


def test_concurrency_of_a_model_based_search_defaults_to_a_few_trials():
    assert resolve_concurrency(tpe(max_concurrent=None), cpus=64) == MODEL_BASED_CONCURRENCY == 4
    assert resolve_concurrency(tpe(max_concurrent=None), cpus=2) == 2
    assert resolve_concurrency(tpe(max_concurrent=16), cpus=64) == 16
    assert resolve_concurrency(Sweep(name="x", workload="curves", space={"lr": grid(1e-3)}), cpus=64) == 64


def test_tpe_options_are_optunas_and_the_settings_go_to_the_parent_run():
    import optuna

    accepted = inspect.signature(optuna.samplers.TPESampler).parameters
    assert set(TPE_OPTIONS) <= set(accepted) and "seed" not in TPE_OPTIONS
    s = tpe(seed=3, num_samples=30, search_options={"n_ei_candidates": 12}, space={**SPACE, "seed": seeds(2)})
    assert s.search_settings(2) == {
        "sweep.search": "tpe", "sweep.search.seed": "3", "sweep.search.max_concurrent": "2",
        "sweep.search.sampler": "optuna.samplers.TPESampler", "sweep.search.proposals": "30",
        "sweep.search.n_startup_trials": "10", "sweep.search.seeds_per_proposal": "2", "sweep.search.n_ei_candidates": "12"}
    assert tpe(num_samples=12).startup_trials() == 4 and tpe(num_samples=3).startup_trials() == 2
    assert tpe(search_options={"n_startup_trials": 0}).startup_trials() == 0
    assert Sweep(name="x", workload="curves").search_settings(2) == {
        "sweep.search": "random", "sweep.search.seed": "0", "sweep.search.max_concurrent": "2"}


# --- the searcher, driven as Tune drives it ---------------------------------------------------


def objective(params) -> float:
    from workloads.curves import Config, final_loss

    return final_loss(Config(lr=params["lr"], warmup=params["warmup"], schedule=params["schedule"]))


def drive(searcher, n: int, *, prefix: str = "t", end=None) -> list[dict]:
    """Propose n trials one at a time, each ending as `end(i, params)` says (default: finished)."""
    configs = []
    for i in range(n):
        config = searcher.suggest(f"{prefix}{i}")
        configs.append(config)
        outcome = end(i, config["params"]) if end else {"eval/loss": objective(config["params"]), "progress": 1.0}
        if outcome.get("error"):
            searcher.on_trial_complete(f"{prefix}{i}", error=True)
        else:
            searcher.on_trial_complete(f"{prefix}{i}", result=outcome)
    return configs


def test_proposals_are_seeded_model_based_and_carry_the_fixed_values():
    from orchestrator.sweeps import search

    s = tpe(num_samples=16, seed=shifted(0), space={**SPACE, "floor": 3.0})
    searcher = search.build(s)
    assert searcher.metric is None  # Tune does not demand the objective in every report
    sampler = searcher.study.sampler
    assert type(sampler).__name__ == "TPESampler" and sampler._n_startup_trials == 5
    assert searcher.study.direction.name == "MINIMIZE"
    first = drive(searcher, 16)
    assert all(c["params"]["floor"] == 3.0 and set(c["params"]) == {"lr", "warmup", "schedule", "floor"} for c in first)
    assert first == drive(search.build(s), 16), "the same seed proposed other trials"
    assert first != drive(search.build(tpe(num_samples=16, seed=shifted(0) + 1, space={**SPACE, "floor": 3.0})), 16)
    trials = searcher.study.trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 16
    assert [t.value for t in trials] == pytest.approx([objective(c["params"]) for c in first])
    # Model-based: the first 5 proposals are the random start (those of a search that stays random,
    # at the same seed) and every later one comes from the model (none is the random search's);
    # the model learned the results: the same search told other results proposes the same random
    # start, then other trials. (Mechanism, not a margin: whether the later proposals gather nearer
    # lr = 1e-2 than the random ones is a coin flip at 16 proposals. Measured at seeds 0-11, their
    # mean |log10(lr / 1e-2)| was below the random start's at 8 seeds, above it at 1, 2, 10 and 11.)
    random_start = drive(search.build(tpe(num_samples=16, seed=shifted(0), space={**SPACE, "floor": 3.0},
                                          search_options={"n_startup_trials": 16})), 16)
    same = [a["params"] == b["params"] for a, b in zip(first, random_start)]
    assert same == [True] * 5 + [False] * 11, same
    told_otherwise = drive(search.build(s), 16, end=lambda i, p: {"eval/loss": -objective(p), "progress": 1.0})
    same = [a["params"] == b["params"] for a, b in zip(first, told_otherwise)]
    assert same[:5] == [True] * 5 and not all(same[5:]), same


def test_a_trial_stopped_early_is_pruned_at_the_fraction_it_reached_and_a_failure_is_left_out():
    from orchestrator.sweeps import search

    searcher = search.build(tpe(num_samples=7, objective=("eval/loss", "min")))
    ends = {0: {"eval/loss": 2.0, "progress": 1.0}, 1: {"eval/loss": 2.6, "progress": 0.3},
            2: {"eval/loss": float("nan"), "progress": 0.5}, 3: {"error": True}, 4: {"progress": 1.0},
            5: {"eval/loss": 2.1, "progress": 1.0}}
    drive(searcher, 6, end=lambda i, p: ends[i])
    trials = searcher.study.trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "PRUNED", "FAIL", "FAIL", "COMPLETE"]
    assert trials[0].value == 2.0 and trials[5].value == 2.1
    assert trials[1].intermediate_values == {300: 2.6}  # where the scheduler stopped it, never as a final value
    assert math.isnan(trials[2].intermediate_values[500])  # diverged
    # Restarted short of where it was stopped (a resumed sweep), stopped again at once: pruned where it had been.
    searcher.suggest("t6")
    searcher.on_trial_result("t6", {"eval/loss": 2.7, "progress": 0.2})
    searcher.on_trial_complete("t6", result={"eval/loss": 3.0, "progress": 0.05})
    assert searcher.study.trials[6].state.name == "PRUNED" and searcher.study.trials[6].intermediate_values == {200: 2.7}
    # An Optuna trial is told once.
    searcher.on_trial_complete("t0", result={"eval/loss": 1.0, "progress": 1.0})
    assert searcher.study.trials[0].value == 2.0 and len(searcher.study.trials) == 7


def test_with_seeds_every_proposal_runs_once_per_seed_and_tpe_learns_the_mean():
    from orchestrator.sweeps import search

    s = tpe(num_samples=3, space={**SPACE, "seed": seeds(2, start=5)})
    assert s.trial_count() == 6
    searcher = search.build(s)
    configs = [searcher.suggest(f"t{i}") for i in range(4)]
    assert [c["params"]["seed"] for c in configs] == [5, 6, 5, 6]
    assert configs[0]["params"]["lr"] == configs[1]["params"]["lr"] != configs[2]["params"]["lr"]
    searcher.on_trial_complete("t0", result={"eval/loss": 2.0, "progress": 1.0})
    assert searcher.study.trials[0].state.name == "RUNNING"  # waits for its other seed
    searcher.on_trial_complete("t1", result={"eval/loss": 2.2, "progress": 1.0})
    assert searcher.study.trials[0].state.name == "COMPLETE" and searcher.study.trials[0].value == pytest.approx(2.1)
    searcher.on_trial_complete("t2", result={"eval/loss": 2.0, "progress": 1.0})
    searcher.on_trial_complete("t3", result={"eval/loss": 2.5, "progress": 0.2})  # one seed stopped: pruned
    assert searcher.study.trials[1].state.name == "PRUNED" and searcher.study.trials[1].intermediate_values == {200: 2.25}


def test_a_restored_searcher_hands_out_again_the_proposals_made_after_tunes_last_save(tmp_path):
    """Tune saves the searcher every few seconds; a driver killed between two saves loses the
    proposals made since. The restored searcher finds them in its journal and hands them out
    again first, as the same ladder trials, then continues without repeating them."""
    from orchestrator.sweeps import search

    s = tpe(num_samples=8, space={**SPACE, "seed": seeds(2)})
    journal = tmp_path / "proposals.jsonl"
    before = search.build(s, journal=journal)
    made = {f"t{i}": before.suggest(f"t{i}") for i in range(3)}
    for tid in ("t0", "t1"):
        before.on_trial_complete(tid, result={"eval/loss": objective(made[tid]["params"]), "progress": 1.0})
    before.save(str(tmp_path / "searcher.pkl"))  # Tune's last save
    made.update({f"t{i}": before.suggest(f"t{i}") for i in range(3, 5)})  # then the driver dies
    assert len(journal.read_text().splitlines()) == 5

    after = search.build(s, journal=journal)
    after.restore(str(tmp_path / "searcher.pkl"))
    assert [t.state.name for t in after.study.trials][:1] == ["COMPLETE"]  # what Tune saved, restored
    again = [after.suggest(f"n{i}") for i in range(2)]
    assert [c.get("trial_of") for c in again] == ["t3", "t4"]
    assert [c["params"] for c in again] == [made[t]["params"] for t in ("t3", "t4")]
    assert after.ladder_trial("n1") == "t4" and after.ladder_trial("n0") == "t3"
    fresh = [after.suggest(f"n{i}")["params"] for i in range(2, 8)]
    assert [p["seed"] for p in fresh] == [1, 0, 1, 0, 1, 0]  # t4's proposal gets its second seed first
    assert fresh[0]["lr"] == made["t4"]["params"]["lr"]
    seen = {(c["params"]["lr"], c["params"]["seed"]) for c in made.values()}
    assert not seen & {(p["lr"], p["seed"]) for p in fresh}, "a lost proposal was also proposed anew"
    assert len({p["lr"] for p in fresh}) == 4
    # Resumed before Tune saved anything: a new searcher hands out every journalled proposal again.
    anew = search.build(s, journal=journal)
    assert [anew.suggest(f"m{i}").get("trial_of") for i in range(5)] == ["t0", "t1", "t2", "t3", "t4"]
    # The journal and the state pickle as Tune does it (plain pickle of the searcher's state).
    pickle.dumps(after.__dict__)
    assert all("trial" in json.loads(line) for line in journal.read_text().splitlines())
