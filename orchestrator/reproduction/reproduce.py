"""`ladder reproduce NAME`: run a workload's reproduction sweep and judge its paper's claims.

`sweeps/repro/<name>.py` defines the comparison at one seed as a function

    def build(*, size: str = "full", seed: int = 0) -> Sweep

(and usually `sweep = build()`, so that `ladder sweep sweeps/repro/<name>.py` runs the full size
too). A reproduction has up to three sizes (`SIZES`): *smoke*, CPU-sized, about a minute a seed,
what CI runs; *bench*, the largest run one 2-core machine finishes for 3 seeds in at most 90
minutes, run on demand, for the effects a minute of training cannot show; *full*, the paper's
comparison at cluster size. A file may instead define `build(*, smoke: bool = False, seed: int = 0)`,
the older form with a smoke and a full size only.

The workload exports `CLAIMS` (effects its paper reports, declared with `orchestrator.claims.claim`)
and `CHECKS` (invariants and mechanism sanity), lists of functions;
each takes the finished trials of one seed, one dict per trial holding its config fields and its
final metrics (metric keys contain a '/', config fields do not, so the two never collide), and
returns `(holds, measured)`: whether it holds at that seed and the numbers it was judged on.
`holds` may be None when the trials cannot decide it (e.g. it needs the full size). A claim's
name is its function's name, its statement the first line of its docstring. A workload may also
export `plot(trials, path)`, which draws the claim plot as a PNG.

A workload may judge a size by claims of its own, `BENCH_CLAIMS` (and `BENCH_CHECKS`) beside
`CLAIMS`: thresholds set by seed noise at one size do not carry over to another.

`--check` runs nothing: it builds every seed's sweep and checks each trial's config, the data and
base models this machine must have and the CPUs asked for, as a run would before it starts.

`--seeds K` builds the sweep at K seeds (the seed passed to `build` steps by the number of seeds
one build uses, so the replicates never share a seed) and runs them as one sweep. Every claim
and check is evaluated on each seed's trials; `orchestrator.claims` judges the claims across the
seeds (mean effect, 95% interval, holds / fails / inconclusive) and a check must hold at every
seed.

The trials run on the local Ray (or `RAY_ADDRESS`) as a Tune sweep, or one after another in this
process with `local=True`. Either way the sweep is one MLflow parent run with a child run per
trial, and the claim tables, their numbers and the plot are logged to the parent run.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import runpy
import subprocess
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from orchestrator import claims as judging
from orchestrator.runners import registry
from orchestrator.tracking import sink as tracking
from orchestrator.runners.config import ConfigError, apply_overrides, to_dict
from orchestrator.sweep import Sweep, SweepError

REPRO_DIR = Path(__file__).resolve().parents[2] / "sweeps" / "repro"
LOCAL_DIR = "ladder-runs/repro"
FULL_SEEDS = judging.FULL_SEEDS
SIZES = judging.SIZES
DEFAULT_SEEDS = {"smoke": 1, "bench": 3, "full": FULL_SEEDS}
"""Seeds a reproduction runs at when --seeds is not given."""

Trial = dict[str, Any]
Claim = Callable[[list[Trial]], tuple[bool | None, Mapping[str, float]]]


@dataclass
class ClaimResult:
    """One claim or check evaluated on the trials of one seed."""

    name: str
    statement: str
    holds: bool | None
    """None: the trials could not decide the claim (not judged at this size)."""
    measured: dict[str, float] = field(default_factory=dict)
    error: str = ""
    seed: int | None = None

    @property
    def judged(self) -> bool:
        return self.holds is not None


@dataclass
class Outcome:
    """A claim or check judged over every seed of a reproduction."""

    name: str
    statement: str
    kind: str
    """'claim' or 'check'."""
    per_seed: list[ClaimResult]
    verdict: str
    """holds / fails / inconclusive / not judged, or 'error' when it raised at a seed."""
    spec: judging.Spec | None = None
    interval: judging.Interval | None = None
    """The effect's mean and 95% interval (a declared claim), or the share of seeds it held at."""
    notes: list[str] = field(default_factory=list)

    @property
    def judged(self) -> bool:
        return any(r.judged for r in self.per_seed)

    @property
    def holds(self) -> bool | None:
        """Whether it held at every seed it was judged at (None: judged at none). A test's view:
        what must hold at every seed; the verdict across seeds is `verdict`."""
        judged = [r for r in self.per_seed if r.judged]
        return all(r.holds for r in judged) if judged else None

    @property
    def error(self) -> str:
        return next((f"seed {r.seed}: {r.error}" if len(self.per_seed) > 1 else r.error
                     for r in self.per_seed if r.error), "")

    @property
    def measured(self) -> dict[str, float]:
        """The seed's numbers with one seed; with several, each number's mean over the seeds."""
        if len(self.per_seed) == 1:
            return self.per_seed[0].measured
        keys = list(dict.fromkeys(k for r in self.per_seed for k in r.measured))
        out = {}
        for k in keys:
            values = [r.measured[k] for r in self.per_seed if k in r.measured and math.isfinite(r.measured[k])]
            out[k] = sum(values) / len(values) if values else math.nan
        return out

    @property
    def effects(self) -> list[float]:
        """The declared effect at each seed (nan where it was not measured)."""
        if self.spec is None:
            return []
        return [r.measured.get(self.spec.effect, math.nan) for r in self.per_seed]


