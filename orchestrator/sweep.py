"""Sweep definitions: plain Python that names a workload, a base config, a search space over its
config fields, a scheduler, resources per trial and an objective.

A sweep file assigns a `Sweep` to a module-level name `sweep`:

    from orchestrator.sweep import Sweep, loguniform, seeds

    sweep = Sweep(
        name="celerity_tuning",
        workload="celerity_lm",
        base="smoke",
        overrides={"tpp": 20},
        space={"weight_decay": loguniform(0.01, 1.0), "seed": seeds(2)},
        num_samples=4,
        scheduler="collapse",
        objective=("eval/loss", "min"),
    )

`search` says how the trials' params are chosen. 'random' (the default) and 'grid' draw every
trial's params before the sweep starts: the grid axes (and `points`) crossed with `num_samples`
draws of the sampled domains, seeded by `seed`; 'grid' also refuses sampled domains, so that
every trial is enumerated. 'tpe' is model-based: Optuna's Tree-structured Parzen Estimator
(through Ray Tune's `OptunaSearch`, see `orchestrator.sweeps.search`) proposes each of `num_samples`
trials from the trials that ended, a few at a time. It searches choice, uniform and loguniform
fields; grid axes and points are refused (a `seeds(n)` axis repeats each proposal per seed):

    from orchestrator.sweep import Sweep, choice, loguniform, uniform

    sweep = Sweep(
        name="celerity_tpe",
        workload="celerity_lm",
        base="smoke",
        space={"lr": loguniform(3e-3, 1e-1), "tau": choice(0.05, 0.2, 0.8), "warmup_frac": uniform(0.0, 0.2)},
        search="tpe",
        num_samples=16,
        scheduler="collapse",  # with TPE: model-based proposals, curve-based stopping
        scheduler_options={"reference": {"experiment": "celerity_reference"}},
        objective=("eval/loss", "min"),
    )

`Sweep.check()` validates everything against the workload's `Config` before anything starts:
unknown fields (with the closest valid name), values of the wrong type, empty spaces,
non-positive budgets, unknown schedulers and searches, their options (by name, against the one
table of each: `SCHEDULER_OPTIONS`, `SEARCH_OPTIONS`; docs/sweep-options.md lists them), and
domains the search cannot use.
"""

from __future__ import annotations

import json
import inspect
import math
import os
import random
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from orchestrator.runners import registry
from orchestrator.runners.config import ConfigError, apply_overrides, check_fields, closest

EXPANDED = ("random", "grid")
"""Searches whose trials are all drawn before the sweep starts (the others propose as results arrive)."""
MODEL_BASED_CONCURRENCY = 4
"""Trials at once of a model-based search when the sweep does not say (`max_concurrent`): it
proposes from the results of trials that ended, so every trial in flight is a proposal made
without the results still to come."""


class SweepError(ConfigError):
    """A sweep file or definition is invalid."""


# --- scheduler and search options ------------------------------------------------------------
# Every option a scheduler or a search accepts, in one table each: `Sweep.check()` refuses any
# other name (with the closest one) before anything starts, the builders take their defaults from
# here (`orchestrator.sweeps.schedulers.build`, `orchestrator.sweeps.references.load_reference`,
# `orchestrator.sweeps.search.sampler`), and docs/sweep-options.md is generated from these tables
# (`python -m orchestrator.sweeps.options_page > docs/sweep-options.md`).


class _Marker:
    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return self.label


REQUIRED = _Marker("required")
"""The default of an option that has none: the sweep must give it."""
LIBRARY = _Marker("the library's")
"""The default of an option left to the library that implements it (Ray Tune, Optuna): not passed unless given."""


@dataclass(frozen=True)
class Option:
    default: Any
    """The value used when the sweep does not give the option (REQUIRED, LIBRARY: see above)."""
    doc: str
    """What it does, in one line."""
    shown: str | None = None
    """The default in words, where its value alone would not say it."""

    def describe_default(self) -> str:
        if self.shown is not None:
            return self.shown
        return "required" if self.default is REQUIRED else repr(self.default)


# --- schedulers ---------------------------------------------------------------------------------
# Ray's ASHA and median rule run on the trials' training fraction in percent (`progress_pct`, up
# to 100): the builder fixes their `time_attr` and `max_t`; the objective (`metric`, `mode`) is
# the sweep's, handed over by Tune.

ASHA_OPTIONS = {
    "grace_period": Option(0.1, "Training fraction before which no trial is stopped (the first rung)."),
    "reduction_factor": Option(2, "Each rung keeps the best 1/reduction_factor of the trials that reached it."),
    "brackets": Option(1, "Ray's ASHA brackets, each starting its rungs at a later point (1: one bracket)."),
}

MEDIAN_OPTIONS = {
    "grace_period": Option(0.1, "Training fraction before which no trial is stopped."),
    "min_samples_required": Option(2, "Other trials that must have reached a point before a trial is compared "
                                      "with their median there."),
}

HYPERBAND_OPTIONS = {
    "reduction_factor": Option(3, "At each rung a bracket keeps the best 1/reduction_factor of the trials it was "
                                  "sized for; the rungs lie reduction_factor times apart in training fraction."),
    "brackets": Option(3, "Hyperband's brackets: bracket s (0 .. brackets-1) first compares its trials at "
                          "reduction_factor**-s of training; bracket 0 stops none. Trials fill the brackets in "
                          "order, bracket s holding about brackets/(s+1) * reduction_factor**s of them."),
}

