"""`ladder reproduce NAME`: run a workload's reproduction sweep and check its paper's claims.

`sweeps/repro/<name>.py` defines the comparison as a function

    def build(*, smoke: bool = False, seed: int = 0) -> Sweep

(and usually `sweep = build()`, so that `ladder sweep sweeps/repro/<name>.py` runs the full size
too). The workload's `CLAIMS` is a list of functions; each takes the finished trials, one dict
per trial holding its config fields and its final metrics (metric keys contain a '/', config
fields do not, so the two never collide), and returns `(holds, measured)`: whether the claim
holds and the numbers it was judged on. `holds` may be None when the trials cannot decide the
claim (e.g. it needs the full size): the table shows it as not judged, it never counts as
holding, and the reproduction holds when every judged claim does and at least one was judged.
A claim's name is its function's name, its statement the first line of its docstring. A workload may also export `plot(trials, path)`, which draws the
claim plot as a PNG.

The trials run on the local Ray (or `RAY_ADDRESS`) as a Tune sweep, or one after another in this
process with `local=True`. Either way the sweep is one MLflow parent run with a child run per
trial, and the claim table, its numbers and the plot are logged to the parent run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import runpy
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from orchestrator import checkpoints, registry, tracking
from orchestrator.config import ConfigError, apply_overrides, flatten, redacted, to_dict, to_json
from orchestrator.sweep import Sweep, SweepError

REPRO_DIR = Path(__file__).resolve().parents[1] / "sweeps" / "repro"
LOCAL_DIR = "ladder-runs/repro"

Trial = dict[str, Any]
Claim = Callable[[list[Trial]], tuple[bool | None, Mapping[str, float]]]


@dataclass
class ClaimResult:
    name: str
    statement: str
    holds: bool | None
    """None: the trials could not decide the claim (not judged at this size)."""
    measured: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def judged(self) -> bool:
        return self.holds is not None


@dataclass
class Reproduction:
    name: str
    sweep: Sweep
    trials: list[Trial]
    claims: list[ClaimResult]
    failed_trials: list[str]
    parent_run_id: str | None
    tracking_uri: str | None
    wall_s: float

    @property
    def holds(self) -> bool:
        judged = [c for c in self.claims if c.judged]
        return bool(judged) and all(c.holds for c in judged) and not self.failed_trials

    def failures(self, names: list[str] | None = None) -> list[str]:
        """Why the reproduction (or, given `names`, those of its claims) does not hold: one line per
        failed trial and per claim that fails or was not judged, each named first (what a test's
        assertion message shows); [] when it holds."""
        lines = [f"trial failed: {t}" for t in self.failed_trials]
        chosen = [c for c in self.claims if names is None or c.name in names]
        for c in chosen:
            if c.judged and not c.holds:
                numbers = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.measured.items())
                lines.append(f"{c.name} does not hold: {c.error or numbers}")
            elif not c.judged and names is not None:
                lines.append(f"{c.name} was not judged")
        if names is None and not any(c.judged for c in chosen):
            lines.append("no claim was judged")
        return lines


def repro_file(name: str) -> Path:
    """sweeps/repro/<name>.py for a built-in workload; repro.py in the workload's own package
    folder for any other (a module path or a plugin)."""
    if name in registry.WORKLOADS:
        return REPRO_DIR / f"{name}.py"
    module = registry.import_workload(name)
    return Path(module.__file__).resolve().parent / "repro.py"


def load_repro(name: str, *, smoke: bool = False, seed: int = 0) -> Sweep:
    """The reproduction sweep of workload `name`, checked; errors name the file and the fix."""
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
        raise SweepError(f"{path} must define `build(*, smoke: bool = False, seed: int = 0) -> Sweep`")
    try:
        sweep = build(smoke=smoke, seed=seed)
    except (ConfigError, SweepError) as exc:
        raise SweepError(f"{path}: build(smoke={smoke}, seed={seed}): {exc}") from None
    if not isinstance(sweep, Sweep):
        raise SweepError(f"{path}: build() returned {type(sweep).__name__}, not a Sweep")
    if sweep.workload != name and registry.resolve(sweep.workload).module != registry.resolve(name).module:
        raise SweepError(f"{path}: its sweep runs workload {sweep.workload!r}, not {name!r}")
    # One MLflow experiment per reproduction size; each invocation is a parent run in it.
    sweep = dataclasses.replace(sweep, name=f"repro-{name}{'-smoke' if smoke else ''}", scheduler="fifo")
    sweep.check()
    return sweep


def evaluate(claims: list[Claim], trials: list[Trial]) -> list[ClaimResult]:
    """Run every claim; one that raises is reported as not holding, with the error."""
    out = []
    for claim in claims:
        name = getattr(claim, "__name__", repr(claim))
        statement = ((claim.__doc__ or "").strip().splitlines() or [name])[0]
        try:
            holds, measured = claim(trials)
            measured = {str(k): float(v) for k, v in dict(measured).items()}
            out.append(ClaimResult(name, statement, None if holds is None else bool(holds), measured))
        except Exception as exc:  # a claim that cannot be judged does not hold
            out.append(ClaimResult(name, statement, False, {}, f"{type(exc).__name__}: {exc}"))
    return out


def trial_record(cfg: Any, final: Mapping[str, float], trial_id: str) -> Trial:
    return {**to_dict(cfg), **{k: float(v) for k, v in final.items()}, "trial_id": trial_id}


def _run_local(sweep: Sweep) -> tuple[list[Trial], list[str], str, str]:
    """Every trial in this process, one after another, each its own MLflow child run."""
    from orchestrator import zero
    from orchestrator.console import ProgressSink
    from orchestrator.run import LocalRun

    workload = sweep.load_workload()
    base = sweep.check()
    for params in sweep.trial_params():
        zero.check_in_process(apply_overrides(base, params))
    uri = tracking.tracking_uri()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    sweep_id = f"{sweep.name}-{stamp}"
    parent = tracking.start_run(
        sweep.name, run_name=sweep_id, uri=uri,
        tags={"workload": sweep.workload, "paper": workload.paper, "ladder.kind": "reproduce", "ladder.mode": "local"},
        params={"sweep.trials": str(sweep.trial_count()), **{f"base.{k}": v for k, v in flatten(base).items()}},
    )
    trials, failed = [], []
    root = Path(LOCAL_DIR).resolve() / sweep_id
    for i, params in enumerate(sweep.trial_params()):
        trial_id = f"trial_{i:03d}"
        cfg = apply_overrides(base, params)
        run_id = tracking.start_run(
            sweep.name, run_name=f"{sweep_id}-{trial_id}", parent_run_id=parent, uri=uri, params=flatten(cfg),
            tags={"workload": sweep.workload, "paper": workload.paper, "ladder.trial_id": trial_id,
                  "ladder.sweep_id": sweep_id, "ladder.trial_params": json.dumps(redacted(dict(params)), default=str)},
        )
        tracking.log_text(run_id, to_json(cfg), "config.json", uri=uri)
        sink = tracking.MlflowSink(run_id, uri)
        run = LocalRun(root / trial_id, sinks=[sink, ProgressSink(f"{sweep.workload}/{trial_id}")],
                       identity=checkpoints.identity(sweep.workload, to_dict(cfg)))
        status = "FAILED"
        try:
            final = workload.train(cfg, run)
            sink.flush()
            tracking.set_final(run_id, final, uri=uri)
            trials.append(trial_record(cfg, final, trial_id))
            status = "FINISHED"
        except Exception as exc:
            failed.append(f"{trial_id} {params}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        finally:
            run.close()
            tracking.end_run(run_id, status, uri=uri)
    tracking.end_run(parent, "FINISHED", uri=uri)
    return trials, failed, parent, uri


def _run_ray(sweep: Sweep, resume: bool, verbose: bool = False) -> tuple[list[Trial], list[str], str | None, str | None]:
    """The sweep on Ray Tune; each trial's final metrics are read back from its MLflow child run."""
    from orchestrator import tune_run

    result = tune_run.run_sweep(sweep, resume=resume, verbose=verbose)
    base = sweep.check()
    c = tracking.client(result.tracking_uri)
    exp = c.get_experiment_by_name(sweep.name)
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`ladder.sweep_id` = '{result.sweep_id}'")
    finals = {r.data.tags.get("ladder.trial_id"): tracking.get_final(r, result.tracking_uri) for r in runs}
    trials, failed = [], []
    for t in sorted(result.trials, key=lambda t: t["trial_id"]):
        final = finals.get(t["trial_id"])
        if t["error"] or not final:
            failed.append(f"{t['trial_id']} {t['params']}: {t['error'] or 'no final metrics recorded'}")
            continue
        trials.append(trial_record(apply_overrides(base, t["params"]), final, t["trial_id"]))
    return trials, failed, result.parent_run_id, result.tracking_uri