@dataclass
class Reproduction:
    name: str
    sweep: Sweep
    trials: list[Trial]
    outcomes: list[Outcome]
    failed_trials: list[str]
    parent_run_id: str | None
    tracking_uri: str | None
    wall_s: float
    seeds: list[int] = field(default_factory=lambda: [0])
    size: str = "full"

    @property
    def smoke(self) -> bool:
        return self.size == "smoke"

    @property
    def claims(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == "claim"]

    @property
    def checks(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == "check"]

    @property
    def holds(self) -> bool:
        """Every claim and check judged held at every seed, at least one claim was judged and no
        trial failed: what a test at one seed asserts. The verdicts across seeds are `ok`."""
        judged = [o for o in self.outcomes if o.judged]
        return (any(o.judged for o in self.claims) and all(o.holds and not o.error for o in judged)
                and not self.failed_trials)

    @property
    def ok(self) -> bool:
        """No claim's verdict is 'fails' (or 'error'), every check holds, no trial failed: what
        `ladder reproduce` exits 0 on. An inconclusive claim is not a failure."""
        bad_claim = any(o.verdict in (judging.FAILS, "error") for o in self.claims)
        bad_check = any(o.verdict in (judging.FAILS, "error") for o in self.checks)
        return not (bad_claim or bad_check or self.failed_trials)

    def failures(self, names: list[str] | None = None) -> list[str]:
        """Why the reproduction (or, given `names`, those of its claims and checks) does not hold
        at every seed: one line per failed trial and per claim or check that fails or was not
        judged at a seed, each named first (what a test's assertion message shows); [] when it holds."""
        lines = [f"trial failed: {t}" for t in self.failed_trials]
        chosen = [o for o in self.outcomes if names is None or o.name in names]
        for o in chosen:
            for r in o.per_seed:
                at = f" at seed {r.seed}" if len(self.seeds) > 1 else ""
                if r.judged and not r.holds:
                    numbers = ", ".join(f"{k}={_fmt(v)}" for k, v in r.measured.items())
                    lines.append(f"{o.name} does not hold{at}: {r.error or numbers}")
                elif not r.judged and names is not None:
                    lines.append(f"{o.name} was not judged{at}")
        if names is None and not any(o.judged for o in self.claims):
            lines.append("no claim was judged")
        return lines


def repro_file(name: str) -> Path:
    """sweeps/repro/<name>.py for a built-in workload; repro.py in the workload's own package
    folder for any other (a module path or a plugin)."""
    if name in registry.WORKLOADS:
        return REPRO_DIR / f"{name}.py"
    module = registry.import_workload(name)
    return Path(module.__file__).resolve().parent / "repro.py"


