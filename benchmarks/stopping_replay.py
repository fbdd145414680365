"""Early-stopping policies replayed asynchronously on recorded full curves: every policy, ours and
its peers', driven by the same event loop, over many random trial orders, at matched compute.

A recorded sweep (every trial trained to the end, its held-out curve cached) is replayed as a
sweep would have run it: `workers` trials train at once, in a launch order drawn per replay;
a trial's reports arrive at times proportional to its cost (parameters x tokens, or 1), and each
report goes to the policy as it arrives, which answers continue, stop or pause (HyperBand),
and picks which waiting or paused trial takes a free worker. So what an asynchronous rule knows
at a decision depends on who reached that point before, as it does in a real sweep, and that is
what the orders sample.

Policies are the real objects a user would run:

* Tune schedulers (`TuneScheduler`): ladder's `collapse`, `asha`, `median` and `hyperband`, built
  by `orchestrator.sweeps.schedulers.build` exactly as `ladder sweep` builds them (Ray's
  `AsyncHyperBandScheduler`, `MedianStoppingRule`, `HyperBandScheduler`, ladder's
  `CollapseScheduler`), fed Tune-shaped results through a minimal controller that does what
  Tune's does for them (the trial list, `stop_trial`, pausing and unpausing);
* Optuna pruners (`OptunaPruner`): a study's ask / `report` / `should_prune` / tell, trials in
  flight at once as under Optuna's own parallel optimisation, the study named per replay (its
  HyperbandPruner places trials in brackets by a hash of that name);
* `PowerLawEnsemble`: learning-curve extrapolation, a peer from the line of work that fits a
  parametric curve per trial and stops a trial unlikely to beat the best finished one (Domhan et
  al. 2015, https://www.ijcai.org/Proceedings/15/Papers/487.pdf; Kadra et al. 2023, "Scaling Laws
  for Hyperparameter Optimization", https://arxiv.org/abs/2302.00441): an ensemble of power laws
  L(t) = a + b t^-c, fitted to bootstrap resamples of the prefix.

Accounting, the same for every policy. Compute: the training fraction each trial reached
(stopped, paused for good or finished), weighted by its cost, over the cost of the whole sweep,
plus `overhead`: what the policy needed outside the sweep (a collapse reference run apart from
it, as a fraction of the sweep's cost). Regret: the best final loss among the trials that ran to
the end, over the best final loss of the whole sweep, minus 1 (inf when none finished).

`frontier` turns the replays of a grid of settings into regret against compute: at each compute
level, the setting of the policy whose mean compute over the orders is at most that level and
whose mean regret is lowest, with the 95% interval of that regret over the orders.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

CONTINUE, STOP, PAUSE = "CONTINUE", "STOP", "PAUSE"


# -- the recorded sweep --------------------------------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """One recorded trial: its full held-out curve and what a scheduler may read beside it."""

    trial_id: str
    progress: np.ndarray
    """Training fraction of each report, increasing, the last one 1 (or the point it diverged)."""
    loss: np.ndarray
    """The objective at each report (lower is better); non-finite from where it diverged."""
    cost: float = 1.0
    """Compute of the whole trial (e.g. parameters x tokens), in any unit shared by the sweep."""
    controls: Mapping[str, float] = field(default_factory=dict)
    """What the trial's results carry for collapse: tau and tpp, when the sweep has them."""

    @property
    def final(self) -> float:
        return float(self.loss[-1]) if np.all(np.isfinite(self.loss)) else math.inf


def curves_from_audit(trials: Iterable[Any]) -> list[Curve]:
    """Curves from `orchestrator.sweeps.audit.load_sweep(...).trials` (TrialCurve)."""
    out = []
    for t in trials:
        controls = {k: float(v) for k, v in (("tau", getattr(t, "tau", None)), ("tpp", getattr(t, "tpp", None)))
                    if v is not None and math.isfinite(float(v))}
        out.append(Curve(t.trial_id, np.asarray(t.progress, float), np.asarray(t.loss, float),
                         float(getattr(t, "cost", 1.0) or 1.0), controls))
    return out


@dataclass(frozen=True)
class Outcome:
    compute: float
    """Compute spent (overhead included) over the sweep's full compute."""
    regret: float
    chosen: str | None
    trained_to: dict[str, float]
    stopped: int


