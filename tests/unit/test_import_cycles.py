"""No import cycle among the package's modules, counting every import.

An import inside a function or under ``TYPE_CHECKING`` cannot fail at import
time, but it is a dependency all the same: two modules that need each other
are one idea cut in two, or a type in the wrong module. So every import counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "supervisor"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for inner in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                deps.add(inner.module)
                deps |= {f"{inner.module}.{a.name}" for a in inner.names}
            elif isinstance(inner, ast.Import):
                deps |= {a.name for a in inner.names}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                found.append([*stack[stack.index(dep):], dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = _graph(_modules())
    assert len(graph) > 100 and any(graph.values())  # the walk found the package
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
