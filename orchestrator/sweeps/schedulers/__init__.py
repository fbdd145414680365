"""Tune schedulers by name: 'collapse' (ours), 'asha', 'median', 'hyperband', 'pbt', 'fifo' (Ray Tune's own).

Every scheduler compares trials on their training fraction (`progress`), not on Tune's
iteration count, so trials that report at different rates are compared at the same point of
their budgets. ASHA, the median rule and HyperBand never stop a trial at 100%, and PBT never
perturbs one there (`ray_rules`): it finishes and its final metrics are recorded.

The objective (metric and mode) is set in one place, the sweep's `tune.TuneConfig`, which hands
it to the scheduler: Ray refuses a Tuner whose scheduler was built with a metric of its own.
`metric` and `mode` here feed only our collapse scheduler, which accepts the same objective
again from Tune (and refuses another one).

Each scheduler's options, their names and defaults, are its table in `orchestrator.sweep`'s
`SCHEDULER_OPTIONS` (the one `Sweep.check()` checks a sweep against, and docs/sweep-options.md lists).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from orchestrator.sweep import SCHEDULER_OPTIONS, SweepError, resolved_options, unknown_option


def build(
    name: str,
    options: Mapping[str, Any],
    *,
    metric: str,
    mode: str,
    state_path: Path | None = None,
    reference: Any = None,
    diagnostics: Any = None,
    space: Mapping[str, Any] | None = None,
) -> Any:
    """The Tune scheduler `name` with `options` (the rest from its table's defaults). `space`:
    the sweep's search space, whose domains PBT mutates within."""
    from ray.tune.schedulers import FIFOScheduler

    from orchestrator.sweeps.schedulers.ray_rules import Asha, Hyperband, Median

    if name not in SCHEDULER_OPTIONS:
        raise SweepError(f"unknown scheduler {name!r}")
    problem = unknown_option(options, SCHEDULER_OPTIONS[name], what="scheduler option", owner=f"scheduler={name!r}")
    if problem:
        raise SweepError(problem)
    opts = resolved_options(options, SCHEDULER_OPTIONS[name])
    if name == "fifo":
        return FIFOScheduler()
    if name == "asha":
        # progress is a fraction; ASHA's rungs need integer-like milestones, so use percent.
        return Asha(
            time_attr="progress_pct",
            max_t=100,
            grace_period=float(opts["grace_period"]) * 100,
            reduction_factor=float(opts["reduction_factor"]),
            brackets=int(opts["brackets"]),
        )
    if name == "median":
        return Median(
            time_attr="progress_pct",
            grace_period=float(opts["grace_period"]) * 100,
            min_samples_required=int(opts["min_samples_required"]),
        )
    if name == "hyperband":
        return Hyperband(reduction_factor=float(opts["reduction_factor"]), brackets=int(opts["brackets"]))
    if name == "pbt":
        return _pbt(opts, space or {})
    # collapse
    from orchestrator.sweeps.collapse import CollapseStopper
    from orchestrator.sweeps.schedulers.collapse import CollapseScheduler

    if reference is None:
        raise SweepError("the collapse scheduler needs a reference (scheduler_options['reference'])")
    opts.pop("reference", None)
    return CollapseScheduler(CollapseStopper(reference, **opts), metric=metric, mode=mode, state_path=state_path,
                             diagnostics=diagnostics)


def _pbt(opts: Mapping[str, Any], space: Mapping[str, Any]) -> Any:
    """PBT over the space's domains of the fields in `mutate` (`Sweep.check` has checked them):
    a grid or choice as its list of values, uniform and loguniform as Tune's own domains."""
    from ray import tune

    from orchestrator.sweep import Choice, Grid, LogUniform, Uniform
    from orchestrator.sweeps.schedulers.ray_rules import Pbt

    names = (opts["mutate"],) if isinstance(opts["mutate"], str) else tuple(opts["mutate"])
    mutations: dict[str, Any] = {}
    bounds: dict[str, tuple[float, float]] = {}
    for key in names:
        domain = space.get(key)
        if isinstance(domain, (Grid, Choice)):
            mutations[key] = list(domain.values)
        elif isinstance(domain, (Uniform, LogUniform)):
            make = tune.loguniform if isinstance(domain, LogUniform) else tune.uniform
            mutations[key] = make(domain.low, domain.high)
            bounds[key] = (domain.low, domain.high)
        else:
            raise SweepError(f"scheduler='pbt': mutate names {key!r}, which is not a domain of the sweep's space")
    return Pbt(mutations=mutations, bounds=bounds, perturbation_interval=float(opts["perturbation_interval"]),
               burn_in_period=float(opts["burn_in_period"]), quantile_fraction=float(opts["quantile_fraction"]),
               resample_probability=float(opts["resample_probability"]),
               perturbation_factors=tuple(float(f) for f in opts["perturbation_factors"]), synch=bool(opts["synch"]))
