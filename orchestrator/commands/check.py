"""`ladder check WORKLOAD`: the workload contract, judged on any workload by running it.

The same checks back `tests/test_conformance.py` for every built-in workload and `ladder check`
for anyone's: the contract's static parts (`registry.contract_checks`), then local runs of
`smoke()` in this process, each through a `LocalRun`:

1. an uninterrupted run: it finishes, reports `train/loss` and a `progress` that reaches 1 and
   never goes back, at steps that never go back, and returns finite float metrics;
2. a run killed one report after its first checkpoint: what such a process leaves on disk is its
   run folder at that moment, so the uninterrupted run copies its folder there
   (`SnapshotAfterCheckpoint`) and goes on, instead of a second run training up to that point;
3. a restart in the copied folder: it must continue from the newest checkpoint, not from step 0,
   and report the same metrics at the same steps as the uninterrupted run (`perf/` metrics, which
   measure time, aside).

The reports are then replayed the way a Tune trial sends them (`ray_train.forward_to_ray`, each
carrying the latest value of every metric): every report that reaches Ray's schedulers must carry
`progress`, and the objective must reach them; a workload that reports its objective only at the
end (many evaluate once, on the finished model) is marked `limit`: fifo sweeps rank it, ASHA, the
median rule and collapse cannot stop it early. With `ray=True`, a fourth run under Ray Train (2 workers when the workload accepts them)
is killed after a checkpoint and must be restarted from it by Ray Train.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from orchestrator.runners import registry
from orchestrator.run import checkpoints
from orchestrator.runners.config import to_dict
from orchestrator.run import LocalRun, pinned_threads

RTOL = 1e-6
"""Relative tolerance of "the same metrics": a resumed run recomputes the same floats, so only
a last-bit difference in a reduction is forgiven."""


class Killed(Exception):
    """Stands in for the process dying: raised from inside the loop, after a checkpoint."""


class SnapshotAfterCheckpoint(LocalRun):
    """A `LocalRun` that, `extra_reports` reports after the run's first checkpoint, copies its run
    folder to `snapshot`: the folder a process killed at that moment leaves behind, reports past
    the checkpoint included (a restart must replay them). The run itself goes on to the end."""

    def __init__(self, *args: Any, snapshot: str | Path, extra_reports: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.snapshot = Path(snapshot)
        self.saved_step: int | None = None
        self.last_saved_step: int | None = None  # the newest checkpoint in the snapshot
        self.snapshotted = False
        self.extra_reports = extra_reports

    def save(self, state: dict[str, Any]) -> None:
        super().save(state)
        if not self.snapshotted:
            self.last_saved_step = int(state["step"])
            if self.saved_step is None:
                self.saved_step = int(state["step"])

    def report(self, metrics: Mapping[str, float], *, step: int) -> None:
        super().report(metrics, step=step)
        if not self.snapshotted and self.saved_step is not None and step > self.saved_step:
            self.extra_reports -= 1
            if self.extra_reports < 0:
                shutil.copytree(self.run_dir, self.snapshot)
                self.snapshotted = True


@dataclass
class Result:
    check: str
    holds: bool | None
    """None: not judged (an earlier check failed, or it was not asked for)."""
    detail: str = ""


@dataclass
class Report:
    workload: str
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0
    device: str = ""
    """Where `ladder run --local` would train this workload here (`devices.describe`)."""

    @property
    def ok(self) -> bool:
        return all(r.holds is not False for r in self.results)

    def failures(self) -> list[str]:
        return [f"{r.check}: {r.detail}" for r in self.results if r.holds is False]

    def add(self, check: str, holds: bool | None, detail: str = "") -> bool:
        self.results.append(Result(check, holds, detail))
        return bool(holds)


def _error(exc: BaseException) -> str:
    return f"raised {type(exc).__name__}: {exc}"


def _by_step(history: list[tuple[int, dict[str, float]]]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for step, metrics in history:
        out.setdefault(step, {}).update(metrics)
    return out


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-12)


def compare_resumed(uninterrupted: list[tuple[int, dict[str, float]]], resumed: list[tuple[int, dict[str, float]]],
                    final_a: Mapping[str, float], final_b: Mapping[str, float]) -> str | None:
    """Where the resumed run's reports differ from the uninterrupted run's at the same steps (and
    their final metrics), in words; None when they agree.

    `perf/` metrics measure time: skipped. A `train/` metric's first report after the restart is
    skipped too: a loss averaged since the last report covers only the steps since the checkpoint
    there (the contract lets train/loss be such a window); every later report must agree."""
    a, b = _by_step(uninterrupted), _by_step(resumed)
    windowed: set[str] = set()
    for step in sorted(b):
        if step not in a:
            return f"the resumed run reported step {step}, which the uninterrupted run never did"
        for key in sorted(set(a[step]) | set(b[step])):
            if key.startswith("perf/"):
                continue
            if key not in a[step] or key not in b[step]:
                which = "resumed" if key not in b[step] else "uninterrupted"
                return f"step {step}: {key} missing from the {which} run"
            if key.startswith("train/") and key not in windowed:
                windowed.add(key)
                continue
            if not _same(a[step][key], b[step][key]):
                return (f"step {step}: {key} = {b[step][key]:.6g} after the restart, {a[step][key]:.6g} in the "
                        "uninterrupted run (restore every piece of state the loop uses: model, optimizer, RNG, data "
                        "position)")
    missing = [s for s in a if s > min(b, default=0) and s not in b]
    if missing:
        return f"the resumed run skipped steps the uninterrupted run reported, e.g. {missing[0]}"
    for key in sorted(set(final_a) | set(final_b)):
        if key.startswith("perf/") or (key.startswith("train/") and len(b) < 2):
            continue
        if key not in final_a or key not in final_b or not _same(float(final_a[key]), float(final_b[key])):
            return (f"final {key}: {final_b.get(key, 'missing')} after the restart, {final_a.get(key, 'missing')} "
                    "uninterrupted")
    return None


FIFO_ONLY = "fifo only"


def scheduler_verdict(history: list[tuple[int, dict[str, float]]], objective: str,
                      final: Mapping[str, float] | None = None) -> tuple[bool | None, str]:
    """Whether Tune's schedulers can rank this run on `objective`, replaying the reports that
    reach Ray (`forward_to_ray`, each carrying the latest value of every metric, as `RayReports`
    sends them): (True, "") when every one carries the objective and `progress` and some come
    before the end, so that ASHA, the median rule and collapse can stop it early at rungs of
    progress; (None, why) when the objective comes only at the end (fifo sweeps rank it, the
    others cannot: Tune refuses a report without the metric it schedules on), also when the
    objective is only among `train`'s returned `final` metrics (recorded on the trial's MLflow run
    and judged by claims, never reported); (False, why) when nothing carries the objective, or a
    report reaches Ray without `progress`."""
    from orchestrator.runners.ray_train import forward_to_ray

    last: dict[str, float] = {}
    sent = []
    for step, metrics in history:
        last.update(metrics)
        if forward_to_ray(metrics):
            sent.append((step, dict(last)))
    if (not sent or objective not in sent[-1][1]) and objective in (final or {}):
        return None, (f"{FIFO_ONLY}: {objective} is only in what train returns, never reported: fifo sweeps record "
                      f"it on each trial's MLflow run; report it (run.report) for asha, median and collapse")
    if not sent or objective not in sent[-1][1]:
        return False, (f"no report that reaches the schedulers carries {objective} (an eval/ metric, or the final "
                       f"report at progress 1): report it, or check with --objective METRIC")
    for step, carried in sent:
        if "progress" not in carried:
            return False, f"the report of step {step} reaches the schedulers without progress"
    for step, carried in sent:
        if objective not in carried:
            return None, (f"{FIFO_ONLY}: the report of step {step} (progress {carried['progress']:.2g}) reaches the "
                          f"schedulers without {objective}; report {objective} with (or before) the first eval/ "
                          "metric for asha, median and collapse to stop trials early")
    if not any(carried["progress"] < 1.0 - 1e-9 for _, carried in sent):
        return None, (f"{FIFO_ONLY}: {objective} reaches the schedulers only at the end; report it during training "
                      "(at several fractions of progress) for asha, median and collapse to stop trials early")
    return True, ""


def default_objective(name: str) -> str:
    """The metric sweeps rank the workload on: its reproduction sweep's objective when it has one
    (sweeps/repro/<name>.py, or repro.py in its own package), else eval/loss."""
    from orchestrator.reproduction import reproduce

    try:
        if reproduce.repro_file(name).is_file():
            return reproduce.load_repro(name, smoke=True).objective[0]
    except Exception:  # judged where it matters: `ladder reproduce` names what is wrong with it
        pass
    return "eval/loss"


PLACEMENT_CHECK = "tensors stay on run.device"


class Placement:
    """The placement check of `check`'s smoke runs, on the stand-in device of
    `orchestrator.run.placement`: the uninterrupted run trains under it (made again on the plain
    CPU when it mixes a tensor on run.device with one left on the CPU, so that the other checks are
    judged); the restart's path (restoring, and the steps after it) is checked for its first reports
    on a copy of the killed run's folder, and the restart itself trains on the plain CPU."""

    REPORTS_AFTER_RESTORE = 2

    def __init__(self) -> None:
        self.problem: str | None = None
        self.ops = 0
        self.runs = 0

    def _checked(self, workload: registry.Workload, cfg: Any, run: Any) -> Any:
        """`train(cfg, run)` on `run` (on the stand-in device) under the check; None when it mixed."""
        from orchestrator.run.placement import DevicePlacement, PlacementError, where

        mode = DevicePlacement()
        restore = run.restore
        # Checkpoints load to the CPU (map_location="cpu"), on a GPU too: what the loop restores
        # must be moved or copied into tensors on run.device before it meets them.
        run.restore = lambda: mode.leave(restore())
        try:
            with pinned_threads(workload.threads(cfg)), mode:  # threads as the runner pins a trial's
                return workload.train(cfg, run)
        except PlacementError as exc:
            own = getattr(inspect.getmodule(workload.train), "__file__", None)
            self.problem = f"{exc} (at {where(exc, os.path.dirname(own) + os.sep if own else None)})"
            return None
        finally:
            self.ops += mode.ops
            self.runs += 1

    def train(self, workload: registry.Workload, cfg: Any, make_run: Any) -> tuple[Any, Any]:
        """The uninterrupted run: `make_run(device)` builds its Run."""
        from orchestrator.run.placement import PLACED_DEVICE

        if self.problem is None:
            run = make_run(PLACED_DEVICE)
            final = self._checked(workload, cfg, run)
            if self.problem is None:
                return run, final
            for made in (run.run_dir, getattr(run, "snapshot", None)):  # made again on the plain CPU
                if made is not None:
                    shutil.rmtree(made, ignore_errors=True)
        run = make_run("cpu")
        with pinned_threads(workload.threads(cfg)):
            return run, workload.train(cfg, run)

    def restart(self, workload: registry.Workload, cfg: Any, folder: Path, identity: Any) -> tuple[Any, Any]:
        """The restart in `folder` (what a killed run left), on the plain CPU, after its path was
        checked for `REPORTS_AFTER_RESTORE` reports on a copy of the folder."""
        from orchestrator.run.placement import PLACED_DEVICE, Enough, stop_after

        if self.problem is None:
            copy = folder.with_name(folder.name + ".checked")
            shutil.copytree(folder, copy)
            try:
                self._checked(workload, cfg, LocalRun(copy, identity=identity, device=PLACED_DEVICE,
                                                      on_report=stop_after(self.REPORTS_AFTER_RESTORE)))
            except Enough:
                pass
            finally:
                shutil.rmtree(copy, ignore_errors=True)
        run = LocalRun(folder, identity=identity)
        with pinned_threads(workload.threads(cfg)):
            return run, workload.train(cfg, run)

    def verdict(self) -> tuple[bool | None, str]:
        if self.problem:
            return False, self.problem
        if not self.runs:
            return None, "no run finished"
        what = "the smoke run" + (f" and a restart's first {self.REPORTS_AFTER_RESTORE} reports" if self.runs > 1 else "")
        return True, (f"{what} on a stand-in device ({self.ops} ops): none mixed a tensor on run.device with one "
                      "left on the CPU")


