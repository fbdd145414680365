"""The house's shape, as docs/architecture.md draws it: orchestrator/ grouped by job (at most 10
entries at its top), its packages layered (no package imports one that imports it back, at most 8
levels), and components/ below everything (it imports nothing from orchestrator)."""

from __future__ import annotations

import functools

from conftest import REPO
from test_imports import cycles
from test_imports import import_graph as _read_graph

import_graph = functools.cache(_read_graph)

TOP_LEVEL_LIMIT = 10
LEVEL_LIMIT = 8


def _box(module: str) -> str | None:
    """The top-level entry of orchestrator/ a module belongs to (`orchestrator.sweeps.search` -> sweeps)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "orchestrator" and len(parts) > 1 else None


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, deps in import_graph().items():
        box = _box(module)
        if box is None:
            continue
        graph.setdefault(box, set()).update(b for d in deps if (b := _box(d)) and b != box)
    return graph


def levels(graph: dict[str, set[str]]) -> int:
    """The longest chain of imports (boxes on it) in an acyclic graph."""
    memo: dict[str, int] = {}

    def depth(v: str) -> int:
        if v not in memo:
            memo[v] = 1 + max((depth(w) for w in graph.get(v, ())), default=0)
        return memo[v]

    return max(depth(v) for v in graph)


def test_the_measures_see_a_cycle_and_count_levels():
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert levels({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == 3


def test_orchestrator_has_few_entries_at_its_top():
    entries = sorted(p.name for p in (REPO / "orchestrator").iterdir() if p.name != "__pycache__")
    assert "runners" in entries and "run" in entries, entries
    assert len(entries) <= TOP_LEVEL_LIMIT, entries


def test_orchestrator_packages_are_layered():
    graph = package_graph()
    assert {"runners", "sweeps", "tracking", "commands"} <= set(graph) and graph["commands"], graph
    assert cycles(graph) == [], "packages of orchestrator/ import each other"
    assert levels(graph) <= LEVEL_LIMIT


def test_components_import_nothing_from_the_orchestrator():
    into = sorted((m, d) for m, deps in import_graph().items() if m.startswith("components")
                  for d in deps if d.startswith("orchestrator"))
    assert any(m.startswith("components.") for m in import_graph()), "read no components"
    assert into == []
