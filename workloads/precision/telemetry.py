"""FP8 cast telemetry with at most one device->host transfer per recorded step.

Definitions follow Transformer Engine's debug ``LogFp8TensorStats`` so numbers compare:

- ``underflow_pct`` = (nonzeros before the cast - nonzeros after) / numel * 100: values that were
  not zero and became zero -- the silent failure of FP8 LoRA (SOURCES.md section 1).
- ``overflow_pct`` = share of elements with ``|x * scale| > fmax`` before the cast, i.e. saturated
  at the format's max (TE's ``fp8_*_overflows%``).
- ``amax`` of the high-precision tensor, ``scale_inv_min/max`` over its scales (1 for a plain
  cast), ``mse`` between the high-precision tensor and the dequantized cast, ``nonfinite`` =
  NaN/Inf count after the cast.
- an *underflow event* is a (step, layer, kind) whose ``underflow_pct >= threshold``.

Cost rule: cast sites check ``telemetry.recording`` first, so on steps that are not recorded
the only cost is that attribute check. On recorded steps each cast appends one small stats
tensor computed on the device; ``end_step`` stacks all of them (plus extras such as the loss)
and moves them to the host in ONE transfer. Micro-batches of one step recorded under the same
(layer, kind) are merged on the host after that transfer.

Frozen base weights never change, so their stats are computed once at conversion
(``register_static``), emitted on every recorded step so per-step plots stay continuous, and
counted as underflow events only once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workloads.precision.formats import Fp8Format

__all__ = [
    "CAST_KINDS",
    "LORA_KINDS",
    "ROW_KEYS",
    "StepTelemetry",
    "Fp8Telemetry",
    "cast_stats",
    "count_saturated",
]

CAST_KINDS = ("activation", "weight", "dgrad", "wgrad", "lora_weight")
# Per-parameter LoRA health (SOURCES.md section 1): the number goes in the ``value`` column.
LORA_KINDS = ("lora_grad_norm", "lora_weight_std")
ROW_KEYS = (
    "step", "layer", "kind", "underflow_pct", "overflow_pct", "amax",
    "scale_inv_min", "scale_inv_max", "mse", "nonfinite", "numel", "value",
)  # fmt: skip
# Layout of one stats vector (all float64 so element counts stay exact).
_UNDER, _OVER, _AMAX, _SMIN, _SMAX, _MSE, _NONFINITE, _VALUE = range(8)
_NAN = float("nan")


def count_saturated(scaled: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Elements whose scaled magnitude exceeds ``fmt.max`` (TE's overflow count), on device."""
    return torch.count_nonzero(scaled.detach().abs() > fmt.max)  # faster than bool .sum()


@torch.no_grad()
def cast_stats(
    x_hp: torch.Tensor,
    x_dq: torch.Tensor,
    scale_inv: torch.Tensor | None,
    saturated: torch.Tensor | int = 0,
) -> torch.Tensor:
    """Stats vector of one cast, computed on ``x_hp``'s device with no host sync.

    Written for few passes and no FP32 copies of activation-sized tensors: reductions run
    straight on the BF16 data (``aminmax``, ``count_nonzero``, ``vector_norm(dtype=float32)``),
    and the one temporary is the difference in the tensors' own dtype (exact while the two
    values are within a factor of 2 of each other, i.e. everywhere but saturated/flushed ones).
    """
    x_hp, x_dq = x_hp.detach(), x_dq.detach()
    dev = x_hp.device
    sinv = torch.ones((), device=dev) if scale_inv is None else scale_inv.detach().float()
    lo, hi = torch.aminmax(x_hp)
    sq_err = torch.linalg.vector_norm(x_hp - x_dq, dtype=torch.float32).square()
    parts = [
        torch.count_nonzero(x_hp) - torch.count_nonzero(x_dq),
        torch.as_tensor(saturated, device=dev),
        torch.maximum(hi, -lo).float(),
        sinv.min(),
        sinv.max(),
        sq_err / max(x_hp.numel(), 1),
        torch.count_nonzero(x_dq - x_dq),  # 0 where finite, NaN (counted) where not
        torch.full((), _NAN, device=dev),
    ]
    return torch.stack([p.to(torch.float64) for p in parts])


@torch.no_grad()
def _value_stats(value: torch.Tensor, amax: torch.Tensor, nonfinite: torch.Tensor) -> torch.Tensor:
    """Stats vector of a LoRA-health row: only amax, nonfinite and value are meaningful."""
    stats = torch.full((8,), _NAN, dtype=torch.float64, device=value.device)
    stats[_AMAX] = amax.to(torch.float64)
    stats[_NONFINITE] = nonfinite.to(torch.float64)
    stats[_VALUE] = value.to(torch.float64)
    return stats