def size_of(size: str | None, smoke: bool = False) -> str:
    """The size asked for: `size` when given (checked), else 'smoke' or 'full' as `smoke` says."""
    if size is None:
        return "smoke" if smoke else "full"
    if size not in SIZES:
        raise ConfigError(f"size {size!r} is not one of {', '.join(SIZES)}: give --size smoke, bench or full")
    if smoke and size != "smoke":
        raise ConfigError(f"--smoke is --size smoke; it cannot be combined with --size {size}: give one")
    return size


def size_flags(size: str) -> list[str]:
    """The command-line words that ask for `size` (none for full, the default), for the commands
    ladder prints back to the user."""
    return {"smoke": ["--smoke"], "bench": ["--size", "bench"], "full": []}[size]


def experiment_name(name: str, size: str) -> str:
    """The MLflow experiment of a reproduction of `name` at `size`: one per size."""
    return f"repro-{name}" + ("" if size == "full" else f"-{size}")


def takes_size(build: Callable[..., Any]) -> bool:
    """Whether a repro file's build() has the `size` keyword (else it is the older `smoke` form)."""
    try:
        return "size" in inspect.signature(build).parameters
    except (TypeError, ValueError):
        return False


def load_repro(name: str, *, smoke: bool = False, seed: int = 0, size: str | None = None) -> Sweep:
    """The reproduction sweep of workload `name` at `size` (or smoke/full as `smoke` says), checked;
    errors name the file and the fix."""
    size = size_of(size, smoke)
    workload = registry.load(name)
    if not workload.claims:
        raise ConfigError(f"workload {name!r} has no CLAIMS: there is nothing to reproduce")
    path = repro_file(name)
    if not path.is_file():
        shown = path.relative_to(REPRO_DIR.parents[1]) if path.is_relative_to(REPRO_DIR.parents[1]) else path
        raise ConfigError(f"workload {name!r} has CLAIMS but no reproduction sweep: write {shown}")
    try:
        namespace = runpy.run_path(str(path), run_name="__ladder_repro__")
    except (ConfigError, SweepError) as exc:
        raise SweepError(f"{path}: {exc}") from None
    build = namespace.get("build")
    if not callable(build):
        raise SweepError(f"{path} must define `build(*, size: str = 'full', seed: int = 0) -> Sweep` "
                         "(or the older `build(*, smoke: bool = False, seed: int = 0)`)")
    if takes_size(build):
        kwargs: dict[str, Any] = {"size": size, "seed": seed}
    elif size == "bench":
        raise ConfigError(f"workload {name!r} has no bench size: {path.name}'s build() takes `smoke`, not `size`. "
                          "Give it `size: str = 'full'` and return the bench sweep for size='bench'")
    else:
        kwargs = {"smoke": size == "smoke", "seed": seed}
    try:
        sweep = build(**kwargs)
    except (ConfigError, SweepError) as exc:
        raise SweepError(f"{path}: build({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): {exc}") from None
    if not isinstance(sweep, Sweep):
        raise SweepError(f"{path}: build() returned {type(sweep).__name__}, not a Sweep")
    if sweep.workload != name and registry.resolve(sweep.workload).module != registry.resolve(name).module:
        raise SweepError(f"{path}: its sweep runs workload {sweep.workload!r}, not {name!r}")
    # One MLflow experiment per reproduction size; each invocation is a parent run in it.
    sweep = dataclasses.replace(sweep, name=experiment_name(name, size), scheduler="fifo")
    sweep.check()
    return sweep


def seeds_used(sweep: Sweep) -> list[int]:
    """The config seeds the trials of one build run (sorted); [] when the config has no `seed`."""
    base = sweep.check()
    if not hasattr(base, "seed"):
        return []
    return sorted({int(apply_overrides(base, p).seed) for p in sweep.trial_params()})


@dataclass
class Plan:
    """What `ladder reproduce --seeds K` runs: one sweep over K builds, and which trial is whose."""

    sweep: Sweep
    seeds: list[int]
    """The seed each build was made with (the replicate's label)."""
    groups: list[list[dict[str, Any]]]
    """The trial params of each replicate, as the merged sweep runs them."""


