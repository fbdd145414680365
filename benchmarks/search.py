"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

Search and early stopping against Optuna's own code, on the same curves and the same budget.

1. Pruners, replayed. Optuna's MedianPruner, HyperbandPruner, SuccessiveHalvingPruner and
   WilcoxonPruner are driven through Optuna's ask / `trial.report(value, step)` /
   `trial.should_prune()` / tell on the cached full curves of `early_stopping.py`'s celerity_lm
   tau sweep (16 trials, 40 held-out evals each), beside the audit's (`orchestrator.sweeps.audit`)
   collapse, ASHA and median rows on the same curves. Order and concurrency: the trials are
   replayed one after another, each to its end or its prune before the next starts, in the
   sweep's trial order (its launch order, tau ascending), so a pruner always sees every earlier
   trial in full: the most a sequential pruner can know. A report's step is its eval's index
   (1..40), Optuna's "epoch". Compute: a pruned trial counts the training fraction it reached at
   the report that pruned it (as the audit counts a trial ASHA stops), weighted by the trial's
   cost as the audit weighs it; regret is the audit's: the best final loss among the trials that
   ran to the end, over the best final loss of the whole sweep, minus 1. Each pruner runs with its
   defaults and over a small grid of settings; beside each audit stop point the table shows the
   setting whose compute is nearest collapse's there (ties: the lower regret, the peer's favour).

2. Search, run. Over the synthetic `curves` workload's lr (log-uniform), warmup (uniform) and
   schedule (categorical), the same number of trials per arm: ladder's random search (fifo), TPE
   (fifo), TPE + collapse stopping, TPE + ASHA, all through `run_sweep` on one local Ray, and
   Optuna standalone (TPESampler + HyperbandPruner, ask/tell in-process, the workload's own
   `train` behind a minimal in-process Run, so its curves are ladder's). Each arm reports the best
   final objective among its trials that ran to the end and the compute it spent (steps trained
   over all trials over random search's full compute), as mean and min-max over the search seeds.
   TPE's random start-up trials are ladder's default in both (a third of the trials, at most 10);
   collapse and ASHA keep ladder's defaults (collapse: rungs 0.1/0.2/0.3, keep half, against the
   3-seed `curves_reference` sweep; ASHA: grace 0.1, reduction factor 2). The ladder arms run at
   the sweeps' default concurrency (2 trials at once on 2 cores; `--concurrency 1` for one at a
   time); Optuna's loop runs one trial at a time. Every curves trial draws the same noise (seed
   0), so trials differ only in their final loss: a current loss already ranks them as well as a
   prediction does, and collapse has no edge over ASHA here by construction.

The MLflow stores live under `benchmarks/.cache/` (ignored by git): the tau sweep is recorded by
`early_stopping.py` (run it first, about 15 minutes on 2 cores); the search sweeps and the
curves reference sweep are recorded here under `benchmarks/.cache/search/` and reused (an arm
finished once is read back; delete the folder to run anew).

    python benchmarks/search.py [--cache DIR] [--seeds 5] [--trials 24] [--concurrency N]
                                [--skip-search] [--skip-pruners]

Takes 1-2 minutes for the replays and about 4 minutes per search seed (20 for five) on 2 cores.

