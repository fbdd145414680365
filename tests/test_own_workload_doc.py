"""docs/own-workload.md, run: from `ladder new` to a collapse sweep, in a folder outside the repo.

Every ```console block's `$ ladder ...` commands run in order, and every ```python block that
starts with `# file: PATH` is written to PATH first, as a reader would. The commands run through
the `ladder` entry point (`orchestrator.commands.cli.main`) in this process, on one local Ray started from
the project folder as `ladder` starts it: the package must be found by ladder itself (the project
folder is not on this process's `sys.path`, as it is not under the `ladder` console script), and
by the Tune trials it starts, in Ray's worker processes. Each command must exit 0 and print every
line the doc shows, numbers, trial ids and paths aside (a shown line that ends with `...` matches
any ending). The ```bash blocks (pip, ray job submit) run elsewhere:
tests/orchestrator/test_registry.py installs a plugin's metadata, tests/test_cluster_job.py submits
a `ladder new` package as a job to a two-node cluster.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys

import pytest

from conftest import REPO

DOC = REPO / "docs" / "own-workload.md"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def steps(text: str) -> list[dict]:
    """The doc's runnable steps in order: files to write and commands with their shown output."""
    out = []
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```", text, flags=re.S | re.M):
        if lang == "python" and body.startswith("# file: "):
            out.append({"kind": "file", "path": body.splitlines()[0][len("# file: "):].strip(), "text": body})
        elif lang == "console":
            for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
                command, _, shown = chunk.partition("\n")
                assert command.startswith("ladder "), f"a console block runs ladder commands only: {command!r}"
                out.append({"kind": "command", "command": command.strip(), "shown": shown.splitlines()})
    return out


def normal(line: str) -> str:
    line = re.sub(r"(/[\w.@+-]+)+/?", "PATH", line)  # absolute paths
    line = re.sub(r"\b[0-9a-f]{5}_\d{5}\b", "TRIAL", line)  # Tune trial ids
    line = re.sub(r"\b[0-9a-f]{32}\b", "RUNID", line)  # MLflow run ids
    line = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return " ".join(line.split())


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The reader's project folder, current, with a local Ray started from it (as `ladder` would)."""
    import ray

    project = tmp_path / "project"  # outside the repo, as a user's project is
    project.mkdir()
    monkeypatch.chdir(project)
    assert str(project) not in sys.path and "" not in sys.path
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
             object_store_memory=100 * 2**20)
    try:
        yield project
    finally:
        ray.shutdown()
        sys.path[:] = [p for p in sys.path if p != str(project)]  # ladder put it there to find mylab


def test_the_doc_runs_as_written(project):
    from orchestrator.commands.cli import main

    plan = steps(DOC.read_text())
    commands = [s["command"] for s in plan if s["kind"] == "command"]
    assert any(c.startswith("ladder new") for c in commands) and any("collapse" in c for c in commands)
    for step in plan:
        if step["kind"] == "file":
            path = project / step["path"]
            assert path.parent.is_dir(), f"{step['path']}: the doc writes it before `ladder new` made its folder"
            path.write_text(step["text"])
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = main(shlex.split(step["command"])[1:])
        printed = out.getvalue()
        assert rc == 0, f"$ {step['command']} exited {rc}:\n{printed[-4000:]}"
        lines = [normal(x) for x in printed.splitlines()]
        for expected in step["shown"]:
            want = normal(expected)
            if not want:
                continue
            found = (any(line.startswith(want[:-3].rstrip()) for line in lines) if want.endswith("...")
                     else want in lines)
            assert found, f"$ {step['command']}: the doc shows {expected!r}; the command printed:\n{printed[-3000:]}"
