"""Ray Tune's ASHA, median stopping rule, HyperBand and PBT, letting a trial that reached the end
of its budget finish.

Both rules may answer STOP to a trial's last report (ASHA at `max_t`, both at a rung or a
median comparison that falls on 100%). Tune then stops the trial inside that report, before
`train` has returned, so what it returned (the final metrics ladder records on the trial's run)
would be lost, and a resumed sweep would train the trial again. A trial at 100% has nothing left
to stop: these subclasses answer CONTINUE there and keep the rules' own decisions everywhere else.
"""

from __future__ import annotations

from typing import Any, Mapping

from ray.tune.schedulers import (AsyncHyperBandScheduler, HyperBandScheduler, MedianStoppingRule,
                                 PopulationBasedTraining, TrialScheduler)
from ray.tune.experiment import Trial
from ray.tune.schedulers.hyperband import _Bracket

END = 100.0
"""`progress_pct` of a trial that trained to the end."""


class _FinishAtEnd:
    """Mixed in before a Ray rule: its STOP to a report at 100% becomes CONTINUE."""

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        action = super().on_trial_result(tune_controller, trial, result)
        at_end = float(result.get(self._time_attr, 0.0)) >= END - 1e-9
        return TrialScheduler.CONTINUE if action == TrialScheduler.STOP and at_end else action


class Asha(_FinishAtEnd, AsyncHyperBandScheduler):
    pass


class Median(_FinishAtEnd, MedianStoppingRule):
    pass


class _RungBracket(_Bracket):
    """Ray's HyperBand bracket, telling `record` which trials each halving keeps and stops (Ray
    keeps no record of why a trial stopped)."""

    def __init__(self, *args: Any, index: int, record: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.index, self.record = index, record

    def filled(self) -> bool:
        # Ray counts the live trials, so a bracket whose first trials ended takes more than it was
        # sized for; HyperBand sizes a bracket by the trials it is given.
        return len(self._all_trials) >= self._n0

    def successive_halving(self, metric: str, metric_op: float) -> tuple[list, list]:
        rung = self._cumul_r  # the milestone the trials reached, before Ray moves it on
        good, bad = super().successive_halving(metric, metric_op)
        self.record(self.index, rung, good, bad)
        return good, bad


class Hyperband(_FinishAtEnd, HyperBandScheduler):
    """Ray's synchronous HyperBand on `progress_pct` up to 100, with the sweep's number of
    brackets, and a decision per stopped trial (`decisions`: trial id -> action, bracket, rung)
    that the sweep's view and its result read, as they do the collapse scheduler's."""

    def __init__(self, *, reduction_factor: float, brackets: int) -> None:
        # stop_last_trials=False: the survivors of a bracket's last halving train to the end of
        # their own budget (with True Ray stops them at the last rung, int(100/eta**k) percent,
        # which is short of 100 whenever 100 is not a power of eta).
        super().__init__(time_attr="progress_pct", max_t=END, reduction_factor=reduction_factor,
                         stop_last_trials=False)
        # Ray derives the number of brackets from max_t (round(log(max_t) / log(eta)) + 1: five at
        # eta 3 for 100%, the first rung at 1% of training); the sweep says how many. `_get_n0`
        # reads it when a bracket is made.
        self._s_max_1 = int(brackets)
        self.decisions: dict[str, dict[str, Any]] = {}

    def _create_bracket(self, s: int) -> _Bracket:
        return _RungBracket(time_attr=self._time_attr, max_trials=self._get_n0(s), init_t_attr=self._get_r0(s),
                            max_t_attr=self._max_t_attr, eta=self._eta, s=s, stop_last_trials=self._stop_last_trials,
                            index=s, record=self._record)

    def _record(self, bracket: int, rung: float, good: list, bad: list) -> None:
        for trial in bad:
            self.decisions[trial.trial_id] = {"action": "stop", "bracket": bracket, "rung": rung / END,
                                              "kept": len(good), "of": len(good) + len(bad)}

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        # A resumed sweep hands this new scheduler its trials that ended before too: one in a
        # bracket would never reach the rung, and the bracket would wait for it for ever.
        if trial.status == Trial.TERMINATED:
            return
        super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if self._time_attr not in result:  # a report before the first `progress`: nothing to place yet
            return TrialScheduler.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)


class _ClipToSpace:
    """PBT's explore step, after Ray's: continuous fields back within their domain's bounds (Ray
    multiplies them by a perturbation factor with no bound). Picklable: Tune pickles the scheduler."""

    def __init__(self, bounds: Mapping[str, tuple[float, float]]) -> None:
        self.bounds = dict(bounds)

    def __call__(self, config: dict) -> dict:
        params = config.get("params", {})
        for key, (low, high) in self.bounds.items():
            if key in params:
                value = min(max(params[key], low), high)
                params[key] = int(round(value)) if isinstance(params[key], int) else float(value)
        return config


