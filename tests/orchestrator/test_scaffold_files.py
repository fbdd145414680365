"""`ladder new` keeps what ladder writes beside a project (run folders, the MLflow store and its
artifacts, a virtualenv) out of git and out of `ray job submit --working-dir .`."""

from __future__ import annotations

import pytest

from orchestrator.commands import scaffold
from orchestrator.commands.cli import main

EXPECTED = {"ladder-runs/", "mlruns.db", "mlartifacts/", ".venv/"}


def _patterns(path) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def test_new_writes_gitignore_and_rayignore_where_commands_run(workdir, capsys):
    assert main(["new", "sparse_moe", "--dir", "mylab"]) == 0
    out = capsys.readouterr().out
    for name in (".gitignore", ".rayignore"):
        path = workdir / name
        assert path.is_file(), f"ladder new wrote no {name}"
        patterns = _patterns(path)
        assert EXPECTED <= patterns, patterns
    assert "wrote .gitignore, .rayignore" in out
    assert not (workdir / "mylab" / ".gitignore").exists()  # beside the runs, not in the package


def test_existing_files_are_kept_and_what_they_lack_is_named(workdir, capsys):
    (workdir / ".gitignore").write_text("*.pyc\n/ladder-runs\n")
    assert main(["new", "sparse_moe"]) == 0
    out = capsys.readouterr().out
    assert (workdir / ".gitignore").read_text() == "*.pyc\n/ladder-runs\n"  # left as it was
    assert "note: .gitignore does not list mlruns.db, mlartifacts/, .venv/: add them" in out
    assert EXPECTED <= _patterns(workdir / ".rayignore")  # absent, so written
    # A second workload in the same project changes nothing and notes nothing new.
    assert scaffold.write_ignore_files(workdir) == ([], {".gitignore": ["mlruns.db", "mlartifacts/", ".venv/"]})


def test_a_package_outside_the_current_folder_gets_them_beside_it(workdir, tmp_path_factory, capsys):
    elsewhere = tmp_path_factory.mktemp("project")
    assert main(["new", "sparse_moe", "--dir", str(elsewhere)]) == 0
    assert EXPECTED <= _patterns(elsewhere / ".rayignore")
    assert not (workdir / ".gitignore").exists()


def test_ray_leaves_them_out_of_a_jobs_working_dir(workdir):
    """Read by Ray's own matcher, the one `ray job submit --working-dir .` applies to .rayignore
    and .gitignore (a private function: skipped where a Ray no longer has it)."""
    packaging = pytest.importorskip("ray._private.runtime_env.packaging")
    matcher = getattr(packaging, "_get_ignore_file", None)
    if matcher is None:
        pytest.skip("this Ray reads ignore files another way")
    assert main(["new", "sparse_moe", "--dir", "mylab"]) == 0
    for name in (".rayignore", ".gitignore"):
        excluded = matcher(workdir, name)
        for path in ("mlruns.db", "ladder-runs/sparse_moe/20260101-000000-abc123/run.json", "mlartifacts/1/abc/a.json",
                     ".venv/bin/python"):
            assert excluded(workdir / path), f"{name} lets {path} into the job"
        for path in ("mylab/sparse_moe/workload.py", "mylab/sparse_moe/sweep.py"):
            assert not excluded(workdir / path), f"{name} keeps {path} out of the job"