PBT_OPTIONS = {
    "mutate": Option(REQUIRED, "The search-space fields PBT may change, e.g. ('lr',): names of `space`, each a "
                               "grid, choice, uniform or loguniform domain (a continuous one stays within its bounds)."),
    "perturbation_interval": Option(0.25, "Training fraction between two perturbations of a trial (in (0, 1)): "
                                          "there, a trial in the worst quantile_fraction continues from the "
                                          "checkpoint of one in the best, with its mutated hyperparameters. The "
                                          "workload should checkpoint at least this often."),
    "burn_in_period": Option(0.0, "Training fraction before the first perturbation."),
    "quantile_fraction": Option(0.25, "Fraction of the trials (the worst) that exploit one of the same fraction "
                                      "of the best at a perturbation; at most 0.5."),
    "resample_probability": Option(0.25, "Chance that a mutated field is drawn again from its domain instead of "
                                         "perturbed."),
    "perturbation_factors": Option((1.2, 0.8), "Factors a continuous field is multiplied by when perturbed (then "
                                               "clipped to its domain); a grid or choice field moves to a "
                                               "neighbouring value."),
    "synch": Option(True, "Synchronous PBT: trials wait for each other at every perturbation point, so they are "
                          "compared at the same training fraction (False: Ray's asynchronous PBT, which compares a "
                          "trial with the others' last scores, taken wherever they were)."),
}

COLLAPSE_OPTIONS = {
    "reference": Option(REQUIRED, "The reference curves trials are compared with: a mapping naming the MLflow "
                                  "experiment of a finished reference sweep, {'experiment': NAME} (its keys: "
                                  "see `reference` below)."),
    "rungs": Option((0.1, 0.2, 0.3), "Training fractions at which each trial's final loss is predicted and "
                                     "compared (increasing, in (0, 1])."),
    "keep_quantile": Option(None, "Fraction of the trials kept at each rung: a trial predicted worse than this "
                                  "quantile of the predictions so far stops.",
                            shown="0.5 (or 1/reduction_factor)"),
    "reduction_factor": Option(None, "The ASHA spelling of keep_quantile: keep 1/reduction_factor (give one of "
                                     "the two).", shown="None"),
    "window_start": Option(0.5, "The fit window at rung r is [max(warmup_frac, r * window_start), r]."),
    "warmup_frac": Option(0.0, "Training fraction never fitted (the warmup's shape differs between runs)."),
    "smooth_window": Option(None, "Smoothing of the trials' curves, as a fraction of training.",
                            shown="the reference's own"),
    "min_samples": Option(2, "Predictions recorded at a rung before any trial is stopped there."),
    "min_points": Option(1, "Reports inside the fit window a trial needs before it is predicted."),
    "n_boot": Option(100, "Bootstrap resamples behind each prediction's uncertainty."),
    "margin": Option(0.0, "Stop a trial only when its prediction is worse than the kept quantile by more than "
                          "this many of its own bootstrap standard errors (0: by any amount)."),
}

REFERENCE_OPTIONS = {
    "experiment": Option(REQUIRED, "The MLflow experiment of the finished reference sweep."),
    "kind": Option("empirical", "'empirical': one reference per (tau, tpp), seeds averaged; 'parametric': the "
                                "paper's curve fitted across them."),
    "metric": Option(None, "The metric of the reference runs' curves.", shown="the sweep's objective metric"),
    "smooth_window": Option(0.0, "Smoothing of the empirical reference curves, as a fraction of training."),
    "rtol": Option(0.05, "How far (relative) a trial's tau and tpp may be from the nearest empirical reference's."),
}
"""The keys of `scheduler_options['reference']` (the collapse scheduler's)."""

SCHEDULER_OPTIONS: dict[str, dict[str, Option]] = {
    "collapse": COLLAPSE_OPTIONS,
    "asha": ASHA_OPTIONS,
    "median": MEDIAN_OPTIONS,
    "hyperband": HYPERBAND_OPTIONS,
    "pbt": PBT_OPTIONS,
    "fifo": {},
}
"""Scheduler name -> its options; the keys are the schedulers a sweep may name."""

SCHEDULER_DOCS = {
    "collapse": "Ladder's collapse early stopping: at each rung, each trial's final loss is predicted from the start "
                "of its curve aligned with a reference sweep's curves, and trials predicted worse than the kept "
                "quantile stop. Objective mode 'min' only.",
    "asha": "Ray Tune's asynchronous successive halving, on the training fraction; a trial that reached the end of "
            "its budget always finishes.",
    "median": "Ray Tune's median stopping rule, on the training fraction: a trial worse than the median of the "
              "others at the same point stops; a trial at the end of its budget always finishes.",
    "hyperband": "Ray Tune's (synchronous) HyperBand, on the training fraction: each bracket pauses its trials at "
                 "its rungs until all have reached the rung, then stops all but the best 1/reduction_factor; "
                 "the survivors of a bracket's last rung train to the end of their budget. Its brackets hold the "
                 "sweep's trials in launch order, all created up front (no max_concurrent).",
    "pbt": "Ray Tune's Population Based Training, on the training fraction: at every perturbation_interval the "
           "worst trials continue from a checkpoint of one of the best, with its hyperparameters, the fields named "
           "in `mutate` perturbed within the space. No trial is stopped. Single-worker CPU trials, search "
           "'random' or 'grid' (the initial population, all created up front: no max_concurrent); a trial's MLflow "
           "run keeps its starting params and is tagged `ladder.pbt.exploits`.",
    "fifo": "Every trial runs to the end of its budget.",
}

