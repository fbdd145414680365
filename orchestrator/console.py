"""Console progress: a periodic line with step, progress, loss and throughput while a run trains."""

from __future__ import annotations

import math
import sys
import time
from typing import Mapping, TextIO


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