def plan(name: str, *, smoke: bool = False, seed: int = 0, seeds: int = 1, size: str | None = None) -> Plan:
    """Build the reproduction at `seeds` seeds and merge them into one sweep; every check of the
    input happens here, before anything runs."""
    size = size_of(size, smoke)
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: a reproduction needs at least one seed (give --seeds 1 or more)")
    first = load_repro(name, size=size, seed=seed)
    if seeds == 1:
        return Plan(first, [seed], [first.trial_params()])
    if first.model_based:
        raise SweepError(f"{name}: its reproduction sweep proposes trials as it goes (search={first.search!r}); "
                         "--seeds needs the trials up front: use search='random' or 'grid'")
    used = seeds_used(first)
    stride = max(used) - min(used) + 1 if used else 1
    labels = [seed + i * stride for i in range(seeds)]
    builds = [first] + [load_repro(name, size=size, seed=s) for s in labels[1:]]
    common = {k: v for k, v in first.overrides.items()
              if all(k in b.overrides and b.overrides[k] == v for b in builds)}
    groups = []
    for b in builds:
        extra = {k: v for k, v in b.overrides.items() if k not in common}
        groups.append([{**extra, **p} for p in b.trial_params()])
    merged = dataclasses.replace(first, overrides=common, space={}, points=tuple(p for g in groups for p in g),
                                 num_samples=1)
    merged.check()
    return Plan(merged, labels, groups)


def _key(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, default=str)


def split_by_seed(p: Plan, trials: list[Trial], params: Mapping[str, Mapping[str, Any]]) -> list[list[Trial]]:
    """The finished trials of each replicate (`params`: trial_id -> the params it ran with)."""
    left = [[_key(q) for q in g] for g in p.groups]
    out: list[list[Trial]] = [[] for _ in p.groups]
    for t in trials:
        key = _key(params[t["trial_id"]])
        for i, keys in enumerate(left):
            if key in keys:
                keys.remove(key)
                out[i].append(t)
                break
    return out


def evaluate(fns: list[Claim], trials: list[Trial], seed: int | None = None) -> list[ClaimResult]:
    """Run every claim (or check) on one seed's trials; one that raises is reported as not
    holding, with the error."""
    out = []
    for fn in fns:
        name = getattr(fn, "__name__", repr(fn))
        statement = ((fn.__doc__ or "").strip().splitlines() or [name])[0]
        try:
            holds, measured = fn(trials)
            measured = {str(k): float(v) for k, v in dict(measured).items()}
            out.append(ClaimResult(name, statement, None if holds is None else bool(holds), measured, seed=seed))
        except Exception as exc:  # a claim that cannot be judged does not hold
            out.append(ClaimResult(name, statement, False, {}, f"{type(exc).__name__}: {exc}", seed=seed))
    return out


def judge(fns: list[Claim], per_seed: list[list[ClaimResult]], kind: str) -> list[Outcome]:
    """Judge each claim (kind 'claim') or check (kind 'check') over its per-seed results."""
    outcomes = []
    for i, fn in enumerate(fns):
        results = [seed_results[i] for seed_results in per_seed]
        spec = judging.spec_of(fn) if kind == "claim" else None
        o = Outcome(results[0].name, results[0].statement, kind, results, judging.NOT_JUDGED, spec)
        judged = [r for r in results if r.judged]
        if any(r.error for r in results):
            o.verdict = "error"
        elif kind == "check":
            o.verdict = judging.NOT_JUDGED if not judged else judging.HOLDS if all(r.holds for r in judged) else judging.FAILS
        elif spec is not None:
            values = []
            for r in judged:
                if spec.effect not in r.measured:
                    o.notes.append(f"seed {r.seed}: the claim measured no {spec.effect!r} (it measured "
                                   f"{sorted(r.measured)}): fix the key in its @claim")
                    continue
                value = r.measured[spec.effect]
                values.append(value)
                if math.isfinite(value) and spec.passes(value) != r.holds:
                    o.notes.append(f"seed {r.seed}: the claim says holds={r.holds} but {spec.effect}={_fmt(value)} "
                                   f"{'passes' if spec.passes(value) else 'misses'} {spec.describe}")
            o.verdict, o.interval = judging.judge_effect(spec, values)
            if o.notes and any("measured no" in n for n in o.notes):
                o.verdict = "error"
        else:
            o.verdict, o.interval = judging.judge_rate([bool(r.holds) for r in judged])
        outcomes.append(o)
    return outcomes


