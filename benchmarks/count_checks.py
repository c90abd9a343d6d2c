"""Count what the test suite checks, so "no fewer tests, no fewer assertions" can be re-checked
after a refactor of the tests (moves, merges, shared fixtures) without reading every diff.

Static and cheap (AST only, nothing imported): in every `*.py` under the given folder it counts

- `assert` statements,
- uses of `pytest.raises`, `pytest.approx` and `pytest.warns` (each is a check an `assert` does
  not show: an expected exception, a tolerance, an expected warning),

per file and per enclosing function (`file stem::function`, keyed by the file's stem so a test
that moves to another folder keeps its key; a function whose file was renamed is looked up by its
name). `--collect` also asks pytest how many tests it
collects (parametrized cases included), which is the number the issue counts.

    python benchmarks/count_checks.py tests --json before.json          # record
    python benchmarks/count_checks.py tests --compare before.json       # exit 1 if anything went down

A comparison fails when a total goes down; per-function decreases are listed (a merge moves
checks from one function to another, so those are for reading, not failing).
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PYTEST_CHECKS = ("raises", "approx", "warns")
KINDS = ("assert", *PYTEST_CHECKS)


@dataclass
class Census:
    """Checks per kind, in total, per file and per function."""

    totals: Counter = field(default_factory=Counter)
    files: dict[str, Counter] = field(default_factory=dict)
    functions: dict[str, Counter] = field(default_factory=dict)
    tests: int | None = None  # collected by pytest, when asked

    def as_json(self) -> dict:
        return {"tests": self.tests, "totals": dict(self.totals),
                "files": {k: dict(v) for k, v in sorted(self.files.items())},
                "functions": {k: dict(v) for k, v in sorted(self.functions.items())}}


def _check_kind(node: ast.AST) -> str | None:
    """'assert', 'raises', 'approx', 'warns' or None for anything else."""
    if isinstance(node, ast.Assert):
        return "assert"
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in PYTEST_CHECKS \
                and isinstance(func.value, ast.Name) and func.value.id == "pytest":
            return func.attr
    return None


def _walk(node: ast.AST, owner: str, found: list[tuple[str, str]]) -> None:
    """Collect (enclosing top-level function or method, kind) for every check under `node`."""
    for child in ast.iter_child_nodes(node):
        name = owner
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and owner == "<module>":
            name = child.name
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and owner.startswith("class "):
            name = f"{owner[6:]}.{child.name}"
        elif isinstance(child, ast.ClassDef) and owner == "<module>":
            name = f"class {child.name}"
        kind = _check_kind(child)
        if kind:
            found.append((name.removeprefix("class "), kind))
        _walk(child, name, found)


def count_file(path: Path) -> list[tuple[str, str]]:
    """(function, kind) for every check in one source file."""
    found: list[tuple[str, str]] = []
    _walk(ast.parse(path.read_text(), filename=str(path)), "<module>", found)
    return found


def census(root: Path) -> Census:
    result = Census()
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        per_file: Counter = Counter()
        for function, kind in count_file(path):
            per_file[kind] += 1
            result.functions.setdefault(f"{path.stem}::{function}", Counter())[kind] += 1
        if per_file:
            result.files[rel] = per_file
            result.totals.update(per_file)
    return result


def collected_tests(root: Path) -> int:
    """How many tests pytest collects under `root` (nothing is run)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(root)],
                          capture_output=True, text=True)
    match = re.search(r"(\d+) tests? collected", proc.stdout)
    if not match:
        raise SystemExit(f"pytest --collect-only gave no count (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return int(match.group(1))


def compare(now: Census, before: dict) -> list[str]:
    """Lines describing every decrease; the ones starting with 'FEWER' fail the comparison."""
    lines = []
    for kind in KINDS:
        was, is_ = before["totals"].get(kind, 0), now.totals.get(kind, 0)
        if is_ < was:
            lines.append(f"FEWER {kind}: {was} -> {is_}")
    if before.get("tests") is not None and now.tests is not None and now.tests < before["tests"]:
        lines.append(f"FEWER tests: {before['tests']} -> {now.tests}")
    by_name: dict[str, list[Counter]] = {}
    for key, counts in now.functions.items():
        by_name.setdefault(key.split("::", 1)[1], []).append(counts)
    for key, was in sorted(before["functions"].items()):
        is_ = now.functions.get(key)
        if is_ is None:  # the file was renamed: the function under another stem counts
            is_ = max(by_name.get(key.split("::", 1)[1], [Counter()]), key=lambda c: sum(c.values()))
        down = {k: (v, is_.get(k, 0)) for k, v in was.items() if is_.get(k, 0) < v}
        if down:
            lines.append(f"  down in {key}: " + ", ".join(f"{k} {a}->{b}" for k, (a, b) in down.items()))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, nargs="?", default=Path("tests"))
    parser.add_argument("--collect", action="store_true", help="also count the tests pytest collects")
    parser.add_argument("--json", type=Path, help="write the census to this file")
    parser.add_argument("--compare", type=Path, help="a census written before; exit 1 if a total went down")
    args = parser.parse_args(argv)
    now = census(args.root)
    before = json.loads(args.compare.read_text()) if args.compare else None
    if args.collect or (before and before.get("tests") is not None):
        now.tests = collected_tests(args.root)
    print(f"tests collected: {now.tests if now.tests is not None else '(not asked: --collect)'}")
    print("checks: " + ", ".join(f"{k} {now.totals.get(k, 0)}" for k in KINDS) + f", total {sum(now.totals.values())}")
    if args.json:
        args.json.write_text(json.dumps(now.as_json(), indent=1) + "\n")
    if before is None:
        return 0
    lines = compare(now, before)
    print("\n".join(lines) if lines else "no decrease against " + str(args.compare))
    return 1 if any(line.startswith("FEWER") for line in lines) else 0


if __name__ == "__main__":
    raise SystemExit(main())
