"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

Search with early stopping against Optuna's own, on the recorded sweeps of `early_stopping.py`.

1. Search, replayed (the benchmark of record). Each recorded grid sweep (`early_stopping.RECORDED`:
   the celerity_lm tau sweep at two seeds, the celerity_lm lr x warmup x width sweep, the frl lr x
   width x modes sweep; every point trained to the end once) is a search space: every axis a
   categorical choice of its recorded values, and a proposal replays the recorded curve at its
   point (`stopping_replay.TuneSearch`, `OptunaSearch`). Each search gets half as many proposals
   as the grid has points, 4 trials at once, in `stopping_replay`'s asynchronous event loop; the
   searcher learns from each trial as it ends. The arms:

   * random: ladder's TPE searcher with every proposal a random start-up one;
   * tpe: ladder's TPE searcher (`orchestrator.sweeps.search.build`, as `ladder sweep` builds it
     for `search='tpe'`), fifo;
   * tpe+collapse: the same searcher with ladder's collapse scheduler at its default rungs, its
     reference the mean normalized curve of the search's own first 3 finishers (no runs outside
     the search: the cheapest reference, `stopping_replay.SelfReferenceCollapse`);
   * tpe+asha: the same searcher with ladder's ASHA at its defaults;
   * optuna tpe+hyperband: Optuna standalone, a study with `TPESampler` and `HyperbandPruner`
     (defaults) asked, reported and told as an Optuna user writes it.

   TPE's random start-up proposals are ladder's default in every TPE arm (a third of the
   proposals, 2 to 10), Optuna's included, so that the arms differ in what stops trials. Regret:
   the best final loss among the search's trials that ran to the end over the best final loss
   of the whole recorded grid, minus 1. Compute: training spent over what the search's proposals
   would cost trained to the end at the grid's mean cost (random search spends about 1). Mean and
   95% interval over 20 search seeds.

   Target: TPE + collapse reaches Optuna's TPE + Hyperband quality (mean regret at most its) at
   no more of its compute (mean), on every recorded sweep. Exit status 0 when it does.

