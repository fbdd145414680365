"""Model-based search for sweeps (`Sweep(search="tpe")`): Optuna's Tree-structured Parzen
Estimator proposes each trial from the results of the trials that ended, through Ray Tune's
`OptunaSearch` (which holds the Optuna study, and which Tune saves and restores with the sweep).

How a trial's end counts for TPE:

- trained to its whole budget: COMPLETE, with its objective;
- stopped early by the scheduler (collapse, ASHA, the median rule), or diverged (a non-finite
  objective): PRUNED, with the objective it reached as its intermediate value at the training
  fraction it reached (in thousandths; for a trial that a resumed sweep restarted short of where
  it had been, and whose scheduler stopped it again at once, the furthest point Tune saw). Optuna's
  TPE ranks pruned trials below every completed one, those that got further and were better
  higher: the loss at 30% of training is never compared with final losses, and the region a
  scheduler gave up on is still learnt as bad;
- failed (an error after its retries): FAIL, which TPE leaves out. A resumed sweep runs failed
  trials again, but the study keeps them as failed: Tune's concurrency limiter forgets a trial
  once it failed and does not pass on its second end.

With a `seeds(n)` axis a proposal is n trials, one per seed, told once all n have ended: COMPLETE
with the mean objective when they all trained to the end, PRUNED when the scheduler stopped one
(at the least training fraction reached, with the mean objective), FAIL when all failed (those
that failed are left out of the mean otherwise).

Resume. Tune saves this searcher (the study: every proposal and every result told) with the
experiment's state, and `Tuner.restore` loads it back, so a resumed sweep continues the study.
Tune saves that state every few seconds, not at each proposal, so a driver killed between two
saves loses the trials proposed since the last one. Every proposal is therefore also appended
to a journal beside the sweep's state (`proposals.jsonl`) as it is made; the restored searcher
finds there the proposals that its restored state does not know and hands them out again before
any new one, each as the same ladder trial (`trial_of` in the trial's config): the trial reuses
the lost trial's MLflow run, and one that had finished reports its recorded result without
training.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import optuna
from ray.tune.search.optuna import OptunaSearch

from orchestrator.sweep import TPE_OPTIONS, Choice, Domain, LogUniform, Sweep, Uniform, resolved_options

PRUNED_STEP_SCALE = 1000
"""A pruned trial's intermediate value is reported at round(training fraction * this)."""

_PRIMITIVE = (type(None), bool, int, float, str)


