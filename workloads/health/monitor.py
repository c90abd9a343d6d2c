"""One trial's early warning: signals at every logged step, the verdict at one of them, and
whether to stop there (docs/health.md). `run_training` calls three methods and nothing else."""
from __future__ import annotations

import logging
import math
from typing import Any, Callable

import torch

from fp8lab_conf.contracts import (METRIC_HEALTH_LOSS_VS_REF, METRIC_HEALTH_REF_LOSS, METRIC_LOSS,
                                   TAG_HEALTH_MISSING, TAG_HEALTH_REASONS, TAG_HEALTH_STEP, TAG_HEALTH_VERDICT)
from workloads.health.rules import HealthRules, Verdict
from workloads.health.signals import AdapterProbe, host_signals

log = logging.getLogger("fp8lab.health")
STOP_VERDICT = "doomed"


def verdict_step(at: float, steps: int, log_every: int, telemetry_every: int | None) -> tuple[int, str]:
    """The step of the verdict and, when `health.at` is not a logged step, a note saying where it went.

    `at` < 1 is a fraction of `steps` (rounded up), `at` >= 1 a step number. The verdict needs a
    logged step whose FP8 telemetry was recorded, so it moves to the next such step (the last
    step is always logged)."""
    target = max(1, math.ceil(at * steps)) if at < 1 else int(at)
    every = telemetry_every or log_every
    step = min(steps, -(-target // every) * every)
    if step == target:
        return step, ""
    return step, (f"health.at={at:g} is step {target}, which logs no "
                  f"{'telemetry' if telemetry_every else 'metrics'}: the verdict is made at step {step}, "
                  f"the next one that does")


class HealthMonitor:
    """Signals + verdict for one trial. `reference(step)` gives the reference trial's loss or None."""

    def __init__(self, probe: AdapterProbe, handle: Any, rules: HealthRules, step: int, early_stop: bool,
                 reference: Callable[[int], float | None] | None = None, logger: Any = None) -> None:
        self.probe, self.handle, self.rules = probe, handle, rules
        self.step, self.early_stop = step, early_stop
        self.reference, self.logger = reference, logger
        self.verdict: Verdict | None = None

    def device_signals(self) -> dict[str, torch.Tensor]:
        """Added to the logged step's extras (they travel in its one transfer)."""
        return self.probe.device_signals()

    def observe(self, step: int, metrics: dict[str, float]) -> Verdict | None:
        """Add the host-side signals to `metrics`; at the verdict step judge and tag the run."""
        metrics.update(host_signals(self.handle))
        if step != self.step:
            return None
        metrics.update(self._reference_signals(step, metrics.get(METRIC_LOSS, math.nan)))
        self.verdict = self.rules.judge(step, metrics)
        log.info("health at step %d: %s", step, self.verdict.line())
        if self.logger is not None:
            self.logger.set_tags({TAG_HEALTH_VERDICT: self.verdict.verdict, TAG_HEALTH_STEP: step,
                                  TAG_HEALTH_REASONS: "; ".join(self.verdict.reasons)[:5000],
                                  TAG_HEALTH_MISSING: "; ".join(self.verdict.missing)[:5000]})
        return self.verdict

    def stops(self, verdict: Verdict | None) -> bool:
        return self.early_stop and verdict is not None and verdict.verdict == STOP_VERDICT

    def _reference_signals(self, step: int, loss: float) -> dict[str, float]:
        ref = self.reference(step) if self.reference else None
        if ref is None or not ref > 0:
            return {}
        return {METRIC_HEALTH_REF_LOSS: ref, METRIC_HEALTH_LOSS_VS_REF: loss / ref}
