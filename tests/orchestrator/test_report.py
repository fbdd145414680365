"""The report page: a paper's hand-written measurement notes appear under its section, and only there."""

from __future__ import annotations

import json

from orchestrator.reproduction import report


def _record(name: str) -> dict:
    return {"name": name, "paper": f"Paper of {name}", "smoke": True, "seeds": [0, 1], "trials": 2,
            "failed_trials": [], "wall_s": 60.0, "date": "2026-12-04", "commit": "abc1234", "run_id": None,
            "outcomes": []}


def test_notes_appear_under_their_own_paper(tmp_path):
    data = tmp_path / "reproductions"
    data.mkdir()
    for name in ("alpha", "beta"):
        (data / f"{name}.json").write_text(json.dumps(_record(name)))
    (data / f"beta{report.NOTES_SUFFIX}").write_text("Seed 100: the gap was 0.31.\n")
    page = report.render(data)
    assert page.count("### ") == 1
    beta = page.index("## beta:")
    assert page.index("### beta: measurement notes") > beta > page.index("## alpha:")
    assert "Seed 100: the gap was 0.31." in page[beta:]
    # a notes file is not a record: it adds no row to the summary table
    assert page.count("| smoke | 2 |") == 2


def test_the_commit_stamp_is_dirty_for_code_changes_not_for_the_reports_own_outputs(tmp_path):
    import subprocess

    from orchestrator.reproduction.reproduce import source_commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "docs" / "reproductions").mkdir(parents=True)
    (tmp_path / "docs" / "reproductions.md").write_text("page\n")
    (tmp_path / "docs" / "reproductions" / "x.json").write_text("{}\n")
    (tmp_path / "code.py").write_text("a = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    clean = source_commit(tmp_path)
    assert clean and not clean.endswith("-dirty")
    (tmp_path / "docs" / "reproductions.md").write_text("page, rewritten by ladder report\n")
    (tmp_path / "docs" / "reproductions" / "x.json").write_text('{"measured": 1}\n')
    assert source_commit(tmp_path / "docs") == clean  # what the report wrote is not a change to the code
    (tmp_path / "code.py").write_text("a = 2\n")
    assert source_commit(tmp_path) == clean + "-dirty"


def _claim(name: str, verdict: str) -> dict:
    return {"name": name, "statement": f"{name} holds.", "kind": "claim", "verdict": verdict, "spec": None,
            "interval": None, "notes": [], "per_seed": []}


def test_each_size_has_its_row_section_and_headline_count(tmp_path):
    data = tmp_path / "reproductions"
    data.mkdir()
    smoke = {**_record("alpha"), "outcomes": [_claim("head", "inconclusive"), _claim("minor", "holds")]}
    bench = {**_record("alpha"), "size": "bench", "smoke": False, "seeds": [0, 1, 2], "wall_s": 4800.0,
             "processor": "Some CPU 3000, 2 CPUs", "outcomes": [_claim("head", "holds"), _claim("minor", "fails")]}
    other = {**_record("beta"), "outcomes": [_claim("first", "fails")]}
    (data / "alpha.json").write_text(json.dumps(smoke))
    (data / f"{report.stem('alpha', 'bench')}.json").write_text(json.dumps(bench))
    (data / "beta.json").write_text(json.dumps(other))
    (data / "alpha.bench.notes.md").write_text("Bench: 12 widths were too many.\n")
    (data / "alpha.notes.md").write_text("Smoke: seed 100 gap 0.2.\n")
    page = report.render(data)
    assert report.stem("alpha", "bench") == "alpha.bench" and report.stem("alpha", "smoke") == "alpha"
    # a row per size measured, the bench row linking to its own section
    assert "| [`alpha`](#alpha) | smoke | 2 |" in page and "| [`alpha`](#alpha-bench) | bench | 3 |" in page
    assert page.index("## alpha: ") < page.index("## alpha, bench size: ") < page.index("## beta: ")
    bench_part = page[page.index("## alpha, bench size: "):page.index("## beta: ")]
    assert "Bench size, seeds 0-2 (3), 2 trials, 80.0 min on Some CPU 3000, 2 CPUs, measured" in bench_part
    assert "Bench: 12 widths were too many." in bench_part and "Smoke: seed 100" not in bench_part
    # headlines (first claims) counted apart per size: smoke alpha inconclusive + beta fails; bench alpha holds
    assert ("Headlines (each paper's first claim), by size: smoke, 2 papers: 1 inconclusive, 1 fail; "
            "bench, 1 paper: 1 hold.") in page