# -- the event loop ------------------------------------------------------------------------------


class Policy:
    """What the event loop asks of a stopping policy. The defaults are a FIFO rule that never stops."""

    overhead: float = 0.0
    """Compute needed outside the sweep, as a fraction of the sweep's own."""

    def add(self, curve: Curve) -> None:
        """A trial is created (all are, in launch order, before the first runs)."""

    def result(self, curve: Curve, index: int) -> str:
        """The trial's report `index` (0-based) arrived: CONTINUE, STOP or PAUSE."""
        return CONTINUE

    def complete(self, curve: Curve) -> None:
        """The trial ran to its end."""

    def removed(self, curve: Curve) -> None:
        """The trial was stopped (by this policy or because it diverged)."""

    def choose(self, waiting: Sequence[str], paused: Sequence[str]) -> str | None:
        """Which trial a free worker takes: by default the next never-started one."""
        return waiting[0] if waiting else None

    def stopped_elsewhere(self) -> Iterable[str]:
        """Paused trials this policy has since stopped (HyperBand stops trials it had paused)."""
        return ()


class Source:
    """Where a search's trials come from (`simulate(..., source=...)`): a searcher proposes each
    trial when a worker frees up, from what the trials that ended so far told it. A proposal is a
    recorded curve under a new trial id (a search may propose a point twice)."""

    def next(self, number: int) -> Curve | None:
        """Proposal `number` (0-based), or None when the searcher has none."""
        raise NotImplementedError

    def reported(self, curve: Curve, index: int) -> None:
        """The trial's report `index` arrived (before the policy's decision on it)."""

    def ended(self, curve: Curve, how: str, index: int) -> None:
        """The trial ended ('finished', 'stopped' or 'diverged') at its report `index`."""


