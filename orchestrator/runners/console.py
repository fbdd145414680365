"""Console progress: a periodic line with step, progress, loss and throughput while a run trains,
and the view of a running sweep (`SweepView`): a table redrawn in place on a terminal, plain lines
elsewhere."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, TextIO


def _si(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def _eta(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class ProgressSink:
    """Prints at most one line every `every_s` seconds, and always the final one (progress = 1)."""

    def __init__(self, name: str, *, every_s: float = 2.0, stream: TextIO | None = None) -> None:
        self.name = name
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self._first: tuple[float, float] | None = None  # (time, progress) at the first report
        self._last_print = -math.inf
        self._latest: dict[str, float] = {}

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._latest.update(metrics)
        progress = self._latest.get("progress", math.nan)
        now = time.monotonic()
        if self._first is None and math.isfinite(progress):
            self._first = (now, progress)
        final = progress >= 1.0 - 1e-9
        if not final and now - self._last_print < self.every_s:
            return
        self._last_print = now
        total = f"/{round(step / progress)}" if progress and progress > 0 else ""
        parts = [f"[{self.name}] step {step}{total}"]
        if math.isfinite(progress):
            parts.append(f"{100 * progress:5.1f}%")
        for key, label in (("train/loss", "loss"), ("eval/loss", "eval")):
            if key in self._latest:
                parts.append(f"{label} {self._latest[key]:.4f}")
        if "perf/tokens_per_s" in self._latest:
            parts.append(f"tok/s {_si(self._latest['perf/tokens_per_s'])}")
        if self._first is not None and progress > self._first[1]:
            # Rate since the first report, so start-up time does not inflate the estimate.
            rate = (progress - self._first[1]) / max(now - self._first[0], 1e-9)
            parts.append(f"eta {_eta((1 - progress) / rate)}")
        # write(), not print(): Ray Train replaces print() in workers with a logger that tees
        # to the console, which would show every line twice.
        self.stream.write("  ".join(parts) + "\n")
        self.stream.flush()

    def log_artifact(self, path: str) -> None:
        pass

    def flush(self) -> None:
        pass


# -- following a sweep ---------------------------------------------------------------------------

PENDING, RUNNING, PAUSED = "pending", "running", "paused"
FINISHED, STOPPED, DIVERGED, FAILED = "finished", "stopped", "diverged", "failed"
ENDED = (FINISHED, STOPPED, DIVERGED, FAILED)
STATES = (PENDING, RUNNING, PAUSED) + ENDED
_STYLE = {RUNNING: "cyan", PAUSED: "cyan", FINISHED: "green", STOPPED: "yellow", DIVERGED: "red", FAILED: "bold red"}


def format_params(params: Mapping[str, Any]) -> str:
    """`lr=0.01, seed=1`: floats to 3 significant digits."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _num(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.4f}"


def _finite(x: Any) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


def trial_state(status: str, progress: float, *, error: bool = False, decision: Mapping[str, Any] | None = None,
                scheduler: str = "fifo") -> str:
    """A Tune trial's state in the sweep's words, from Tune's status ('PENDING', 'RUNNING',
    'PAUSED', 'TERMINATED', 'ERROR'), its training fraction, and the collapse scheduler's decision.

    A trial that ended cleanly short of its budget was stopped by the scheduler: the collapse
    scheduler says so in its decisions; Ray's ASHA and median rule keep no record, so for them an
    early clean end is the record."""
    decision = decision or {}
    if status == "ERROR" or error:
        return FAILED
    if status == "RUNNING":
        return RUNNING
    if status == "PAUSED":
        return PAUSED
    if status != "TERMINATED":
        return PENDING
    if decision.get("diverged"):
        return DIVERGED
    short = not progress >= 1 - 1e-9  # NaN (never reported) counts as short
    if short and (decision.get("action") == "stop" or scheduler in ("asha", "median")):
        return STOPPED
    return FINISHED


def stop_reason(scheduler: str, decision: Mapping[str, Any] | None, options: Mapping[str, Any] | None = None) -> str:
    """Why a scheduler stopped a trial, in one short phrase. `options`: the scheduler's options with
    its table's defaults filled in (`orchestrator.sweep.resolved_options`)."""
    d = decision or {}
    if d.get("diverged"):
        return "diverged: non-finite loss"
    if scheduler == "collapse":
        if d.get("predicted") is not None and d.get("cutoff") is not None:
            rung = f" at rung {d['rung']:.0%}" if d.get("rung") is not None else ""
            return f"predicted final {d['predicted']:.4g} > cutoff {d['cutoff']:.4g}{rung}"
        return d.get("reason") or "collapse scheduler"
    if scheduler == "asha":
        rf = (options or {})["reduction_factor"]  # the resolved options: the table's default where unset
        return f"asha: not in the best 1/{rf:g} at its rung"
    if scheduler == "hyperband":
        if d.get("rung") is not None:
            return (f"hyperband: not in the best {d['kept']} of {d['of']} at rung {d['rung']:.0%} "
                    f"of bracket {d['bracket']}")
        return "hyperband: not kept at its rung"
    if scheduler == "median":
        return "median rule: worse than the other trials' median"
    return "stopped"


