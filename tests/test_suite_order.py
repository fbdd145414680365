"""The suite's module order: conftest.MODULE_SECONDS, read from tests/module_seconds.json (which
`make test-durations` writes with tests/module_seconds.py), names modules that exist, heaviest
first: a renamed or removed module would silently drop out of the heaviest-first order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import conftest
import module_seconds
from conftest import MODULE_SECONDS, MODULE_SECONDS_FILE, REPO, read_module_seconds


def test_every_weighted_module_exists():
    missing = [m for m in MODULE_SECONDS if not (REPO / m).is_file()]
    assert not missing, (f"{MODULE_SECONDS_FILE.name} names modules that are gone: {missing}; "
                         "regenerate it with `make test-durations`")


def test_the_weights_file_is_read_and_heaviest_first():
    raw = json.loads(MODULE_SECONDS_FILE.read_text())
    assert isinstance(raw, dict) and raw, f"{MODULE_SECONDS_FILE} is not a non-empty {{module: seconds}} object"
    assert all(isinstance(v, (int, float)) and v >= 0 for v in raw.values()), raw
    assert MODULE_SECONDS == {k: float(v) for k, v in raw.items()}
    assert list(raw.values()) == sorted(raw.values(), reverse=True)


def test_a_missing_or_broken_weights_file_means_no_order(tmp_path):
    assert read_module_seconds(tmp_path / "absent.json") == {}
    (tmp_path / "broken.json").write_text('{"tests/a.py": 3')
    assert read_module_seconds(tmp_path / "broken.json") == {}
    (tmp_path / "list.json").write_text("[1, 2]")
    assert read_module_seconds(tmp_path / "list.json") == {}
    (tmp_path / "ok.json").write_text('{"tests/a.py": 12, "tests/b.py": "x", "tests/c.py": 10.5}')
    assert read_module_seconds(tmp_path / "ok.json") == {"tests/a.py": 12.0, "tests/c.py": 10.5}


class _Item:
    def __init__(self, path: Path, name: str) -> None:
        self.fspath, self.name, self.markers = path, name, []

    def add_marker(self, marker) -> None:
        self.markers.append(marker)


def test_collection_runs_the_heaviest_modules_first_and_keeps_each_modules_order(monkeypatch):
    light, heavy, unknown = (REPO / "tests" / f"test_{n}.py" for n in ("light", "heavy", "unknown"))
    monkeypatch.setattr(conftest, "MODULE_SECONDS", {"tests/test_light.py": 10.0, "tests/test_heavy.py": 99.0})
    items = [_Item(unknown, "u1"), _Item(light, "l1"), _Item(heavy, "h1"), _Item(light, "l2"), _Item(heavy, "h2")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.name for i in items] == ["h1", "h2", "l1", "l2", "u1"]


# ---------------------------------------------------------------- tests/module_seconds.py

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="7">
  <testcase classname="tests.orchestrator.test_heavy" name="test_a" file="tests/orchestrator/test_heavy.py" time="9.5"/>
  <testcase classname="tests.orchestrator.test_heavy" name="test_b[x-1]" time="6.25"/>
  <testcase classname="tests.orchestrator.test_heavy.TestGroup" name="test_c" time="4.0">
    <failure message="boom">a failed test's time counts too</failure>
  </testcase>
  <testcase classname="tests.test_edge" name="test_one" time="10.0"/>
  <testcase classname="tests.workloads.test_light" name="test_one" time="3.0"/>
  <testcase classname="tests.workloads.test_light" name="test_two" time="6.9"/>
  <testcase classname="" name="tests.test_gone" file="tests/test_elsewhere.py" time="30.0"/>
</testsuite></testsuites>
"""


@pytest.fixture
def sample(tmp_path) -> tuple[Path, Path]:
    """A hand-made JUnit report and a repository root holding the modules it names."""
    root = tmp_path / "repo"
    for module in ("tests/orchestrator/test_heavy.py", "tests/test_edge.py", "tests/workloads/test_light.py"):
        (root / module).parent.mkdir(parents=True, exist_ok=True)
        (root / module).write_text("")
    report = tmp_path / "report.xml"
    report.write_text(REPORT)
    return report, root


def test_seconds_are_summed_per_module_and_the_light_ones_dropped(sample):
    report, root = sample
    seconds = module_seconds.module_seconds(report, root=root)
    # 9.5 + 6.25 + 4.0 (a class's tests are its module's); 10.0 is at the cutoff; 3.0 + 6.9 is under it;
    # a case whose classname names no module falls back on its file attribute.
    assert seconds == {"tests/test_elsewhere.py": 30, "tests/orchestrator/test_heavy.py": 20, "tests/test_edge.py": 10}
    assert list(seconds) == ["tests/test_elsewhere.py", "tests/orchestrator/test_heavy.py", "tests/test_edge.py"]
    assert module_seconds.module_seconds(report, root=root, min_seconds=0)["tests/workloads/test_light.py"] == 10
    assert list(module_seconds.module_seconds(report, root=root, min_seconds=25)) == ["tests/test_elsewhere.py"]


def test_the_script_writes_the_json_conftest_reads(sample, tmp_path, monkeypatch, capsys):
    report, root = sample
    monkeypatch.setattr(module_seconds, "REPO", root)
    out = tmp_path / "weights.json"
    assert module_seconds.main([str(report), "--out", str(out), "--min-seconds", "15"]) == 0
    assert read_module_seconds(out) == {"tests/test_elsewhere.py": 30.0, "tests/orchestrator/test_heavy.py": 20.0}
    assert "2 modules of 15 s or more" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["", "<testsuites><testsuite/></testsuites>"])
def test_a_report_without_tests_leaves_the_weights_as_they_were(tmp_path, text, capsys):
    report, out = tmp_path / "report.xml", tmp_path / "weights.json"
    report.write_text(text)
    out.write_text('{"tests/a.py": 12}\n')
    assert module_seconds.main([str(report), "--out", str(out)]) == 1
    assert out.read_text() == '{"tests/a.py": 12}\n'
    assert "left as it was" in capsys.readouterr().err
    assert module_seconds.main([str(tmp_path / "absent.xml"), "--out", str(out)]) == 1
    assert out.read_text() == '{"tests/a.py": 12}\n'
