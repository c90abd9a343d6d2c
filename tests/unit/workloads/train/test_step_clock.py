"""workloads.train.step_clock: the steady-state speed figure leaves warm-up out and resists one slow step."""
from __future__ import annotations

import pytest

from fp8lab_conf.contracts import METRIC_STEP_S, METRIC_STEPS_TIMED, METRIC_TOKENS_PER_S
from workloads.train import step_clock
from workloads.train.step_clock import StepClock, warmup_steps


def _run(clock: StepClock, durations: list[float], tokens: int, monkeypatch, sync_every: int = 1) -> None:
    now = [0.0]
    monkeypatch.setattr(step_clock.time, "perf_counter", lambda: now[0])
    clock._start = 0.0
    for step, d in enumerate(durations, start=1):
        now[0] += d
        clock.step_done(step, tokens, synced=step % sync_every == 0)


def test_warmup_is_a_tenth_of_the_steps_within_1_and_10():
    assert (warmup_steps(5), warmup_steps(40), warmup_steps(400)) == (1, 4, 10)


def test_the_median_ignores_warmup_and_a_burst_of_load(monkeypatch):
    clock = StepClock(20)
    durations = [5.0, 5.0] + [0.1] * 17 + [3.0]  # slow warm-up, one step hit by another process
    _run(clock, durations, 100, monkeypatch)
    out = clock.summary()
    assert out[METRIC_STEP_S] == pytest.approx(0.1) and out[METRIC_TOKENS_PER_S] == pytest.approx(1000.0)
    assert out[METRIC_STEPS_TIMED] == 18  # steps 3..20 (warm-up: 2 steps)
    whole_run_mean = 100 * 20 / sum(durations)
    assert whole_run_mean < 150  # what the old figure said


def test_windows_between_sync_points_give_per_step_means(monkeypatch):
    clock = StepClock(40)
    _run(clock, [0.2] * 40, 50, monkeypatch, sync_every=10)  # an accelerator syncing every 10th step
    out = clock.summary()
    assert out[METRIC_STEP_S] == pytest.approx(0.2) and out[METRIC_STEPS_TIMED] == 30  # first window is warm-up


def test_too_short_a_run_has_no_steady_figure():
    assert StepClock(1).summary() == {METRIC_STEPS_TIMED: 0.0}
