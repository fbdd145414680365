"""The house's shape, as docs/architecture.md draws it: orchestrator/ grouped by job (at most 10
entries at its top), its packages layered (no package imports one that imports it back, at most 8
levels), and components/ below everything (it imports nothing from orchestrator). And one rule of
the workloads' code: their clocks wait for the GPU (`orchestrator.run.devices.clock`)."""

from __future__ import annotations

import ast
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


# ---------------------------------------------------------------- workloads' clocks
# CUDA runs ops asynchronously: time.perf_counter() read right after queuing GPU work times the
# queuing, not the work. A workload reads `devices.clock(device)` (synchronise, then perf_counter).
PERF_COUNTER_ALLOWED: dict[str, str] = {}
"""`path:function` -> why that function may read time.perf_counter itself (none may today)."""


def perf_counter_reads(source: str) -> list[tuple[int, str]]:
    """(line, enclosing function or `<module>`) of every `time.perf_counter` / `perf_counter` in
    `source`: attribute, bare name or `from time import perf_counter`, called or not."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            where = node.name
        if (isinstance(node, ast.Attribute) and node.attr == "perf_counter"
                or isinstance(node, ast.Name) and node.id == "perf_counter"
                or isinstance(node, ast.ImportFrom) and any(a.name == "perf_counter" for a in node.names)):
            found.append((node.lineno, where))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(ast.parse(source), "<module>")
    return found


def test_the_clock_rule_sees_perf_counter_in_every_form():
    source = ("import time\nfrom time import perf_counter\nt0 = time.perf_counter()\n"
              "def f(run):\n    tick = time.perf_counter\n    return perf_counter() - t0\n"
              "def g(run):\n    return devices.clock(run.device) + time.process_time()\n")
    assert perf_counter_reads(source) == [(2, "<module>"), (3, "<module>"), (5, "f"), (6, "f")]


def test_workloads_read_the_clock_after_synchronising():
    files = sorted((REPO / "workloads").rglob("*.py"))
    assert len(files) > 20, "read no workloads"
    seen: set[str] = set()
    bad = []
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        for line, where in perf_counter_reads(path.read_text()):
            key = f"{rel}:{where}"
            seen.add(key)
            if key not in PERF_COUNTER_ALLOWED:
                bad.append(f"{rel}:{line} (in {where})")
    assert bad == [], ("time.perf_counter() in a workload times the queuing of GPU work, not the work: "
                       "read devices.clock(device) (orchestrator.run.devices) instead")
    stale = sorted(set(PERF_COUNTER_ALLOWED) - seen)
    assert stale == [], "allowed perf_counter reads that no longer exist: drop them from PERF_COUNTER_ALLOWED"