2. Search, run live on the synthetic `curves` workload (`--live`), through `run_sweep` on one
   local Ray: random search, TPE, TPE + collapse, TPE + ASHA, and Optuna standalone (TPESampler +
   HyperbandPruner on the workload's own `train`), over lr (log-uniform), warmup (uniform) and
   schedule (categorical). Every curves trial draws the same noise (the workload's seed 0), so
   trials differ only in their final loss and a current loss ranks them as well as a prediction
   does: this section checks the live path, not which rule ranks better (section 1 does, on real
   curves). The MLflow stores
   live under `benchmarks/.cache/search/` and are reused (delete the folder to run anew);
   about 4 minutes per search seed on 2 cores.

The recorded sweeps are read from `benchmarks/.cache/` (run `early_stopping.py --record-only`
first, about an hour). The replay takes a few minutes.

    python benchmarks/search.py [--cache DIR] [--seeds 20] [--workers 4] [--sweeps ...]
    python benchmarks/search.py --live [--live-seeds 5] [--trials 24] [--concurrency N]
"""

from __future__ import annotations

import argparse
import json
import math
import runpy
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from early_stopping import CACHE, RECORDED, inside, record, recorded  # noqa: E402

from orchestrator.sweep import Sweep, choice, loguniform, uniform  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TARGET_REGRET, TARGET_COMPUTE = 0.005, 0.5
VERSION = "v1"  # part of the sweep names: a changed definition records anew, never mixes

# -- 1. search replayed on the recorded sweeps ---------------------------------------------------

SEARCH_SEEDS = 20
WORKERS = 4
SHARE = 0.5
"""Proposals per search, as a share of the grid's points."""
REPLAY_ARMS = ("random", "tpe", "tpe+collapse", "tpe+asha", "optuna tpe+hyperband")
COLLAPSE_FINISHERS = 3


def recorded_grid(sweep: Sweep, uri: str) -> tuple[Any, list[Any]]:
    """The recorded sweep as a `RecordedGrid`, and its curves."""
    from orchestrator.sweeps.curves import load_sweep
    from stopping_replay import RecordedGrid, curves_from_audit

    trials = load_sweep(sweep.name, sweep.objective[0], uri=uri).trials
    curves = curves_from_audit(trials)
    points = [{a: float(t.params[a]) for a in sweep.space} for t in trials]
    return RecordedGrid(curves, points), curves


def searcher_sweep(sweep: Sweep, seed: int, budget: int, *, random: bool = False) -> Sweep:
    """The TPE sweep over the recorded grid's axes (each a choice of its recorded values)."""
    return Sweep(name=f"{sweep.name}_search_s{seed}", workload=sweep.workload, base=sweep.base,
                 overrides=sweep.overrides, space={a: choice(*d.values) for a, d in sweep.space.items()},
                 search="tpe", num_samples=budget, seed=seed, objective=sweep.objective,
                 search_options={"n_startup_trials": budget} if random else {})


def search_arm(arm: str, sweep: Sweep, grid: Any, seed: int, budget: int, controls: bool) -> tuple[Any, Any]:
    """(policy, source) of one arm's search at one seed."""
    import optuna

    from orchestrator.sweeps.search import build
    from stopping_replay import OptunaPruner, OptunaSearch, Policy, SelfReferenceCollapse, TuneSearch, ladder_scheduler

    metric = sweep.objective[0]
    if arm == "optuna tpe+hyperband":
        startup = searcher_sweep(sweep, seed, budget).startup_trials()
        policy = OptunaPruner(optuna.pruners.HyperbandPruner(), study_name=f"search_s{seed}",
                              sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup))
        return policy, OptunaSearch(policy, grid)
    source = TuneSearch(build(searcher_sweep(sweep, seed, budget, random=arm == "random")), grid, metric=metric)
    if arm in ("random", "tpe"):
        return Policy(), source
    if arm == "tpe+collapse":
        return SelfReferenceCollapse(COLLAPSE_FINISHERS, {}, controls=controls, metric=metric), source
    if arm == "tpe+asha":
        return ladder_scheduler("asha", {}, metric=metric), source
    raise ValueError(f"unknown arm {arm!r}; the arms are {', '.join(REPLAY_ARMS)}")


def replay_search(label: str, sweep: Sweep, uri: str, *, n_seeds: int = SEARCH_SEEDS,
                  workers: int = WORKERS) -> dict[str, Any]:
    """Every arm's search replayed on one recorded sweep, at the same seeds."""
    from stopping_replay import simulate

    grid, curves = recorded_grid(sweep, uri)
    controls = all("tau" in c.controls and "tpp" in c.controls for c in curves)
    budget = max(4, round(SHARE * len(curves)))
    arms: dict[str, dict[str, list[float]]] = {}
    started = time.monotonic()
    for arm in REPLAY_ARMS:
        acc = arms.setdefault(arm, {"regret": [], "compute": [], "finished": [], "distinct": []})
        for seed in range(n_seeds):
            policy, source = search_arm(arm, sweep, grid, seed, budget, controls)
            out = simulate(curves, policy, workers=workers, source=source, budget=budget)
            acc["regret"].append(out.regret)
            acc["compute"].append(out.compute)
            acc["finished"].append(sum(1 for t, p in out.trained_to.items() if p >= 1 - 1e-9))
            acc["distinct"].append(len(set(source.point.values())))
    return {"sweep": label, "experiment": sweep.name, "points": len(curves), "budget": budget, "seeds": n_seeds,
            "workers": workers, "replay_s": time.monotonic() - started, "arms": arms}


def search_verdict(res: dict[str, Any]) -> tuple[bool, str]:
    """Whether TPE + collapse reaches Optuna TPE + Hyperband's mean regret at no more mean compute."""
    tc, op = res["arms"]["tpe+collapse"], res["arms"]["optuna tpe+hyperband"]
    r_tc, r_op = float(np.mean(tc["regret"])), float(np.mean(op["regret"]))
    c_tc, c_op = float(np.mean(tc["compute"])), float(np.mean(op["compute"]))
    ok = r_tc <= r_op + 1e-12 and c_tc <= c_op + 1e-12
    return ok, (f"TPE + collapse {_pct(r_tc)} regret at {c_tc:.2f} compute against Optuna TPE + Hyperband's "
                f"{_pct(r_op)} at {c_op:.2f}: {'holds' if ok else 'does not hold'}")


def format_search(res: dict[str, Any]) -> list[str]:
    from stopping_replay import mean_interval

    lines = [f"{res['sweep']} ({res['experiment']}): {res['points']} recorded points, {res['budget']} proposals a search, "
             f"{res['workers']} at once, {res['seeds']} search seeds"]
    rows = [("arm", "regret, mean [95%]", "compute, mean [95%]", "to the end", "distinct points")]
    for arm, a in res["arms"].items():
        r, c = mean_interval(np.array(a["regret"])), mean_interval(np.array(a["compute"]))
        rows.append((arm, f"{_pct(r[0])} [{_pct(r[1])}, {_pct(r[2])}]", f"{c[0]:.2f} [{c[1]:.2f}, {c[2]:.2f}]",
                     f"{np.mean(a['finished']):.1f}", f"{np.mean(a['distinct']):.1f}"))
    lines += _table(rows)
    lines.append(search_verdict(res)[1])
    return lines


# -- 2. search run live on the curves workload (--live) ----------------------------------------

SPACE = {
    "lr": loguniform(1e-3, 1e-1),
    "warmup": uniform(0.0, 0.3),
    "schedule": choice("cosine", "linear", "constant"),
}
OVERRIDES = {"steps": 200, "report_every": 4, "checkpoint_every": 100}
ARMS = ("random", "tpe", "tpe+collapse", "tpe+asha", "optuna tpe+hyperband")


def arm_sweep(arm: str, seed: int, trials: int, concurrency: int | None = None) -> Sweep:
    common = dict(workload="curves", base="smoke", overrides=OVERRIDES, space=SPACE, num_samples=trials, seed=seed,
                  objective=("eval/loss", "min"), max_concurrent=concurrency)
    name = f"search_{arm.replace('+', '_')}_{VERSION}_s{seed}_n{trials}" + (f"_c{concurrency}" if concurrency else "")
    if arm == "random":
        return Sweep(name=name, search="random", scheduler="fifo", **common)
    if arm == "tpe":
        return Sweep(name=name, search="tpe", scheduler="fifo", **common)
    if arm == "tpe+collapse":
        return Sweep(name=name, search="tpe", scheduler="collapse",
                     scheduler_options={"reference": {"experiment": "curves_reference"}}, **common)
    if arm == "tpe+asha":
        return Sweep(name=name, search="tpe", scheduler="asha", **common)
    raise ValueError(arm)


def run_ladder_arm(sweep: Sweep) -> dict[str, Any]:
    from orchestrator.sweeps.tune_run import _state_file, run_sweep

    started = time.monotonic()
    result = run_sweep(sweep, resume=_state_file(sweep).is_file(), progress=False)
    steps = OVERRIDES["steps"]
    trials = []
    for t in result.trials:
        progress = float(t["progress"]) if t["progress"] == t["progress"] else 0.0
        trials.append({"params": t["params"], "progress": progress, "objective": float(t["objective"]),
                       "finished": t["state"] == "finished" and progress >= 1 - 1e-9})
    return {"trials": trials, "steps": sum(steps * t["progress"] for t in trials), "wall_s": time.monotonic() - started}


class _PrunableRun:
    """The least of a `Run` that `curves.train` uses, feeding each report to an Optuna trial."""

    device, rank, world_size = "cpu", 0, 1

    def __init__(self, trial: Any) -> None:
        self.trial, self.k, self.progress = trial, 0, 0.0

    def report(self, metrics: dict[str, float], *, step: int) -> None:
        import optuna

        self.k += 1
        self.progress = float(metrics.get("progress", self.progress))
        self.trial.report(float(metrics["eval/loss"]), self.k)
        if self.trial.should_prune():
            raise optuna.TrialPruned()

    def save(self, state: dict) -> None:
        pass

    def restore(self) -> None:
        return None

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        return model, optimizer

    def log_artifact(self, path: str) -> None:
        pass


def run_optuna_arm(seed: int, trials: int) -> dict[str, Any]:
    """TPE + Hyperband as an Optuna user writes it, on the curves workload's own `train`."""
    import optuna

    from workloads import curves

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    startup = arm_sweep("tpe", seed, trials).startup_trials()  # ladder's TPE start-up, for a like comparison
    study = optuna.create_study(study_name=f"search_s{seed}", direction="minimize",  # named: Hyperband's brackets repeat
                                sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup),
                                pruner=optuna.pruners.HyperbandPruner())
    base = replace(curves.smoke(), **OVERRIDES)
    out = []
    started = time.monotonic()
    for _ in range(trials):
        trial = study.ask()
        params = {"lr": trial.suggest_float("lr", 1e-3, 1e-1, log=True),
                  "warmup": trial.suggest_float("warmup", 0.0, 0.3),
                  "schedule": trial.suggest_categorical("schedule", ["cosine", "linear", "constant"])}
        run = _PrunableRun(trial)
        try:
            final = curves.train(replace(base, **params), run)
        except optuna.TrialPruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            out.append({"params": params, "progress": run.progress, "objective": math.nan, "finished": False})
            continue
        study.tell(trial, final["eval/loss"])
        out.append({"params": params, "progress": run.progress, "objective": final["eval/loss"], "finished": True})
    steps = OVERRIDES["steps"]
    return {"trials": out, "steps": sum(steps * t["progress"] for t in out), "wall_s": time.monotonic() - started}


