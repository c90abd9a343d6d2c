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


def _spec(tid: str, policy: str) -> SimpleNamespace:
    return SimpleNamespace(trial_id=tid, run_name=tid, config={"train": {"steps": 10}, "precision": {"policy": policy}})


def test_eta_waits_for_one_trial_per_policy_then_spreads_the_rest_over_running_trials() -> None:
    from orchestrator.progress import eta_line

    specs = [_spec("b0", "bf16"), _spec("b1", "bf16"), _spec("p0", "fp8"), _spec("p1", "fp8")]
    rows = {"b0": {"state": "FINISHED", "started": 0.0, "ended": 60.0}, "p0": {"state": "RUNNING", "started": 60.0}}
    assert eta_line(specs, rows, now=90.0) == "2 pending; ETA once a trial of each policy has finished"
    rows = {"b0": {"state": "FINISHED", "started": 0.0, "ended": 60.0}, "p0": {"state": "FINISHED", "started": 0.0, "ended": 120.0},
            "b1": {"state": "RUNNING", "started": 120.0}}
    # b1 has 60 - 30 s left, p1 (pending) 120 s; one trial running: 150 s
    assert eta_line(specs, rows, now=150.0) == "1 pending; ETA ~2.5 min"
    assert eta_line(specs, {t.trial_id: {"state": "FINISHED", "started": 0, "ended": 1} for t in specs}) == ""
