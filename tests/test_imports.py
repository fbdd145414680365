"""How ladder's modules depend on each other: no import cycles among orchestrator/, workloads/
and kernels/ (lazy imports inside functions count; imports for type checking only do not)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGES = ("orchestrator", "components", "workloads", "kernels")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:`."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    graph = import_graph()
    assert "orchestrator.tracking.sink" in graph and graph["orchestrator.tracking.sink"], "the graph read no imports"
    assert cycles(graph) == []


def imported_names(path: Path) -> set[str]:
    """Every module name `path` imports (its `from X import y` as X and X.y), whether or not it exists."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _workload_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "workloads" and len(parts) > 1 else None


def test_no_workload_imports_another():
    """A workload's shared parts live outside workloads/ (the LM corpus, sampler and GPT in
    `components.lm`); a model one workload trains and another uses comes from components too (`components.lm.pretrain`)."""
    modules = _modules()
    crossing = sorted((m, d) for m, path in modules.items() if _workload_of(m) for d in imported_names(path)
                      if _workload_of(d) and _workload_of(d) != _workload_of(m))
    assert "components.lm.corpus" in imported_names(modules["workloads.celerity_lm.workload"]), "read no imports"
    assert crossing == []


CONTRACT_MODULES = ("orchestrator.run", "orchestrator.run.devices", "orchestrator.claims")
"""Orchestrator modules a workload may import names from: the `Run` contract, its device helpers
(`devices.clock`: the clock read after a GPU sync) and claims (not other submodules:
orchestrator.run.checkpoints belongs to the runners)."""
CONTRACT_PACKAGES = ("orchestrator.sweeps.collapse",)
"""Orchestrator packages a workload may import from, submodules included: the pure collapse maths
celerity_lm's claims use."""


def _in_contract(name: str, modules: dict[str, Path]) -> bool:
    module = name if name in modules else name.rsplit(".", 1)[0]  # `from X import y`: y is a name in X
    return module in CONTRACT_MODULES or any(module == p or module.startswith(p + ".") for p in CONTRACT_PACKAGES)


def test_no_workload_imports_a_runner():
    """A workload reaches the outside world through the contract alone: no runner (registry, launch,
    tune_run, trial, checkpoints, ...), whatever it would borrow from one; what it needs from another
    workload's model lives in `components/`."""
    modules = _modules()
    reaching = sorted((m, d) for m, path in modules.items() if _workload_of(m) for d in imported_names(path)
                      if d.startswith("orchestrator.") and not _in_contract(d, modules))
    names = imported_names(modules["workloads.celerity_lm.claims"])
    assert "orchestrator.sweeps.collapse" in names and "orchestrator.claims.claim" in names, "read no imports"
    assert not _in_contract("orchestrator.run.checkpoints", modules) and _in_contract("orchestrator.run.LocalRun", modules)
    assert reaching == []


def test_the_orchestrator_imports_no_workload():
    modules = _modules()
    into = sorted((m, d) for m, path in modules.items() if m.startswith("orchestrator")
                  for d in imported_names(path) if d == "workloads" or d.startswith("workloads."))
    assert into == []