REPORT_OUTPUTS = ("docs/reproductions.md", "docs/reproductions")
"""What `ladder report` itself writes in the checkout: not a change to the code that measured."""


def source_commit(folder: Path | None = None) -> str:
    """The checkout's commit, '-dirty' when tracked files other than the report's own outputs
    differ from it; '' outside git."""
    cwd = str(folder or Path(__file__).resolve().parents[1])
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        # ':/' is the whole tree and `top` anchors the exclusions there, wherever `cwd` is in it.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/",
                                *(f":(top,exclude){p}" for p in REPORT_OUTPUTS)], cwd=cwd, capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return sha + ("-dirty" if dirty else "")


def processor() -> str:
    """This machine's processor as the OS names it (Linux: /proc/cpuinfo's model name) and its CPU
    count: what a bench result is recorded with, since numbers and times depend on it."""
    import platform

    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown processor"
    return f"{name}, {os.cpu_count() or '?'} CPUs"


def trial_record(cfg: Any, final: Mapping[str, float], trial_id: str) -> Trial:
    """One finished trial as claims read it: its config fields (a Config, or its dict) and its final metrics."""
    fields = dict(cfg) if isinstance(cfg, Mapping) else to_dict(cfg)
    return {**fields, **{k: float(v) for k, v in final.items()}, "trial_id": trial_id}


Ran = tuple[list[Trial], dict[str, dict[str, Any]], list[str], str | None, str | None]
"""Finished trials, trial_id -> params of every trial, failed trials, parent run id, tracking URI."""