class Pbt(PopulationBasedTraining):
    """Ray's PBT on `progress_pct`, mutating `config['params']`.

    It marks each trial's config with `pbt`: the fields it may mutate (`mutable`, which the trial
    leaves out of its checkpoints' identity, so that a trial may continue another's checkpoint
    under changed hyperparameters) and the trial's exploits so far (`exploits`: from which trial,
    at which progress and step, to which params), which the trial records on its MLflow run. A
    trial at 100% is never perturbed: it finishes, and what `train` returned is recorded."""

    def __init__(self, *, mutations: Mapping[str, Any], bounds: Mapping[str, tuple[float, float]],
                 perturbation_interval: float, burn_in_period: float, quantile_fraction: float,
                 resample_probability: float, perturbation_factors: tuple[float, ...], synch: bool) -> None:
        super().__init__(time_attr="progress_pct", perturbation_interval=perturbation_interval * END,
                         burn_in_period=burn_in_period * END, hyperparam_mutations={"params": dict(mutations)},
                         quantile_fraction=quantile_fraction, resample_probability=resample_probability,
                         perturbation_factors=tuple(perturbation_factors), custom_explore_fn=_ClipToSpace(bounds),
                         # A report without the objective (a workload that evaluates now and then) is no error.
                         require_attrs=False, synch=synch)
        self.mutable = sorted(mutations)
        self.exploits: dict[str, list[dict[str, Any]]] = {}
        """Trial id -> its exploits, as recorded in its config."""

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        super().on_trial_add(tune_controller, trial)
        trial.config.setdefault("pbt", {"mutable": self.mutable, "exploits": []})

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if float(result.get(self._time_attr, 0.0)) >= END - 1e-9:
            return TrialScheduler.CONTINUE
        before = self._next_perturbation_sync
        action = super().on_trial_result(tune_controller, trial, result)
        if self._synch and self._next_perturbation_sync != before:
            # After a perturbation Ray moves the next one to max(next + interval, the furthest
            # trial's time). When every trial is that far (a resumed sweep, whose new scheduler
            # starts at the first interval while its trials continue from their checkpoints),
            # none is behind it, so none is chosen to run and the sweep waits for ever.
            furthest = max(s.last_train_time for s in self._trial_state.values())
            if self._next_perturbation_sync <= furthest:
                self._next_perturbation_sync = furthest + self._perturbation_interval
        return action

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        trial = super().choose_trial_to_run(tune_controller)
        if trial is None and self._synch and self._waiting_on_nobody(tune_controller):
            self._perturb_the_waiting(tune_controller)
            trial = super().choose_trial_to_run(tune_controller)
        return trial

    def _waiting_on_nobody(self, tune_controller: Any) -> bool:
        """Every live trial is paused at or past the sync point, so none will report there.

        Ray perturbs the population when the last trial behind the sync point reports at it. A
        trial that ends before (its own budget, a metric bar it passed, an error) never does: the
        others, paused at the sync point, would wait for it for ever, and Ray's `choose_trial_to_run`
        picks only trials behind that point."""
        live = [t for t in tune_controller.get_live_trials() if t.status != Trial.ERROR]
        return bool(live) and all(t.status == Trial.PAUSED and t in self._trial_state
                                  and self._trial_state[t].last_train_time >= self._next_perturbation_sync
                                  for t in live)

    def _perturb_the_waiting(self, tune_controller: Any) -> None:
        """What Ray does when the last trial reaches the sync point: the paused trials of the lower
        quantile exploit those of the upper one, and the next sync point is set."""
        lower, upper = self._quantiles()
        waiting = list(tune_controller.get_live_trials())
        middle = [t for t in waiting if t not in lower and t not in upper]
        for t in upper + middle + lower:  # the strong saved before the weak copy them, as Ray orders it
            self._trial_state[t].last_perturbation_time = self._trial_state[t].last_train_time
            self._checkpoint_or_exploit(t, tune_controller, upper, lower)
        furthest = max(self._trial_state[t].last_train_time for t in waiting)
        self._next_perturbation_sync = max(self._next_perturbation_sync + self._perturbation_interval,
                                           furthest + self._perturbation_interval)

    def _get_new_config(self, trial: Any, trial_to_clone: Any) -> tuple[dict, dict]:
        new_config, operations = super()._get_new_config(trial, trial_to_clone)
        source = self._trial_state[trial_to_clone].last_result or {}
        # The exploiting trial's own history, not the one copied with the clone's config.
        exploits = list((trial.config.get("pbt") or {}).get("exploits", [])) + [{
            "from": trial_to_clone.trial_id,
            "at": float(source.get(self._time_attr, float("nan"))) / END,
            "from_step": int(source["step"]) if "step" in source else None,
            "params": {k: new_config["params"].get(k) for k in self.mutable},
        }]
        new_config["pbt"] = {"mutable": self.mutable, "exploits": exploits}
        self.exploits[trial.trial_id] = exploits
        return new_config, operations