class Space:
    """The sweep's sampled fields as Optuna's define-by-run space. A plain object rather than a
    function: Tune saves the searcher with plain pickle, which does not take closures. Choices
    that Optuna cannot store (anything but None, bool, int, float, str) are searched by label."""

    def __init__(self, space: Mapping[str, Any]) -> None:
        self.fields: list[tuple[Any, ...]] = []
        for key, domain in space.items():
            if isinstance(domain, Choice):
                values = list(domain.values)
                labels = values if all(isinstance(v, _PRIMITIVE) for v in values) else [repr(v) for v in values]
                self.fields.append((key, "choice", labels, values))
            elif isinstance(domain, (Uniform, LogUniform)):
                self.fields.append((key, "float", domain.low, domain.high, isinstance(domain, LogUniform)))

    def __call__(self, trial: Any) -> dict[str, Any]:
        """Suggest every field on `trial`; returns Optuna's params (labels for labelled choices)."""
        for field in self.fields:
            if field[1] == "choice":
                trial.suggest_categorical(field[0], field[2])
            else:
                trial.suggest_float(field[0], field[2], field[3], log=field[4])
        return dict(trial.params)

    def values(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The config values of Optuna's params."""
        out = {}
        for field in self.fields:
            label = params[field[0]]
            if field[1] == "choice":
                index = next(i for i, x in enumerate(field[2]) if type(x) is type(label) and x == label)
                out[field[0]] = field[3][index]
            else:
                out[field[0]] = float(label)
        return out


def sampler(sweep: Sweep) -> optuna.samplers.BaseSampler:
    """Optuna's TPE sampler of a sweep: seeded by `sweep.seed`, its random start-up proposals
    `sweep.startup_trials()`, the rest of `sweep.search_options` as given (the options of
    `orchestrator.sweep.TPE_OPTIONS`; those not given are Optuna's defaults)."""
    options = {k: v for k, v in resolved_options(sweep.search_options, TPE_OPTIONS).items() if k != "n_startup_trials"}
    return optuna.samplers.TPESampler(seed=sweep.seed, n_startup_trials=sweep.startup_trials(), **options)


class OptunaSweepSearch(OptunaSearch):
    """Ray Tune's `OptunaSearch` proposing a sweep's trials (see the module docstring): the
    sweep's fixed values in every proposal, each proposal once per seed of a `seeds(n)` axis,
    scheduler-stopped trials told as pruned, and lost proposals handed out again on resume.

    It is built with its space, objective and mode (the sweep's) and keeps them: its
    `set_search_properties` declines TuneConfig's, so its objective is the same whether
    TuneConfig names one (every scheduler but FIFO) or not."""

    def __init__(self, sweep: Sweep, *, journal: str | os.PathLike | None = None) -> None:
        self._fields = Space(sweep.space)
        self._fixed = {k: v for k, v in sweep.space.items() if not isinstance(v, Domain)}
        self._seed_key, self._seeds = sweep.replicas()
        self._replicas = max(1, len(self._seeds))
        self._groups: dict[int, dict[str, Any]] = {}
        """Optuna trial number -> {'trial', 'params', 'members' (Tune trial id -> replica), 'results', 'told'}."""
        self._number_of: dict[str, int] = {}
        self._root_of: dict[str, str] = {}
        """Tune trial id -> ladder trial id (the id its MLflow run has; another only for a proposal handed out again)."""
        self._open: int | None = None
        self._reached: dict[str, tuple[float, float]] = {}
        """Tune trial id -> (furthest training fraction reported, objective there)."""
        self._spare: Any = None
        self._renumbered: dict[int, int] = {}
        self._journal = str(journal) if journal else None
        metric, mode = sweep.objective
        super().__init__(space=self._fields, metric=metric, mode=mode, sampler=sampler(sweep), study_name=sweep.name)
        self._lost = self._lost_proposals()

    # Tune checks that every report carries its searcher's metric. This searcher reads the
    # objective only from a trial's last result (`on_trial_complete`), so it declares none: a
    # workload that reports its objective only at the end works under FIFO too.
    @property
    def metric(self) -> None:
        return None

    @property
    def study(self) -> optuna.Study:
        return self._ot_study

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self._lost:
            return self._again(trial_id, self._lost.pop(0))
        group = self._groups.get(self._open) if self._open is not None else None
        if group is None or len(group["members"]) >= self._replicas:
            group = self._open_group(self._next_trial())
        return self._hand_out(trial_id, group, root=trial_id)

    def _next_trial(self) -> Any:
        """A new proposal: the one set aside while a lost one was asked again, else a new ask."""
        if self._spare is not None:
            trial, self._spare = self._spare, None
            return trial
        trial = self._ot_study.ask()
        self._fields(trial)
        return trial

    def _open_group(self, trial: Any) -> dict[str, Any]:
        group = {"trial": trial, "params": dict(trial.params), "members": {}, "results": {}, "told": None}
        self._groups[trial.number] = group
        self._open = trial.number
        return group

    def _hand_out(self, trial_id: str, group: dict[str, Any], *, root: str, replica: int | None = None) -> dict[str, Any]:
        replica = len(group["members"]) if replica is None else replica
        number = group["trial"].number
        group["members"][trial_id] = replica
        self._number_of[trial_id] = number
        self._root_of[trial_id] = root
        params = {**self._fixed, **self._fields.values(group["params"])}
        if self._seed_key is not None:
            params[self._seed_key] = self._seeds[replica]
        self._write({"trial": trial_id, "of": root, "number": number, "replica": replica, "params": group["params"]})
        config: dict[str, Any] = {"params": params}
        if root != trial_id:
            config["trial_of"] = root
        return config

    def _again(self, trial_id: str, lost: Mapping[str, Any]) -> dict[str, Any]:
        """Hand out a proposal that the restored state does not know, as the same ladder trial."""
        number = self._renumbered.get(lost["number"], lost["number"])
        group = self._groups.get(number)
        if group is None or group["params"] != lost["params"]:
            # Asked after Tune's last save. Asked again from the same state, the sampler proposes
            # the same params (and moves its random state on as it did); otherwise that proposal
            # is kept for the next new trial and the lost one is asked with its params fixed.
            trial = self._next_trial()
            if dict(trial.params) != dict(lost["params"]):
                self._spare = trial
                self._ot_study.enqueue_trial(dict(lost["params"]))
                trial = self._ot_study.ask()
                self._fields(trial)
            group = self._open_group(trial)
            self._renumbered[lost["number"]] = trial.number
        return self._hand_out(trial_id, group, root=lost["of"], replica=lost["replica"])

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        # TPE learns from how trials end (on_trial_complete); this keeps how far each got, for a
        # trial that a resumed sweep restarts short of that and its scheduler stops at once.
        progress, value = result.get("progress"), result.get(self._metric)
        if progress is None or value is None:
            return
        if float(progress) >= self._reached.get(trial_id, (-1.0, 0.0))[0]:
            self._reached[trial_id] = (float(progress), float(value))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        number = self._number_of.get(trial_id)
        if number is None:
            return
        group = self._groups[number]
        group["results"][trial_id] = self._outcome(trial_id, result, error)
        if len(group["members"]) >= self._replicas and all(t in group["results"] for t in group["members"]):
            self._tell(group)

    def _outcome(self, trial_id: str, result: dict | None, error: bool) -> tuple[str, float | None, float | None]:
        """('complete' | 'pruned' | 'fail', objective, training fraction reached)."""
        if error or not result or result.get(self._metric) is None:
            return "fail", None, None  # nothing to rank it by
        value = float(result[self._metric])
        progress = result.get("progress")
        progress = float(progress) if progress is not None else None
        if not math.isfinite(value) or (progress is not None and progress < 1.0 - 1e-6):
            further = self._reached.get(trial_id)
            if progress is not None and further is not None and further[0] > progress:
                progress, value = further  # stopped where it had been before a restart
            return "pruned", value, progress
        return "complete", value, progress

    def _tell(self, group: dict[str, Any]) -> None:
        outcomes = [group["results"][t] for t in group["members"]]
        kinds = {o[0] for o in outcomes}
        finite = [o[1] for o in outcomes if o[0] != "fail" and math.isfinite(o[1])]
        if kinds == {"fail"}:
            state, value, step = optuna.trial.TrialState.FAIL, None, None
        elif "pruned" in kinds:
            reached = [o[2] for o in outcomes if o[0] == "pruned" and o[2] is not None]
            state = optuna.trial.TrialState.PRUNED
            value = sum(finite) / len(finite) if finite else math.nan
            step = int(round(PRUNED_STEP_SCALE * min(reached, default=0.0)))
        else:
            done = [o[1] for o in outcomes if o[0] == "complete"]
            state, value, step = optuna.trial.TrialState.COMPLETE, sum(done) / len(done), None
        if group["told"] is not None:
            return  # an Optuna trial is told once
        trial = group["trial"]
        if step is not None:
            trial.report(value, step)
        self._ot_study.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state)
        group["told"] = state.name

    def ladder_trial(self, trial_id: str) -> str:
        """The ladder trial id (that of its MLflow run) of a Tune trial this searcher proposed."""
        return self._root_of.get(trial_id, trial_id)

    # --- the journal of proposals ------------------------------------------------------------

    def _write(self, event: Mapping[str, Any]) -> None:
        if not self._journal:
            return
        Path(self._journal).parent.mkdir(parents=True, exist_ok=True)
        with open(self._journal, "a", encoding="utf-8") as f:  # opened per proposal: the searcher pickles
            f.write(json.dumps(event) + "\n")

    def _lost_proposals(self) -> list[dict[str, Any]]:
        """Proposals in the journal that this searcher's state does not know, one per ladder
        trial (its latest, for a proposal already handed out again once), in the order of those."""
        if not self._journal or not Path(self._journal).is_file():
            return []
        known = set(self._root_of.values())
        lost: dict[str, dict[str, Any]] = {}
        for line in Path(self._journal).read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
                root, trial = event["of"], event["trial"]
            except (ValueError, TypeError, KeyError):
                continue  # a line cut short by a kill mid-write
            if trial in self._root_of or root in known:
                continue
            lost.pop(root, None)
            lost[root] = event
        return list(lost.values())

    def use_journal(self, path: str | os.PathLike) -> None:
        """Keep the journal at `path` (a resumed sweep's folder may have moved since it began)."""
        self._journal = str(path)

    def restore(self, checkpoint_path: str) -> None:
        journal = self._journal
        super().restore(checkpoint_path)
        self._journal = journal or self._journal
        self._lost = self._lost_proposals()


def build(sweep: Sweep, *, journal: str | os.PathLike | None = None, quiet: bool = True) -> OptunaSweepSearch:
    """The searcher of a model-based sweep (`sweep.search == 'tpe'`)."""
    if sweep.search != "tpe":
        raise ValueError(f"search={sweep.search!r} has no searcher: its trials are drawn up front")
    if quiet:
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial told, under the sweep's view
    return OptunaSweepSearch(sweep, journal=journal)