# --- searches -----------------------------------------------------------------------------------

TPE_OPTIONS = {
    "n_startup_trials": Option(None, "Random proposals before the model takes over.",
                               shown="a third of num_samples, between 2 and 10"),
    "n_ei_candidates": Option(LIBRARY, "Candidates drawn per proposal, the best by expected improvement kept.",
                              shown="Optuna's"),
    "multivariate": Option(LIBRARY, "Model the fields jointly instead of one by one.", shown="Optuna's"),
    "group": Option(LIBRARY, "With multivariate: model separately the groups of fields that occur together.",
                    shown="Optuna's"),
    "constant_liar": Option(LIBRARY, "Count trials still running as bad, so that proposals made at once spread out.",
                            shown="Optuna's"),
    "prior_weight": Option(LIBRARY, "Weight of the prior (the space's own spread) against the observed trials.",
                           shown="Optuna's"),
    "consider_magic_clip": Option(LIBRARY, "Clip the kernels' widths from below by a heuristic.", shown="Optuna's"),
    "consider_endpoints": Option(LIBRARY, "Let the bounds of a uniform field widen the kernels at the edges.",
                                 shown="Optuna's"),
}
"""Keyword options of Optuna's `TPESampler` (its seed is `Sweep.seed`)."""

SEARCH_OPTIONS: dict[str, dict[str, Option]] = {
    "random": {},
    "grid": {},
    "tpe": TPE_OPTIONS,
}
"""Search name -> its options; the keys are the searches a sweep may name."""

SEARCH_DOCS = {
    "random": "Every trial's params drawn before the sweep starts: the grid axes and points crossed with "
              "num_samples draws of the sampled domains, seeded by Sweep.seed.",
    "grid": "As 'random', refusing sampled domains: every trial is enumerated.",
    "tpe": "Optuna's Tree-structured Parzen Estimator proposes each trial from the trials that ended "
           "(choice, uniform and loguniform fields; a seeds(n) axis repeats each proposal).",
}

ELSEWHERE = {
    "seed": "the seed is Sweep.seed",
    "metric": "the objective is Sweep.objective",
    "mode": "the objective is Sweep.objective",
    "time_attr": "every scheduler compares trials on their training fraction",
    "max_t": "every scheduler compares trials on their training fraction, up to its end",
    "hyperparam_mutations": "PBT mutates the space's domains of the fields named in `mutate`",
}
"""Names a sweep may reach for that are set elsewhere, and where."""

OPTIONS_PAGE = "docs/sweep-options.md"


def unknown_option(given: Mapping[str, Any], table: Mapping[str, Option], *, what: str, owner: str) -> str | None:
    """Why `given` has a name `table` does not hold (the closest one, the valid ones), or None.
    `what` names the options (e.g. "scheduler option"), `owner` whose they are (e.g. "scheduler='asha'")."""
    if not isinstance(given, Mapping):
        return f"{what}s of {owner} must be a dict of option -> value, got {type(given).__name__}"
    unknown = [k for k in given if k not in table]
    if not unknown:
        return None
    name = unknown[0]
    if not table:
        return (f"{owner} takes no {what}s (got {sorted(map(str, given))})"
                + (f"; {ELSEWHERE[name]}" if name in ELSEWHERE else "") + f" (see {OPTIONS_PAGE})")
    hint = None if name in ELSEWHERE else suggest(str(name), table)
    return (f"unknown {what} {name!r} for {owner}" + (f"; did you mean {hint!r}?" if hint else "")
            + (f"; {ELSEWHERE[name]}" if name in ELSEWHERE else "")
            + f" (valid: {', '.join(table)}; see {OPTIONS_PAGE})")


def suggest(name: str, valid: Any) -> str | None:
    """The valid name meant by `name`: the only one it begins (a name cut short, 'grace' for
    'grace_period'), else the closest by spelling (`closest`)."""
    begun = [v for v in valid if len(name) >= 3 and v.startswith(name)]
    return begun[0] if len(begun) == 1 else closest(name, valid)


def missing_option(given: Mapping[str, Any], table: Mapping[str, Option]) -> str | None:
    """The first required option of `table` that `given` lacks, or None."""
    return next((k for k, o in table.items() if o.default is REQUIRED and k not in given), None)


def resolved_options(given: Mapping[str, Any], table: Mapping[str, Option]) -> dict[str, Any]:
    """The options a builder passes on: each given one, else its default (those left to the
    library, and required ones not given, are left out)."""
    out = {}
    for key, option in table.items():
        if key in given:
            out[key] = given[key]
        elif option.default is not REQUIRED and option.default is not LIBRARY:
            out[key] = option.default
    return out


SCHEDULERS = tuple(SCHEDULER_OPTIONS)
"""'collapse', 'asha', 'median', 'hyperband', 'pbt', 'fifo': the keys of `SCHEDULER_OPTIONS`."""
SEARCHES = tuple(SEARCH_OPTIONS)
"""'random', 'grid', 'tpe': the keys of `SEARCH_OPTIONS`."""


# --- search-space domains -------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """Every value, each once (a grid axis; several grids multiply)."""

    values: tuple[Any, ...]

    def examples(self) -> list[Any]:
        return list(self.values)


@dataclass(frozen=True)
class Choice:
    """One of the values, sampled uniformly per trial."""

    values: tuple[Any, ...]

    def examples(self) -> list[Any]:
        return list(self.values)


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float

    def examples(self) -> list[Any]:
        return [self.low, self.high]