def search_section(folder: Path, seeds: Sequence[int], trials: int,
                   concurrency: int | None = None) -> tuple[list[str], bool, dict[str, Any]]:
    from orchestrator.tracking import sink as tracking

    results_file = folder / "results.json"
    with inside(folder):
        results = json.loads(results_file.read_text()) if results_file.is_file() else {}
        uri = tracking.tracking_uri()
        reference = runpy.run_path(str(REPO / "sweeps" / "curves_reference.py"))["sweep"]
        record(reference, uri)
        for seed in seeds:
            for arm in ARMS:
                key = _key(arm, seed, trials, concurrency)
                if key in results:
                    continue
                print(f"search: {arm}, seed {seed}, {trials} trials ...", flush=True)
                results[key] = (run_optuna_arm(seed, trials) if arm.startswith("optuna")
                                else run_ladder_arm(arm_sweep(arm, seed, trials, concurrency)))
                results_file.write_text(json.dumps(results, indent=1))
    full = trials * OVERRIDES["steps"]
    per_arm: dict[str, dict[str, list[float]]] = {}
    for arm in ARMS:
        acc = per_arm.setdefault(arm, {"best": [], "ratio": [], "compute": [], "finished": [], "wall": []})
        for seed in seeds:
            r, rnd = results[_key(arm, seed, trials, concurrency)], results[_key("random", seed, trials, concurrency)]
            best = min((t["objective"] for t in r["trials"] if t["finished"]), default=math.inf)
            rbest = min(t["objective"] for t in rnd["trials"] if t["finished"])
            acc["best"].append(best)
            acc["ratio"].append(best / rbest)
            acc["compute"].append(r["steps"] / full)
            acc["finished"].append(sum(t["finished"] for t in r["trials"]))
            acc["wall"].append(r["wall_s"])
    rows = [("arm", "best final (mean, min-max)", "x random's best (mean, max)", "compute x random (mean, min-max)",
             "trials run to the end", "wall s / seed")]
    for arm, a in per_arm.items():
        rows.append((arm, f"{np.mean(a['best']):.4f} ({min(a['best']):.4f}-{max(a['best']):.4f})",
                     f"{np.mean(a['ratio']):.4f} ({max(a['ratio']):.4f})",
                     f"{np.mean(a['compute']):.2f} ({min(a['compute']):.2f}-{max(a['compute']):.2f})",
                     f"{np.mean(a['finished']):.1f}", f"{np.mean(a['wall']):.0f}"))
    lines = [f"2. search over lr, warmup, schedule of curves ({OVERRIDES['steps']} steps, a report every "
             f"{OVERRIDES['report_every']}): {trials} trials per arm, seeds {', '.join(map(str, seeds))}; ladder arms "
             + (f"{concurrency} trial(s) at a time" if concurrency else "at the default concurrency (2 on 2 cores)")
             + ", Optuna's one at a time"]
    lines += _table(rows)
    tc = per_arm["tpe+collapse"]
    held = [r <= 1 + TARGET_REGRET and c <= TARGET_COMPUTE for r, c in zip(tc["ratio"], tc["compute"])]
    ok = float(np.mean(tc["ratio"])) <= 1 + TARGET_REGRET and max(tc["compute"]) <= TARGET_COMPUTE
    lines.append(f"TPE + collapse within {TARGET_REGRET:.1%} of random search's best with <= {TARGET_COMPUTE:.0%} of its "
                 f"compute: {'holds' if ok else 'does not hold'} (mean x{np.mean(tc['ratio']):.4f} at "
                 f"{np.mean(tc['compute']):.0%} compute; holds on {sum(held)} of {len(held)} seeds)")
    return lines, ok, results


