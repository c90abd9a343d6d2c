"""benchmarks/durations_table.py: pytest's --durations lines summed per test, folder and file."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import durations_table  # noqa: E402

OUTPUT = """
============================= slowest durations ==============================
120.50s call     tests/integration/test_sweep.py::test_sweep_layout_failures_and_rerun
30.00s setup    tests/unit/analysis/test_report_e2e.py::test_a
2.25s call     tests/unit/analysis/test_report_e2e.py::test_a
0.25s teardown tests/unit/workloads/precision/test_x.py::test_b[bf16]
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def test_parses_every_phase_and_sums_per_test_folder_and_file() -> None:
    entries = durations_table.parse(OUTPUT)
    assert entries[1] == (30.0, "setup", "tests/unit/analysis/test_report_e2e.py::test_a") and len(entries) == 4
    text = durations_table.tables(entries, top=2)
    assert text.startswith("3 tests with a duration line, 153 s in all")
    slowest = text.split("\n\n")[1].splitlines()
    assert slowest[2:] == ["| tests/integration/test_sweep.py::test_sweep_layout_failures_and_rerun | 120.5 |",
                           "| tests/unit/analysis/test_report_e2e.py::test_a | 32.2 |"]  # setup + call
    folders = text.split("\n\n")[2]
    assert "| tests/integration | 120.5 |" in folders and "| tests/unit/analysis | 32.2 |" in folders
    assert "| tests/unit/workloads | 0.2 |" in folders and "| **total** | 153.0 |" in folders
    assert "| tests/unit/analysis/test_report_e2e.py::test_a | 30.0 |" in text.split("\n\n")[4]
    quick = durations_table.tables(durations_table.parse(OUTPUT.replace("30.00s setup", "0.01s setup")))
    assert quick.endswith("(no setup phase of 0.1 s or more)")  # bookkeeping is not a shared fixture
