"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

Early stopping by loss-curve collapse against every peer, replayed asynchronously on the full
curves of real sweeps of record (`stopping_replay`): for each sweep, every policy at a grid of
its settings over the same 20 random launch orders, 4 trials at once; regret against compute as
a curve, at each compute level the policy's best setting within it, mean and 95% interval over
the orders; a collapse reference's cost outside the sweep is counted in collapse's compute.

The sweeps of record (`RECORDED`), each recorded once with the fifo scheduler, every trial to the end:

* the celerity_lm tau (weight-decay) sweep at fixed TPP, at two seeds (`TUNING`, seed 0, and
  `REFERENCE`, seed 1): the setting of the paper's Fig. 9, where curves cross (small-tau runs
  lead mid-run and end worse). Each seed's sweep is the other's tau-matched reference (App. D),
  at the trials' width: at this scale a smaller model does not collapse onto the trials (width
  32 against 48 at TPP 80 differ by 0.09-0.13 in normalized loss at t = 0.2, several times the
  differences that rank the trials), so that reference costs a whole sweep, counted;
* a celerity_lm sweep over learning rate x warmup x width (32 trials, `LM_LR`), weight decay
  fixed, so tau moves with the learning rate as in a plain LR sweep;
* frl, a neural operator on Burgers' equation (not an LM), over learning rate x width x Fourier
  modes (24 trials, `FRL`).