def _key(arm: str, seed: int, trials: int, concurrency: int | None) -> str:
    # Optuna's loop is one trial at a time whatever the ladder arms' concurrency: one record for both.
    c = "" if concurrency is None or arm.startswith("optuna") else f"/c{concurrency}"
    return f"{arm}/s{seed}/n{trials}{c}"


# -- helpers ---------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return "inf" if not math.isfinite(x) else f"{100 * x:.2f}%"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--cache", type=Path, default=CACHE, help="folder of the recorded MLflow stores")
    parser.add_argument("--seeds", type=int, default=SEARCH_SEEDS, help="search seeds of the replay (0..n-1)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="trials at once in the replay")
    parser.add_argument("--sweeps", nargs="+", default=list(RECORDED), choices=list(RECORDED), metavar="SWEEP",
                        help=f"recorded sweeps to replay on (default all: {', '.join(RECORDED)})")
    parser.add_argument("--live", action="store_true", help="run section 2 (search on curves, live) instead")
    parser.add_argument("--live-seeds", type=int, default=5, help="search seeds of the live run")
    parser.add_argument("--trials", type=int, default=24, help="trials per arm in the live run")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="trials at once in the live ladder arms (default: the sweeps' own, 2 on 2 cores)")
    args = parser.parse_args()

    from orchestrator.tracking import sink as tracking

    cache = args.cache.resolve()
    if args.live:
        lines, ok, _ = search_section(cache / "search", list(range(args.live_seeds)), args.trials, args.concurrency)
        print("\n".join(lines))
        return 0 if ok else 1
    ok, out, data = True, [], []
    with inside(cache):
        uri = tracking.tracking_uri()
        for label in args.sweeps:
            sweep = RECORDED[label][0]
            if recorded(sweep, uri) < sweep.trial_count():
                raise SystemExit(f"{sweep.name} is not recorded in {cache}: run benchmarks/early_stopping.py --record-only first")
            res = replay_search(label, sweep, uri, n_seeds=args.seeds, workers=args.workers)
            data.append(res)
            held, said = search_verdict(res)
            ok &= held
            out.append(f"{label}: {said}")
            print("\n".join(format_search(res)) + "\n", flush=True)
    (cache / "search_replay.json").write_text(json.dumps(data, indent=1))
    print("\n".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
