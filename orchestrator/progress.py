"""Live progress of a sweep: a Ray actor collects trial updates; the driver renders a table.

Trials call `board.update.remote(...)` fire-and-forget (never blocking training); the driver
polls one snapshot per refresh.
"""
from __future__ import annotations

import time
from typing import Any

import ray
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fp8lab_conf.contracts import METRIC_ACCURACY, METRIC_FINAL_LOSS, METRIC_TOKENS_PER_S

STATE_STYLE = {"FINISHED": "green", "DIVERGED": "yellow", "STOPPED_EARLY": "yellow", "FAILED": "red", "KILLED": "red",
               "RUNNING": "cyan", "PENDING": "dim", "SKIPPED": "dim", "RETRYING": "magenta"}


@ray.remote(num_cpus=0)
class ProgressBoard:
    """Latest known state of every trial, keyed by trial id."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def update(self, trial_id: str, fields: dict[str, Any]) -> None:
        row = self.rows.setdefault(trial_id, {})
        if fields.get("state") == "RUNNING" and "started" not in row:
            row["started"] = time.time()
        row.update(fields)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return self.rows


def render_table(specs: list[Any], rows: dict[str, dict[str, Any]], total_steps: int, title: str) -> Table:
    """trial, state, step/total, loss, tokens/s, elapsed, health (the verdict once it is made)."""
    table = Table(title=title, expand=False)
    for column in ("trial", "state", "step", "loss", "tokens/s", "elapsed", "health"):
        table.add_column(column, justify="right" if column not in ("trial", "state", "health") else "left")
    for spec in specs:
        row = rows.get(spec.trial_id, {})
        state = row.get("state", "PENDING")
        started, ended = row.get("started"), row.get("ended") or time.time()
        table.add_row(
            spec.run_name,
            _styled(state),
            f"{row.get('step', 0)}/{spec.config['train']['steps']}",
            _fmt(row.get("loss"), ".4f"),
            _fmt(row.get("tokens_per_s"), ".0f"),
            f"{ended - started:.0f}s" if started else "-",
            health_cell(row.get("health")),
        )
    table.caption = eta_line(specs, rows)
    return table


DONE_STATES = ("FINISHED", "DIVERGED", "STOPPED_EARLY", "FAILED", "KILLED")


def eta_line(specs: list[Any], rows: dict[str, dict[str, Any]], now: float | None = None) -> str:
    """'N pending; ETA ~M min' once a trial of every policy still to run has finished (its mean
    duration then stands for that policy's other trials), spread over the trials running now."""
    now = time.time() if now is None else now
    durations: dict[str, list[float]] = {}
    left: list[tuple[str, float]] = []  # (policy, seconds it has run so far)
    for spec in specs:
        row, policy = rows.get(spec.trial_id, {}), spec.config.get("precision", {}).get("policy", "")
        state, started = row.get("state", "PENDING"), row.get("started")
        if state in ("FINISHED", "DIVERGED") and started is not None and row.get("ended") is not None:
            durations.setdefault(policy, []).append(row["ended"] - started)
        elif state not in DONE_STATES:
            left.append((policy, now - started if state == "RUNNING" and started is not None else 0.0))
    pending = sum(1 for s in specs if rows.get(s.trial_id, {}).get("state", "PENDING") == "PENDING")
    if not left:
        return ""
    if any(p not in durations for p, _ in left):
        return f"{pending} pending; ETA once a trial of each policy has finished"
    mean = {p: sum(v) / len(v) for p, v in durations.items()}
    running = sum(1 for s in specs if rows.get(s.trial_id, {}).get("state") == "RUNNING")
    work = sum(max(0.0, mean[p] - ran) for p, ran in left)
    return f"{pending} pending; ETA ~{work / max(1, running) / 60:.1f} min"


HEALTH_STYLE = {"healthy": "green", "at risk": "yellow", "doomed": "red"}


def health_cell(line: str | None, width: int = 70) -> str:
    """The verdict word coloured, then its reasons, cut to `width` (the full line is a run tag)."""
    if not line:
        return "-"
    word = next((w for w in HEALTH_STYLE if line.startswith(w)), "")
    rest = line[len(word):]
    text = rest if len(word) + len(rest) <= width else rest[: max(0, width - len(word) - 1)] + "…"
    return (f"[{HEALTH_STYLE[word]}]{word}[/]" if word else "") + escape(text)


def summary_table(specs: list[Any], results: dict[str, dict[str, Any]], title: str) -> Table:
    """Final table: accuracy, tokens/s and status per trial."""
    table = Table(title=title)
    for column in ("trial", "status", "accuracy", "tokens/s", "final loss", "trial_id", "note"):
        table.add_column(column)
    for spec in specs:
        result = results.get(spec.trial_id, {})
        metrics = result.get("metrics", {})
        status = result.get("status", "-")
        table.add_row(spec.run_name, _styled(status),
                      _fmt(metrics.get(METRIC_ACCURACY), ".3f"), _fmt(metrics.get(METRIC_TOKENS_PER_S), ".0f"),
                      _fmt(metrics.get(METRIC_FINAL_LOSS), ".4f"), spec.trial_id, (result.get("reason") or "")[:60])
    return table


def _styled(state: str) -> str:
    style = STATE_STYLE.get(state)
    return f"[{style}]{state}[/]" if style else state


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def console() -> Console:
    """A terminal gets its own width; logs and pipes get wide tables instead of wrapped ones."""
    probe = Console()
    return Console(highlight=False, width=None if probe.is_terminal else 160)
