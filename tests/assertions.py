"""The suite's assertions, listed: every `assert` (and `pytest.raises`) in every test module, by the
test function that holds it, so that a change that moves or merges tests can show where each
assertion went.

    python tests/assertions.py [--out FILE.json]           # the inventory of this tree
    python tests/assertions.py --compare OLD.json NEW.json  # assertions gone, and where moved ones went

An assertion is keyed by its source text with whitespace collapsed; the comparison prints each one
that the old tree had and the new one lacks, and for each assertion whose test function changed, the
new place (module::function).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _text(source: str, node: ast.AST) -> str:
    return re.sub(r"\s+", " ", ast.get_source_segment(source, node) or "").strip()


def _function_asserts(source: str, fn: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            found.append("assert " + _text(source, node.test))
        elif isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
            call = node.context_expr
            if isinstance(call.func, ast.Attribute) and call.func.attr in ("raises", "warns"):
                found.append(_text(source, call))
    return found


def inventory(root: Path = TESTS) -> dict[str, dict[str, list[str]]]:
    """{module path: {function name: [assertion text, ...]}} for every tests/**/*.py, functions in
    file order (helpers that assert count: a test reaches them)."""
    out: dict[str, dict[str, list[str]]] = {}
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        functions: dict[str, list[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                asserts = _function_asserts(source, node)
                # nested functions are walked twice: the outermost keeps them
                if asserts and not any(a in sum(functions.values(), []) for a in asserts[:1]):
                    functions[node.name] = asserts
        if functions:
            out[path.relative_to(root.parent).as_posix()] = functions
    return out


def compare(old: dict, new: dict) -> tuple[list[str], list[str]]:
    """(assertions the new tree lacks, assertions that changed place: 'text: old -> new')."""
    def places(inv: dict) -> dict[str, set[str]]:
        where: dict[str, set[str]] = {}
        for module, functions in inv.items():
            for fn, asserts in functions.items():
                for a in asserts:
                    where.setdefault(a, set()).add(f"{module}::{fn}")
        return where

    before, after = places(old), places(new)
    gone = sorted(a for a in before if a not in after)
    moved = sorted(f"{a}: {', '.join(sorted(before[a]))} -> {', '.join(sorted(after[a]))}"
                   for a in before if a in after and before[a] != after[a])
    return gone, moved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the inventory here as JSON (default: a summary on stdout)")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="two inventories to compare")
    args = parser.parse_args()
    if args.compare:
        old, new = (json.loads(Path(p).read_text()) for p in args.compare)
        gone, moved = compare(old, new)
        print(f"{len(gone)} assertions gone, {len(moved)} moved")
        for a in gone:
            print(f"gone: {a}")
        for m in moved:
            print(f"moved: {m}")
        return 0
    inv = inventory()
    if args.out:
        Path(args.out).write_text(json.dumps(inv, indent=1))
    total = 0
    for module, functions in inv.items():
        n = sum(len(a) for a in functions.values())
        total += n
        if not args.out:
            print(f"{module}: {len(functions)} functions, {n} assertions")
    print(f"{total} assertions in {len(inv)} modules", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