def simulate(curves: Sequence[Curve], policy: Policy, *, order: Sequence[int] | None = None, workers: int = 4,
             source: Source | None = None, budget: int | None = None) -> Outcome:
    """Replay `curves` launched in `order` (indices into `curves`) on `workers` at once.

    With a `source` instead of an order: a search of `budget` trials, each drawn from the source
    when a worker is free and no drawn trial waits; `curves` is then the whole recorded sweep,
    whose best final loss regret is measured against, and compute is counted over `budget` trials
    of the sweep's mean cost (a search that trains every proposal to the end spends about 1)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if len({c.trial_id for c in curves}) != len(curves):
        raise ValueError("trial ids must be unique")
    if source is None:
        if order is None or sorted(curves[i].trial_id for i in order) != sorted(c.trial_id for c in curves):
            raise ValueError("order must be a permutation of the trials")
    elif budget is None or budget < 1:
        raise ValueError(f"a search needs a budget of at least one trial, got {budget!r}")
    mean_cost = float(np.mean([c.cost for c in curves]))
    by_id: dict[str, Curve] = {}
    launch: list[str] = []
    waiting: list[str] = []
    paused: list[str] = []
    next_index: dict[str, int] = {}
    reached: dict[str, float] = {}
    ended: dict[str, str] = {}
    events: list[tuple[float, int, str]] = []
    running: set[str] = set()
    clock, tick, drawn = 0.0, 0, 0

    def admit(c: Curve) -> None:
        if c.trial_id in by_id:
            raise ValueError(f"trial id {c.trial_id!r} was launched twice")
        by_id[c.trial_id] = c
        launch.append(c.trial_id)
        waiting.append(c.trial_id)
        next_index[c.trial_id], reached[c.trial_id] = 0, 0.0
        policy.add(c)

    def end(tid: str, how: str) -> None:
        ended[tid] = how
        if source is not None:
            source.ended(by_id[tid], how, max(next_index[tid] - 1, 0))

    def start(tid: str, now: float) -> None:
        nonlocal tick
        c = by_id[tid]
        k = next_index[tid]
        dt = (float(c.progress[k]) - reached[tid]) * c.cost / mean_cost
        tick += 1
        heapq.heappush(events, (now + max(dt, 0.0), tick, tid))
        running.add(tid)

    def fill(now: float) -> None:
        nonlocal drawn
        for tid in list(policy.stopped_elsewhere()):
            if tid in paused:
                paused.remove(tid)
                end(tid, "stopped")
        while len(running) < workers:
            if source is not None and not waiting and drawn < (budget or 0):
                c = source.next(drawn)
                drawn = drawn + 1 if c is not None else budget or 0
                if c is not None:
                    admit(c)
            tid = policy.choose(list(waiting), list(paused))
            if tid is None:
                return
            if tid in waiting:
                waiting.remove(tid)
            elif tid in paused:
                paused.remove(tid)
            else:
                raise RuntimeError(f"{type(policy).__name__} chose {tid!r}, which is neither waiting nor paused")
            start(tid, now)

    if source is None:
        for i in order or ():
            admit(curves[i])
    fill(clock)
    while events:
        clock, _, tid = heapq.heappop(events)
        running.discard(tid)
        c = by_id[tid]
        k = next_index[tid]
        reached[tid] = float(c.progress[k])
        next_index[tid] = k + 1
        if not math.isfinite(float(c.loss[k])):
            policy.removed(c)
            end(tid, "diverged")
        else:
            if source is not None:
                source.reported(c, k)
            action = policy.result(c, k)
            last = k + 1 >= len(c.progress)
            if last:
                policy.complete(c)  # a trial at its end finishes whatever the rule says
                end(tid, "finished")
            elif action == STOP:
                policy.removed(c)
                end(tid, "stopped")
            elif action == PAUSE:
                paused.append(tid)
            else:
                start(tid, clock)
        fill(clock)
    for tid in paused:
        if tid not in ended:  # paused and never resumed: it trained no further
            end(tid, "stopped")
    for tid in waiting:
        ended.setdefault(tid, "never started")
    total = sum(c.cost for c in curves) if source is None else (budget or 0) * mean_cost
    spent = sum(by_id[t].cost * reached[t] for t in launch) / total + policy.overhead
    best = min(c.final for c in curves)
    finishers = [t for t, how in ended.items() if how == "finished"]
    chosen = min(finishers, key=lambda t: by_id[t].final) if finishers else None
    regret = by_id[chosen].final / best - 1 if chosen is not None and math.isfinite(by_id[chosen].final) else math.inf
    stopped = sum(how == "stopped" for how in ended.values())
    return Outcome(spent, regret, chosen, reached, stopped)


# -- Tune schedulers -----------------------------------------------------------------------------


class _Trial:
    """What Ray's schedulers read of a Tune trial."""

    def __init__(self, trial_id: str) -> None:
        from ray.tune.experiment import Trial

        self.trial_id = trial_id
        self.status = Trial.PENDING
        self.config: dict[str, Any] = {}
        self.evaluated_params: dict[str, Any] = {}
        self.last_result: dict[str, Any] = {}
        self.is_saving = False

    def __repr__(self) -> str:
        return f"Trial({self.trial_id})"


class _Controller:
    """The part of Tune's controller that Ray's schedulers call: the trial list and stop_trial."""

    def __init__(self, owner: "TuneScheduler") -> None:
        self.owner = owner

    def get_trials(self) -> list[_Trial]:
        return list(self.owner.trials.values())

    def get_live_trials(self) -> list[_Trial]:
        from ray.tune.experiment import Trial

        return [t for t in self.owner.trials.values() if t.status not in (Trial.TERMINATED, Trial.ERROR)]

    def stop_trial(self, trial: _Trial) -> None:
        from ray.tune.experiment import Trial

        if trial.status in (Trial.TERMINATED, Trial.ERROR):
            return
        if trial.status in (Trial.PENDING, Trial.PAUSED):
            self.owner.scheduler.on_trial_remove(self, trial)
            self.owner.stopped.append(trial.trial_id)
        trial.status = Trial.TERMINATED