@dataclass
class TrialView:
    trial_id: str
    params: Mapping[str, Any] = field(default_factory=dict)
    state: str = PENDING
    progress: float = math.nan
    """Training fraction, 0..1."""
    objective: float = math.nan
    """The objective's latest value."""
    predicted: float | None = None
    """The collapse scheduler's predicted final objective."""
    why: str = ""
    """Why the trial was stopped, or how it failed."""
    first_progress: float | None = None
    """The first progress this invocation saw (a resumed trial's earlier work is not part of its rate)."""


class SweepView:
    """What a sweep is doing: one row per trial (state, progress, objective, predicted final,
    why stopped), the totals over the sweep's real trial count, the best trial so far, an ETA.

    On a terminal it is a table redrawn in place (rich); otherwise (CI, `ray job logs`, a pipe) it
    prints one line per trial end and at most one status line every `every_s` seconds. Feed it
    with `update`, call `tick` often (it throttles itself), `close` at the end."""

    def __init__(self, name: str, total: int, metric: str, mode: str = "min", *, scheduler: str = "fifo",
                 stream: TextIO | None = None, live: bool | None = None, every_s: float = 10.0,
                 clock: Any = time.monotonic, max_rows: int | None = None) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.name, self.total, self.metric, self.mode, self.scheduler = name, int(total), metric, mode, scheduler
        self.stream = stream or sys.stderr
        if live is None:
            live = _is_terminal(self.stream) and _is_terminal(sys.stdout)
        self.live = live
        self.every_s = every_s
        self.clock = clock
        self.max_rows = max_rows
        self.trials: dict[str, TrialView] = {}
        self._started: float | None = None  # when the first trial of this invocation ran
        self._last_line = -math.inf
        self._changed = False
        self._live: Any = None
        self._last_draw = -math.inf

    # -- feeding ------------------------------------------------------------------------------

    def update(self, trial_id: str, *, params: Mapping[str, Any] | None = None, state: str | None = None,
               progress: float | None = None, objective: float | None = None, predicted: float | None = None,
               why: str | None = None) -> None:
        if state is not None and state not in STATES:
            raise ValueError(f"unknown trial state {state!r}; one of {', '.join(STATES)}")
        t = self.trials.get(trial_id)
        # Announced when it ends while watched; a trial first seen ended (it ended before a
        # resumed sweep's invocation) is counted, not announced.
        watched = t is not None and t.state not in ENDED
        if t is None:
            t = self.trials[trial_id] = TrialView(trial_id)
        if params is not None:
            t.params = dict(params)
        if progress is not None and math.isfinite(_finite(progress)):
            t.progress = float(progress)
            if t.first_progress is None:
                t.first_progress = t.progress
        if objective is not None and math.isfinite(_finite(objective)):
            t.objective = float(objective)
        if predicted is not None and math.isfinite(_finite(predicted)):
            t.predicted = float(predicted)
        if why is not None:
            t.why = why
        if state is not None:
            t.state = state
            if state in (RUNNING, PAUSED) and self._started is None:
                self._started = self.clock()
        self._changed = True
        if watched and t.state in ENDED:
            self._ended(t)

    def _ended(self, t: TrialView) -> None:
        if self.live:
            self.tick(force=True)
        else:
            self._write(self.end_line(t))

    # -- what it says -------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Trials per state; trials Tune has not created yet count as pending."""
        n = {s: 0 for s in STATES}
        for t in self.trials.values():
            n[t.state] += 1
        n[PENDING] += max(0, self.total - len(self.trials))
        return n

    def done(self) -> int:
        n = self.counts()
        return sum(n[s] for s in ENDED)

    def best(self) -> TrialView | None:
        """The best trial that trained to the end (a stopped trial's objective is from earlier in training)."""
        finished = [t for t in self.trials.values() if t.state == FINISHED and math.isfinite(t.objective)]
        if not finished:
            return None
        pick = min if self.mode == "min" else max
        return pick(finished, key=lambda t: t.objective)

    def eta_s(self) -> float:
        """Seconds left: the training fractions still to run over the rate since the first trial
        started. A trial not yet run is expected to use what the ended trials used on average
        (early stopping included), a whole budget before any has ended."""
        if self._started is None:
            return math.nan
        elapsed = self.clock() - self._started
        work = 0.0
        ended_work: list[float] = []
        remaining = 0.0
        for t in self.trials.values():
            p = t.progress if math.isfinite(t.progress) else 0.0
            work += max(0.0, p - (t.first_progress or 0.0))
            if t.state in ENDED:
                ended_work.append(p)
            elif t.state != PENDING:
                remaining += max(0.0, 1.0 - p)
        pending = self.counts()[PENDING]
        remaining += pending * (sum(ended_work) / len(ended_work) if ended_work else 1.0)
        if remaining <= 0:
            return 0.0
        if work <= 0 or elapsed <= 0:
            return math.nan
        return remaining / (work / elapsed)

    def totals(self) -> str:
        n = self.counts()
        ended = ", ".join(f"{n[s]} {s}" for s in (STOPPED, DIVERGED, FAILED) if n[s])
        parts = [f"{self.done()}/{self.total} done" + (f" ({ended})" if ended else "")]
        active = n[RUNNING] + n[PAUSED]
        parts.append(f"{active} running" + (f" ({n[PAUSED]} paused)" if n[PAUSED] else ""))
        parts.append(f"{n[PENDING]} pending")
        text = ", ".join(parts)
        best = self.best()
        text += f"  best {self.metric} {_num(best.objective)} ({best.trial_id}" + (
            f": {format_params(best.params)})" if best.params else ")") if best else f"  best {self.metric} -"
        eta = self.eta_s()
        if self.done() < self.total:
            text += f"  eta {_eta(eta)}"
        return text

    def status_line(self) -> str:
        return f"ladder: sweep {self.name}: {self.totals()}"

    def end_line(self, t: TrialView) -> str:
        at = f" at {t.progress:.0%}" if math.isfinite(t.progress) and t.state != FINISHED else ""
        why = f" ({t.why})" if t.why and t.state != FINISHED else ""
        return (f"ladder: trial {t.trial_id} {t.state}{at}{why}: {self.metric} {_num(t.objective)}  "
                f"[{self.done()}/{self.total} done]")

    def rows(self) -> list[TrialView]:
        """The trials the table lists: every trial Tune has created, in creation order; past
        `max_rows`, the running ones and the best ended ones."""
        listed = sorted(self.trials.values(), key=lambda t: t.trial_id)
        if self.max_rows is None or len(listed) <= self.max_rows:
            return listed
        active = [t for t in listed if t.state not in ENDED]
        sign = 1 if self.mode == "min" else -1
        ended = sorted((t for t in listed if t.state in ENDED),
                       key=lambda t: sign * t.objective if math.isfinite(t.objective) else math.inf)
        keep = {t.trial_id for t in (active + ended)[: self.max_rows]}
        return [t for t in listed if t.trial_id in keep]

    def table(self) -> Any:
        """The view as a rich renderable."""
        from rich.table import Table
        from rich.text import Text

        predicted = self.scheduler == "collapse"
        table = Table(title=f"sweep {self.name} ({self.scheduler}, objective {self.metric} {self.mode})",
                      title_justify="left", caption=self.totals(), caption_justify="left", expand=False)
        for col, kw in (("trial", {}), ("params", {"overflow": "fold"}), ("state", {}), ("progress", {"justify": "right"}),
                        (self.metric, {"justify": "right"})):
            table.add_column(col, **kw)
        if predicted:
            table.add_column("predicted final", justify="right")
        table.add_column("why stopped", overflow="fold")
        rows = self.rows()
        for t in rows:
            cells = [t.trial_id, format_params(t.params), Text(t.state, style=_STYLE.get(t.state, "")),
                     f"{t.progress:.0%}" if math.isfinite(t.progress) else "-", _num(t.objective)]
            if predicted:
                cells.append(_num(t.predicted))
            cells.append(t.why if t.state in (STOPPED, DIVERGED, FAILED) else "")
            table.add_row(*cells)
        hidden = len(self.trials) - len(rows)
        if hidden:
            table.add_row(f"… {hidden} more", *[""] * (len(table.columns) - 1))
        return table

    # -- output -------------------------------------------------------------------------------

    def start(self) -> None:
        if self.live and self._live is None:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream)
            if self.max_rows is None:
                self.max_rows = max(5, console.size.height - 8)
            self._live = Live(console=console, auto_refresh=False, transient=True, get_renderable=self.table)
            self._live.start()

    def tick(self, force: bool = False) -> None:
        """Redraw (a terminal, at most twice a second) or print a status line (otherwise, at
        most every `every_s` seconds, and only when something changed)."""
        now = self.clock()
        if self.live:
            if self._live is None:
                self.start()
            if force or now - self._last_draw >= 0.5:
                self._last_draw = now
                self._live.refresh()
            return
        if force or (self._changed and now - self._last_line >= self.every_s):
            self._last_line = now
            self._changed = False
            self._write(self.status_line())

    def close(self) -> None:
        """Stop redrawing (the table goes: the command prints its summary) and print the final status line."""
        if self._live is not None:
            self._live.stop()
            self._live = None
            self._write(self.status_line())
        elif not self.live and (self._changed or self._last_line == -math.inf):
            self.tick(force=True)

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def quiet_tune(quiet: bool = True) -> Iterator[None]:
    """Within it, Ray Tune prints nothing of its own (`RunConfig(verbose=0)` alone still prints its
    configuration box, the results folder and a TensorBoard hint): its legacy reporter, which
    `RAY_AIR_NEW_OUTPUT=0` selects, prints nothing at verbosity 0. Tune's result files
    (result.json, progress.csv) are still written; TensorBoard events are not (MLflow holds the curves)."""
    if not quiet:
        yield
        return
    with environ("RAY_AIR_NEW_OUTPUT", "0"):
        yield


@contextlib.contextmanager
def environ(name: str, value: str) -> Iterator[None]:
    """The environment variable `name` set to `value` for the block (Ray Tune reads some of its
    settings from the environment as it runs), and as it was afterwards."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
