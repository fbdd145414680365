"""Collapse scheduler under load: decision time per result at 200 trials x 100 reports.

Drives `CollapseScheduler.on_trial_result` exactly as Tune's controller does, one result at a
time, for 200 trials of the synthetic `curves` workload's curves (100 reports each, `concurrency`
trials running at once, stopped trials leaving the field), with the state persisted to disk as
in a real sweep and, unless `--no-diagnostics`, the deviation diagnostic logging to a real MLflow
SQLite store (one run per trial). No Ray: what is timed is the scheduler's own work.

The baseline, measured in the same run on the same results, persists the way the scheduler used
to: the whole state (every curve) rewritten after every result.

    python benchmarks/scheduler_load.py [--trials 200] [--reports 100] [--concurrency 2]

Targets: under 5 ms per decision (p99), and no growth with the reports already seen: the mean of
the last tenth of results over the mean of the first tenth stays below 2. Exit status 0 when both
hold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.sweeps.collapse import CollapseStopper, EmpiricalReference  # noqa: E402
from orchestrator.sweeps.schedulers.collapse import CollapseScheduler  # noqa: E402
from workloads.curves import Config, final_loss, shape  # noqa: E402


class FullRewriteScheduler(CollapseScheduler):
    """The baseline: every result rewrites the whole state, curves included."""

    def _append(self, *args, **kwargs) -> None:
        pass

    def on_trial_result(self, tune_controller, trial, result):
        action = super().on_trial_result(tune_controller, trial, result)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stopper": self.stopper.state_dict(curves=True), "decisions": self.decisions}))
        os.replace(tmp, self.state_path)
        return action


def results(trials: int, reports: int, concurrency: int, seed: int = 0):
    """(trial_id, result) in the order a controller with `concurrency` slots would see them;
    a trial's remaining reports are skipped once the consumer says stop (via the `stopped` set)."""
    rng = np.random.default_rng(seed)
    lrs = [10 ** (-3 + 2 * i / 49) for i in range(50)]
    stopped: set[str] = set()
    order = rng.permutation(trials)  # learning rates in no particular order, as a random search sends them
    queue = [(f"t{i:04d}", Config(lr=lrs[int(j) % 50], steps=reports * 2, report_every=2, seed=i)) for i, j in enumerate(order)]
    running: list[tuple[str, Config, int]] = []
    while queue or running:
        while queue and len(running) < concurrency:
            tid, cfg = queue.pop(0)
            running.append((tid, cfg, 0))
        for idx, (tid, cfg, k) in enumerate(list(running)):
            k += 1
            p = k / reports
            loss = final_loss(cfg) * float(shape(p)) * (1 + cfg.noise * rng.standard_normal())
            yield stopped, tid, {"progress": p, "eval/loss": loss, "step": 2 * k}
            running[idx] = (tid, cfg, k)
        running = [(t, c, k) for t, c, k in running if k < reports and t not in stopped]


def reference() -> EmpiricalReference:
    rng = np.random.default_rng(123)
    p = np.linspace(0.01, 1.0, 100)
    runs = [(p, 2.0 * shape(p) * (1 + 0.005 * rng.standard_normal(p.size))) for _ in range(3)]
    return EmpiricalReference(runs)


def drive(kind: str, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    cls = CollapseScheduler if kind == "incremental" else FullRewriteScheduler
    diagnostics = None
    if args.diagnostics:
        from orchestrator.tracking import sink as tracking
        from orchestrator.sweeps.schedulers.diagnostics import CollapseDiagnostics

        uri = f"sqlite:///{folder / 'mlruns.db'}"
        sweep_id = f"load-{kind}"
        for i in range(args.trials):
            tracking.start_run(sweep_id, run_name=f"t{i:04d}", uri=uri,
                               tags={"ladder.trial_id": f"t{i:04d}", "ladder.sweep_id": sweep_id})
        diagnostics = CollapseDiagnostics(experiment=sweep_id, sweep_id=sweep_id, uri=uri)
    sched = cls(CollapseStopper(reference(), rungs=(0.2, 0.4), keep_quantile=0.5), metric="eval/loss",
                state_path=folder / f"{kind}.json", diagnostics=diagnostics)
    times: list[float] = []
    stops = 0
    for stopped, tid, result in results(args.trials, args.reports, args.concurrency):
        trial = SimpleNamespace(trial_id=tid)
        t0 = time.perf_counter()
        action = sched.on_trial_result(None, trial, result)
        if action == "STOP" or result["progress"] >= 1.0:
            sched.on_trial_complete(None, trial, result)
        times.append(time.perf_counter() - t0)
        if action == "STOP":
            stopped.add(tid)
            stops += 1
    if diagnostics is not None:
        diagnostics.flush()  # what the background thread still holds, before the store goes away (not timed)
    t = np.array(times) * 1e3
    tenth = max(1, t.size // 10)
    return {"results": float(t.size), "stopped": float(stops), "mean_ms": float(t.mean()),
            "p50_ms": float(np.median(t)), "p99_ms": float(np.quantile(t, 0.99)), "max_ms": float(t.max()),
            "growth": float(t[-tenth:].mean() / t[:tenth].mean())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--reports", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--no-diagnostics", dest="diagnostics", action="store_false")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ladder-scheduler-load-") as tmp:
        rows = {kind: drive(kind, args, Path(tmp)) for kind in ("incremental", "full-rewrite")}
    new, old = rows["incremental"], rows["full-rewrite"]
    print(f"{args.trials} trials x {args.reports} reports, concurrency {args.concurrency}, "
          f"diagnostics {'on' if args.diagnostics else 'off'}: {int(new['results'])} results, {int(new['stopped'])} stopped")
    print(f"{'persistence':<14}{'mean ms':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'last/first tenth':>18}")
    for kind, r in rows.items():
        print(f"{kind:<14}{r['mean_ms']:>9.3f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['max_ms']:>9.2f}{r['growth']:>18.2f}")
    print(f"ratio incremental / full-rewrite: mean {new['mean_ms'] / old['mean_ms']:.3f}, p99 {new['p99_ms'] / old['p99_ms']:.3f}")
    ok = new["p99_ms"] < 5.0 and new["growth"] < 2.0
    print(f"target p99 < 5 ms and growth < 2: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