class TuneScheduler(Policy):
    """A Ray Tune scheduler (ladder's or Ray's) driven as Tune drives it."""

    def __init__(self, scheduler: Any, *, metric: str = "eval/loss", overhead: float = 0.0) -> None:
        self.scheduler = scheduler
        self.metric = metric
        self.overhead = overhead
        self.trials: dict[str, _Trial] = {}
        self.stopped: list[str] = []
        self.controller = _Controller(self)
        if hasattr(scheduler, "set_search_properties"):
            scheduler.set_search_properties(metric, "min")
        if hasattr(scheduler, "announce"):
            scheduler.announce = False

    def add(self, curve: Curve) -> None:
        trial = self.trials[curve.trial_id] = _Trial(curve.trial_id)
        self.scheduler.on_trial_add(self.controller, trial)

    def result(self, curve: Curve, index: int) -> str:
        from ray.tune.experiment import Trial

        trial = self.trials[curve.trial_id]
        p = float(curve.progress[index])
        res = {self.metric: float(curve.loss[index]), "progress": p, "progress_pct": 100.0 * p,
               "training_iteration": index + 1, "time_total_s": p * curve.cost, **curve.controls}
        trial.last_result = res
        action = self.scheduler.on_trial_result(self.controller, trial, res)
        if action == PAUSE:
            trial.status = Trial.PAUSED
        elif action == STOP:
            trial.status = Trial.TERMINATED
        return action

    def complete(self, curve: Curve) -> None:
        from ray.tune.experiment import Trial

        trial = self.trials[curve.trial_id]
        if trial.status != Trial.TERMINATED:
            self.scheduler.on_trial_complete(self.controller, trial, trial.last_result)
        trial.status = Trial.TERMINATED

    def removed(self, curve: Curve) -> None:
        from ray.tune.experiment import Trial

        trial = self.trials[curve.trial_id]
        if trial.status == Trial.TERMINATED:  # stopped by the rule: Tune completes it for the scheduler
            self.scheduler.on_trial_complete(self.controller, trial, trial.last_result)
        else:  # diverged: Tune reports it as an error
            trial.status = Trial.ERROR
            self.scheduler.on_trial_error(self.controller, trial)

    def choose(self, waiting: Sequence[str], paused: Sequence[str]) -> str | None:
        from ray.tune.experiment import Trial

        trial = self.scheduler.choose_trial_to_run(self.controller)
        if trial is None:
            return None
        if trial.trial_id not in waiting and trial.trial_id not in paused:
            return None
        trial.status = Trial.RUNNING
        return trial.trial_id

    def stopped_elsewhere(self) -> Iterable[str]:
        out, self.stopped = self.stopped, []
        return out


def ladder_scheduler(name: str, options: Mapping[str, Any] | None = None, *, reference: Any = None,
                     metric: str = "eval/loss", overhead: float = 0.0) -> TuneScheduler:
    """One of ladder's schedulers ('collapse', 'asha', 'median', 'hyperband'), built as a sweep builds it."""
    from orchestrator.sweeps.schedulers import build

    return TuneScheduler(build(name, dict(options or {}), metric=metric, mode="min", reference=reference),
                         metric=metric, overhead=overhead)


# -- Optuna pruners ------------------------------------------------------------------------------