@dataclass(frozen=True)
class LogUniform:
    low: float
    high: float

    def examples(self) -> list[Any]:
        return [self.low, self.high]


def grid(*values: Any) -> Grid:
    if len(values) == 1 and isinstance(values[0], (list, tuple)):
        values = tuple(values[0])
    return Grid(tuple(values))


def choice(*values: Any) -> Choice:
    if len(values) == 1 and isinstance(values[0], (list, tuple)):
        values = tuple(values[0])
    return Choice(tuple(values))


def uniform(low: float, high: float) -> Uniform:
    return Uniform(float(low), float(high))


def loguniform(low: float, high: float) -> LogUniform:
    return LogUniform(float(low), float(high))


def data_root() -> Path:
    """Where a sweep file finds the datasets it names: `$LADDER_DATA`, else `./data` of the folder
    the sweep starts in; absolute, since trials run in folders of their own."""
    return Path(os.environ.get("LADDER_DATA", "data")).resolve()


@dataclass(frozen=True)
class Seeds(Grid):
    """Seeds as a grid axis (see `seeds`)."""


def seeds(n: int, start: int = 0) -> Seeds:
    """Seeds as a grid axis: every point of the space runs with each of `n` seeds; with a
    model-based search, every proposal runs once per seed and the search learns their mean."""
    return Seeds(tuple(range(start, start + n)))


Domain = Grid | Choice | Uniform | LogUniform


