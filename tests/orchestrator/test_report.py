"""The report page: a paper's hand-written measurement notes appear under its section, and only there."""

from __future__ import annotations

import json

from orchestrator import report


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