def reproduce(name: str, *, smoke: bool = False, seed: int = 0, local: bool = False, resume: bool = False,
              verbose: bool = False) -> Reproduction:
    sweep = load_repro(name, smoke=smoke, seed=seed)  # every input check before anything runs
    if local and resume:
        raise ConfigError("--resume continues a reproduction on Ray; a --local one runs again from the start")
    if not local and not os.environ.get("RAY_ADDRESS"):
        from orchestrator.launch import check_resources

        check_resources(sweep.workers, sweep.cpus_per_worker)
    workload = sweep.load_workload()
    started = time.monotonic()
    if local:
        trials, failed, parent, uri = _run_local(sweep)
    else:
        trials, failed, parent, uri = _run_ray(sweep, resume, verbose)
    results = evaluate(workload.claims, trials) if trials else []
    rep = Reproduction(name, sweep, trials, results, failed, parent, uri, time.monotonic() - started)
    if parent:
        _log(rep, workload, seed=seed, smoke=smoke)
    return rep


def _log(rep: Reproduction, workload: registry.Workload, *, seed: int, smoke: bool) -> None:
    uri, run_id = rep.tracking_uri, rep.parent_run_id
    c = tracking.client(uri)
    for claim in rep.claims:
        if claim.judged:  # a claim not judged at this size has no 0/1 to log
            c.log_metric(run_id, f"claim/{claim.name}", 1.0 if claim.holds else 0.0)
        for key, value in claim.measured.items():
            if math.isfinite(value):
                c.log_metric(run_id, f"claim/{claim.name}/{key}", value)
    tracking.set_tags(run_id, {
        "ladder.claims": _count(rep),
        "ladder.reproduced": str(rep.holds).lower(),
        "ladder.seed": str(seed),
        "ladder.smoke": str(smoke).lower(),
    }, uri=uri)
    tracking.log_text(run_id, format_claims(rep), "claims.txt", uri=uri)
    tracking.log_text(run_id, json.dumps([dataclasses.asdict(r) for r in rep.claims], indent=2), "claims.json", uri=uri)
    tracking.log_text(run_id, json.dumps(rep.trials, indent=2, default=str), "repro_trials.json", uri=uri)
    plot = getattr(workload.module, "plot", None)
    if plot is not None and rep.trials:
        with tempfile.TemporaryDirectory(prefix="ladder-plot-") as tmp:
            path = Path(tmp) / f"{rep.name}_claims.png"
            try:
                plot(rep.trials, path)
                c.log_artifact(run_id, str(path))
            except Exception as exc:  # a broken plot must not hide the measured claims
                tracking.warn(f"{rep.name}: claim plot failed: {type(exc).__name__}: {exc}")


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4g}"


def format_claims(rep: Reproduction) -> str:
    rows = [("claim", "holds", "measured")]
    for c in rep.claims:
        measured = ", ".join(f"{k}={_fmt(v)}" for k, v in c.measured.items()) or c.error
        rows.append((c.name, "not judged" if not c.judged else "yes" if c.holds else "NO", measured))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows]
    lines += [f"  {c.name}: {c.statement}" for c in rep.claims]
    for f in rep.failed_trials:
        lines.append(f"trial failed: {f}")
    all_judged = all(c.judged for c in rep.claims)
    verdict = ("all claims hold" if all_judged else "all judged claims hold") if rep.holds else "NOT reproduced"
    lines.append(f"{rep.name}: {verdict} ({_count(rep).removesuffix(' hold')}, {len(rep.trials)} trials, {rep.wall_s:.0f} s)")
    return "\n".join(lines)


def _count(rep: Reproduction) -> str:
    """'3/4 claims hold', or '2/3 claims hold, 1 not judged' when some could not be decided."""
    judged = [c for c in rep.claims if c.judged]
    text = f"{sum(bool(c.holds) for c in judged)}/{len(judged)} claims hold"
    skipped = len(rep.claims) - len(judged)
    return text + (f", {skipped} not judged" if skipped else "")
