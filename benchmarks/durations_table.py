"""Where the test suite's time goes: tables from the `--durations` lines pytest prints.

    python -m pytest -q -n auto --dist loadgroup tests --durations=0 > run.txt
    python benchmarks/durations_table.py run.txt            # markdown tables

Prints the slowest tests (setup + call + teardown together), the time per folder and per test
file, and the slowest setup phases (a module- or session-scoped fixture shows up as the setup of
the first test that needs it). Under xdist the sums are worker time, not wall time: two workers
each busy for 5 minutes sum to 10.
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

MIN_SETUP_S = 0.1  # setups below this are pytest's own bookkeeping, not a shared fixture
LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def parse(text: str) -> list[tuple[float, str, str]]:
    """(seconds, phase, node id) for every `--durations` line."""
    return [(float(m[1]), m[2], m[3]) for m in map(LINE.match, text.splitlines()) if m]


def _table(header: str, rows: list[tuple[str, float]], total: float | None = None) -> str:
    lines = [f"| {header} | s |", "|---|---:|"] + [f"| {name} | {sec:.1f} |" for name, sec in rows]
    if total is not None:
        lines.append(f"| **total** | {total:.1f} |")
    return "\n".join(lines)


def tables(entries: list[tuple[float, str, str]], top: int = 30, depth: int = 3) -> str:
    per_test: dict[str, float] = defaultdict(float)
    per_folder: dict[str, float] = defaultdict(float)
    per_file: dict[str, float] = defaultdict(float)
    for sec, _, node in entries:
        per_test[node] += sec
        path = node.split("::", 1)[0]
        per_file[path] += sec
        per_folder["/".join(path.split("/")[:depth]) if path.count("/") >= depth else path.rsplit("/", 1)[0]] += sec
    setups = sorted(((node, sec) for sec, phase, node in entries if phase == "setup" and sec >= MIN_SETUP_S),
                    key=lambda r: -r[1])
    slowest = sorted(per_test.items(), key=lambda r: -r[1])
    total = sum(per_test.values())
    return "\n\n".join([
        f"{len(per_test)} tests with a duration line, {total:.0f} s in all",
        _table(f"{top} slowest tests (setup+call+teardown)", slowest[:top]),
        _table("per folder", sorted(per_folder.items(), key=lambda r: -r[1]), total),
        _table("per file (top 25)", sorted(per_file.items(), key=lambda r: -r[1])[:25]),
        _table("slowest setups (shared fixtures are charged to their first test)", setups[:15])
        if setups else f"(no setup phase of {MIN_SETUP_S} s or more)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("durations", type=Path, help="pytest output with --durations=0 (or N) lines")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    entries = parse(args.durations.read_text())
    if not entries:
        raise SystemExit(f"{args.durations}: no --durations lines found")
    print(tables(entries, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
