"""Training cost from measured throughput (docs/background.md §3 economics), pure arithmetic.

    TokensPerHour   = TPS * 3600 * N_gpu
    EffCostPerHour  = price * N_gpu / U
    Cost_per_1M     = EffCostPerHour / (TokensPerHour / 1e6)
    Cost_per_epoch  = EffCostPerHour * Tokens_epoch / TokensPerHour

TPS is tokens/s per GPU as measured by one trial. Missing or non-positive inputs give NaN, so a
run without throughput shows "n/a" instead of a division error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NAN = float("nan")


@dataclass(frozen=True)
class Cost:
    """Cost figures for one policy."""

    tokens_per_hour: float
    eff_cost_per_hour: float
    cost_per_1m_tokens: float
    cost_per_epoch: float
    hours_per_epoch: float
    """Hours billed per epoch per job: tokens / TokensPerHour / U (idle share included)."""


def _ok(x: float) -> bool:
    return math.isfinite(x) and x > 0


def training_cost(
    tokens_per_s: float | None,
    tokens_per_epoch: float | None,
    gpu_hour_price: float,
    utilization: float,
    n_gpu: int,
) -> Cost:
    """Apply the §3 formulas; any unknown input makes the dependent outputs NaN."""
    eff = gpu_hour_price * n_gpu / utilization
    tps = float(tokens_per_s) if tokens_per_s is not None else NAN
    tokens = float(tokens_per_epoch) if tokens_per_epoch is not None else NAN
    if not _ok(tps):
        return Cost(NAN, eff, NAN, NAN, NAN)
    tph = tps * 3600.0 * n_gpu
    per_1m = eff / (tph / 1e6)
    if _ok(tokens):
        per_epoch = eff * tokens / tph
        hours = tokens / tph / utilization
    else:
        per_epoch = hours = NAN
    return Cost(tph, eff, per_1m, per_epoch, hours)
