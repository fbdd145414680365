"""ladder's per-trial overhead against plain Ray Tune running the same trainable, measured in one run.

The trainable is the `curves` workload's own `train` (no training cost of its own: 1000 steps,
a report every 5, so 200 reports a trial): what is timed is what a sweep adds around a trial.
Two arms, each a fresh process that starts its own local Ray (a cold start, as a user's command
is), over the same 24 trials of random search:

* ladder: `run_sweep` of a `Sweep` (random search over lr, fifo scheduler), with everything ladder
  does per trial: an MLflow child run on SQLite with every report, checkpoints, the sweep's view;
* plain Ray Tune: a `tune.Tuner` with its defaults (its own result loggers and reporter) over the
  same search space, the trainable calling the same `train` behind a minimal `Run` whose
  `report` is `ray.tune.report` and whose checkpoints are dropped.

The arms alternate, ladder first, for `--rounds` rounds; each arm's time is its fastest round
(the machine is shared with other work, and noise only adds time). Target: ladder's time per
trial at or below plain Ray Tune's (ratio <= 1). Exit status 0 when it holds.

    python benchmarks/sweep_overhead.py [--trials 24] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS, REPORT_EVERY = 1000, 5


def ladder_arm(trials: int) -> None:
    from orchestrator.sweep import Sweep, loguniform
    from orchestrator.sweeps.tune_run import run_sweep

    sweep = Sweep(name="overhead_ladder", workload="curves", base="smoke",
                  overrides={"steps": STEPS, "report_every": REPORT_EVERY, "checkpoint_every": 250},
                  space={"lr": loguniform(1e-3, 1e-1)}, num_samples=trials, scheduler="fifo")
    run_sweep(sweep, progress=False)


class _TuneRun:
    """The least of a `Run` that `curves.train` uses, reporting to Tune."""

    device, rank, world_size = "cpu", 0, 1

    def report(self, metrics: dict, *, step: int) -> None:
        from ray import tune

        tune.report(dict(metrics))

    def save(self, state: dict) -> None:
        pass

    def restore(self) -> None:
        return None

    def prepare(self, model, optimizer):
        return model, optimizer

    def log_artifact(self, path: str) -> None:
        pass


def _trainable(config: dict) -> None:
    from dataclasses import replace

    from workloads import curves

    curves.train(replace(curves.smoke(), steps=STEPS, report_every=REPORT_EVERY, checkpoint_every=250, lr=config["lr"]),
                 _TuneRun())


def tune_arm(trials: int) -> None:
    from ray import tune

    tuner = tune.Tuner(_trainable, param_space={"lr": tune.loguniform(1e-3, 1e-1)},
                       tune_config=tune.TuneConfig(num_samples=trials, metric="eval/loss", mode="min"),
                       run_config=tune.RunConfig(storage_path=str(Path.cwd() / "ray_results")))
    tuner.fit()


def timed(arm: str, trials: int) -> float:
    """Seconds the arm takes in a fresh process, from its start to its end, in a fresh folder."""
    with tempfile.TemporaryDirectory(prefix=f"overhead-{arm}-") as folder:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "benchmarks")])}
        env.pop("MLFLOW_TRACKING_URI", None)
        started = time.monotonic()
        done = subprocess.run([sys.executable, __file__, "--arm", arm, "--trials", str(trials)], cwd=folder, env=env,
                              capture_output=True, text=True)
        spent = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the {arm} arm failed:\n{done.stderr[-3000:]}")
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--arm", choices=("ladder", "tune"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        (ladder_arm if args.arm == "ladder" else tune_arm)(args.trials)
        return 0
    times: dict[str, list[float]] = {"ladder": [], "tune": []}
    for _ in range(args.rounds):
        for arm in ("ladder", "tune"):
            times[arm].append(timed(arm, args.trials))
            print(f"{arm}: {times[arm][-1]:.1f} s for {args.trials} trials", flush=True)
    best = {arm: min(t) for arm, t in times.items()}
    ratio = best["ladder"] / best["tune"]
    print(json.dumps({"trials": args.trials, "reports_per_trial": STEPS // REPORT_EVERY, "seconds": times,
                      "per_trial_s": {arm: t / args.trials for arm, t in best.items()}, "ratio": ratio}))
    print(f"ladder per trial {best['ladder'] / args.trials:.2f} s, plain Ray Tune {best['tune'] / args.trials:.2f} s: "
          f"ratio {ratio:.2f} (target <= 1: {'holds' if ratio <= 1 else 'does not hold'})")
    return 0 if ratio <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
