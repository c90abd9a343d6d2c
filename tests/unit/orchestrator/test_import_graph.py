"""The orchestrator's modules import each other without a circle (module-level or deferred)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "orchestrator"


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.glob("*.py"):
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "orchestrator":
                parts = node.module.split(".")
                edges |= {a.name for a in node.names} if len(parts) == 1 else {parts[1]}
        graph[path.stem] = edges & {p.stem for p in ROOT.glob("*.py")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    def walk(node: str, path: list[str]) -> list[str]:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            found = walk(nxt, path + [nxt])
            if found:
                return found
        return []

    return next((c for c in (walk(n, [n]) for n in sorted(graph)) if c), [])


def test_no_import_circle_in_orchestrator() -> None:
    assert _cycle(_graph()) == []


def test_the_check_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