def check(name: str, folder: str | Path, *, objective: str | None = None, ray: bool = False,
          workers: int = 2) -> Report:
    """Judge the workload `name` (any name `registry.resolve` accepts) against the contract,
    training it in `folder` (emptied first). `objective` defaults to `default_objective(name)`."""
    started = time.monotonic()
    from orchestrator.run import devices

    report = Report(name, device=devices.describe(devices.resolve()))
    folder = Path(folder)
    try:
        module = registry.import_workload(name)
    except (registry.UnknownWorkload, registry.ContractError) as exc:
        report.add("workload imports", False, str(exc))
        return report
    static = registry.contract_checks(module)
    for check_name, problem in static:
        report.add(check_name, problem is None, problem or "")
    if any(problem for _, problem in static):
        _not_judged(report, ray, "the contract's static parts do not hold")
        report.wall_s = time.monotonic() - started
        return report
    workload = registry.Workload(name, module)
    objective = objective or default_objective(name)
    try:
        cfg = workload.smoke()
    except Exception as exc:
        report.add("smoke() returns a Config", False, _error(exc))
        _not_judged(report, ray, "smoke() failed")
        return report
    if not report.add("smoke() returns a Config", isinstance(cfg, workload.Config),
                      "" if isinstance(cfg, workload.Config) else f"smoke() returned {type(cfg).__name__}"):
        _not_judged(report, ray, "smoke() gave no Config")
        return report
    if folder.exists():
        shutil.rmtree(folder)
    ident = checkpoints.identity(name, to_dict(cfg))

    # 1. Uninterrupted, leaving in `killed/` the folder of a run killed one report after its
    # first checkpoint (2.). It trains on the placement check's stand-in device; a tensor left on
    # the CPU fails that row, and the run is made again on the plain CPU to judge the others.
    placement = Placement()
    try:
        whole, final = placement.train(workload, cfg, lambda device: SnapshotAfterCheckpoint(
            folder / "uninterrupted", snapshot=folder / "killed", identity=ident, device=device))
    except Exception as exc:
        report.add("smoke run finishes", False, _error(exc))
        _not_judged(report, ray, "the smoke run failed")
        return report
    ok = isinstance(final, Mapping) and final and all(isinstance(v, float) for v in final.values())
    finite = ok and any(math.isfinite(v) for v in final.values())
    report.add("smoke run finishes", bool(ok and finite),
               "" if ok and finite else f"train must return a dict of float metrics, some finite; got {final!r}")
    history = whole.history
    losses = [m["train/loss"] for _, m in history if "train/loss" in m]
    report.add("reports train/loss", bool(losses), "" if losses else "no report carries train/loss")
    progress = [m["progress"] for _, m in history if "progress" in m]
    monotone = all(b >= a for a, b in zip(progress, progress[1:]))
    reaches = bool(progress) and abs(progress[-1] - 1.0) <= 1e-6
    report.add("progress reaches 1", bool(progress and monotone and reaches),
               "no report carries progress" if not progress else
               "progress goes back" if not monotone else
               "" if reaches else f"the last progress is {progress[-1]:.6g}, not 1")
    steps = [s for s, _ in history]
    report.add("steps increase", steps == sorted(steps),
               "" if steps == sorted(steps) else "a report's step is lower than the one before")

    # 3. Restarted in the folder the killed run left.
    if not whole.snapshotted or not whole.saved_step:
        report.add("checkpoints before the end", False,
                   "smoke() never checkpointed before its last report: call run.save({'step': step, ...}) during "
                   "training (e.g. every checkpoint_every steps)" if whole.saved_step is None or whole.snapshotted else
                   f"the only checkpoint is at step {whole.saved_step}, the end")
        report.add(PLACEMENT_CHECK, *placement.verdict())
        _not_judged(report, ray, "no checkpoint to resume from", keep_scheduler=(history, objective, final))
        return report
    report.add("checkpoints before the end", True, f"first at step {whole.saved_step}")
    try:
        second, resumed_final = placement.restart(workload, cfg, folder / "killed", ident)
    except Exception as exc:
        report.add("killed run resumes from its checkpoint", False, _error(exc))
        report.add("resumed run matches an uninterrupted one", None, "the restart failed")
    else:
        resumed = second.history
        if second.restored_step is None:
            problem = "the restart never called run.restore() (or ignored what it returned)"
        elif second.restored_step != whole.last_saved_step:
            problem = f"restored step {second.restored_step}, the newest checkpoint is step {whole.last_saved_step}"
        elif not resumed or resumed[0][0] <= whole.saved_step:
            problem = "the restarted run began again from step 0" if resumed else "the restarted run reported nothing"
        elif abs(resumed[-1][1].get("progress", 0.0) - 1.0) > 1e-6:
            problem = "the restarted run did not reach progress 1"
        else:
            problem = None
        report.add("killed run resumes from its checkpoint", problem is None,
                   problem or f"from step {second.restored_step}")
        if problem is None:
            differs = compare_resumed(history, resumed, final, resumed_final)
            report.add("resumed run matches an uninterrupted one", differs is None, differs or "")
        else:
            report.add("resumed run matches an uninterrupted one", None, "it did not resume")
    report.add(f"reports usable by every scheduler ({objective})", *scheduler_verdict(history, objective, final))
    report.add(PLACEMENT_CHECK, *placement.verdict())
    if ray:
        report.results.append(ray_restore(workload, cfg, folder / "ray", workers=workers))
    else:
        report.add("restores under Ray Train", None, "not run (ladder check --ray)")
    report.wall_s = time.monotonic() - started
    return report


