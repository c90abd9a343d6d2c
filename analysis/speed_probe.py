"""The sweep's paired speed probe (`sweep.speed_probe=true`, logged on the parent run as
`speed_probe/<policy>/{ratio,low,high}`: step-time ratio to bf16) in the summary's speed columns.

Why it replaces the sweep-time ratio: the probe timed the policies back to back in one process,
interleaved, so load hits both sides of each ratio; the trials' own tokens/s were taken whenever
each trial happened to run. The probe ran at the sweep's base config, so it applies to the groups
without other axes; everywhere else the sweep-time ratio stays, marked indicative.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

PREFIX = "speed_probe/"
PAIRED = "paired probe"
INDICATIVE = "sweep-time tokens/s, indicative"


def probe_ratios(parent_metrics: dict[str, float] | None) -> dict[str, tuple[float, float, float]]:
    """policy -> (tokens/s ratio, low, high) to bf16: the inverse of the logged step-time ratio."""
    out: dict[str, tuple[float, float, float]] = {}
    metrics = parent_metrics or {}
    for key, value in metrics.items():
        if key.startswith(PREFIX) and key.endswith("/ratio"):
            policy = key[len(PREFIX):-len("/ratio")]
            low, high = metrics.get(f"{PREFIX}{policy}/low", math.nan), metrics.get(f"{PREFIX}{policy}/high", math.nan)
            out[policy] = (_inv(value), _inv(high), _inv(low))
    return out


def apply_probe(summary: pd.DataFrame, ratios: dict[str, tuple[float, float, float]]) -> pd.DataFrame:
    """Summary rows of axis-free groups take the probe's ratio; every row says where its ratio is from."""
    out = summary.copy()
    if out.empty:
        return out
    out["tps_ratio_source"] = INDICATIVE
    for i, row in out.iterrows():
        if row["policy"] in ratios and not _has_axes(row):
            ratio, low, high = ratios[row["policy"]]
            out.loc[i, ["tps_ratio", "tps_ratio_low", "tps_ratio_high"]] = [ratio, low, high]
            out.loc[i, "tps_ratio_source"] = PAIRED
    return out


def _has_axes(row: Any) -> bool:
    return bool(str(row.get("axes_key") or ""))


def _inv(value: float) -> float:
    return 1.0 / value if value and math.isfinite(value) else math.nan
