"""The sweep's console view, fed fake trial states on a fake clock: rows, totals over the sweep's
real trial count, best so far, ETA, the plain-line mode's throttling, the redrawn table. No Ray."""

from __future__ import annotations

import io
import math
import os

import pytest
from rich.console import Console

from orchestrator.runners.console import SweepView, quiet_tune, stop_reason, trial_state


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain(total=6, scheduler="asha", mode="min", every_s=5.0):
    clock, out = Clock(), io.StringIO()
    view = SweepView("lr", total, "eval/loss", mode, scheduler=scheduler, stream=out, live=False, every_s=every_s,
                     clock=clock)
    return view, clock, out


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def render(view: SweepView, width: int = 160) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(view.table())
    return console.file.getvalue()


def test_plain_mode_prints_one_line_per_trial_end_and_counts_against_the_sweeps_real_total():
    view, clock, out = plain()
    for i, lr in enumerate((0.01, 0.02)):  # Tune has created two of the six trials
        view.update(f"t{i}", params={"lr": lr}, state="running", progress=0.0)
    view.update("t0", progress=1.0, objective=2.01)
    view.update("t0", state="finished")
    view.update("t1", progress=0.2, objective=2.37, state="stopped", why=stop_reason("asha", None, {"reduction_factor": 2}))
    assert lines(out) == [
        "ladder: trial t0 finished: eval/loss 2.0100  [1/6 done]",
        "ladder: trial t1 stopped at 20% (asha: not in the best 1/2 at its rung): eval/loss 2.3700  [2/6 done]",
    ]
    view.close()
    assert lines(out)[-1].startswith("ladder: sweep lr: 2/6 done (1 stopped), 0 running, 4 pending  best eval/loss 2.0100 "
                                     "(t0: lr=0.01)  eta ")


def test_status_lines_are_throttled_and_skipped_when_nothing_changed():
    view, clock, out = plain(every_s=5.0)
    view.update("t0", params={"lr": 0.01}, state="running", progress=0.0)
    view.tick()
    assert len(lines(out)) == 1 and "0/6 done, 1 running, 5 pending" in lines(out)[0]
    for step in range(1, 5):  # a report a second: no new line before 5 s
        clock.now += 1
        view.update("t0", progress=step / 10, objective=3.0 - step / 10)
        view.tick()
    assert len(lines(out)) == 1
    clock.now += 1
    view.tick()
    assert len(lines(out)) == 2
    clock.now += 60
    view.tick()  # nothing reported since the last line
    assert len(lines(out)) == 2
    view.close()  # and nothing new to say at the end either
    assert len(lines(out)) == 2


def test_best_is_the_best_trial_that_trained_to_the_end():
    view, clock, out = plain(mode="min")
    view.update("a", state="running")
    view.update("a", progress=1.0, objective=2.5, state="finished")
    view.update("b", state="running")
    view.update("b", progress=0.3, objective=2.0, state="stopped")  # lower, but early in training
    view.update("c", state="running", progress=0.9, objective=1.0)  # still running
    assert view.best().trial_id == "a"
    view.update("d", state="running")
    view.update("d", progress=1.0, objective=2.4, state="finished")
    assert view.best().trial_id == "d"
    maxed, _, _ = plain(mode="max")
    for tid, value in (("a", 0.7), ("b", 0.9)):
        maxed.update(tid, state="running")
        maxed.update(tid, progress=1.0, objective=value, state="finished")
    assert maxed.best().trial_id == "b"


def test_eta_is_the_work_left_over_the_rate_so_far_with_early_stopping_counted():
    view, clock, _ = plain(total=4)
    assert math.isnan(view.eta_s())  # nothing has run
    view.update("t0", state="running", progress=0.0)
    view.update("t1", state="running", progress=0.0)
    clock.now += 10
    view.update("t0", progress=0.5)
    view.update("t1", progress=0.5)
    # 1.0 budget done in 10 s; left: 2 x 0.5 running + 2 pending x a whole budget (none ended yet).
    assert view.eta_s() == pytest.approx(30.0)
    clock.now += 10
    view.update("t0", progress=1.0, state="finished")
    view.update("t1", state="stopped")  # stopped at 0.5
    # 1.5 in 20 s; each pending trial is expected to use the ended trials' mean, 0.75.
    assert view.eta_s() == pytest.approx(2 * 0.75 / (1.5 / 20))
    assert "eta 20s" in view.status_line()
    for tid in ("t2", "t3"):
        view.update(tid, state="running", progress=0.0)
        view.update(tid, progress=1.0, state="finished")
    assert view.eta_s() == 0.0 and "eta" not in view.status_line() and "4/4 done" in view.status_line()


def test_a_resumed_sweep_counts_what_ended_before_without_announcing_it_or_taking_it_as_its_rate():
    view, clock, out = plain(total=3)
    view.update("t0", params={"lr": 0.1}, state="finished", progress=1.0, objective=2.0)  # seen ended
    view.update("t1", state="running", progress=0.6)  # restored from its checkpoint at 0.6
    assert lines(out) == [] and view.done() == 1
    clock.now += 10
    view.update("t1", progress=0.8)
    assert view.eta_s() == pytest.approx((0.2 + 1.0) / (0.2 / 10))  # the rate is this invocation's 0.2 in 10 s
    view.update("t1", state="finished", progress=1.0, objective=1.9)
    assert lines(out) == ["ladder: trial t1 finished: eval/loss 1.9000  [2/3 done]"]


