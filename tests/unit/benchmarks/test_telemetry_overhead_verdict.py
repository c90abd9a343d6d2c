"""The telemetry-overhead benchmark's verdict: a pass only when the whole IQR of the per-round
ratio is within the 3% goal, "not decidable" when it straddles the goal or is too wide to say."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture(scope="module")
def verdict():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("telemetry_overhead").verdict
    finally:
        sys.path.remove(str(BENCH))


def _spread(center: float, half_iqr: float, n: int = 20) -> list[float]:
    """``n`` ratios whose quartiles are about ``center -+ half_iqr`` (evenly spaced)."""
    return [center + 2 * half_iqr * (2 * i / (n - 1) - 1) for i in range(n)]


def test_a_tight_iqr_under_the_goal_passes(verdict):
    v = verdict(_spread(1.010, 0.01))
    assert v["verdict"] == "pass" and v["p75"] <= 1.03 and v["overhead_pct"] == pytest.approx(1.0)
    assert v["ci95"][0] <= v["median"] <= v["ci95"][1] and v["rounds"] == 20


def test_a_median_under_the_goal_with_the_iqr_across_it_is_not_a_pass(verdict):
    """The issue's fp8_naive run: median +2.5%, IQR reaching past 1.03 -> not decidable."""
    v = verdict(_spread(1.025, 0.015))
    assert v["median"] < 1.03 < v["p75"]
    assert v["verdict"] == "not decidable" and "straddles" in v["why"]


def test_a_tight_iqr_above_the_goal_fails(verdict):
    v = verdict(_spread(1.060, 0.01))
    assert v["verdict"] == "fail" and v["p25"] > 1.03


def test_an_iqr_wider_than_3_percent_decides_nothing(verdict):
    """The issue's 12-round run (IQR 0.969..1.181): too noisy, whatever the median."""
    for center in (0.99, 1.068, 1.2):
        v = verdict(_spread(center, 0.05))
        assert v["verdict"] == "not decidable" and "wider" in v["why"], center


def test_too_few_rounds_are_not_decidable(verdict):
    assert verdict([])["verdict"] == "not decidable"
    few = verdict([1.0, 1.001, 1.002])  # tight and well under the goal, but 3 rounds (a smoke run)
    assert few["verdict"] == "not decidable" and "fewer than" in few["why"]


def test_the_verdict_line_shows_the_control_or_says_it_was_not_measured():
    """Each verdict is printed with the off-vs-off control beside it, or says it was left out."""
    sys.path.insert(0, str(BENCH))
    try:
        line = importlib.import_module("telemetry_overhead").verdict_line
    finally:
        sys.path.remove(str(BENCH))
    res = {"policy": "bf16", "hidden": 128, "loadavg_start": 0.5, "loadavg_end": 1.0,
           "verdict": {"verdict": "pass", "why": "IQR at or below 1.03", "clock": "cpu", "overhead_pct": 0.9,
                       "p25": 1.003, "p75": 1.016, "ci95": [0.998, 1.028], "rounds": 12}}
    with_control = line({**res, "control": {"overhead_pct": 0.2, "p25": 0.995, "p75": 1.015, "ci95": [0.994, 1.023]}})
    assert "PASS" in with_control and "control (off_again vs off, identical): +0.2%, ratio IQR 0.995..1.015" in with_control
    assert "control (off_again vs off, identical): not measured (--no-control)" in line({**res, "control": None})
