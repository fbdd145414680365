"""Sweep definitions are checked against the workload's Config before anything launches."""

from __future__ import annotations

import json
import re
import sys
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
        # Ray's habit: iteration counts where ladder's schedulers take training fractions.
        ("sweep = Sweep(name='x', workload='celerity_lm', scheduler='asha', scheduler_options={'grace_period': 5})",
         "grace_period of scheduler='asha' is a training fraction in [0, 1) (the default 0.1: no trial is stopped "
         "before 10% of its budget), got 5: Ray counts grace_period in iterations (reports); ladder's schedulers "
         "count training fractions, so 5 of 100 reports is grace_period=0.05"),
        ("sweep = Sweep(name='x', workload='celerity_lm', scheduler='median', scheduler_options={'grace_period': -0.1})",
         "grace_period of scheduler='median' is a training fraction in [0, 1)"),
        ("sweep = Sweep(name='x', workload='celerity_lm', scheduler='asha', scheduler_options={'reduction_factor': 1.5})",
         "reduction_factor of scheduler='asha' must be a whole number >= 2, got 1.5"),
        ("sweep = Sweep(name='x', workload='celerity_lm', scheduler='median', "
         "scheduler_options={'min_samples_required': 0})", "min_samples_required of scheduler='median' must be a whole"),
        ("sweep = Sweep(name='x', workload='curves', space={'lr': loguniform(1e-3, 1e-1)}, scheduler='pbt', "
         "scheduler_options={'mutate': ('lr',), 'perturbation_interval': 20})",
         "Ray counts perturbation_interval in iterations (reports); ladder's PBT counts training fractions, so 20 of "
         "100 reports is perturbation_interval=0.2"),
    ],
)
def test_bad_sweeps_are_refused_with_the_fix(tmp_path, body, expected):
    with pytest.raises(SweepError, match=re.escape(expected)):
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


# --- scheduler and search options: one table each (SCHEDULER_OPTIONS, SEARCH_OPTIONS) -------------------

from orchestrator import sweep as sweep_options  # noqa: E402
from orchestrator.sweeps.options_page import markdown  # noqa: E402

REFERENCE = "{'experiment': 'ref'}"
MISSPELT = [(scheduler, option) for scheduler, table in sweep_options.SCHEDULER_OPTIONS.items() for option in table]


def _options_sweep(scheduler: str, options: str, search: str = "random") -> str:
    space = "{'lr': loguniform(1e-3, 1e-1)}" if search == "tpe" else "{'lr': grid(1e-3, 1e-2)}"
    return (f"sweep = Sweep(name='x', workload='curves', base='smoke', space={space}, search={search!r}, "
            f"scheduler={scheduler!r}, scheduler_options={options})")


def test_every_scheduler_has_options_checked():
    # Every scheduler a sweep may name has its table: a new scheduler without one fails here.
    from orchestrator.sweep import SCHEDULERS, SEARCHES

    assert set(SCHEDULERS) == {"collapse", "asha", "median", "hyperband", "pbt", "fifo"} == set(sweep_options.SCHEDULER_OPTIONS)
    assert set(SEARCHES) == set(sweep_options.SEARCH_OPTIONS)
    assert {s for s, _ in MISSPELT} == set(SCHEDULERS) - {"fifo"}


