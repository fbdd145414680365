from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO
from orchestrator import registry


def test_registry_matches_workload_folders():
    folders = {p.parent.name for p in (REPO / "workloads").glob("*/__init__.py")}
    assert folders == set(registry.WORKLOADS)
    for name, module in registry.WORKLOADS.items():
        assert module == f"workloads.{name}"


def test_unknown_name_lists_known_ones_and_the_closest():
    with pytest.raises(registry.UnknownWorkload) as info:
        registry.check_name("celerity_ln")
    msg = str(info.value)
    assert "'celerity_ln'" in msg and "Closest match: 'celerity_lm'" in msg
    for name in registry.WORKLOADS:
        assert name in msg


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_paper_title_is_the_first_docstring_line(name):
    title = registry.paper_title(name)
    assert title and "http" in title, f"{name}: docstring must start with the paper title and link"


def test_listing_imports_no_workload_code():
    code = (
        "import sys; from orchestrator.cli import main; main(['list']);"
        "heavy = [m for m in ('torch', 'ray', 'transformers', 'mlflow') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "celerity_lm" in out.stdout