class OptunaPruner(Policy):
    """An Optuna pruner behind a study: ask at launch, report each eval (step = its index), ask
    `should_prune`, tell at the end."""

    def __init__(self, pruner: Any, *, study_name: str = "replay", sampler: Any = None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.optuna = optuna
        self.study = optuna.create_study(study_name=study_name, direction="minimize", pruner=pruner,
                                         sampler=sampler or optuna.samplers.RandomSampler(seed=0))
        self.trials: dict[str, Any] = {}
        self.told: set[str] = set()

    def _trial(self, tid: str) -> Any:
        if tid not in self.trials:
            self.trials[tid] = self.study.ask()
        return self.trials[tid]

    def result(self, curve: Curve, index: int) -> str:
        trial = self._trial(curve.trial_id)
        trial.report(float(curve.loss[index]), index + 1)
        if index + 1 < len(curve.progress) and trial.should_prune():
            self._tell(curve.trial_id, state=self.optuna.trial.TrialState.PRUNED)
            return STOP
        return CONTINUE

    def _tell(self, tid: str, value: float | None = None, state: Any = None) -> None:
        if tid not in self.told:
            self.told.add(tid)
            self.study.tell(self._trial(tid), value, state=state)

    def complete(self, curve: Curve) -> None:
        self._tell(curve.trial_id, float(curve.loss[-1]))

    def removed(self, curve: Curve) -> None:  # diverged (a pruned trial was told already)
        self._tell(curve.trial_id, state=self.optuna.trial.TrialState.FAIL)

    def choose(self, waiting: Sequence[str], paused: Sequence[str]) -> str | None:
        if not waiting:
            return None
        self._trial(waiting[0])  # asked at launch: trial numbers follow the launch order
        return waiting[0]


# -- search: a searcher proposing points of a recorded grid ---------------------------------------


class RecordedGrid:
    """A recorded grid sweep as a search space: each axis's values, and the recorded curve at
    each point (every point of the grid recorded once)."""

    def __init__(self, curves: Sequence[Curve], points: Sequence[Mapping[str, float]]) -> None:
        if len(curves) != len(points) or not curves:
            raise ValueError("one point per recorded curve, at least one")
        self.axes: dict[str, list[float]] = {a: sorted({float(p[a]) for p in points}) for a in points[0]}
        self.at: dict[tuple[float, ...], Curve] = {}
        for c, p in zip(curves, points):
            key = self._key(p)
            if key in self.at:
                raise ValueError(f"two recorded curves at the point {dict(p)}")
            self.at[key] = c
        self.curves = list(curves)

    def _key(self, point: Mapping[str, Any]) -> tuple[float, ...]:
        return tuple(float(point[a]) for a in self.axes)

    def curve(self, point: Mapping[str, Any]) -> Curve:
        try:
            return self.at[self._key(point)]
        except KeyError:
            raise KeyError(f"the point {dict(point)} was not recorded (axes: {self.axes})") from None


class TuneSearch(Source):
    """A Ray Tune searcher (ladder's `OptunaSweepSearch`, as `ladder sweep` builds it for a
    `search='tpe'` sweep) driven as Tune drives it: `suggest` when a worker frees, every report
    to `on_trial_result`, the trial's last result to `on_trial_complete` when it ends (a stopped
    trial's last result is short of progress 1, which the searcher tells Optuna as pruned)."""

    def __init__(self, searcher: Any, grid: RecordedGrid, *, metric: str) -> None:
        self.searcher, self.grid, self.metric = searcher, grid, metric
        self.point: dict[str, str] = {}
        """Proposal id -> the recorded trial it replays."""

    def next(self, number: int) -> Curve | None:
        tid = f"p{number:03d}"
        config = self.searcher.suggest(tid)
        if config is None:
            return None
        c = self.grid.curve(config["params"])
        self.point[tid] = c.trial_id
        return replace(c, trial_id=tid)

    def _result(self, curve: Curve, index: int, *, end: bool = False) -> dict[str, float]:
        p = 1.0 if end else float(curve.progress[index])  # a trial that ran to its end reports progress 1
        return {self.metric: float(curve.loss[index]), "progress": p, "training_iteration": index + 1}

    def reported(self, curve: Curve, index: int) -> None:
        self.searcher.on_trial_result(curve.trial_id, self._result(curve, index))

    def ended(self, curve: Curve, how: str, index: int) -> None:
        self.searcher.on_trial_complete(curve.trial_id, self._result(curve, index, end=how == "finished"))


class OptunaSearch(Source):
    """Optuna standalone, as its users write it: the study of an `OptunaPruner` policy (its sampler
    e.g. TPE) asked for each trial, every axis of the grid a categorical `suggest`; the policy
    reports, prunes and tells."""

    def __init__(self, policy: OptunaPruner, grid: RecordedGrid) -> None:
        self.policy, self.grid = policy, grid
        self.point: dict[str, str] = {}

    def next(self, number: int) -> Curve | None:
        trial = self.policy.study.ask()
        point = {a: trial.suggest_categorical(a, values) for a, values in self.grid.axes.items()}
        c = self.grid.curve(point)
        tid = f"p{number:03d}"
        self.policy.trials[tid] = trial
        self.point[tid] = c.trial_id
        return replace(c, trial_id=tid)


# -- learning-curve extrapolation ----------------------------------------------------------------


def power_law_predictions(t: np.ndarray, y: np.ndarray, *, members: int = 16, seed: int = 0,
                          exponents: np.ndarray | None = None, at: float = 1.0) -> np.ndarray:
    """Predictions at `at` of an ensemble of power laws y = a + b t^-c, each fitted by least
    squares (c on a grid, a and b in closed form) to a bootstrap resample of the points."""
    t = np.asarray(t, float)
    y = np.asarray(y, float)
    if t.size < 3:
        raise ValueError("a power-law fit needs at least three points")
    cs = np.geomspace(0.05, 3.0, 24) if exponents is None else np.asarray(exponents, float)
    rng = np.random.default_rng(seed)
    idx = np.vstack([np.arange(t.size)] + [rng.integers(0, t.size, t.size) for _ in range(members - 1)])
    tb, yb = t[idx], y[idx]  # [members, n]
    x = tb[:, None, :] ** -cs[None, :, None]  # [members, C, n]
    xm = x.mean(-1, keepdims=True)
    ym = yb.mean(-1)[:, None, None]
    xc = x - xm
    yc = yb[:, None, :] - ym
    sxx = (xc * xc).sum(-1)
    b = np.where(sxx > 1e-12, (xc * yc).sum(-1) / np.maximum(sxx, 1e-12), 0.0)  # [members, C]
    a = ym[..., 0] - b * xm[..., 0]
    resid = ((yc - b[..., None] * xc) ** 2).sum(-1)
    resid = np.where(b >= 0, resid, np.inf)  # a loss curve that falls: b >= 0
    best = np.argmin(resid, axis=1)
    rows = np.arange(members)
    ok = np.isfinite(resid[rows, best])
    pred = a[rows, best] + b[rows, best] * at ** -cs[best]
    # no decreasing power law fits a rising prefix: its last value is the honest extrapolation
    return np.where(ok, pred, y[-1])


class PowerLawEnsemble(Policy):
    """Stop a trial at a check point when the `quantile` of its ensemble's predicted final loss
    is worse than the best final loss finished so far (no stop before any trial has finished)."""

    def __init__(self, *, grace: float = 0.1, every: float = 0.05, quantile: float = 0.1, members: int = 16,
                 window_start: float = 0.5) -> None:
        self.grace, self.every, self.quantile, self.members = grace, every, quantile, members
        self.window_start = window_start
        self.best_final = math.inf
        self.next_check: dict[str, float] = {}

    def add(self, curve: Curve) -> None:
        self.next_check[curve.trial_id] = self.grace

    def result(self, curve: Curve, index: int) -> str:
        p = float(curve.progress[index])
        tid = curve.trial_id
        if p < self.next_check[tid] or not math.isfinite(self.best_final) or index + 1 >= len(curve.progress):
            return CONTINUE
        while self.next_check[tid] <= p:
            self.next_check[tid] += self.every
        t, y = curve.progress[: index + 1], curve.loss[: index + 1]
        keep = t >= p * self.window_start
        if np.count_nonzero(keep) < 3:
            keep = slice(max(0, index - 2), index + 1)
        try:
            pred = power_law_predictions(t[keep], y[keep], members=self.members, seed=index)
        except ValueError:
            return CONTINUE
        return STOP if float(np.quantile(pred, self.quantile)) > self.best_final else CONTINUE

    def complete(self, curve: Curve) -> None:
        self.best_final = min(self.best_final, curve.final)


# -- replays and the frontier --------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    policy: str
    """The peer's name, e.g. 'asha (Ray)'."""
    setting: str
    """Its options, in words."""
    make: Callable[[int], Policy]
    """A fresh policy for replay number k (k seeds whatever the policy randomises)."""
    default: bool = False


@dataclass(frozen=True)
class Replays:
    policy: str
    setting: str
    compute: np.ndarray
    regret: np.ndarray
    default: bool = False

    @property
    def mean_compute(self) -> float:
        return float(np.mean(self.compute))

    def regret_interval(self) -> tuple[float, float, float]:
        return mean_interval(self.regret)


def mean_interval(x: np.ndarray) -> tuple[float, float, float]:
    """Mean and the 95% t-interval of the mean (inf when any value is)."""
    from scipy import stats

    x = np.asarray(x, float)
    if not np.all(np.isfinite(x)):
        return math.inf, math.inf, math.inf
    m = float(np.mean(x))
    if x.size < 2:
        return m, m, m
    half = float(stats.t.ppf(0.975, x.size - 1) * np.std(x, ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


def orders(n_trials: int, n_orders: int, seed: int = 0) -> list[list[int]]:
    """`n_orders` random launch orders, the same for every policy."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(n_trials).tolist() for _ in range(n_orders)]


def replay_all(curves: Sequence[Curve], settings: Sequence[Setting], *, launch_orders: Sequence[Sequence[int]],
               workers: int = 4) -> list[Replays]:
    out = []
    for s in settings:
        results = [simulate(curves, s.make(k), order=o, workers=workers) for k, o in enumerate(launch_orders)]
        out.append(Replays(s.policy, s.setting, np.array([r.compute for r in results]),
                           np.array([r.regret for r in results]), s.default))
    return out


@dataclass(frozen=True)
class FrontierPoint:
    policy: str
    level: float
    setting: str | None
    compute: float
    regret: tuple[float, float, float]
    """Mean regret and its 95% interval over the orders (inf when no setting fits the level)."""


def frontier(replays: Sequence[Replays], levels: Sequence[float]) -> list[FrontierPoint]:
    """Per policy and compute level: its setting of lowest mean regret among those whose mean
    compute is at most the level."""
    out = []
    for policy in dict.fromkeys(r.policy for r in replays):
        mine = [r for r in replays if r.policy == policy]
        for level in levels:
            fits = [r for r in mine if r.mean_compute <= level + 1e-9]
            if not fits:
                out.append(FrontierPoint(policy, level, None, math.nan, (math.inf, math.inf, math.inf)))
                continue
            best = min(fits, key=lambda r: (r.regret_interval()[0], r.mean_compute))
            out.append(FrontierPoint(policy, level, best.setting, best.mean_compute, best.regret_interval()))
    return out


# -- collapse with a reference from the sweep's own first finishers ------------------------------


class _Undefined:
    ready = False
    smooth_window = 0.0

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return np.full(np.shape(t), np.nan)


class _Growing:
    """A collapse reference built from the sweep's first `n` finished trials. Until they have
    finished it is not `ready`, and the stopper defers the rung decisions of the trials that pass
    rungs meanwhile to their first report after it is."""

    smooth_window = 0.0

    def __init__(self, n: int) -> None:
        self.n = n
        self.runs: list[Curve] = []
        self.built: Any = None

    def add(self, curve: Curve) -> None:
        from orchestrator.sweeps.collapse import ControlledCurve, EmpiricalReference, fit_parametric

        if self.built is not None or not np.all(np.isfinite(curve.loss)):
            return
        self.runs.append(curve)
        if len(self.runs) < self.n:
            return
        controls = {(round(c.controls.get("tau", 0.0), 6), round(c.controls.get("tpp", 0.0), 6)) for c in self.runs}
        if len(controls) > 1:  # finishers at several tau or tpp: the paper's curve family (Eq. 4-5)
            self.built = fit_parametric([ControlledCurve(c.progress, c.loss, c.controls["tau"], c.controls["tpp"])
                                         for c in self.runs])
        else:
            self.built = EmpiricalReference([(c.progress, c.loss) for c in self.runs], smooth_window=0.0)

    @property
    def ready(self) -> bool:
        return self.built is not None

    def __call__(self, t: np.ndarray) -> np.ndarray:
        if self.built is None:
            return np.full(np.shape(t), np.nan)
        if hasattr(self.built, "for_controls"):
            raise ValueError("this reference depends on tau and tpp")
        return self.built(t)


class _GrowingFamily(_Growing):
    def for_controls(self, tau: float, tpp: float) -> Any:
        if self.built is None:
            return _Undefined()
        return self.built.for_controls(tau, tpp) if hasattr(self.built, "for_controls") else self.built


class SelfReferenceCollapse(TuneScheduler):
    """ladder's collapse scheduler whose reference is the mean normalized curve (or, when they
    differ in tau or TPP, the paper's parametric family) of the sweep's first `n_ref` trials to
    finish: no runs outside the sweep, so no overhead; the finishers' own compute is the cost."""

    def __init__(self, n_ref: int, options: Mapping[str, Any] | None = None, *, controls: bool,
                 metric: str = "eval/loss") -> None:
        from orchestrator.sweeps.schedulers import build

        self.reference = (_GrowingFamily if controls else _Growing)(n_ref)
        super().__init__(build("collapse", dict(options or {}), metric=metric, mode="min", reference=self.reference),
                         metric=metric)

    def complete(self, curve: Curve) -> None:
        super().complete(curve)
        self.reference.add(curve)