@dataclass(frozen=True)
class Sweep:
    name: str
    """Sweep name: the MLflow experiment and the Tune run folder."""
    workload: str
    """The workload: a built-in name, a module path importable from the working directory (or the
    job's working directory on a cluster), or a plugin's entry-point name."""
    space: Mapping[str, Any] = field(default_factory=dict)
    """Config field -> domain (grid/choice/uniform/loguniform/seeds) or a fixed value."""
    base: str = "default"
    """Starting config: 'default' (Config()) or 'smoke' (smoke())."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """Fixed config changes applied to the base before the space."""
    points: tuple[Mapping[str, Any], ...] = ()
    """Explicit parameter sets of coupled fields (e.g. a model family from the scaling recipe),
    each crossed with the grid axes of `space`."""
    num_samples: int = 1
    """Samples of the random domains; grids are crossed with each sample, as in Ray Tune. With
    search='tpe': the number of proposals, each run once per seed of a `seeds(n)` axis."""
    search: str = "random"
    """How trials get their params: 'random' (draw the sampled domains up front, crossed with
    the grid axes and points), 'grid' (the same, refusing sampled domains: every trial is
    enumerated) or 'tpe' (Optuna's TPE proposes each trial from the results so far; no grid
    axes but `seeds(n)`, no points)."""
    search_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options of a model-based search's sampler, e.g. {'n_startup_trials': 4}; its seed
    is `seed`. Every search's options: `SEARCH_OPTIONS` (docs/sweep-options.md)."""
    scheduler: str = "fifo"
    """'collapse', 'asha', 'median', 'hyperband', 'pbt' or 'fifo'."""
    scheduler_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options of the scheduler, e.g. {'grace_period': 0.2} for 'asha'. Every scheduler's
    options, their defaults and meaning: `SCHEDULER_OPTIONS` (docs/sweep-options.md)."""
    objective: tuple[str, str] = ("eval/loss", "min")
    """(metric, 'min' | 'max') that ranks trials."""
    workers: int = 1
    """Data-parallel workers per trial; > 1 runs Ray Train inside the trial."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per worker (fractions allowed)."""
    gpus_per_worker: float = 0.0
    """GPUs reserved per worker; > 0 trains every trial under Ray Train on GPU workers (NCCL)."""
    max_concurrent: int | None = None
    """Trials at once (default: as many as the CPUs hold; with a model-based search at most
    `MODEL_BASED_CONCURRENCY`, 4, since each proposal learns only from trials that ended)."""
    max_failures: int = 1
    """Restarts of a failed trial from its last checkpoint."""
    seed: int = 0
    """Seed of the search: the random draws, or TPE's sampler (the same proposals for the same
    results: a TPE sweep is reproducible with max_concurrent=1; with more trials at once, which
    trials end first also decides what is proposed next)."""

    def load_workload(self) -> registry.Workload:
        try:
            return registry.load(self.workload)
        except (registry.UnknownWorkload, registry.ContractError) as exc:
            raise SweepError(str(exc)) from None

    def base_config(self) -> Any:
        w = self.load_workload()
        if self.base not in ("default", "smoke"):
            raise SweepError(f"base must be 'default' or 'smoke', got {self.base!r}")
        cfg = w.smoke() if self.base == "smoke" else w.Config()
        return apply_overrides(cfg, dict(self.overrides))

    def check(self) -> Any:
        """Validate the whole definition; returns the base config. Raises SweepError."""
        if not self.name or any(c in self.name for c in "/\\ "):
            raise SweepError(f"sweep name {self.name!r} must be non-empty without spaces or slashes")
        w = self.load_workload()
        try:
            base = self.base_config()
            if not self.points:  # with points, each point completes the base and is checked below
                w.validate(base, world_size=self.workers, gpus=bool(self.gpus_per_worker))
            check_fields(w.Config, self.space, what="search-space field")
            for point in self.points:
                check_fields(w.Config, point, what="field of a sweep point")
                w.validate(apply_overrides(base, dict(point)), world_size=self.workers, gpus=bool(self.gpus_per_worker))
            for key, domain in self.space.items():
                values = domain.examples() if isinstance(domain, Domain) else [domain]
                if not values:
                    raise SweepError(f"search-space field {key!r} has no values")
                if isinstance(domain, (Uniform, LogUniform)):
                    if not domain.low < domain.high:
                        raise SweepError(f"{key}: low ({domain.low}) must be below high ({domain.high})")
                    if isinstance(domain, LogUniform) and domain.low <= 0:
                        raise SweepError(f"{key}: loguniform needs positive bounds, got {domain.low}")
                for value in values:  # with points, on the first (a point may complete the base)
                    point = dict(self.points[0]) if self.points else {}
                    w.validate(apply_overrides(base, {**point, key: value}), world_size=self.workers, gpus=bool(self.gpus_per_worker))
        except ConfigError as exc:
            raise SweepError(f"sweep {self.name!r}: {exc}") from None
        if self.num_samples < 1:
            raise SweepError(f"num_samples must be at least 1, got {self.num_samples}")
        self._check_search()
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise SweepError(f"max_concurrent must be at least 1 (None: as many as the CPUs hold), "
                             f"got {self.max_concurrent}")
        if self.scheduler not in SCHEDULERS:
            hint = closest(self.scheduler, SCHEDULERS, cutoff=0.0)
            raise SweepError(f"unknown scheduler {self.scheduler!r}; did you mean {hint!r}? (known: {', '.join(SCHEDULERS)})")
        self._check_scheduler()
        metric, mode = self.objective
        if mode not in ("min", "max"):
            raise SweepError(f"objective mode must be 'min' or 'max', got {mode!r}")
        if self.workers < 1 or self.cpus_per_worker <= 0:
            raise SweepError("workers must be >= 1 and cpus_per_worker > 0")
        if self.gpus_per_worker < 0:
            raise SweepError(f"gpus_per_worker must be >= 0 (0: CPU workers), got {self.gpus_per_worker}")
        if self.trial_count() < 1:
            raise SweepError("the search space is empty: give at least one value per grid axis")
        return base

    def _check_scheduler(self) -> None:
        """Every scheduler option is one the scheduler takes (`SCHEDULER_OPTIONS`, `SEARCH_OPTIONS`), and
        the required ones are given."""
        table = SCHEDULER_OPTIONS[self.scheduler]
        problem = unknown_option(self.scheduler_options, table, what="scheduler option",
                                               owner=f"scheduler={self.scheduler!r}")
        if problem:
            raise SweepError(problem)
        if missing_option(self.scheduler_options, table) == "reference":
            raise SweepError(
                "the collapse scheduler needs scheduler_options={'reference': {'experiment': NAME}} naming the "
                "MLflow experiment of a finished reference sweep")
        if self.scheduler == "collapse":
            spec = self.scheduler_options["reference"]
            if not isinstance(spec, Mapping):
                raise SweepError(f"scheduler_options['reference'] must be a dict like {{'experiment': NAME}}, got {spec!r}")
            problem = unknown_option(spec, REFERENCE_OPTIONS, what="option",
                                                   owner="scheduler_options['reference']")
            if problem:
                raise SweepError(problem)
            if missing_option(spec, REFERENCE_OPTIONS):
                raise SweepError(
                    "the collapse scheduler needs scheduler_options={'reference': {'experiment': NAME}} naming the "
                    f"MLflow experiment of a finished reference sweep, got {dict(spec)!r}")
        if self.scheduler in ("asha", "median"):
            self._check_rung_rule()
        if self.scheduler != "fifo":
            self._check_loop_feeds_the_scheduler()
        if self.scheduler == "hyperband":
            self._check_hyperband()
        if self.scheduler == "pbt":
            self._check_pbt()
        if self.scheduler in ("hyperband", "pbt") and self.max_concurrent is not None:
            raise SweepError(
                f"scheduler={self.scheduler!r} needs every trial created from the start (its "
                f"{'brackets' if self.scheduler == 'hyperband' else 'population'}), and max_concurrent caps the "
                "trials Tune creates, paused ones included: leave max_concurrent unset (the trials' CPUs cap how "
                "many run at once)")

    def _check_loop_feeds_the_scheduler(self) -> None:
        """The workload's loop, read from its source (`registry.run_calls`), gives the scheduler what
        it decides on: a curve (run.report) for every scheduler, checkpoints (run.save) for PBT. A
        loop that hands its run to a helper is not judged."""
        train = self.load_workload().train
        where = f"read from its source, {os.path.basename(inspect.getsourcefile(train) or '?')}"
        if registry.run_calls(train, "report") == []:
            raise SweepError(
                f"scheduler={self.scheduler!r} decides on the curve each trial reports as it trains, and workload "
                f"{self.workload!r} never calls run.report(metrics, step=step) ({where}): what train returns "
                "reaches no scheduler, so no trial could be compared and the sweep would end with no best. Report "
                f"the objective ({self.objective[0]!r}) and 'progress' with run.report as the loop goes "
                "(docs/own-workload.md), or use scheduler='fifo'")
        if self.scheduler == "pbt" and registry.run_calls(train, "save") == []:
            raise SweepError(
                f"scheduler='pbt' moves the worse trials onto the better ones' checkpoints, and workload "
                f"{self.workload!r} never calls run.save(state) ({where}): PBT would exploit nothing and the sweep "
                "would be a random search. Save the loop's state with run.save at least every perturbation_interval "
                "of training and restore it with run.restore() (docs/own-workload.md), or use scheduler='asha'")

    def _check_rung_rule(self) -> None:
        """ASHA's and the median rule's options: grace_period is a training fraction (Ray's counts
        iterations, and Ray refuses one above max_t only once the sweep is running), the counts are
        whole numbers."""
        table = ASHA_OPTIONS if self.scheduler == "asha" else MEDIAN_OPTIONS
        opts = resolved_options(self.scheduler_options, table)
        owner = f"scheduler={self.scheduler!r}"
        grace = opts["grace_period"]
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0.0 <= grace < 1.0:
            hint = ""
            if isinstance(grace, (int, float)) and not isinstance(grace, bool) and grace >= 1:
                hint = (f": Ray counts grace_period in iterations (reports); ladder's schedulers count training "
                        f"fractions, so {grace:g} of 100 reports is grace_period={grace / 100:g}")
            raise SweepError(f"scheduler option grace_period of {owner} is a training fraction in [0, 1) (the default "
                             f"{table['grace_period'].default:g}: no trial is stopped before 10% of its budget), got "
                             f"{grace!r}{hint}")
        for key, least in (("reduction_factor", 2), ("brackets", 1), ("min_samples_required", 1)):
            if key not in opts:
                continue
            value = opts[key]
            whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
            if isinstance(value, bool) or not whole or value < least:
                raise SweepError(f"scheduler option {key} of {owner} must be a whole number >= {least}, got {value!r}")

    def _check_hyperband(self) -> None:
        opts = resolved_options(self.scheduler_options, HYPERBAND_OPTIONS)
        eta, brackets = opts["reduction_factor"], opts["brackets"]
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not eta > 1:
            raise SweepError(f"scheduler option reduction_factor of scheduler='hyperband' must be a number above 1 "
                             f"(3: keep the best third at each rung), got {eta!r}")
        if isinstance(brackets, bool) or not isinstance(brackets, int) or brackets < 1:
            raise SweepError(f"scheduler option brackets of scheduler='hyperband' must be a whole number >= 1, "
                             f"got {brackets!r}")
        # Ray places the rungs in whole percent of training: a rung below 1% would be at 0.
        if int(100 * eta ** -(brackets - 1)) < 1:
            most = 1 + int(math.floor(math.log(100) / math.log(eta) + 1e-9))
            raise SweepError(f"scheduler='hyperband' with brackets={brackets} and reduction_factor={eta:g} would "
                             f"compare trials before 1% of training: give at most brackets={most}")

    def _check_pbt(self) -> None:
        """PBT's options, and the trials it can exploit: the fields it mutates are domains of the
        space, the population is drawn up front, and a trial's checkpoint is the Tune trial's own."""
        if missing_option(self.scheduler_options, PBT_OPTIONS) == "mutate":
            raise SweepError("scheduler='pbt' needs scheduler_options={'mutate': (FIELD, ...)} naming the search-space "
                             f"fields it may change (space: {', '.join(self.space) or 'empty'})")
        opts = resolved_options(self.scheduler_options, PBT_OPTIONS)
        mutate = opts["mutate"]
        names = (mutate,) if isinstance(mutate, str) else mutate
        if not isinstance(names, (tuple, list)) or not names or not all(isinstance(n, str) for n in names):
            raise SweepError(f"scheduler option mutate of scheduler='pbt' must be a tuple of search-space field "
                             f"names, e.g. ('lr',), got {mutate!r}")
        for name in names:
            if name not in self.space:
                hint = suggest(name, list(self.space))
                raise SweepError(
                    f"scheduler option mutate of scheduler='pbt' names {name!r}, which is not a field of the sweep's "
                    f"space" + (f"; did you mean {hint!r}?" if hint else "")
                    + f" (space: {', '.join(self.space) or 'empty'}): add it to space with the domain PBT may "
                    "mutate it within, e.g. space={" + f"{name!r}: loguniform(LOW, HIGH)" + "}")
            domain = self.space[name]
            if isinstance(domain, Seeds):
                raise SweepError(f"scheduler option mutate of scheduler='pbt' names {name!r}, a seeds(n) axis: seeds "
                                 "repeat trials, they are not a hyperparameter to evolve; leave it out of mutate")
            if not isinstance(domain, Domain):
                raise SweepError(f"scheduler option mutate of scheduler='pbt' names {name!r}, which the space fixes "
                                 f"to {domain!r}: give it a domain to mutate within (grid, choice, uniform, "
                                 "loguniform), or leave it out of mutate")
        for key, low, high in (("perturbation_interval", 0.0, 1.0), ("burn_in_period", None, 1.0),
                               ("quantile_fraction", None, 0.5), ("resample_probability", None, 1.0)):
            value = opts[key]
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
                (low is None and 0.0 <= value <= high) or (low is not None and low < value < high))
            if not ok:
                bounds = f"in (0, {high:g})" if low is not None else f"in [0, {high:g}]"
                hint = ""
                if key in ("perturbation_interval", "burn_in_period") and isinstance(value, (int, float)) \
                        and not isinstance(value, bool) and value >= 1:
                    hint = (f": Ray counts {key} in iterations (reports); ladder's PBT counts training fractions, "
                            f"so {value:g} of 100 reports is {key}={value / 100:g}")
                raise SweepError(f"scheduler option {key} of scheduler='pbt' is a fraction {bounds}, got {value!r}{hint}")
        factors = opts["perturbation_factors"]
        if (not isinstance(factors, (tuple, list)) or not factors
                or not all(isinstance(f, (int, float)) and f > 0 for f in factors)):
            raise SweepError(f"scheduler option perturbation_factors of scheduler='pbt' must be a tuple of positive "
                             f"numbers, e.g. (1.2, 0.8), got {factors!r}")
        if self.model_based:
            raise SweepError(f"scheduler='pbt' evolves its population itself and cannot run with search={self.search!r}: "
                             "use search='random' or 'grid' to draw the initial population")
        if self.workers != 1 or self.gpus_per_worker:
            raise SweepError("scheduler='pbt' runs single-worker CPU trials (workers=1, gpus_per_worker=0): a trial "
                             "of several workers or on GPUs checkpoints through Ray Train, which PBT cannot hand to "
                             "another trial")

    @property
    def model_based(self) -> bool:
        """True when trials are proposed as results arrive (no list of trials up front)."""
        return self.search not in EXPANDED

    def _check_search(self) -> None:
        """The search is known and can use every domain of the space."""
        if self.search not in SEARCHES:
            hint = closest(str(self.search), SEARCHES, cutoff=0.0)
            raise SweepError(f"unknown search {self.search!r}; did you mean {hint!r}? (known: {', '.join(SEARCHES)})")
        sampled = [k for k, d in self.space.items() if isinstance(d, (Choice, Uniform, LogUniform))]
        if self.search == "grid" and sampled:
            raise SweepError(
                f"search-space field {sampled[0]!r}: search='grid' enumerates every trial, and "
                f"{type(self.space[sampled[0]]).__name__.lower()}(...) is sampled: use grid(...) to list its values, "
                "or search='random' to sample it")
        if not self.model_based:
            if self.search_options:
                raise SweepError(f"search_options configure a model-based search; search={self.search!r} takes none "
                                 f"(got {sorted(self.search_options)})")
            return
        if self.points:
            raise SweepError(
                f"points: search={self.search!r} proposes every field itself and cannot run explicit points: give each "
                "field a domain in space (choice(...) for a categorical one), or run the points with search='random'")
        seed_axes = [k for k, d in self.space.items() if isinstance(d, Seeds)]
        for key, domain in self.space.items():
            if isinstance(domain, Grid) and not isinstance(domain, Seeds):
                raise SweepError(
                    f"search-space field {key!r}: search={self.search!r} proposes values itself, and a grid(...) axis "
                    "enumerates them: use choice(...) for a categorical field with TPE (uniform/loguniform for a "
                    "continuous one), or seeds(n) to repeat every proposal over n seeds")
        if len(seed_axes) > 1:
            raise SweepError(f"search-space fields {seed_axes}: search={self.search!r} repeats each proposal over one "
                             "seeds(n) axis; keep one")
        if not sampled:
            raise SweepError(f"search={self.search!r} has nothing to search: give at least one field a choice(...), "
                             "uniform(...) or loguniform(...) domain")
        problem = unknown_option(self.search_options, SEARCH_OPTIONS[self.search],
                                               what="search option", owner=f"search={self.search!r}")
        if problem:
            raise SweepError(problem)
        n = self.search_options.get("n_startup_trials")
        if n is not None and (not isinstance(n, int) or n < 0):
            raise SweepError(f"search option n_startup_trials must be a whole number >= 0, got {n!r}")

    def replicas(self) -> tuple[str | None, tuple[Any, ...]]:
        """With a model-based search: the field of the `seeds(n)` axis and its seeds (every
        proposal runs once per seed), or (None, ()) without one."""
        for key, domain in self.space.items():
            if isinstance(domain, Seeds):
                return key, tuple(domain.values)
        return None, ()

    def startup_trials(self) -> int:
        """TPE's random proposals before its model takes over: `search_options['n_startup_trials']`,
        else a third of the proposals, between 2 and Optuna's own default of 10 (which would
        leave a sweep of a dozen proposals almost all random)."""
        n = self.search_options.get("n_startup_trials")
        return int(n) if n is not None else min(10, max(2, self.num_samples // 3))

    def describe_search(self, at_once: int | None = None, where: str = "") -> str:
        """The search in words, e.g. 'TPE (Optuna, seed 0): 12 proposals, the first 4 random; at most 4 trials at once'.
        `at_once`: the trials at once where it would run, said to be `where` (e.g. 'on this machine');
        default the sweep's cap (`max_concurrent`, else `MODEL_BASED_CONCURRENCY`)."""
        if not self.model_based:
            return f"{self.search} search (seed {self.seed})"
        key, values = self.replicas()
        each = f", each run over {len(values)} seeds of {key}" if key else ""
        at_once = at_once or self.max_concurrent or MODEL_BASED_CONCURRENCY
        return (f"{self.search.upper()} (Optuna, seed {self.seed}): {self.num_samples} proposals, the first "
                f"{min(self.startup_trials(), self.num_samples)} random{each}; at most {at_once} trial"
                f"{'s' if at_once != 1 else ''} at once" + (f" {where}" if where else ""))

    def search_plan(self) -> dict[str, Any]:
        """What decides a model-based sweep's trials, for checking that a resumed sweep is the one
        that started (its trials are not known up front)."""
        return json.loads(json.dumps({
            "search": self.search, "seed": self.seed, "num_samples": self.num_samples,
            "options": dict(self.search_options),
            "space": {k: repr(d) if isinstance(d, Domain) else d for k, d in self.space.items()},
        }, default=repr))

    def search_settings(self, concurrency: int) -> dict[str, str]:
        """The search and its settings, as params of the sweep's MLflow parent run."""
        out = {"sweep.search": self.search, "sweep.search.seed": str(self.seed),
               "sweep.search.max_concurrent": str(concurrency)}
        if self.model_based:
            key, values = self.replicas()
            out.update({"sweep.search.sampler": "optuna.samplers.TPESampler",
                        "sweep.search.proposals": str(self.num_samples),
                        "sweep.search.n_startup_trials": str(self.startup_trials()),
                        "sweep.search.seeds_per_proposal": str(len(values) or 1)})
            out.update({f"sweep.search.{k}": str(v) for k, v in self.search_options.items() if k != "n_startup_trials"})
        return out

    def param_examples(self) -> list[dict[str, Any]]:
        """Parameter sets that stand for the sweep's trials when checking configs: the trials
        themselves when they are drawn up front; with a model-based search, every domain's
        examples (bounds, choices, seeds) one field at a time, the others at their first."""
        if not self.model_based:
            return self.trial_params()
        first = {k: (d.examples()[0] if isinstance(d, Domain) else d) for k, d in self.space.items()}
        out = [first]
        for key, domain in self.space.items():
            if isinstance(domain, Domain):
                out += [{**first, key: v} for v in domain.examples()[1:]]
        return out

    def trial_resources(self) -> dict[str, float]:
        """What one trial reserves in all: {'CPU': ..., 'GPU': ...} (GPU only when asked for)."""
        need = {"CPU": self.workers * self.cpus_per_worker}
        if self.gpus_per_worker:
            need["GPU"] = self.workers * self.gpus_per_worker
        return need

    def describe_resources(self) -> str:
        """One trial's request in words, e.g. '8 workers x (8 CPU, 1 GPU)'."""
        per = f"{self.cpus_per_worker:g} CPU" + (f", {self.gpus_per_worker:g} GPU" if self.gpus_per_worker else "")
        return f"{self.workers} worker{'s' if self.workers != 1 else ''} x ({per})"

    def preflight(self) -> Any:
        """Checks of the machine that will run the trials (data present, ...): the workload's
        optional `preflight(cfg)` hook on the base config and every distinct trial config, every
        distinct problem named in one error.
        Separate from `check()`, which judges the file alone: a cluster sweep is valid on a
        laptop that cannot run it. Raises SweepError."""
        w = self.load_workload()
        base = self.base_config()
        seen: set[str] = set()
        # Every distinct missing item once, in trial order: a sweep over two models and one dataset
        # names the dataset once, not once per model (a workload joins its problems with '; ').
        problems: dict[str, None] = {}
        owner = f"{w.name}: "
        for params in ([] if self.points else [{}]) + self.param_examples():  # a point may complete the base
            try:
                cfg = apply_overrides(base, params)
                key = repr(cfg)
                if key not in seen:
                    seen.add(key)
                    w.preflight(cfg)
            except ConfigError as exc:
                text = str(exc)
                for item in (text[len(owner):] if text.startswith(owner) else text).split("; "):
                    problems.setdefault(item, None)
        if len(problems) == 1:
            raise SweepError(f"sweep {self.name!r}: {owner}{next(iter(problems))}")
        if problems:
            raise SweepError(f"sweep {self.name!r}: {owner}{len(problems)} things missing on this machine:"
                             + "".join(f"\n    - {item}" for item in problems))
        return base

    def trial_count(self) -> int:
        grids = [len(d.values) for d in self.space.values() if isinstance(d, Grid)]
        return self.num_samples * math.prod(grids) * max(1, len(self.points))

    def trial_params(self) -> list[dict[str, Any]]:
        """The concrete parameter sets, in launch order (grid crossed with samples), seeded. A
        model-based search has none up front: see `param_examples`."""
        if self.model_based:
            raise SweepError(f"search={self.search!r} proposes trials as results arrive: there is no list of them up "
                             "front (a model-based sweep runs on Ray Tune: `ladder sweep`)")
        rng = random.Random(self.seed)
        grid_keys = [k for k, d in self.space.items() if isinstance(d, Grid)]
        points: list[dict[str, Any]] = [dict(p) for p in self.points] or [{}]
        for key in grid_keys:
            points = [{**p, key: v} for p in points for v in self.space[key].values]
        out = []
        for _ in range(self.num_samples):
            for point in points:
                params = dict(point)
                for key, domain in self.space.items():
                    if key in grid_keys:
                        continue
                    if isinstance(domain, Choice):
                        params[key] = rng.choice(domain.values)
                    elif isinstance(domain, Uniform):
                        params[key] = rng.uniform(domain.low, domain.high)
                    elif isinstance(domain, LogUniform):
                        params[key] = math.exp(rng.uniform(math.log(domain.low), math.log(domain.high)))
                    else:
                        params[key] = domain
                out.append(params)
        return out


def load_sweep_file(path: str | Path) -> Sweep:
    """Execute a sweep file and return its `sweep`; errors name the file, the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {str(path)!r} does not exist")
    try:
        namespace = runpy.run_path(str(path), run_name="__ladder_sweep__")
    except SyntaxError as exc:
        raise SweepError(f"{path}:{exc.lineno}: syntax error: {exc.msg}\n    {(exc.text or '').rstrip()}") from None
    except SweepError:
        raise
    except ConfigError as exc:
        raise SweepError(f"{path}: {exc}") from None
    except Exception as exc:
        raise SweepError(f"{path}: raised {type(exc).__name__}: {exc}") from None
    found = namespace.get("sweep")
    if not isinstance(found, Sweep):
        sweeps = [v for v in namespace.values() if isinstance(v, Sweep)]
        if len(sweeps) == 1:
            return sweeps[0]
        raise SweepError(f"{path} must assign a Sweep(...) to a module-level name `sweep`")
    return found