Targets: TPE + collapse finds a config within 0.5% of the best random-search result (mean over
seeds) with at most half of random search's compute (every seed); no Optuna pruner reaches a lower
regret than collapse at equal compute (nearest setting, at every stop point of the audit). Exit
status 0 when both hold.
"""

from __future__ import annotations

import argparse
import json
import math
import runpy
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from early_stopping import CACHE, REFERENCE, TUNING, inside, record  # noqa: E402

from orchestrator.sweep import Sweep, choice, loguniform, uniform  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BUDGETS = (0.15, 0.3, 0.45, 0.6)
TARGET_REGRET, TARGET_COMPUTE = 0.005, 0.5
ORDERS = 20
VERSION = "v1"  # part of the sweep names: a changed definition records anew, never mixes

# -- 1. Optuna's pruners replayed on the cached tau sweep ----------------------------------------


@dataclass(frozen=True)
class Replayed:
    name: str
    setting: str
    compute_fraction: float
    regret: float
    chosen: str | None
    default: bool = False


def _pruners() -> list[tuple[str, str, Callable[[], Any], bool]]:
    """(pruner, setting, factory, is-default): the defaults and a small grid around them."""
    import optuna.pruners as P

    out: list[tuple[str, str, Callable[[], Any], bool]] = [
        ("optuna-median", "defaults (5 startup trials, no warmup)", P.MedianPruner, True),
        ("optuna-hyperband", "defaults (min 1, max auto, rf 3)", P.HyperbandPruner, True),
        ("optuna-sh", "defaults (min auto, rf 4)", P.SuccessiveHalvingPruner, True),
        ("optuna-wilcoxon", "defaults (p 0.1, 2 startup steps)", P.WilcoxonPruner, True),
    ]
    for s in (1, 2, 5):
        for w in (2, 4, 6, 8, 12, 16, 20, 24, 28, 32):
            out.append(("optuna-median", f"{s} startup trials, warmup {w} evals",
                        lambda s=s, w=w: P.MedianPruner(n_startup_trials=s, n_warmup_steps=w), False))
    for m in (1, 2, 3, 4, 6, 8, 12):
        for rf in (2, 3, 4):
            out.append(("optuna-hyperband", f"min {m}, max 40, rf {rf}",
                        lambda m=m, rf=rf: P.HyperbandPruner(min_resource=m, max_resource=40, reduction_factor=rf), False))
            out.append(("optuna-sh", f"min {m}, rf {rf}",
                        lambda m=m, rf=rf: P.SuccessiveHalvingPruner(min_resource=m, reduction_factor=rf), False))
    for p in (0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5):
        for n in (2, 5, 10, 20):
            out.append(("optuna-wilcoxon", f"p {p:g}, {n} startup steps",
                        lambda p=p, n=n: P.WilcoxonPruner(p_threshold=p, n_startup_steps=n), False))
    return out


def replay_optuna(trials: Sequence[Any], pruner: Any, finals: dict[str, float],
                  study_name: str = "replay") -> tuple[float, float, str | None]:
    """Replay `trials` (audit TrialCurves, in order, one at a time) through an Optuna study with
    `pruner`; returns (compute fraction, regret, pick)."""
    import optuna

    # HyperbandPruner puts a trial in a bracket by a hash of the study's name and the trial's
    # number: a fixed name makes the replays repeat (an unnamed study gets a random one).
    study = optuna.create_study(study_name=study_name, direction="minimize", pruner=pruner,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    trained: dict[str, float] = {}
    finishers = []
    for t in trials:
        trial = study.ask()
        trained[t.trial_id] = 1.0
        stopped = False
        for k, (p, y) in enumerate(zip(t.progress.tolist(), t.loss.tolist()), start=1):
            if not math.isfinite(y):  # diverged: stopped at its first NaN, as the audit counts it
                trained[t.trial_id] = p
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                stopped = True
                break
            trial.report(y, k)
            if trial.should_prune():
                trained[t.trial_id] = p
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                stopped = True
                break
        if not stopped:
            study.tell(trial, float(t.loss[-1]))
            finishers.append(t.trial_id)
    spent = sum(t.cost * trained[t.trial_id] for t in trials) / sum(t.cost for t in trials)
    best = min(finals.values())
    chosen = min(finishers, key=lambda tid: finals[tid]) if finishers else None
    regret = finals[chosen] / best - 1 if chosen else math.inf
    return spent, regret, chosen


def pruner_section(uri: str, budgets: Sequence[float]) -> tuple[list[str], bool, dict[str, Any]]:
    import optuna

    from orchestrator.sweeps.audit import audit, load_sweep

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # WilcoxonPruner's
    result = audit(TUNING.name, reference={"experiment": REFERENCE.name, "kind": "empirical"}, uri=uri,
                   budgets=budgets, log=False, plot=False)
    trials = load_sweep(TUNING.name, "eval/loss", uri=uri, sweep_id=result.sweep_id).trials  # trial-id = launch order
    replays = []
    for name, setting, factory, default in _pruners():
        compute, regret, chosen = replay_optuna(trials, factory(), result.finals)
        replays.append(Replayed(name, setting, compute, regret, chosen, default))
    names = ("optuna-median", "optuna-hyperband", "optuna-sh", "optuna-wilcoxon")
    rows = [("stop at", "policy", "setting", "compute", "regret", "x collapse compute", "vs collapse")]
    ok = True
    wins: list[str] = []
    for b in budgets:
        c = result.row("collapse", b)
        for pol in ("collapse", "asha", "median"):
            r = result.row(pol, b)
            rows.append((f"{b:g}", {"collapse": "ladder collapse", "asha": "ASHA (audit)", "median": "median rule (audit)"}[pol],
                         r.setting, _pct(r.compute_fraction), _pct(r.regret), f"{r.compute_fraction / c.compute_fraction:.2f}",
                         "-" if pol == "collapse" else _versus(r.regret, c.regret, r.compute_fraction / c.compute_fraction)))
        for name in names:
            mine = [r for r in replays if r.name == name]
            near = min(mine, key=lambda r: (round(abs(r.compute_fraction - c.compute_fraction), 3), r.regret))
            verdict = _versus(near.regret, c.regret, near.compute_fraction / c.compute_fraction)
            if near.regret < c.regret - 1e-12 and near.compute_fraction <= c.compute_fraction * 1.1:
                ok = False
                wins.append(f"{name} ({near.setting}) at stop point {b:g}")
            rows.append((f"{b:g}", name, near.setting, _pct(near.compute_fraction), _pct(near.regret),
                         f"{near.compute_fraction / c.compute_fraction:.2f}", verdict))
    for r in replays:
        if r.default:
            rows.append(("-", r.name, r.setting, _pct(r.compute_fraction), _pct(r.regret), "-", "-"))
    rnd = result.row("random", None)
    rows.append(("-", "random pick (audit)", rnd.setting, _pct(rnd.compute_fraction), _pct(rnd.regret), "-", "-"))
    lines = [f"1. pruners replayed on {TUNING.name} ({len(trials)} full curves of eval/loss, best final "
             f"{result.best_final:.4f}); collapse reference: {result.reference}",
             "   one trial at a time in launch order (tau ascending); step = eval index; a pruned trial counts "
             "the fraction it reached"]
    lines += _table(rows)
    # Best regret each Optuna pruner reaches at or below collapse's compute, over the whole grid.
    frontier = []
    for b in budgets:
        c = result.row("collapse", b)
        cells = []
        for name in names:
            under = [r for r in replays if r.name == name and r.compute_fraction <= c.compute_fraction + 1e-9]
            cells.append(f"{name} {_pct(min(r.regret for r in under)) if under else 'none'}")
        frontier.append(f"   at <= {_pct(c.compute_fraction)} compute (collapse {_pct(c.regret)}): best of the grid: "
                        + ", ".join(cells))
    lines.append("lowest regret of any grid setting spending no more than collapse:")
    lines += frontier
    # The sequential pruners depend on the order trials arrive in; the audit's replays do not.
    rng = np.random.default_rng(0)
    orders = [[trials[i] for i in rng.permutation(len(trials))] for _ in range(ORDERS)]
    lines.append(f"the same settings over {ORDERS} random trial orders, each its own study name (mean compute, mean regret, worst regret):")
    for b in budgets:
        c = result.row("collapse", b)
        cells = []
        for name in names:
            near = min((r for r in replays if r.name == name),
                       key=lambda r: (round(abs(r.compute_fraction - c.compute_fraction), 3), r.regret))
            factory = next(f for n, st, f, _ in _pruners() if n == name and st == near.setting)
            runs = [replay_optuna(order, factory(), result.finals, f"replay-{i}") for i, order in enumerate(orders)]
            cells.append(f"{name} {_pct(float(np.mean([x[0] for x in runs])))} / "
                         f"{_pct(float(np.mean([x[1] for x in runs])))} / {_pct(max(x[1] for x in runs))}")
        lines.append(f"   stop point {b:g} (collapse {_pct(c.compute_fraction)} / {_pct(c.regret)}): " + "; ".join(cells))
    # Hyperband's brackets are a hash of the study name: in effect a seed the verdict above rests on.
    lines.append(f"optuna-hyperband's nearest setting in launch order under {ORDERS} study names (its bracket draws): "
                 "mean compute / mean regret / names where it beats collapse at <= 1.1x its compute")
    for b in budgets:
        c = result.row("collapse", b)
        near = min((r for r in replays if r.name == "optuna-hyperband"),
                   key=lambda r: (round(abs(r.compute_fraction - c.compute_fraction), 3), r.regret))
        factory = next(f for n, st, f, _ in _pruners() if n == "optuna-hyperband" and st == near.setting)
        runs = [replay_optuna(trials, factory(), result.finals, f"replay-{i}") for i in range(ORDERS)]
        beats = sum(x[1] < c.regret - 1e-12 and x[0] <= 1.1 * c.compute_fraction for x in runs)
        lines.append(f"   stop point {b:g} ({near.setting}; collapse {_pct(c.compute_fraction)} / {_pct(c.regret)}): "
                     f"{_pct(float(np.mean([x[0] for x in runs])))} / {_pct(float(np.mean([x[1] for x in runs])))} / "
                     f"{beats} of {ORDERS}")
    data = {"audit": result.to_dict(), "optuna": [r.__dict__ for r in replays]}
    lines.append("no Optuna pruner lower regret than collapse at (nearest) equal compute: "
                 + ("holds" if ok else "does not hold (" + "; ".join(wins) + ")"))
    return lines, ok, data


def _versus(regret: float, collapse: float, compute_ratio: float) -> str:
    if math.isclose(regret, collapse, abs_tol=1e-12):
        return "tie"
    if regret > collapse:
        return "higher"
    return "lower: peer wins" if compute_ratio <= 1.1 else "lower, at more compute"


# -- 2. search on the curves workload ------------------------------------------------------------

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
    parser.add_argument("--seeds", type=int, default=5, help="search seeds (0..n-1)")
    parser.add_argument("--trials", type=int, default=24, help="trials per arm")
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS), help="the audit's stop points")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="trials at once in the ladder arms (default: the sweeps' own, 2 on 2 cores)")
    parser.add_argument("--skip-search", action="store_true", help="only the pruner replays")
    parser.add_argument("--skip-pruners", action="store_true", help="only the search")
    args = parser.parse_args()

    from orchestrator.tracking import sink as tracking

    cache = args.cache.resolve()
    ok = True
    out: list[str] = []
    if not args.skip_pruners:
        with inside(cache):
            uri = tracking.tracking_uri()
            from early_stopping import recorded

            if recorded(TUNING, uri) < TUNING.trial_count():
                raise SystemExit(f"{TUNING.name} is not recorded in {cache}: run benchmarks/early_stopping.py first")
            lines, held, data = pruner_section(uri, args.budgets)
        (cache / "search_pruners.json").write_text(json.dumps(data, indent=1, default=str))
        out += lines + [""]
        ok &= held
    if not args.skip_search:
        lines, held, _ = search_section(cache / "search", list(range(args.seeds)), args.trials, args.concurrency)
        out += lines
        ok &= held
    print("\n".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
