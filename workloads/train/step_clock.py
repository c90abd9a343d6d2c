"""Per-step training times and the steady-state speed figure of a trial.

Why not the whole-run mean: it folds in warm-up (first-step allocation, lazy compilation) and
whatever else the machine did meanwhile, so one busy minute can make a trial look 50x slower in
a later sweep that reuses it. The median over steps after warm-up, with its IQR, says what a
step costs in steady state and how much that moved.

Steps are timed on the host between *sync points*: on CPU every step is one (its ops run
inline); on an accelerator only the loop's logged steps are (`train_loop`'s one transfer per
logged step), so a timed window there spans `log_every` steps and its per-step time is the
window's mean. Windows that start inside the warm-up are left out.
"""
from __future__ import annotations

import math
import os
import statistics
import time

from fp8lab_conf.contracts import (
    METRIC_STEP_S, METRIC_STEP_S_P25, METRIC_STEP_S_P75, METRIC_STEPS_TIMED, METRIC_TOKENS_PER_S, METRIC_TOKENS_PER_S_P25,
    METRIC_TOKENS_PER_S_P75,
)

WARMUP_SHARE = 0.1  # the first 10% of steps (at least 1, at most MAX_WARMUP) are warm-up
MAX_WARMUP = 10


def warmup_steps(total_steps: int) -> int:
    return max(1, min(MAX_WARMUP, math.ceil(WARMUP_SHARE * total_steps)))


def load_average() -> float:
    """The 1-minute load average (NaN where the OS has none): logged next to every speed figure."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan


class StepClock:
    """Times windows of steps between sync points; `windows` ([steps, tokens, seconds] rows)
    is plain data so a checkpoint can carry it across a resume."""

    def __init__(self, total_steps: int, windows: list[list[float]] | None = None) -> None:
        self.warmup = warmup_steps(total_steps)
        self.windows = windows if windows is not None else []
        self._first_step: int | None = None
        self._steps = 0
        self._tokens = 0
        self._start = time.perf_counter()

    def step_done(self, step: int, tokens: int, synced: bool) -> float | None:
        """Count a finished step; at a sync point close the window and return its per-step seconds."""
        self._first_step = step if self._first_step is None else self._first_step
        self._steps += 1
        self._tokens += tokens
        if not synced:
            return None
        now = time.perf_counter()
        seconds, steps, first = now - self._start, self._steps, self._first_step
        self._start, self._steps, self._tokens, self._first_step, tokens = now, 0, 0, None, self._tokens
        if first > self.warmup:
            self.windows.append([float(steps), float(tokens), seconds])
        return seconds / steps

    def summary(self) -> dict[str, float]:
        """Median and quartiles of per-step seconds and of tokens/s over the timed windows (no
        speed figure at all when no window came after the warm-up: the caller falls back to the mean)."""
        if not self.windows:
            return {METRIC_STEPS_TIMED: 0.0}
        step_s = [s / n for n, _, s in self.windows]
        tps = [t / s for _, t, s in self.windows if s > 0]
        p25, p75 = _quartiles(step_s)
        t25, t75 = _quartiles(tps)
        return {METRIC_STEP_S: statistics.median(step_s), METRIC_STEP_S_P25: p25, METRIC_STEP_S_P75: p75,
                METRIC_TOKENS_PER_S: statistics.median(tps), METRIC_TOKENS_PER_S_P25: t25, METRIC_TOKENS_PER_S_P75: t75,
                METRIC_STEPS_TIMED: float(sum(n for n, _, _ in self.windows))}


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]

