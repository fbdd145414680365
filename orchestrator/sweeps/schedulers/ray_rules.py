"""Ray Tune's ASHA and median stopping rule, letting a trial that reached the end of its budget
finish.

Both rules may answer STOP to a trial's last report (ASHA at `max_t`, both at a rung or a
median comparison that falls on 100%). Tune then stops the trial inside that report, before
`train` has returned, so what it returned (the final metrics ladder records on the trial's run)
would be lost, and a resumed sweep would train the trial again. A trial at 100% has nothing left
to stop: these subclasses answer CONTINUE there and keep the rules' own decisions everywhere else.
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import AsyncHyperBandScheduler, MedianStoppingRule, TrialScheduler

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
