"""Sweep axes as one flat mapping: the shape schema, the sweep grammar and the matrix all read.

Its own module (importing nothing of fp8lab) so that `schema` can use it without importing
`matrix`, which imports `schema`: no import circle in the orchestrator.
"""
from __future__ import annotations

from typing import Any


def flatten_axes(axes: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{lora: {r: [8, 16]}}` (from `+sweep.axes.lora.r=[8,16]`) becomes `{"lora.r": [8, 16]}`."""
    flat: dict[str, Any] = {}
    for key, value in axes.items():
        if isinstance(value, dict):
            flat.update(flatten_axes(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