def _not_judged(report: Report, ray: bool, why: str, keep_scheduler: tuple[Any, str, Any] | None = None) -> None:
    names = ["smoke() returns a Config", "smoke run finishes", "reports train/loss", "progress reaches 1",
             "steps increase", "checkpoints before the end", "killed run resumes from its checkpoint",
             "resumed run matches an uninterrupted one", PLACEMENT_CHECK]
    done = {r.check for r in report.results}
    for n in names:
        if n not in done:
            report.add(n, None, why)
    if keep_scheduler is not None:
        history, objective, final = keep_scheduler
        report.add(f"reports usable by every scheduler ({objective})", *scheduler_verdict(history, objective, final))
    elif not any(r.check.startswith("reports usable") for r in report.results):
        report.add("reports usable by every scheduler", None, why)
    report.add("restores under Ray Train", None, why if ray else "not run (ladder check --ray)")


def _ray_worker(loop_config: dict[str, Any]) -> dict[str, float]:
    """A Ray Train worker that trains the smoke config and, on the group's first attempt, dies one
    report after the first checkpoint on every rank; the restarted group must restore it."""
    import logging

    import ray.train

    from orchestrator.runners import zero
    from orchestrator.runners.ray_train import RayTrainRun

    logging.getLogger("ray.train").setLevel(logging.WARNING)  # not a line per report on the console
    spec = loop_config["spec"]
    workload, cfg = spec.load()
    first_attempt = ray.train.get_checkpoint() is None
    seen: dict[str, float] = {}

    class Run(RayTrainRun):
        def save(self, state: dict[str, Any]) -> None:
            super().save(state)
            seen.setdefault("saved_step", float(state["step"]))

        def restore(self) -> dict[str, Any] | None:
            state = super().restore()
            if state is not None:
                seen["restored_step"] = float(state["step"])
            return state

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.report = self._report  # RayTrainRun binds `report` per instance

        def _report(self, metrics: Mapping[str, float], *, step: int) -> None:
            self._ray.report(metrics, step=step)
            seen["progress"] = float(metrics.get("progress", seen.get("progress", 0.0)))
            if first_attempt and "saved_step" in seen and step > seen["saved_step"]:
                self._ray.flush()
                raise Killed(f"rank {self.rank}: killed after the checkpoint of step {int(seen['saved_step'])}")

    run = Run(sinks=[], zero=zero.spec_of(cfg), identity=spec.identity)
    with pinned_threads(workload.threads(cfg) or spec.threads):
        workload.train(cfg, run)
    run.flush()
    return {"restored_step": seen.get("restored_step", -1.0), "progress": seen.get("progress", 0.0)}