def _run_local(sweep: Sweep, tags: Mapping[str, str]) -> Ran:
    """Every trial in this process, one after another, each its own MLflow child run."""
    from orchestrator.runners import zero
    from orchestrator.run import LocalRun
    from orchestrator.runners.trial import (STATUS_FINISHED, STATUS_KILLED, TrialSpec, finish_run, open_run,
                                            open_sweep_run, run_trial, trial_tags)

    workload = sweep.load_workload()
    base = sweep.check()
    sweep.preflight()  # this machine runs every trial: data and base models present, as under Ray
    for params in sweep.trial_params():
        zero.check_in_process(apply_overrides(base, params))
    uri = tracking.tracking_uri()
    sweep_id, parent = open_sweep_run(sweep.name, sweep.workload, base, kind="reproduce", uri=uri,
                                      tags={"ladder.mode": "local", **tags},
                                      params={"sweep.trials": str(sweep.trial_count())})
    trials, failed, ran = [], [], {}
    root = Path(LOCAL_DIR).resolve() / sweep_id
    for i, params in enumerate(sweep.trial_params()):
        trial_id = f"trial_{i:03d}"
        ran[trial_id] = params
        cfg = apply_overrides(base, params)
        run_id = open_run(sweep.workload, cfg, experiment=sweep.name, run_name=f"{sweep_id}-{trial_id}", uri=uri,
                          parent_run_id=parent, tags=trial_tags(trial_id, sweep_id, params))
        spec = TrialSpec.of(sweep.workload, cfg, run_id=run_id, tracking_uri=uri,
                            progress=f"{sweep.workload}/{trial_id}")
        try:
            final, _ = run_trial(spec, lambda sinks, _: LocalRun(root / trial_id, sinks=sinks, identity=spec.identity),
                                 loaded=(workload, cfg))
            trials.append(trial_record(cfg, final, trial_id))
        except Exception as exc:  # the trial's run is ended FAILED; the others still run
            failed.append(f"{trial_id} {params}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        except KeyboardInterrupt:  # the trial's run is ended KILLED by run_trial; so is the reproduction's
            finish_run(parent, STATUS_KILLED, uri=uri)
            raise
    finish_run(parent, STATUS_FINISHED, uri=uri)
    return trials, ran, failed, parent, uri


def _run_ray(sweep: Sweep, resume: bool, verbose: bool, tags: Mapping[str, str]) -> Ran:
    """The sweep on Ray Tune; each trial's config and final metrics come with the sweep's result."""
    from orchestrator.sweeps import tune_run

    result = tune_run.run_sweep(sweep, resume=resume, verbose=verbose)
    if result.parent_run_id:  # a reproduction, as a local one's parent is (what `ladder report --from-mlflow` reads)
        tracking.set_tags(result.parent_run_id, {**tags, "ladder.kind": "reproduce"}, uri=result.tracking_uri)
    trials, failed, ran = [], [], {}
    for t in sorted(result.trials, key=lambda t: t["trial_id"]):
        ran[t["trial_id"]] = dict(t["params"])
        final = t.get("final")
        if t["error"] or not final:
            failed.append(f"{t['trial_id']} {t['params']}: {t['error'] or 'no final metrics recorded'}")
            continue
        trials.append(trial_record(t["config"], final, t["trial_id"]))
    return trials, ran, failed, result.parent_run_id, result.tracking_uri


def check(name: str, *, size: str | None = None, smoke: bool = False, seed: int = 0, seeds: int | None = None,
          local: bool = False) -> str:
    """`ladder reproduce NAME --check`: everything `reproduce` checks before it runs, and nothing
    run: the builds at every seed, each trial's config, the data and base models this machine must
    have (`Sweep.preflight`) and, for Ray, the CPUs the trials ask for. Returns what would run;
    raises the error a run would meet first."""
    size = size_of(size, smoke)
    seeds = DEFAULT_SEEDS[size] if seeds is None else seeds
    p = plan(name, size=size, seed=seed, seeds=seeds)
    sweep = p.sweep
    base = sweep.check()
    sweep.preflight()
    if local:
        from orchestrator.runners import zero

        for params in sweep.trial_params():
            zero.check_in_process(apply_overrides(base, params))
    elif not os.environ.get("RAY_ADDRESS"):
        from orchestrator.runners.launch import check_resources

        check_resources(sweep.workers, sweep.cpus_per_worker)
    per_seed, workload = len(p.groups[0]), registry.load(name)
    return (f"{name} at {size} size: {sweep.trial_count()} trials ({per_seed} a seed, seeds "
            f"{', '.join(map(str, p.seeds))}), MLflow experiment {sweep.name!r}; "
            f"{len(workload.claims_at(size))} claims, {len(workload.checks_at(size))} checks: ready to run")


def reproduce(name: str, *, smoke: bool = False, seed: int = 0, seeds: int | None = None, local: bool = False,
              resume: bool = False, verbose: bool = False, size: str | None = None) -> Reproduction:
    """Run the reproduction of workload `name` at `size` (smoke, bench or full; or as `smoke`
    says) and `seeds` seeds (default `DEFAULT_SEEDS` of the size) from `seed` on, and judge its
    claims and checks."""
    size = size_of(size, smoke)
    if seeds is None:
        seeds = DEFAULT_SEEDS[size]
    p = plan(name, size=size, seed=seed, seeds=seeds)  # every input check before anything runs
    sweep = p.sweep
    if local and resume:
        raise ConfigError("--resume continues a reproduction on Ray; a --local one runs again from the start")
    if not local and not os.environ.get("RAY_ADDRESS"):
        from orchestrator.runners.launch import check_resources

        check_resources(sweep.workers, sweep.cpus_per_worker)
    workload = sweep.load_workload()
    tags = {"ladder.seeds": ",".join(map(str, p.seeds)), "ladder.size": size,
            "ladder.smoke": str(size == "smoke").lower(), "ladder.commit": source_commit(),
            "ladder.processor": processor()}
    started = time.monotonic()
    if local:
        trials, ran, failed, parent, uri = _run_local(sweep, tags)
    else:
        trials, ran, failed, parent, uri = _run_ray(sweep, resume, verbose, tags)
    by_seed = split_by_seed(p, trials, ran)
    claim_fns, check_fns = workload.claims_at(size), workload.checks_at(size)
    outcomes = []
    if trials:
        outcomes = (judge(claim_fns, [evaluate(claim_fns, ts, s) for s, ts in zip(p.seeds, by_seed)], "claim")
                    + judge(check_fns, [evaluate(check_fns, ts, s) for s, ts in zip(p.seeds, by_seed)], "check"))
    rep = Reproduction(name, sweep, trials, outcomes, failed, parent, uri, time.monotonic() - started, p.seeds, size)
    if parent:
        _log(rep, workload)
    return rep


def outcome_record(o: Outcome) -> dict[str, Any]:
    """An outcome as plain JSON (what claims.json holds and `ladder report` reads back as is)."""
    return {"name": o.name, "statement": o.statement, "kind": o.kind, "verdict": o.verdict,
            "spec": dataclasses.asdict(o.spec) if o.spec else None,
            "interval": dataclasses.asdict(o.interval) if o.interval else None, "notes": o.notes,
            "per_seed": [dataclasses.asdict(r) for r in o.per_seed]}


def _log(rep: Reproduction, workload: registry.Workload) -> None:
    uri, run_id = rep.tracking_uri, rep.parent_run_id
    c = tracking.client(uri)
    for o in rep.outcomes:
        prefix = f"{o.kind}/{o.name}"
        if o.judged:  # held at every seed judged: 1, else 0; not judged at this size: nothing to log
            c.log_metric(run_id, prefix, 1.0 if o.holds else 0.0)
        if o.interval is not None:
            for part in ("mean", "low", "high"):
                value = getattr(o.interval, part)
                if math.isfinite(value):
                    c.log_metric(run_id, f"{prefix}/{'rate' if o.spec is None else 'effect'}_{part}", value)
        for key, value in o.measured.items():
            if math.isfinite(value):
                c.log_metric(run_id, f"{prefix}/{key}", value)
    tracking.set_tags(run_id, {
        "ladder.claims": _count(rep),
        "ladder.reproduced": str(rep.ok).lower(),
        "ladder.seed": str(rep.seeds[0]),
        "ladder.seeds": ",".join(map(str, rep.seeds)),
        "ladder.smoke": str(rep.smoke).lower(),
        "ladder.size": rep.size,
        **{f"ladder.verdict.{o.name}": o.verdict for o in rep.outcomes},
    }, uri=uri)
    tracking.log_text(run_id, format_claims(rep), "claims.txt", uri=uri)
    tracking.log_text(run_id, json.dumps([outcome_record(o) for o in rep.outcomes], indent=2), "claims.json", uri=uri)
    tracking.log_text(run_id, json.dumps(rep.trials, indent=2, default=str), "repro_trials.json", uri=uri)
    if rep.trials:
        with tempfile.TemporaryDirectory(prefix="ladder-plot-") as tmp:
            path = draw_plot(rep, workload, Path(tmp) / f"{rep.name}_claims.png")
            if path is not None:
                c.log_artifact(run_id, str(path))


def draw_plot(rep: Reproduction, workload: registry.Workload, path: Path) -> Path | None:
    """The workload's claim plot over every trial of the reproduction, or None (no plot, or it failed)."""
    plot = getattr(workload.module, "plot", None)
    if plot is None or not rep.trials:
        return None
    try:
        plot(rep.trials, path)
        return path
    except Exception as exc:  # a broken plot must not hide the measured claims
        tracking.warn(f"{rep.name}: claim plot failed: {type(exc).__name__}: {exc}")
        return None


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4g}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() for r in rows]