@dataclass
class StepTelemetry:
    """What one recorded step produced, already on the host.

    ``rows``: per (layer, kind) dicts with the keys in ``ROW_KEYS`` (the Parquet table).
    ``metrics``: aggregates under their MLflow names (docs/contracts.md) plus the extras.
    ``events``: the new underflow events of this step as (step, layer, kind).
    """

    step: int
    rows: list[dict[str, Any]]
    metrics: dict[str, float]
    events: list[tuple[int, str, str]] = field(default_factory=list)


@dataclass
class _Pending:
    layer: str
    kind: str
    numel: int
    stats: torch.Tensor
    static: bool = False


class Fp8Telemetry:
    """Collects FP8 cast stats during a step and reports them after one transfer."""

    def __init__(self, underflow_threshold_pct: float = 10.0) -> None:
        self.underflow_threshold_pct = float(underflow_threshold_pct)
        self.recording = False
        self.step = -1
        self.events_total = 0
        self._pending: list[_Pending] = []
        self._static: dict[tuple[str, str], _Pending] = {}
        self._static_reported: set[tuple[str, str]] = set()

    # -- recording -------------------------------------------------------------------------
    def begin_step(self, step: int, record: bool) -> None:
        """Start step ``step``; cast sites record only when ``record`` is True."""
        self.step = step
        self.recording = bool(record)
        self._pending.clear()

    def record_cast(
        self,
        layer: str,
        kind: str,
        x_hp: torch.Tensor,
        x_dq: torch.Tensor,
        scale_inv: torch.Tensor | None,
        saturated: torch.Tensor | int = 0,
    ) -> None:
        """Append the stats of one cast (device math only). No-op when not recording."""
        if not self.recording:
            return
        stats = cast_stats(x_hp, x_dq, scale_inv, saturated)
        self._pending.append(_Pending(layer, kind, x_hp.numel(), stats))

    def register_static(self, layer: str, kind: str, stats: torch.Tensor, numel: int) -> None:
        """Stats of a tensor that never changes (frozen FP8 weights), see module docstring."""
        self._static[(layer, kind)] = _Pending(layer, kind, numel, stats, static=True)
        self._static_reported.discard((layer, kind))

    @torch.no_grad()
    def record_lora(self, model: nn.Module) -> None:
        """Per trainable (LoRA) parameter: grad L2 norm and weight std, on device.

        Call after gradients are unscaled and before the optimizer step, so the numbers are
        the ones the optimizer sees.
        """
        if not self.recording:
            return
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            layer = name.removesuffix(".weight")
            w = p.detach().float()
            w_stats = _value_stats(w.std(), w.abs().amax(), (~torch.isfinite(w)).sum())
            self._pending.append(_Pending(layer, "lora_weight_std", p.numel(), w_stats))
            if p.grad is not None:
                g = p.grad.detach().float()
                g_stats = _value_stats(
                    torch.linalg.vector_norm(g), g.abs().amax(), (~torch.isfinite(g)).sum()
                )
                self._pending.append(_Pending(layer, "lora_grad_norm", p.numel(), g_stats))

    # -- reporting -------------------------------------------------------------------------
    def end_step(
        self, extras: Mapping[str, torch.Tensor | float] | None = None
    ) -> StepTelemetry | None:
        """Finish the step: one device->host transfer, then host-side merging and aggregates.

        Returns None (and transfers nothing) on steps that were not recorded.
        """
        if not self.recording:
            return None
        self.recording = False
        extras = dict(extras or {})
        entries = list(self._static.values()) + self._pending
        host_extras = {k: float(v) for k, v in extras.items() if not isinstance(v, torch.Tensor)}
        dev_extras = {k: v for k, v in extras.items() if isinstance(v, torch.Tensor)}
        values = self._transfer(entries, list(dev_extras.values()))
        self._pending.clear()
        stats, extra_values = values[: len(entries)], values[len(entries) :]
        rows = self._merge(entries, stats)
        events = self._new_events(rows)
        metrics = _aggregate(rows)
        metrics["underflow/new_events"] = float(len(events))
        metrics["underflow/events"] = float(self.events_total)
        metrics.update(host_extras)
        metrics.update({k: float(v[0]) for k, v in zip(dev_extras, extra_values, strict=True)})
        return StepTelemetry(self.step, rows, metrics, events)

    @staticmethod
    def _transfer(entries: list[_Pending], extras: list[torch.Tensor]) -> list[list[float]]:
        """Stack every stats vector and extra into one tensor and copy it to the host once."""
        if not entries and not extras:
            return []
        device = (entries[0].stats if entries else extras[0]).device
        vectors = [e.stats.to(device) for e in entries]
        vectors += [_pad8(x.detach().reshape(()).to(device, torch.float64)) for x in extras]
        return torch.stack(vectors).tolist()  # SYNC: the one device->host transfer per step

    def _merge(self, entries: list[_Pending], stats: list[list[float]]) -> list[dict[str, Any]]:
        """Combine micro-batch records of the same (layer, kind) into one row (host only)."""
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for entry, s in zip(entries, stats, strict=True):
            key = (entry.layer, entry.kind)
            row = merged.get(key)
            if row is None:
                merged[key] = _new_row(self.step, entry, s)
            else:
                _accumulate(row, entry.numel, s)
        rows = list(merged.values())
        for row in rows:
            _finish_row(row)
        return rows

    def _new_events(self, rows: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
        events = []
        for row in rows:
            if row["kind"] not in CAST_KINDS:
                continue
            if not row["underflow_pct"] >= self.underflow_threshold_pct:
                continue
            key = (row["layer"], row["kind"])
            if key in self._static:
                if key in self._static_reported:
                    continue
                self._static_reported.add(key)
            events.append((self.step, row["layer"], row["kind"]))
        self.events_total += len(events)
        return events


def _pad8(x: torch.Tensor) -> torch.Tensor:
    """An extra scalar as a stats-shaped vector so it can ride in the same stacked transfer."""
    return torch.cat([x.reshape(1), torch.zeros(7, dtype=x.dtype, device=x.device)])


def _new_row(step: int, entry: _Pending, s: list[float]) -> dict[str, Any]:
    # Accumulate raw counts/sums; _finish_row turns them into percentages and means.
    return {
        "step": step,
        "layer": entry.layer,
        "kind": entry.kind,
        "underflow_pct": s[_UNDER],
        "overflow_pct": s[_OVER],
        "amax": s[_AMAX],
        "scale_inv_min": s[_SMIN],
        "scale_inv_max": s[_SMAX],
        "mse": s[_MSE] * entry.numel,
        "nonfinite": s[_NONFINITE],
        "numel": entry.numel,
        "value": s[_VALUE],
    }


def _accumulate(row: dict[str, Any], numel: int, s: list[float]) -> None:
    row["underflow_pct"] += s[_UNDER]
    row["overflow_pct"] += s[_OVER]
    row["amax"] = _nanmax(row["amax"], s[_AMAX])
    row["scale_inv_min"] = min(row["scale_inv_min"], s[_SMIN])
    row["scale_inv_max"] = max(row["scale_inv_max"], s[_SMAX])
    row["mse"] += s[_MSE] * numel
    row["nonfinite"] += s[_NONFINITE]
    row["numel"] += numel
    row["value"] = s[_VALUE]  # LoRA-health rows are recorded once per step; keep the latest


def _finish_row(row: dict[str, Any]) -> None:
    n = max(row["numel"], 1)
    row["underflow_pct"] = row["underflow_pct"] / n * 100.0
    row["overflow_pct"] = row["overflow_pct"] / n * 100.0
    row["mse"] = row["mse"] / n
    row["nonfinite"] = 0 if math.isnan(row["nonfinite"]) else int(row["nonfinite"])


def _nanmax(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return _NAN
    return max(a, b)


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per-kind means/maxima under the metric names of docs/contracts.md."""
    metrics: dict[str, float] = {}
    for kind in CAST_KINDS:
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        metrics[f"telemetry/{kind}/underflow_pct"] = _mean(r["underflow_pct"] for r in sel)
        metrics[f"telemetry/{kind}/overflow_pct"] = _mean(r["overflow_pct"] for r in sel)
        metrics[f"telemetry/{kind}/amax"] = _max(r["amax"] for r in sel)
    metrics["telemetry/nonfinite"] = float(
        sum(r["nonfinite"] for r in rows if r["kind"] in CAST_KINDS)
    )
    grad_norms = [r["value"] for r in rows if r["kind"] == "lora_grad_norm"]
    if grad_norms:  # global L2 norm over all LoRA grads = sqrt(sum of squared per-param norms)
        metrics["train/grad_norm"] = math.sqrt(sum(v * v for v in grad_norms))
    stds = [r["value"] for r in rows if r["kind"] == "lora_weight_std"]
    if stds:
        metrics["train/lora_weight_std"] = _mean(stds)
        metrics["train/lora_weight_std_min"] = min(stds)
    return metrics


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else _NAN


def _max(values: Any) -> float:
    values = list(values)
    return _NAN if any(math.isnan(v) for v in values) else max(values)