def ray_restore(workload: registry.Workload, cfg: Any, folder: Path, *, workers: int = 2) -> Result:
    """Train `cfg` under Ray Train, kill every worker after the first checkpoint, and check that
    Ray Train's restart continued from it."""
    from orchestrator.runners.config import ConfigError
    from orchestrator.runners.launch import init_ray, local_cpus

    check_name = f"restores under Ray Train ({workers} workers)"
    try:
        workload.validate(cfg, world_size=workers)
    except ConfigError:
        workers, check_name = 1, "restores under Ray Train (1 worker: the workload refuses more)"
    try:
        from orchestrator.runners.ray_train import trainer
        from orchestrator.runners.trial import TrialSpec

        init_ray()
        cpus = min(1.0, local_cpus() / workers)
        fit = trainer(TrialSpec.of(workload.name, cfg), workers=workers, cpus_per_worker=cpus,
                      name=f"check-{folder.parent.name}", storage=str(folder.resolve()), max_failures=1,
                      entry=_ray_worker)
        out = dict(fit.fit().return_value or {})
    except Exception as exc:
        return Result(check_name, False, _error(exc).splitlines()[0][:400])
    if out.get("restored_step", -1) <= 0:
        return Result(check_name, False, "the restarted worker group did not restore the checkpoint")
    if abs(out.get("progress", 0.0) - 1.0) > 1e-6:
        return Result(check_name, False, f"the restarted worker group stopped at progress {out['progress']:.3g}")
    return Result(check_name, True, f"from step {int(out['restored_step'])}")


def format_report(report: Report) -> str:
    """The table: ok, FAILS, `limit` (holds for part of ladder: fifo sweeps only) or - (not judged)."""
    marks = {True: "ok", False: "FAILS", None: "-"}
    width = max(len(r.check) for r in report.results)
    lines = [f"ladder check {report.workload}"]
    if report.device:
        lines.append(f"  device: `ladder run --local` trains it on {report.device} here (--device to choose); "
                     "Ray Train workers on CPUs unless --gpus-per-worker")
    for r in report.results:
        mark = "limit" if r.holds is None and r.detail.startswith(FIFO_ONLY) else marks[r.holds]
        lines.append(f"  {mark:<5}  {r.check:<{width}}  {r.detail}".rstrip())
    failed = [r.check for r in report.results if r.holds is False]
    if failed:
        lines.append(f"{report.workload} does not follow the workload contract: {len(failed)} check"
                     f"{'s' if len(failed) > 1 else ''} failed ({', '.join(failed)})")
    else:
        lines.append(f"{report.workload} follows the workload contract ({report.wall_s:.1f} s)")
    return "\n".join(lines)
