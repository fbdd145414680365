"""A run records which code of its workload it ran: the commit (with '-dirty' when the files differ
from it) of the git checkout the workload's module lives in, beside ladder's own version and commit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from orchestrator.commands import scaffold
from orchestrator.runners import registry
from orchestrator.runners.trial import open_run, workload_provenance
from orchestrator.tracking import sink as tracking

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(folder, *args) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A git checkout (in tmp_path) holding a `ladder new` workload, lab.prov_moe, importable from here."""
    root = tmp_path / "project"
    root.mkdir()
    git(root, "init", "-q")
    scaffold.new("prov_moe", root / "lab", cwd=root)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a workload")
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    _forget("lab")
    tracking.source_provenance.cache_clear()  # read once per process: each case here is a new checkout
    yield root
    _forget("lab")
    tracking.source_provenance.cache_clear()


def _forget(package: str) -> None:
    """Drop `package` from sys.modules: each test's checkout holds its own `lab`."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def _tags(tmp_path, workload: str) -> dict[str, str]:
    uri = f"sqlite:///{tmp_path / 'store' / 'mlruns.db'}"
    (tmp_path / "store").mkdir(exist_ok=True)
    w = registry.load(workload)
    run_id = open_run(workload, w.smoke(), experiment="provenance", run_name="r", uri=uri)
    return tracking.client(uri).get_run(run_id).data.tags


def test_a_run_records_the_commit_of_its_workloads_checkout(project, tmp_path):
    head = git(project, "rev-parse", "HEAD")
    tags = _tags(tmp_path, "lab.prov_moe")
    assert tags["workload.git.commit"] == head
    assert tags["workload.git.path"] == "lab/prov_moe"
    assert tags["workload.source"] == str((project / "lab" / "prov_moe").resolve())
    assert "ladder.version" in tags and "git.commit" in tags  # ladder's own, beside it
    assert tags["git.commit"] != head


def test_changed_or_untracked_code_marks_the_commit_dirty(project, tmp_path):
    head = git(project, "rev-parse", "HEAD")
    workload = project / "lab" / "prov_moe" / "workload.py"
    workload.write_text(workload.read_text() + "\n# changed after the commit\n")
    assert workload_provenance("lab.prov_moe")["workload.git.commit"] == f"{head}-dirty"

    git(project, "commit", "-q", "-am", "the change")
    tracking.source_provenance.cache_clear()
    assert workload_provenance("lab.prov_moe")["workload.git.commit"] == git(project, "rev-parse", "HEAD")

    # A module of the package that the commit does not hold is code the commit cannot rebuild ...
    (project / "lab" / "prov_moe" / "extra.py").write_text("X = 1\n")
    tracking.source_provenance.cache_clear()
    assert workload_provenance("lab.prov_moe")["workload.git.commit"].endswith("-dirty")
    # ... an untracked file elsewhere, or a non-source one (a run folder, bytecode), is not.
    (project / "lab" / "prov_moe" / "extra.py").unlink()
    (project / "notes.py").write_text("")
    (project / "lab" / "prov_moe" / "cache.bin").write_text("")
    tracking.source_provenance.cache_clear()
    assert not _tags(tmp_path, "lab.prov_moe")["workload.git.commit"].endswith("-dirty")


def test_a_workload_outside_any_checkout_records_its_source_only(tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    scaffold.new("loose_moe", plain, cwd=plain)
    monkeypatch.chdir(plain)
    monkeypatch.syspath_prepend(str(plain))
    tracking.source_provenance.cache_clear()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no checkout above tmp_path counts
    tags = _tags(tmp_path, "loose_moe")
    tracking.source_provenance.cache_clear()
    assert tags["workload.source"] == str((plain / "loose_moe").resolve())
    assert "workload.git.commit" not in tags and "workload.git.path" not in tags