@pytest.mark.parametrize("scheduler,option", MISSPELT, ids=[f"{s}-{o}" for s, o in MISSPELT])
def test_check_refuses_a_misspelt_scheduler_option_naming_the_right_one(workdir, capsys, scheduler, option):
    misspelt = option[:-1]  # 'rung' for 'rungs'
    given = {misspelt: "1"}
    if scheduler == "collapse" and option != "reference":
        given["reference"] = "REF"
    body = _options_sweep(scheduler, repr(given).replace("'REF'", REFERENCE))
    assert main(["sweep", str(_write(workdir, body)), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"unknown scheduler option {misspelt!r} for scheduler={scheduler!r}; did you mean {option!r}?" in err
    assert ", ".join(sweep_options.SCHEDULER_OPTIONS[scheduler]) in err  # the valid ones, named
    ray = sys.modules.get("ray")
    assert not (ray and ray.is_initialized()) and not (workdir / "mlruns.db").exists()


def test_check_refuses_options_of_a_scheduler_that_takes_none(workdir, capsys):
    assert main(["sweep", str(_write(workdir, _options_sweep("fifo", "{'grace_period': 0.2}"))), "--check"]) == 2
    assert "scheduler='fifo' takes no scheduler options (got ['grace_period'])" in capsys.readouterr().err


@pytest.mark.parametrize("option", list(sweep_options.TPE_OPTIONS))
def test_check_refuses_a_misspelt_search_option_naming_the_right_one(option):
    s = Sweep(name="x", workload="curves", base="smoke", search="tpe", space={"lr": loguniform(1e-3, 1e-1)},
              search_options={option[:-1]: 1})
    with pytest.raises(SweepError, match=f"unknown search option '{option[:-1]}' for search='tpe'; did you mean '{option}'"):
        s.check()


@pytest.mark.parametrize("body,expected", [
    (_options_sweep("collapse", "{'reference': {'experiement': 'ref'}}"),
     "unknown option 'experiement' for scheduler_options['reference']; did you mean 'experiment'?"),
    (_options_sweep("collapse", "{'reference': {'kind': 'parametric'}}"), "the collapse scheduler needs scheduler_options="),
    (_options_sweep("collapse", "{'rungs': (0.2,)}"), "the collapse scheduler needs scheduler_options="),
    (_options_sweep("asha", "{'grace': 0.2}"), "did you mean 'grace_period'?"),
    (_options_sweep("median", "{'metric': 'eval/loss'}"), "the objective is Sweep.objective"),
])
def test_the_collapse_reference_and_names_set_elsewhere_are_checked_too(tmp_path, body, expected):
    with pytest.raises(SweepError, match=re.escape(expected)):
        load_sweep_file(_write(tmp_path, body)).check()


def test_valid_options_pass_and_reach_the_builder_with_the_tables_defaults():
    import inspect

    from orchestrator.sweeps.collapse import CollapseStopper

    for scheduler, table in sweep_options.SCHEDULER_OPTIONS.items():
        options = {k: ({"experiment": "ref"} if k == "reference" else ("lr",) if k == "mutate" else o.default)
                   for k, o in table.items()
                   if k != "reduction_factor" or scheduler != "collapse"}  # collapse: keep_quantile or it, not both
        Sweep(name="x", workload="curves", base="smoke", space={"lr": loguniform(1e-3, 1e-1)}, scheduler=scheduler,
              scheduler_options=options).check()
    # The collapse scheduler's table and the stopper it builds agree on every default.
    stopper = {k: p.default for k, p in inspect.signature(CollapseStopper.__init__).parameters.items()
               if p.kind is p.KEYWORD_ONLY}
    assert {k: o.default for k, o in sweep_options.COLLAPSE_OPTIONS.items() if k != "reference"} == stopper
    assert sweep_options.resolved_options({"rungs": (0.5,)}, sweep_options.ASHA_OPTIONS) == {"grace_period": 0.1, "reduction_factor": 2,
                                                                             "brackets": 1}


def _page_sections(text: str) -> dict[str, set[str]]:
    """Heading -> the option names in the table under it."""
    sections: dict[str, set[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("#"):
            current = line.lstrip("#").strip()
            sections[current] = set()
        elif current and line.startswith("| `"):
            sections[current].add(line.split("`")[1])
    return sections


def test_the_options_page_lists_every_option_of_the_code_and_no_other():
    page = (REPO / "docs" / "sweep-options.md").read_text()
    sections = _page_sections(page)
    expected = {**{f"scheduler='{n}'": set(t) for n, t in sweep_options.SCHEDULER_OPTIONS.items()},
                "scheduler_options['reference']": set(sweep_options.REFERENCE_OPTIONS),
                **{f"search='{n}'": set(t) for n, t in sweep_options.SEARCH_OPTIONS.items()}}
    for heading, names in expected.items():
        assert heading in sections, f"docs/sweep-options.md has no section {heading!r}"
        assert sections[heading] == names, (f"{heading}: in the code only {sorted(names - sections[heading])}, "
                                            f"on the page only {sorted(sections[heading] - names)}")
    listed = {h for h, names in sections.items() if names}
    assert listed <= set(expected), f"sections of options the code does not have: {sorted(listed - set(expected))}"
    assert page == markdown(), \
        "docs/sweep-options.md is out of date: python -m orchestrator.sweeps.options_page > docs/sweep-options.md"


def test_the_callback_usage_tag_is_rays_own_without_importing_wandb(monkeypatch):
    """The driver records Ray Tune's callback telemetry by class name (tune_run._light_callback_usage_tag):
    the tag it records is the one Ray's own function records for the same callbacks."""
    from ray.air._internal import usage
    from ray.tune import Callback
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, LoggerCallback

    from orchestrator.sweeps import tune_run

    class Mine(Callback):
        pass

    class MyLogger(LoggerCallback):
        pass

    callbacks = [CSVLoggerCallback(), JsonLoggerCallback(), Mine(), Mine(), MyLogger(), object()]
    recorded = []
    monkeypatch.setattr(usage, "record_extra_usage_tag", lambda key, value: recorded.append((key, json.loads(value))))
    monkeypatch.setattr(usage, "tag_callbacks", usage.tag_callbacks)  # restored after the test
    rays_own = dict(usage._count_callbacks(callbacks))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)  # as in a driver that never imported it
    tune_run._light_callback_usage_tag()
    assert usage.tag_callbacks.ladder_light
    assert usage.tag_callbacks(callbacks) is True
    assert recorded == [(usage.TagKey.AIR_CALLBACKS, rays_own)]
    assert rays_own == {"CSVLoggerCallback": 1, "JsonLoggerCallback": 1, "CustomCallback": 2, "CustomLoggerCallback": 1}
    assert "wandb" not in sys.modules
    assert usage.tag_callbacks([]) is False  # no callbacks: Ray's own answer, nothing recorded
    assert len(recorded) == 1