def test_the_table_has_a_row_per_trial_with_state_progress_objective_prediction_and_why():
    view, clock, _ = plain(total=5, scheduler="collapse")
    view.update("t0", params={"tau": 0.5}, state="running", progress=0.0)
    view.update("t0", progress=0.42, objective=3.1, predicted=2.95)
    decision = {"action": "stop", "predicted": 3.3, "cutoff": 3.0, "rung": 0.3, "diverged": False}
    view.update("t1", params={"tau": 2.0}, state="running")
    view.update("t1", progress=0.3, objective=3.4, predicted=3.3, state=trial_state("TERMINATED", 0.3, decision=decision,
                                                                                      scheduler="collapse"),
                why=stop_reason("collapse", decision))
    view.update("t2", params={"tau": 8.0}, state="running")
    view.update("t2", progress=0.1, state="diverged", why=stop_reason("collapse", {"diverged": True}))
    view.update("t3", params={"tau": 1.0}, state="pending")
    text = render(view)
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ t")}
    assert set(rows) == {"t0", "t1", "t2", "t3"}
    assert "running" in rows["t0"] and "42%" in rows["t0"] and "3.1000" in rows["t0"] and "2.9500" in rows["t0"]
    assert "stopped" in rows["t1"] and "30%" in rows["t1"] and "predicted final 3.3 > cutoff 3 at rung 30%" in rows["t1"]
    assert "diverged" in rows["t2"] and "non-finite loss" in rows["t2"]
    assert "pending" in rows["t3"] and "tau=1" in rows["t3"]
    assert "predicted final" in text and "why stopped" in text
    assert "2/5 done (1 stopped, 1 diverged), 1 running, 2 pending" in text  # t3 and the one not created yet
    assert "predicted final" not in render(plain(scheduler="asha")[0])  # only the collapse scheduler predicts


def test_a_long_table_keeps_the_running_and_the_best_ended_trials():
    view, clock, _ = plain(total=20)
    view.max_rows = 5
    for i in range(10):
        view.update(f"t{i:02d}", state="running", progress=0.0)
        if i < 8:
            view.update(f"t{i:02d}", progress=1.0, objective=float(10 - i), state="finished")
    kept = [t.trial_id for t in view.rows()]
    assert kept == ["t05", "t06", "t07", "t08", "t09"]  # the two running, then the three lowest losses
    assert "… 5 more" in render(view)


def test_the_terminal_view_redraws_in_place_and_prints_no_lines_of_its_own():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, clock = Terminal(), Clock()
    view = SweepView("lr", 2, "eval/loss", stream=out, live=True, clock=clock)
    view.update("t0", params={"lr": 0.01}, state="running", progress=0.0)
    view.tick()
    clock.now += 1
    view.update("t0", progress=1.0, objective=2.0, state="finished")
    view.close()
    drawn = out.getvalue()
    assert "t0" in drawn and "\x1b[" in drawn  # drawn with cursor control
    assert "ladder: trial" not in drawn and drawn.endswith("ladder: sweep lr: 1/2 done, 0 running, 1 pending  best eval/loss "
                                                           "2.0000 (t0: lr=0.01)  eta 1s\n")


def test_trial_states_and_stop_reasons():
    assert trial_state("PENDING", math.nan) == "pending"
    assert trial_state("RUNNING", 0.4) == "running"
    assert trial_state("PAUSED", 0.4) == "paused"
    assert trial_state("ERROR", 0.4) == "failed"
    assert trial_state("TERMINATED", 1.0, scheduler="asha") == "finished"
    assert trial_state("TERMINATED", 0.4, scheduler="asha") == "stopped"  # ASHA keeps no record: a short end is one
    assert trial_state("TERMINATED", 0.4, scheduler="median") == "stopped"
    assert trial_state("TERMINATED", 0.4, scheduler="fifo") == "finished"
    assert trial_state("TERMINATED", 0.4, scheduler="collapse", decision={"action": "continue"}) == "finished"
    assert trial_state("TERMINATED", 0.4, scheduler="collapse", decision={"action": "stop"}) == "stopped"
    assert trial_state("TERMINATED", 0.2, scheduler="collapse", decision={"action": "stop", "diverged": True}) == "diverged"
    assert stop_reason("median", None) == "median rule: worse than the other trials' median"
    assert stop_reason("asha", None, {"reduction_factor": 3}) == "asha: not in the best 1/3 at its rung"
    with pytest.raises(ValueError, match="unknown trial state 'done'"):
        plain()[0].update("t0", state="done")


def test_quiet_tune_selects_tunes_silent_reporter_only_inside():
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    with quiet_tune():
        assert os.environ["RAY_AIR_NEW_OUTPUT"] == "0"
    assert os.environ.get("RAY_AIR_NEW_OUTPUT") == before
    with quiet_tune(False):
        assert os.environ.get("RAY_AIR_NEW_OUTPUT") == before