Collapse is replayed with a reference from the sweep's own first finishers (`SelfReferenceCollapse`:
no runs outside the sweep; the rungs a trial passes before the reference exists are decided at
its first report after), the same with a margin of error (`MARGINS`: stop only when the
prediction is worse than the kept quantile by more than 1 or 2 of its standard errors), and on
the tau sweeps also with the other seed's sweep as reference and with the paper's curve fitted on
4 of its runs. The peers: Ray's ASHA, median rule and
HyperBand (ladder's schedulers as `ladder sweep` builds them), Optuna's HyperbandPruner (over
the study names that place trials in its brackets), SuccessiveHalving, Median, Percentile and
Wilcoxon pruners, and a power-law-ensemble extrapolation (`stopping_replay.PowerLawEnsemble`).
`ranking` measures why a policy wins or not: how well collapse's predicted final loss and the
current loss rank the trials' final losses at each rung.

The sweeps are recorded into an MLflow store under `benchmarks/.cache/` (ignored by git) and
reused; delete the folder, or pass another `--cache`, to record again. An interrupted recording
resumes. Recording takes about an hour of one core (the trials run one at a time); the replay
a few minutes.

    python benchmarks/early_stopping.py [--cache DIR] [--orders 20] [--workers 4] [--sweeps ...]
    python benchmarks/early_stopping.py --record-only

Target: on every sweep, collapse's regret is below every peer's at every compute level from 15%
to 50%, its reference's cost counted. Exit status 0 when one collapse variant is, on every sweep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from orchestrator.sweep import Sweep, grid

CACHE = Path(__file__).resolve().parent / ".cache"

# TPP 48: several times the early token-bound phase (~1M tokens) at this size, where at TPP 20
# that phase fills most of a run and curves of one shape cannot be told apart from noise; 16
# log-spaced tau values around the optimum for TPP 48 (about 0.11 by the Power Lines law).
TAUS = tuple(float(f"{x:.4g}") for x in np.geomspace(0.01, 1.5, 16))
COMMON = {
    "tpp": 48.0,
    "batch_size": 32,
    "width": 48,
    "eval_every_frac": 0.025,  # 40 held-out evals: the fits read a fixed set, not noisy train loss
    "eval_tokens": 16384,
    "checkpoint_every_frac": 0.5,
    "max_bytes": 4_000_000,
    "log_every": 10,
}
PARAMETRIC_TAUS = TAUS[::5]
VERSION = "v1"  # part of the experiment names: a changed definition records anew, never mixes

TUNING = Sweep(
    name=f"early_stopping_tuning_{VERSION}",
    workload="celerity_lm",
    base="smoke",
    overrides={**COMMON, "seed": 0},
    space={"tau": grid(*TAUS)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
)
REFERENCE = Sweep(
    name=f"early_stopping_reference_{VERSION}",
    workload="celerity_lm",
    base="smoke",
    overrides={**COMMON, "seed": 1},
    space={"tau": grid(*TAUS)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
)


# The sweeps of record beyond the tau sweep (each recorded once, every trial to the end, fifo):
# a celerity_lm sweep over learning rate x warmup x width where curves cross (a high learning
# rate leads early and can end worse), weight decay fixed so that tau moves with the learning
# rate as in a plain LR sweep; and frl (a neural operator on Burgers' equation, not an LM) over
# learning rate x width x Fourier modes.
LM_LR = Sweep(
    name=f"early_stopping_lm_lr_{VERSION}",
    workload="celerity_lm",
    base="smoke",
    overrides={"tpp": 24.0, "batch_size": 32, "eval_every_frac": 0.025, "eval_tokens": 8192,
               "checkpoint_every_frac": 0.5, "max_bytes": 4_000_000, "log_every": 10, "seed": 0},
    space={"lr": grid(4e-3, 1e-2, 2.5e-2, 6e-2), "warmup_frac": grid(0.0, 0.05, 0.15, 0.3), "width": grid(32, 48)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
    max_concurrent=1,
)
FRL = Sweep(
    name=f"early_stopping_frl_{VERSION}",
    workload="frl",
    base="smoke",
    overrides={"steps": 800, "eval_every_frac": 0.025, "checkpoint_every_frac": 0.5, "log_every": 20, "seed": 0},
    space={"lr": grid(3e-4, 1e-3, 3e-3, 1e-2, 2e-2, 4e-2), "width": grid(16, 32), "modes": grid(8, 12)},
    scheduler="fifo",
    objective=("eval/rel_l2/x1", "min"),
    max_concurrent=1,
)
RECORDED = {
    "tau, seed 0": (TUNING, "eval/loss"),
    "tau, seed 1": (REFERENCE, "eval/loss"),
    "lm lr x warmup x width": (LM_LR, "eval/loss"),
    "frl lr x width x modes": (FRL, "eval/rel_l2/x1"),
}
"""The recorded sweeps every policy is replayed on: name -> (sweep, objective)."""


@contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Work in the cache folder: run_sweep keeps its store and Tune state in the current folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".gitignore").write_text("*\n")
    here, uri = os.getcwd(), os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)
        if uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = uri


def recorded(sweep: Sweep, uri: str) -> int:
    """How many trials of `sweep` have a full curve in the store."""
    from orchestrator.sweeps.audit import load_sweep
    from orchestrator.sweep import SweepError

    try:
        return len(load_sweep(sweep.name, sweep.objective[0], uri=uri).trials)
    except SweepError:
        return 0


def record(sweep: Sweep, uri: str) -> float:
    """Run `sweep` to the end unless the cache holds it; returns the seconds spent now."""
    from orchestrator.sweeps.tune_run import _state_file, run_sweep

    if recorded(sweep, uri) >= sweep.trial_count():
        return 0.0
    started = time.monotonic()
    print(f"recording {sweep.name}: {sweep.trial_count()} trials of {sweep.workload} (fifo) ...", flush=True)
    run_sweep(sweep, resume=_state_file(sweep).is_file(), progress=False)
    if recorded(sweep, uri) < sweep.trial_count():
        raise SystemExit(f"{sweep.name}: only {recorded(sweep, uri)} of {sweep.trial_count()} trials finished; "
                         "rerun to resume the recording")
    return time.monotonic() - started


def total_cost(sweep: Sweep, uri: str) -> float:
    from orchestrator.sweeps.audit import load_sweep

    return sum(t.cost for t in load_sweep(sweep.name, sweep.objective[0], uri=uri).trials)


def parametric_reference(uri: str, taus: tuple[float, ...]):
    """The paper's Eq. 4-5 curve fitted on the reference runs at `taus` only."""
    from orchestrator.sweeps.audit import load_sweep, schedule_of
    from orchestrator.sweeps.collapse import ControlledCurve, fit_parametric

    runs = [t for t in load_sweep(REFERENCE.name, "eval/loss", uri=uri).trials
            if any(abs(t.tau / tau - 1) < 0.01 for tau in taus)]
    return fit_parametric([ControlledCurve(t.progress, t.loss, t.tau, t.tpp) for t in runs], schedule=schedule_of(runs))


# -- the replay of record ----------------------------------------------------------------------

LEVELS = (0.15, 0.2, 0.3, 0.4, 0.5)
"""Compute levels (fractions of the full sweep's compute) at which regret is compared."""
ORDERS = 20
WORKERS = 4
STOP_POINTS = (0.15, 0.3, 0.45, 0.6)
MARGINS = (1.0, 2.0)
"""Collapse's `margin` variants replayed: stop only when the prediction is worse than the kept
quantile by more than this many of its own standard errors."""
"""Collapse's settings: rungs x/3, 2x/3, x for each stop point x (as the audit's)."""


def peers() -> list[Any]:
    """Every peer's settings: defaults and a grid around them, so that each reaches a range of compute."""
    import warnings

    import optuna

    from stopping_replay import OptunaPruner, PowerLawEnsemble, Setting, ladder_scheduler

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    P = optuna.pruners
    out: list[Setting] = []
    for g in (0.05, 0.1, 0.2, 0.3):
        for rf in (2, 3, 4):
            out.append(Setting("ASHA (Ray)", f"grace {g:g}, rf {rf}",
                               lambda k, g=g, rf=rf: ladder_scheduler("asha", {"grace_period": g, "reduction_factor": rf}),
                               default=(g, rf) == (0.1, 2)))
    for g in (0.05, 0.1, 0.2, 0.3, 0.5):
        out.append(Setting("median rule (Ray)", f"grace {g:g}",
                           lambda k, g=g: ladder_scheduler("median", {"grace_period": g}), default=g == 0.1))
    for rf in (2, 3, 4):
        for b in (2, 3, 4):
            out.append(Setting("HyperBand (Ray)", f"rf {rf}, {b} brackets",
                               lambda k, rf=rf, b=b: ladder_scheduler("hyperband", {"reduction_factor": rf, "brackets": b}),
                               default=(rf, b) == (3, 3)))
    for m in (1, 2, 4, 8):
        for rf in (2, 3, 4):
            out.append(Setting("HyperbandPruner (Optuna)", f"min {m}, max 40, rf {rf}",
                               lambda k, m=m, rf=rf: OptunaPruner(P.HyperbandPruner(min_resource=m, max_resource=40,
                                                                                   reduction_factor=rf), study_name=f"order{k}")))
            out.append(Setting("SuccessiveHalvingPruner (Optuna)", f"min {m}, rf {rf}",
                               lambda k, m=m, rf=rf: OptunaPruner(P.SuccessiveHalvingPruner(min_resource=m, reduction_factor=rf),
                                                                  study_name=f"order{k}")))
    out.append(Setting("HyperbandPruner (Optuna)", "defaults", lambda k: OptunaPruner(P.HyperbandPruner(), study_name=f"order{k}"),
                       default=True))
    out.append(Setting("SuccessiveHalvingPruner (Optuna)", "defaults",
                       lambda k: OptunaPruner(P.SuccessiveHalvingPruner(), study_name=f"order{k}"), default=True))
    for n in (2, 5):
        for w in (2, 4, 8, 12, 20):
            out.append(Setting("MedianPruner (Optuna)", f"{n} startup trials, warmup {w} evals",
                               lambda k, n=n, w=w: OptunaPruner(P.MedianPruner(n_startup_trials=n, n_warmup_steps=w)),
                               default=(n, w) == (5, 2)))
            out.append(Setting("PercentilePruner 25% (Optuna)", f"{n} startup trials, warmup {w} evals",
                               lambda k, n=n, w=w: OptunaPruner(P.PercentilePruner(25.0, n_startup_trials=n, n_warmup_steps=w))))
    for pt in (0.01, 0.1, 0.3):
        for n in (2, 8):
            out.append(Setting("WilcoxonPruner (Optuna)", f"p {pt:g}, {n} startup steps",
                               lambda k, pt=pt, n=n: OptunaPruner(P.WilcoxonPruner(p_threshold=pt, n_startup_steps=n)),
                               default=(pt, n) == (0.1, 2)))
    for g in (0.1, 0.2, 0.3):
        for q in (0.0, 0.1, 0.3):
            out.append(Setting("power-law ensemble (LCE)", f"grace {g:g}, quantile {q:g}",
                               lambda k, g=g, q=q: PowerLawEnsemble(grace=g, quantile=q), default=(g, q) == (0.1, 0.1)))
    return out


def collapse_settings(sweep: Sweep, uri: str, controls: bool) -> list[Any]:
    """Collapse's settings on `sweep`: with a reference from the sweep's own first finishers (no
    runs outside it) and, for the tau sweeps, with the other seed's sweep as the tau-matched
    reference (its whole cost counted) and with the paper's curve fitted on 4 of its runs."""
    from orchestrator.sweeps.references import load_reference
    from stopping_replay import SelfReferenceCollapse, Setting, ladder_scheduler

    out = []
    for x in STOP_POINTS:
        rungs = tuple(round(x * k / 3, 6) for k in (1, 2, 3))
        for n in (2, 3, 4):
            out.append(Setting("collapse, own first finishers", f"{n} finishers, rungs {'/'.join(f'{r:g}' for r in rungs)}",
                               lambda k, n=n, rungs=rungs: SelfReferenceCollapse(n, {"rungs": rungs}, controls=controls,
                                                                                 metric=sweep.objective[0]),
                               default=(n, x) == (3, 0.3)))
        for m in MARGINS:  # one change at a time: the default reference (3 finishers), a margin of error
            out.append(Setting(f"collapse, own first finishers, margin {m:g} SE", f"3 finishers, rungs {'/'.join(f'{r:g}' for r in rungs)}",
                               lambda k, m=m, rungs=rungs: SelfReferenceCollapse(3, {"rungs": rungs, "margin": m}, controls=controls,
                                                                                 metric=sweep.objective[0])))
    if sweep.name in (TUNING.name, REFERENCE.name):
        other = REFERENCE if sweep is TUNING else TUNING
        share = total_cost(other, uri) / total_cost(sweep, uri)
        table = load_reference({"experiment": other.name, "kind": "empirical", "smooth_window": 0.0}, metric="eval/loss", uri=uri)
        few = parametric_reference(uri, PARAMETRIC_TAUS) if other is REFERENCE else None
        for x in STOP_POINTS:
            rungs = tuple(round(x * k / 3, 6) for k in (1, 2, 3))
            label = f"rungs {'/'.join(f'{r:g}' for r in rungs)}"
            out.append(Setting("collapse, other seed's sweep as reference", label,
                               lambda k, rungs=rungs: ladder_scheduler("collapse", {"rungs": rungs}, reference=table, overhead=share)))
            if few is not None:
                out.append(Setting(f"collapse, paper's curve on {len(PARAMETRIC_TAUS)} reference runs", label,
                                   lambda k, rungs=rungs: ladder_scheduler("collapse", {"rungs": rungs}, reference=few,
                                                                           overhead=share * len(PARAMETRIC_TAUS) / len(TAUS))))
    return out


def replay_sweep(label: str, sweep: Sweep, uri: str, *, n_orders: int = ORDERS, workers: int = WORKERS) -> dict[str, Any]:
    """Every policy replayed on one recorded sweep, over the same `n_orders` launch orders."""
    from orchestrator.sweeps.audit import load_sweep
    from stopping_replay import curves_from_audit, frontier, orders, replay_all

    trials = load_sweep(sweep.name, sweep.objective[0], uri=uri).trials
    curves = curves_from_audit(trials)
    controls = all("tau" in c.controls and "tpp" in c.controls for c in curves)
    settings = collapse_settings(sweep, uri, controls) + peers()
    launch = orders(len(curves), n_orders, seed=0)
    started = time.monotonic()
    replays = replay_all(curves, settings, launch_orders=launch, workers=workers)
    points = frontier(replays, LEVELS)
    finals = sorted(c.final for c in curves)
    return {
        "sweep": label, "experiment": sweep.name, "trials": len(curves), "metric": sweep.objective[0],
        "best_final": finals[0], "second_final": finals[1], "orders": n_orders, "workers": workers,
        "replay_s": time.monotonic() - started,
        "settings": [{"policy": r.policy, "setting": r.setting, "default": r.default, "compute": r.compute.tolist(),
                      "regret": r.regret.tolist()} for r in replays],
        "frontier": [{"policy": f.policy, "level": f.level, "setting": f.setting, "compute": f.compute,
                      "regret": list(f.regret)} for f in points],
    }


def ranking(sweep: Sweep, uri: str, at: tuple[float, ...] = (0.1, 0.2, 0.3)) -> list[str]:
    """How well each score ranks the trials' final losses at training fraction `at` (Spearman's
    rho over the sweep): the current loss, and collapse's predicted final loss with the most
    favourable reference there is, the curve fitted on every trial of the sweep itself (the
    paper's Eq. 4-5 family when the trials report tau and TPP, else their mean normalized curve)."""
    from scipy.stats import spearmanr

    from orchestrator.sweeps.audit import load_sweep
    from orchestrator.sweeps.collapse import ControlledCurve, EmpiricalReference, fit_divisor, fit_parametric

    trials = load_sweep(sweep.name, sweep.objective[0], uri=uri).trials
    finals = np.array([t.loss[-1] for t in trials])
    if all(t.tau is not None and math.isfinite(t.tau) for t in trials):
        fit = fit_parametric([ControlledCurve(t.progress, t.loss, t.tau, t.tpp) for t in trials])
        ref = lambda t: fit.for_controls(t.tau, t.tpp)  # noqa: E731
    else:
        mean = EmpiricalReference([(t.progress, t.loss) for t in trials], smooth_window=0.0)
        ref = lambda t: mean  # noqa: E731
    out = []
    for x in at:
        predicted = np.array([fit_divisor(t.progress, t.loss, ref(t), (x / 2, x)) for t in trials])
        current = np.array([np.interp(x, t.progress, t.loss) for t in trials])
        error = float(np.median(np.abs(predicted / finals - 1)))
        out.append(f"at {x:g}: rank correlation with the final loss: collapse's prediction "
                   f"{spearmanr(predicted, finals)[0]:.2f} (median error {100 * error:.1f}%), current loss "
                   f"{spearmanr(current, finals)[0]:.2f}")
    return out


def _cell(regret: list[float]) -> str:
    m, lo, hi = regret
    if not math.isfinite(m):
        return "-"
    return f"{100 * m:.2f}% [{100 * lo:.2f}, {100 * hi:.2f}]"


def format_replay(res: dict[str, Any]) -> tuple[list[str], dict[str, list[str]]]:
    """A markdown table (policy x compute level: mean regret [95% interval] over the orders, at
    the policy's best setting within the level) and, per collapse variant, the levels where it is
    not below every peer."""
    levels = sorted({f["level"] for f in res["frontier"]})
    policies = list(dict.fromkeys(f["policy"] for f in res["frontier"]))
    at = {(f["policy"], f["level"]): f for f in res["frontier"]}
    lines = [f"{res['sweep']} ({res['experiment']}: {res['trials']} trials, {res['metric']}, best final "
             f"{res['best_final']:.4g}, the second best {100 * (res['second_final'] / res['best_final'] - 1):.2f}% above it; "
             f"{res['orders']} launch orders, {res['workers']} trials at once)", "",
             "| policy | " + " | ".join(f"<= {100 * x:.0f}% compute" for x in levels) + " |",
             "|---|" + "---|" * len(levels)]
    for p in policies:
        lines.append(f"| {p} | " + " | ".join(_cell(at[(p, x)]["regret"]) for x in levels) + " |")
    behind: dict[str, list[str]] = {}
    peers_ = [p for p in policies if not p.startswith("collapse")]
    for p in (q for q in policies if q.startswith("collapse")):
        for x in levels:
            mine = at[(p, x)]["regret"][0]
            best_peer = min(peers_, key=lambda q: at[(q, x)]["regret"][0])
            theirs = at[(best_peer, x)]["regret"][0]
            if not mine < theirs:
                behind.setdefault(p, []).append(f"{100 * x:.0f}%: {_cell(at[(p, x)]['regret'])} vs {best_peer} "
                                                f"{_cell(at[(best_peer, x)]['regret'])}")
    return lines, behind


def record_all(cache: Path, labels: Sequence[str] | None = None) -> dict[str, float]:
    """Record every sweep of `RECORDED` (or those of `labels`) not yet in the cache (an interrupted one resumes);
    returns the seconds each has taken to record, over all sessions."""
    from orchestrator.tracking import sink as tracking

    with inside(cache):
        uri = tracking.tracking_uri()
        timing_file = cache / "recording.json"
        timing = json.loads(timing_file.read_text()) if timing_file.is_file() else {}
        # one trial at a time: the machine stays usable, and a recorded curve does not depend on it
        chosen = [RECORDED[k] for k in (labels or RECORDED)]
        for sweep, _ in sorted(chosen, key=lambda item: item[0] in (TUNING, REFERENCE)):
            spent = record(replace(sweep, max_concurrent=1), uri)
            if spent:
                timing[sweep.name] = timing.get(sweep.name, 0.0) + spent
                timing_file.write_text(json.dumps(timing, indent=2))
    return timing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--cache", type=Path, default=CACHE, help="folder of the recorded MLflow store")
    parser.add_argument("--record-only", action="store_true", help="record every sweep of record, replay nothing")
    parser.add_argument("--orders", type=int, default=ORDERS, help="random launch orders per policy setting")
    parser.add_argument("--workers", type=int, default=WORKERS, help="trials at once in the replay")
    parser.add_argument("--sweeps", nargs="+", choices=sorted(RECORDED), help="replay only these")
    args = parser.parse_args()

    from orchestrator.tracking import sink as tracking

    cache = args.cache.resolve()
    timing = record_all(cache, args.sweeps)
    if args.record_only:
        return 0
    results = []
    with inside(cache):
        uri = tracking.tracking_uri()
        for label, (sweep, _) in RECORDED.items():
            if args.sweeps and label not in args.sweeps:
                continue
            results.append(replay_sweep(label, sweep, uri, n_orders=args.orders, workers=args.workers))
            results[-1]["ranking"] = ranking(sweep, uri)
    (cache / "replay.json").write_text(json.dumps(results, indent=1))
    ahead = True
    for res in results:
        lines, behind = format_replay(res)
        print("\n".join(lines))
        for policy in (p for p in dict.fromkeys(f["policy"] for f in res["frontier"]) if p.startswith("collapse")):
            gaps = behind.get(policy, [])
            print(f"  {policy}: {'below every peer at every level' if not gaps else 'not below every peer at ' + '; '.join(gaps)}")
        for line in res["ranking"]:
            print(f"  {line}")
        ahead = ahead and any(p.startswith("collapse") and p not in behind for p in {f["policy"] for f in res["frontier"]})
        print(f"  replayed in {res['replay_s']:.0f} s\n")
    if timing:
        print("recording wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timing.items()))
    print(f"cache: {cache} (replay.json: every setting's compute and regret per order)")
    return 0 if ahead else 1


if __name__ == "__main__":
    sys.exit(main())
