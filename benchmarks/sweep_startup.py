"""A sweep's start-up: `ladder sweep FILE` against plain Ray Tune running the same trainable, in one run.

One trial of the `curves` workload (no training cost of its own), so what is timed is what a user
waits for before a sweep does anything. Each arm is a fresh process in a fresh folder that starts
its own local Ray (a cold start, as a user's command is):

* ladder: `ladder sweep one.py` from the shell, a one-trial fifo sweep, with everything ladder does
  (checks, an MLflow parent and child run on SQLite, the sweep's view, its summary and plots);
* plain Ray Tune: a script whose `tune.Tuner` runs the same `train` behind a minimal `Run` whose
  `report` is `ray.tune.report`, with Tune's defaults.

Both arms run the trainable `stamped_train` below (through a module path for ladder, as a user's
own workload is named), which writes the wall time of its first report to `$STARTUP_STAMP`. Rows:

* seconds from the command's start to the first trial result (that stamp);
* seconds from the command's start to its end;
* CPU seconds of the driver process (its own, from `wait4`), and of the whole machine over the arm
  (`/proc/stat`: Ray's daemons and the trial process too; read on an idle machine).

The arms alternate for `--rounds` rounds; each row keeps an arm's fastest round. Target: ladder
no slower than plain Ray Tune to the first result (ratio <= 1). Exit status 0 when it holds.

    python benchmarks/sweep_startup.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS, REPORT_EVERY = 200, 10

SWEEP_FILE = """
from orchestrator.sweep import Sweep, grid
sweep = Sweep(name="startup", workload="sweep_startup", base="smoke", scheduler="fifo",
              space={"lr": grid(0.01)})
"""

# The workload contract, for ladder's arm (`workload="sweep_startup"`, a module path).
from workloads.curves import Config  # noqa: E402

from sweep_overhead import _TuneRun  # noqa: E402  (benchmarks/ is on the path: this file's folder)


def smoke() -> Config:
    from workloads import curves

    return replace(curves.smoke(), steps=STEPS, report_every=REPORT_EVERY, checkpoint_every=STEPS)


def train(cfg: Config, run) -> dict:
    """curves' `train`, stamping the wall time of its first report into `$STARTUP_STAMP`."""
    from workloads import curves

    class Stamped:
        def __init__(self, inner) -> None:
            self.inner, self.stamped = inner, False

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def report(self, metrics, *, step):
            if not self.stamped and os.environ.get("STARTUP_STAMP"):
                Path(os.environ["STARTUP_STAMP"]).write_text(repr(time.time()))
                self.stamped = True
            return self.inner.report(metrics, step=step)

    return curves.train(cfg, Stamped(run))


def _trainable(config: dict) -> None:
    train(replace(smoke(), lr=config["lr"]), _TuneRun())


def tune_arm() -> None:
    from ray import tune

    tuner = tune.Tuner(_trainable, param_space={"lr": tune.grid_search([0.01])},
                       tune_config=tune.TuneConfig(metric="eval/loss", mode="min"),
                       run_config=tune.RunConfig(storage_path=str(Path.cwd() / "ray_results")))
    tuner.fit()


def _machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent (every process), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def timed(arm: str) -> dict[str, float]:
    """The arm's rows, measured in a fresh process in a fresh folder."""
    with tempfile.TemporaryDirectory(prefix=f"startup-{arm}-") as folder:
        stamp = Path(folder) / "first-report"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "benchmarks")]),
               "STARTUP_STAMP": str(stamp)}
        env.pop("MLFLOW_TRACKING_URI", None)
        env.pop("RAY_ADDRESS", None)
        if arm == "ladder":
            (Path(folder) / "one.py").write_text(SWEEP_FILE)
            command = [sys.executable, "-m", "orchestrator.commands.cli", "sweep", "one.py"]
        else:
            command = [sys.executable, __file__, "--arm", "tune"]
        cpu0, started = _machine_cpu_s(), time.time()
        proc = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate()
        ended, cpu1 = time.time(), _machine_cpu_s()
        # communicate() reaped it: its rusage is read from the children's total, one arm at a time
        if proc.returncode != 0 or not stamp.is_file():
            raise SystemExit(f"the {arm} arm failed ({proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        first = float(stamp.read_text())
    return {"first_result_s": first - started, "total_s": ended - started, "machine_cpu_s": cpu1 - cpu0}


def main() -> int:
    import resource

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arm", choices=("tune",), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        tune_arm()
        return 0
    rows: dict[str, list[dict[str, float]]] = {"ladder": [], "tune": []}
    for _ in range(args.rounds):
        for arm in ("ladder", "tune"):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            row = timed(arm)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            row["driver_cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            rows[arm].append(row)
            print(f"{arm}: first result {row['first_result_s']:.1f} s, end {row['total_s']:.1f} s, "
                  f"driver CPU {row['driver_cpu_s']:.1f} s, machine CPU {row['machine_cpu_s']:.1f} s", flush=True)
    best = {arm: {k: min(r[k] for r in rs) for k in rs[0]} for arm, rs in rows.items()}
    ratio = best["ladder"]["first_result_s"] / best["tune"]["first_result_s"]
    print(json.dumps({"rounds": rows, "best": best, "ratio_first_result": ratio}))
    for key, what in (("first_result_s", "to the first trial result"), ("total_s", "to the command's end"),
                      ("driver_cpu_s", "driver CPU"), ("machine_cpu_s", "machine CPU")):
        print(f"{what:>26}: ladder {best['ladder'][key]:5.1f} s, plain Ray Tune {best['tune'][key]:5.1f} s "
              f"(ratio {best['ladder'][key] / best['tune'][key]:.2f})")
    print(f"target (ladder no slower to the first result): {'holds' if ratio <= 1 else 'does not hold'}")
    return 0 if ratio <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
