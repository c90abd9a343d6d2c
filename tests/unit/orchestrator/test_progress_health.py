"""The live progress table's health column: the verdict word coloured, its reasons escaped and cut."""
from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from orchestrator.progress import health_cell, render_table


def test_health_cell_colours_the_verdict_and_keeps_brackets_literal() -> None:
    assert health_cell(None) == "-"
    assert health_cell("doomed: adapters frozen (x=0 < 1e-06)") == "[red]doomed[/]: adapters frozen (x=0 < 1e-06)"
    assert health_cell("at risk: a [b]") == r"[yellow]at risk[/]: a \[b]"
    assert len(health_cell("healthy" + "x" * 200, width=40)) < 60


def test_progress_table_shows_the_verdict_of_a_trial() -> None:
    spec = SimpleNamespace(trial_id="t1", run_name="fp8-s0", config={"train": {"steps": 100}})
    rows = {"t1": {"state": "STOPPED_EARLY", "step": 10, "health": "doomed: adapters frozen"}}
    console = Console(width=200, record=True)
    console.print(render_table([spec], rows, 0, "sweep"))
    text = console.export_text()
    assert "STOPPED_EARLY" in text and "doomed: adapters frozen" in text and "10/100" in text
