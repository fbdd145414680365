"""docs/errors.md is the catalogue of bad input: every row is run here and must be refused
before anything starts (exit 2, nothing recorded) with the message the row shows."""

from __future__ import annotations

import re
import shlex

import pytest

from conftest import REPO
from orchestrator.commands.cli import main

DOC = (REPO / "docs" / "errors.md").read_text()


def _rows(section: str) -> list[tuple[str, str, str]]:
    body = DOC.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("Problem", "---") or set(cells[0]) <= {"-"}:
            continue
        spans = [re.fullmatch(r"`(.*)`", c) for c in cells[1:]]
        if all(spans):
            rows.append((cells[0], spans[0].group(1), spans[1].group(1)))
    return rows


SWEEP_ROWS = _rows("Sweep files")
COMMAND_ROWS = _rows("Commands")


def test_the_catalogue_is_complete():
    assert len(SWEEP_ROWS) >= 14 and len(COMMAND_ROWS) >= 11


def _refused(argv, workdir, capsys, message):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, f"{argv} exited {code}: {err}"
    assert message in err, f"documented message not produced:\n  doc: {message}\n  got: {err}"
    assert not (workdir / "mlruns.db").exists(), "a refused input recorded something"


@pytest.mark.parametrize("problem,body,message", SWEEP_ROWS, ids=[r[0] for r in SWEEP_ROWS])
def test_documented_sweep_errors(problem, body, message, workdir, capsys):
    path = workdir / "bad_sweep.py"
    path.write_text("from orchestrator.sweep import *\n" + body + "\n")
    _refused(["sweep", str(path)], workdir, capsys, message)


@pytest.mark.parametrize("problem,command,message", COMMAND_ROWS, ids=[r[0] for r in COMMAND_ROWS])
def test_documented_command_errors(problem, command, message, workdir, capsys):
    argv = shlex.split(command)
    assert argv[0] == "ladder"
    argv = [str(REPO / a) if a.startswith("sweeps/") else a for a in argv[1:]]
    _refused(argv, workdir, capsys, message)
