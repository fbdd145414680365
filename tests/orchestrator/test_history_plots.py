"""optuna-dashboard's three study plots for a sweep (orchestrator/sweeps/history_plots.py): the
best-so-far line of the optimisation history, fANOVA importances that find the one parameter
that matters, log and categorical axes, too little to compute on said in the plot, a plot that
cannot be drawn costing a warning and not the others; and a real `ladder sweep` of the curves
workload logging the three PNGs on its parent run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.sweep import grid, loguniform
from orchestrator.sweeps import history_plots as hp
from orchestrator.tracking import sink as tracking

PNG = b"\x89PNG\r\n\x1a\n"
NAMES = {hp.HISTORY_NAME, hp.IMPORTANCE_NAME, hp.PARALLEL_NAME}


def trial(tid: str, objective: float, state: str = "finished", **params) -> dict:
    return {"trial_id": tid, "params": params, "objective": objective, "state": state, "progress": 1.0, "why": ""}


def one_matters(n: int = 24, seed: int = 0) -> list[dict]:
    """`lr` (log-uniform over three decades) sets the objective; `warmup` is noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        lr, warmup = float(10 ** rng.uniform(-4, -1)), float(rng.uniform(0.0, 0.2))
        out.append(trial(f"t{i:02d}", 2.0 + (math.log10(lr) + 2.5) ** 2 + 0.01 * rng.standard_normal(), lr=lr, warmup=warmup))
    return out


def test_best_so_far_follows_finished_trials_in_completion_order_and_direction():
    trials = [trial("a", 3.0), trial("b", 1.0, "stopped"), trial("c", 2.5), trial("d", math.nan, "diverged"),
              trial("e", 0.5, "failed"), trial("f", 2.0), trial("g", 4.0)]
    # Completion order differs from trial order: g ended first, a last; b and e have no time.
    ended = {"g": 1, "c": 2, "d": 3, "f": 4, "a": 5}
    h = hp.history(trials, "min", ended)
    assert h.trial_ids == ["g", "c", "d", "f", "a", "b", "e"]
    # The stopped trial's 1.0 and the failed one's 0.5 are not results: the line ignores them.
    assert h.best == [4.0, 2.5, 2.5, 2.0, 2.0, 2.0, 2.0]
    assert hp.history(trials, "max", ended).best == [4.0] * 7
    assert hp.history(trials, "max").best == [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 4.0]  # no times: trial order
    late = hp.history([trial("x", 1.0, "stopped"), trial("y", 5.0)], "min")
    assert math.isnan(late.best[0]) and late.best[1] == 5.0
    with pytest.raises(ValueError, match="'min' or 'max'"):
        hp.history(trials, "minimize")


def test_importance_ranks_the_parameter_that_sets_the_objective_first():
    imp, method = hp.importances(one_matters(), "min")
    assert method == "fANOVA"
    assert list(imp) == ["lr", "warmup"] and imp["lr"] > 0.8, imp
    assert sum(imp.values()) == pytest.approx(1.0)
    # Swap the roles: the ranking follows the data, not the order of the params.
    swapped = [{**t, "objective": 2.0 + 50 * (t["params"]["warmup"] - 0.1) ** 2} for t in one_matters()]
    imp, _ = hp.importances(swapped, "max")
    assert list(imp)[0] == "warmup" and imp["warmup"] > 0.8, imp


def test_a_categorical_parameter_can_be_the_important_one():
    rng = np.random.default_rng(3)
    loss = {"cosine": 2.0, "linear": 2.5, "constant": 3.0}
    trials = [trial(f"t{i}", loss[s] + 0.01 * rng.standard_normal(), schedule=s, seed=(i // 3) % 3)
              for i, s in enumerate(["cosine", "linear", "constant"] * 6)]
    imp, _ = hp.importances(trials, "min")
    assert list(imp) == ["schedule", "seed"] and imp["schedule"] > 0.8, imp


def test_log_and_categorical_parameters_get_their_scales_and_labels():
    trials = [trial("a", 1.0, lr=1e-4, wd=0.01, opt="adam", seed=0), trial("b", 2.0, lr=1e-3, wd=0.02, opt="sgd", seed=1),
              trial("c", 3.0, lr=1e-2, wd=0.04, opt="adam", seed=2)]
    d = hp.distributions(trials)
    assert d["lr"].log and not d["wd"].log  # three decades vs a factor of four
    assert d["opt"].choices == ("adam", "sgd")
    assert (d["seed"].low, d["seed"].high, d["seed"].log) == (0, 2, False)
    # The sweep's space says what values cannot: a loguniform over less than two decades is log.
    d = hp.distributions(trials, {"wd": loguniform(0.005, 0.05), "lr": grid(1e-4, 1e-3, 1e-2, 1e-1)})
    assert d["wd"].log and (d["wd"].low, d["wd"].high) == (0.005, 0.05)
    assert d["lr"].high == pytest.approx(1e-1)  # the grid's values widen the range to all of them

    pos, ticks, labels = hp.axis_positions([1e-4, 1e-3, 1e-2], hp.distributions(trials)["lr"])
    assert pos == pytest.approx([0.0, 0.5, 1.0])  # evenly spaced decades
    pos, ticks, labels = hp.axis_positions(["sgd", "adam"], d["opt"])
    assert list(pos) == [1.0, 0.0] and labels == ["adam", "sgd"] and ticks == [0.0, 1.0]
    assert hp.axis_positions([0, 2], d["seed"])[2] == ["0", "1", "2"]


def test_too_few_trials_or_one_parameter_is_said_in_the_plot(tmp_path):
    few = one_matters(n=3)
    with pytest.raises(hp.NoImportance, match="3 finished trial.*at least 4"):
        hp.importances(few + [trial("s", 1.0, "stopped", lr=0.1, warmup=0.1)], "min")
    single = [trial(f"t{i}", float(i), lr=10.0 ** -i, warmup=0.05) for i in range(6)]
    with pytest.raises(hp.NoImportance, match="only 'lr' varies"):
        hp.importances(single, "min")
    for name, trials in (("few", few), ("single", single), ("none", [trial("x", math.nan, "failed", lr=1.0)])):
        for plot in (hp.plot_importances, hp.plot_parallel, hp.plot_history):
            path = plot(trials, tmp_path / f"{name}-{plot.__name__}.png", metric="eval/loss", mode="min")
            assert open(path, "rb").read(8) == PNG


@pytest.fixture(scope="module")
def parent_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("history-store")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    c = tracking.client(uri)
    run = c.create_run(c.create_experiment("history", artifact_location=str(root / "artifacts")))
    return uri, run.info.run_id


def test_a_plot_that_cannot_be_drawn_is_a_warning_and_the_others_are_logged(parent_run, capsys):
    uri, run_id = parent_run
    trials = one_matters(n=8)
    del trials[2]["trial_id"]  # the history orders trials by id: it cannot draw this one
    logged = hp.log_history_plots(run_id, trials, metric="eval/loss", mode="min", uri=uri)
    assert logged == [hp.IMPORTANCE_NAME, hp.PARALLEL_NAME]
    assert f"could not draw the sweep's {hp.HISTORY_NAME}: KeyError" in capsys.readouterr().err
    sizes = {a.path: a.file_size for a in tracking.client(uri).list_artifacts(run_id)}
    assert set(sizes) == {hp.IMPORTANCE_NAME, hp.PARALLEL_NAME} and min(sizes.values()) > 5000