def interval_text(o: Outcome) -> str:
    iv = o.interval
    if iv is None:
        return "-"
    if o.spec is None:
        return f"held at {round(iv.mean * iv.n)}/{iv.n} seeds, [{iv.low:.2f}, {iv.high:.2f}]"
    if iv.n == 1:
        return "- (1 seed: no interval)"
    return f"[{_fmt(iv.low)}, {_fmt(iv.high)}]"


def format_claims(rep: Reproduction) -> str:
    n = len(rep.seeds)
    seeds = ", ".join(map(str, rep.seeds))
    lines = [f"CLAIMS: effects the paper reports, judged over {n} seed{'s' * (n > 1)} ({seeds})"]
    rows = [("claim", "effect, threshold", "mean", "95% interval", "per seed", "verdict")]
    for o in rep.claims:
        mean = _fmt(o.interval.mean) if o.interval is not None and o.spec is not None else "-"
        per_seed = " ".join(_fmt(v) for v in o.effects) if o.spec else " ".join(
            "-" if r.holds is None else "yes" if r.holds else "no" for r in o.per_seed)
        rows.append((o.name, o.spec.describe if o.spec else "(undeclared: share of seeds)", mean, interval_text(o),
                     per_seed, o.verdict.upper() if o.verdict in (judging.FAILS, "error") else o.verdict))
    lines += _table(rows) if rep.claims else ["  (none)"]
    lines.append("CHECKS: invariants and mechanism sanity, which must hold at every seed")
    rows = [("check", "held", "measured" + (f" (seed {rep.seeds[0]})" if n > 1 else ""))]
    for o in rep.checks:
        held = sum(bool(r.holds) for r in o.per_seed if r.judged)
        judged = sum(r.judged for r in o.per_seed)
        first = o.per_seed[0]
        measured = ", ".join(f"{k}={_fmt(v)}" for k, v in first.measured.items()) or o.error
        state = "not judged" if not judged else f"{held}/{judged}" + ("" if held == judged else " FAILS")
        rows.append((o.name, "error" if o.verdict == "error" else state, measured))
    lines += _table(rows) if rep.checks else ["  (none)"]
    for o in rep.claims:
        lines.append(f"  {o.name}: {o.statement}")
        if o.spec is not None:
            lines.append(f"      paper: {o.spec.paper}; threshold from: {o.spec.source}")
        if n == 1:  # with several seeds the table shows each seed's effect; the MLflow run keeps the rest
            for r in o.per_seed:
                shown = ", ".join(f"{k}={_fmt(v)}" for k, v in r.measured.items()) or r.error
                lines.append(f"      seed {r.seed}: {shown}")
        lines += [f"      note: {x}" for x in o.notes]
    for o in rep.checks:
        lines.append(f"  {o.name}: {o.statement}")
        lines += [f"      seed {r.seed}: {r.error}" for r in o.per_seed if r.error]
    for f in rep.failed_trials:
        lines.append(f"trial failed: {f}")
    verdict = "reproduction OK (no claim fails)" if rep.ok else "NOT reproduced"
    lines.append(f"{rep.name}: {verdict}: {_count(rep)} ({n} seed{'s' * (n > 1)}, {len(rep.trials)} trials, "
                 f"{rep.wall_s:.0f} s)")
    if n == 1 and rep.claims:
        lines.append("  one seed gives no interval: run --seeds 3 or more for a verdict")
    return "\n".join(lines)


def _count(rep: Reproduction) -> str:
    """'claims: 2 hold, 1 inconclusive, 1 fails; checks: 3/3 hold'."""
    order = [judging.HOLDS, judging.INCONCLUSIVE, judging.FAILS, "error", judging.NOT_JUDGED]
    counts = {v: sum(o.verdict == v for o in rep.claims) for v in order}
    claims = ", ".join(f"{counts[v]} {v}" for v in order if counts[v]) or "none"
    checks = rep.checks
    if not checks:
        return f"claims: {claims}; no checks"
    held = sum(o.verdict == judging.HOLDS for o in checks)
    judged = sum(o.verdict != judging.NOT_JUDGED for o in checks)
    return f"claims: {claims}; checks: {held}/{judged} hold" + (
        f", {len(checks) - judged} not judged" if len(checks) > judged else "")
