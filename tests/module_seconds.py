"""Seconds per test module, summed from a pytest JUnit XML report: the weights that order the suite.

`make test-durations` runs the suite as `make test` does, with `--junitxml`, then

    python tests/module_seconds.py REPORT.xml [--out tests/module_seconds.json] [--min-seconds 10]

writes each module's total (setup, call and teardown of its tests, so a module fixture counts
once) as JSON, heaviest first, modules under `--min-seconds` left out. tests/conftest.py reads the
file and runs the modules in that order (see MODULE_SECONDS there).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Mapping

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().with_name("module_seconds.json")
MIN_SECONDS = 10.0


def module_of(case: ET.Element, root: Path) -> str | None:
    """The test module (a path relative to `root`) a <testcase> belongs to: read from its
    classname (pytest's node id, dotted: `tests.orchestrator.test_trial.TestX`), the longest prefix
    that is a file under `root`; else its `file` attribute (junit_family=xunit1); else None."""
    parts = [p for p in (case.get("classname") or "").split(".") if p]
    for i in range(len(parts), 0, -1):
        candidate = "/".join(parts[:i]) + ".py"
        if (root / candidate).is_file():
            return candidate
    file = case.get("file")
    return Path(file).as_posix() if file else None


def module_seconds(report: str | Path, *, root: Path | None = None, min_seconds: float = MIN_SECONDS) -> dict[str, int]:
    """{module: whole seconds} of every module whose tests took at least `min_seconds` in
    `report`, heaviest first (ties by name); modules are paths under `root` (default: this
    repository). Raises ValueError for a report without test cases."""
    root = root or REPO
    totals: dict[str, float] = defaultdict(float)
    cases = 0
    for case in ET.parse(report).iter("testcase"):
        cases += 1
        module = module_of(case, root)
        if module is not None:
            totals[module] += float(case.get("time") or 0.0)
    if not cases:
        raise ValueError(f"{report} holds no test cases: did the test run start?")
    heavy = sorted(((m, s) for m, s in totals.items() if s >= min_seconds), key=lambda ms: (-ms[1], ms[0]))
    return {m: round(s) for m, s in heavy}


def write(seconds: Mapping[str, float], out: str | Path) -> None:
    Path(out).write_text(json.dumps(dict(seconds), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="pytest's --junitxml report of a test run")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON to write (default: %(default)s)")
    parser.add_argument("--min-seconds", type=float, default=MIN_SECONDS,
                        help="leave out modules faster than this (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        seconds = module_seconds(args.report, min_seconds=args.min_seconds)
    except (OSError, ValueError, ET.ParseError) as exc:
        print(f"module_seconds: cannot read {args.report}: {exc}; {args.out} left as it was", file=sys.stderr)
        return 1
    write(seconds, args.out)
    print(f"module_seconds: {len(seconds)} modules of {args.min_seconds:g} s or more -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
