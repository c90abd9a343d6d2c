"""FP8 cast telemetry with at most one device->host transfer per recorded step.

Definitions follow Transformer Engine's debug ``LogFp8TensorStats`` so numbers compare:

- ``underflow_pct`` = (nonzeros before the cast - nonzeros after) / numel * 100: values that were
  not zero and became zero, as a share of *all* elements (zeros included) -- TE's ``underflows%``
  exactly (``debug/features/utils/stats_computation.py``), the silent failure of FP8 LoRA
  (docs/background.md §1).
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

Small casts are batched (``Fp8Telemetry.measure``): a LoRA model casts hundreds of small tensors
per step (adapter weights, rank-sized activations and gradients), where a dozen reductions per
tensor cost their per-op overhead, not their data. Below ``BATCH_BELOW_NUMEL`` elements a cast
keeps a copy of its input and a reference to its output, and ``end_step`` computes the stats of
all casts of the same shape at once (``_batched_stats``): a few dozen ops per step instead of a
dozen per cast. The numbers are the per-cast ones. Where compiled kernels serve the device (CPU
with a C++ compiler, ``formats.FUSED``) one compiled loop over the stacked batch computes them
(``_k_row_stats``: counts, amax and scales exactly, the FP32 sum behind ``mse`` in the kernel's
order); elsewhere the same eager reductions run per row (bit-identical to one cast at a time on
CPU; on a GPU ``mse`` may differ in its last bits). ``test_precision_telemetry.py`` checks both.
The deferred copies are bounded (``BATCH_BYTES``: past it the pending batch is computed at once).

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

from fp8lab_conf.contracts import METRIC_GRAD_NORM, METRIC_LORA_WEIGHT_STD, METRIC_LORA_WEIGHT_STD_MIN, METRIC_UNDERFLOW_EVENTS
from workloads.precision.formats import FUSED, Fp8Format, _k_row_stats

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
# Per-parameter LoRA health (docs/background.md §1): the number goes in the ``value`` column.
LORA_KINDS = ("lora_grad_norm", "lora_weight_std")
ROW_KEYS = (
    "step", "layer", "kind", "underflow_pct", "overflow_pct", "amax",
    "scale_inv_min", "scale_inv_max", "mse", "nonfinite", "numel", "value",
)  # fmt: skip
# Layout of one stats vector (all float64 so element counts stay exact).
_UNDER, _OVER, _AMAX, _SMIN, _SMAX, _MSE, _NONFINITE, _VALUE = range(8)
_NAN = float("nan")
# Casts below this many elements are measured in batches at the end of the step (module doc):
# under it the per-op dispatch (a few us) outweighs the data; above it the stacked per-row
# reductions lose to the flat ones (measured on CPU: a LoRA adapter's 1-4 Ki-element weights and
# rank-sized activations batch 2-3x faster, 38 Ki-element activations 4x slower).
BATCH_BELOW_NUMEL = 1 << 14
BATCH_BYTES = 64 << 20  # deferred copies held past this are measured at once (memory bound)


def count_saturated(scaled: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Elements whose scaled magnitude exceeds ``fmt.max`` (TE's overflow count), on device."""
    return torch.count_nonzero(scaled.detach().abs() > fmt.max)  # faster than bool .sum()


@torch.no_grad()
def cast_stats(x_hp: torch.Tensor, x_dq: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Stats vector of one cast (``_UNDER``.. layout), computed on ``x_hp``'s device with no host
    sync; arguments as ``_cast_parts``, whose reductions it stacks at once (a recording
    ``Fp8Telemetry`` keeps them apart and stacks every cast's at the end of the step instead)."""
    parts = _cast_parts(x_hp, x_dq, *args, **kwargs)
    return _finish_raw(torch.stack(parts).reshape(1, _RAW_WIDTH))[0]


# Layout of the raw parts of one cast (``_cast_parts``), turned into a stats vector by
# ``_finish_raw``: the two nonzero counts, not yet subtracted; the squared-error sum, not yet
# divided; the element count. Stacking 0-d tensors of mixed dtypes promotes to the widest, and the
# element count is FP64, so a stacked row is FP64 and every count in it exact.
_RAW_NZ_HP, _RAW_NZ_DQ, _RAW_SAT, _RAW_AMAX, _RAW_SMIN, _RAW_SMAX, _RAW_SQ, _RAW_NONFINITE, _RAW_NUMEL = range(9)
_RAW_WIDTH = 9


def _cast_parts(
    x_hp: torch.Tensor,
    x_dq: torch.Tensor,
    scale_inv: torch.Tensor | None,
    saturated: torch.Tensor | int = 0,
    codes: torch.Tensor | None = None,
    nan_free: bool = False,
    amax: torch.Tensor | None = None,
    row: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """The reductions behind one cast's stats vector, as 0-d tensors in the ``_RAW_*`` layout.

    ``saturated``: the cast's count of elements above the format's max (0 when it cannot saturate).
    ``amax``: max |x_hp| when the caller has it already (the scaler's pass), saving one.
    ``codes`` (the float8 data behind ``x_dq``) lets the zero count run on one byte per element
    instead of two; ``nan_free=True`` (the caster knows ``x_dq`` has no NaN, e.g. from a CPU
    finiteness check) skips counting non-finite values.

    Written for few passes: reductions run straight on the BF16 data (``aminmax``,
    ``count_nonzero``), and the one temporary is the difference (``_squared_error``: FP32 on CPU,
    where that is faster; the tensors' own dtype elsewhere, so no FP32 copy of an activation-sized
    tensor on a GPU). The subtraction, division and stacking are left to ``_finish_raw``, once
    for all the casts of a step: on mid-sized CPU tensors those scalar ops cost as much as the
    reductions (measured inside a training step, where each op pays ~5-30 us)."""
    x_hp, x_dq = x_hp.detach(), x_dq.detach()
    dev = x_hp.device
    zero = _const(0.0, dev)
    if row is None and FUSED.usable(x_hp):
        fused = FUSED.run(_k_row_stats, (x_hp.reshape(1, -1), x_dq.reshape(1, -1)))
        row = None if fused is None else fused[0]
    if row is not None:  # one compiled loop over both tensors (large CPU tensors), or the cast's own
        nonzero_hp, amax, sq_err, nonfinite = row.unbind()  # nonzero_hp: the underflow count itself
        nonzero_dq = zero
    else:
        if amax is None:
            lo, hi = torch.aminmax(x_hp)
            amax = torch.maximum(hi, -lo)
        if codes is not None:  # a value is zero iff its code's magnitude bits are (NaN is not)
            nonzero_dq = torch.count_nonzero(codes.view(torch.uint8) & 0x7F)
        else:
            nonzero_dq = torch.count_nonzero(_magnitude_bits(x_dq))
        nonzero_hp = torch.count_nonzero(_magnitude_bits(x_hp))
        sq_err = _squared_error(x_hp, x_dq)
        nonfinite = zero if nan_free else torch.count_nonzero(x_dq - x_dq)  # NaN (counted) where not finite
    if scale_inv is None:
        smin = smax = _const(1.0, dev)
    elif scale_inv.dim() == 0:
        smin = smax = scale_inv.detach()
    else:
        smin, smax = torch.aminmax(scale_inv.detach())
    sat = saturated if isinstance(saturated, torch.Tensor) else _const(float(saturated), dev)
    return [nonzero_hp, nonzero_dq, sat, amax, smin, smax, sq_err, nonfinite, _const(float(x_hp.numel()), dev)]


def _finish_raw(raw: torch.Tensor) -> torch.Tensor:
    """Stats rows ``[k, 8]`` (the ``_UNDER``.. layout) from raw rows ``[k, 9]`` (``_RAW_*``), FP64:
    underflow = nonzeros before - after, mse = squared-error sum / elements (in FP64)."""
    raw = raw.to(torch.float64)
    underflow = raw[:, _RAW_NZ_HP] - raw[:, _RAW_NZ_DQ]
    mse = raw[:, _RAW_SQ] / raw[:, _RAW_NUMEL].clamp(min=1.0)
    nan = torch.full_like(mse, _NAN)
    return torch.stack([underflow, raw[:, _RAW_SAT], raw[:, _RAW_AMAX], raw[:, _RAW_SMIN], raw[:, _RAW_SMAX],
                        mse, raw[:, _RAW_NONFINITE], nan], dim=1)


class _Parts:
    """One cast measured now (``Fp8Telemetry.measure`` for a large tensor) whose raw parts are
    stacked with every other cast's in one op at the end of the step (``_stack_parts``); then
    ``block[row]`` is its stats vector."""

    __slots__ = ("parts", "block", "row")

    def __init__(self, parts: list[torch.Tensor]) -> None:
        self.parts: list[torch.Tensor] | None = parts
        self.block: torch.Tensor | None = None
        self.row = 0


def _stack_parts(pending: list[_Parts]) -> None:
    """Stack the raw parts of ``pending`` (distinct objects) into one block and point each at its row."""
    raw = torch.stack([part for p in pending for part in p.parts]).reshape(len(pending), _RAW_WIDTH)
    block = _finish_raw(raw)
    for row, p in enumerate(pending):
        p.block, p.row, p.parts = block, row, None


def _squared_error(x_hp: torch.Tensor, x_dq: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of squared differences in FP32 (over ``dim``, or all elements).

    On CPU the difference is taken in FP32 (a copy of ``x_hp`` minus ``x_dq`` in place): a BF16
    subtraction rounds every element back to BF16 one at a time and costs ~1.7x as much (measured:
    (16, 19, 512) BF16 tensors, cache-cold, 195 us -> 117 us for the whole sum). The result is the
    same number bit for bit wherever the BF16 difference was exact (both values within a factor of 2,
    i.e. every element but saturated ones), and the exact difference elsewhere. Elsewhere (GPU) the
    difference stays in the tensors' own dtype: no FP32 copy of an activation-sized tensor."""
    if x_hp.device.type == "cpu":
        diff = x_hp.to(torch.float32, copy=True)  # a copy even when x_hp is FP32: subtracted in place
        diff.sub_(x_dq)
        return torch.linalg.vector_norm(diff, dim=dim).square()
    return torch.linalg.vector_norm(x_hp - x_dq, dim=dim, dtype=torch.float32).square()


_MAGNITUDE = {torch.bfloat16: (torch.int16, 0x7FFF), torch.float16: (torch.int16, 0x7FFF),
              torch.float32: (torch.int32, 0x7FFFFFFF), torch.float64: (torch.int64, 0x7FFFFFFFFFFFFFFF)}


def _magnitude_bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits without the sign, as integers: non-zero exactly where ``t`` is (-0.0 is zero,
    NaN is not). Counting these is the same count as ``count_nonzero(t)`` in integer ops, which on
    CPU run at several times the speed of BF16 comparisons."""
    view = _MAGNITUDE.get(t.dtype)
    if view is None:  # other dtypes: the values themselves
        return t
    return t.view(view[0]) & view[1]


def _const(value: float, device: torch.device) -> torch.Tensor:
    """A 0-d FP64 constant (cached per device on CPU: these are never written to)."""
    if device.type == "cpu":
        key = value if value == value else "nan"  # NaN != NaN: key it by name
        cached = _CPU_CONSTS.get(key)
        if cached is None:
            cached = _CPU_CONSTS[key] = torch.tensor(value, dtype=torch.float64)
        return cached
    return torch.full((), value, dtype=torch.float64, device=device)


_CPU_CONSTS: dict[Any, torch.Tensor] = {}


@torch.no_grad()
def _value_block(value: torch.Tensor, amax: torch.Tensor, nonfinite: torch.Tensor) -> torch.Tensor:
    """Stats rows ``[k, 8]`` of LoRA-health entries: only amax, nonfinite and value are meaningful."""
    stats = torch.full((value.shape[0], 8), _NAN, dtype=torch.float64, device=value.device)
    stats[:, _AMAX] = amax
    stats[:, _NONFINITE] = nonfinite.to(torch.float64)
    stats[:, _VALUE] = value
    return stats


class _Deferred:
    """One small cast whose stats are computed later, with the others of its shape.

    ``x`` is a copy of the high-precision input (the caller may write the original in place
    afterwards, as the optimizer does to an adapter weight); ``dq`` is the cast's own output,
    held by reference and checked unchanged (``version``) when measured. Once ``_measure_deferred``
    ran, ``block[row]`` is its stats vector (the block holds its batch's rows)."""

    __slots__ = ("x", "dq", "version", "codes", "scale_inv", "saturated", "amax", "nan_free", "block", "row")

    def __init__(self, x_hp: torch.Tensor, x_dq: torch.Tensor, scale_inv: torch.Tensor | None,
                 saturated: torch.Tensor | int, codes: torch.Tensor | None, nan_free: bool,
                 amax: torch.Tensor | None) -> None:
        flat = x_hp.detach().reshape(-1)
        self.x = flat.clone() if flat.data_ptr() == x_hp.data_ptr() else flat  # reshape may have copied already
        self.dq = x_dq.detach().reshape(-1)
        self.version = self.dq._version
        self.codes = None if codes is None else codes.view(torch.uint8).reshape(-1)
        self.scale_inv = None if scale_inv is None else scale_inv.detach()
        self.saturated, self.amax, self.nan_free = saturated, amax, nan_free
        self.block: torch.Tensor | None = None
        self.row = 0

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + self.dq.nbytes

    def group(self) -> tuple[Any, ...]:
        """Casts with equal keys stack into one batch."""
        s = self.scale_inv
        return (self.x.numel(), self.x.dtype, self.dq.dtype, self.x.device, self.codes is None,
                self.amax is None, None if s is None else tuple(s.shape))


@torch.no_grad()
def _batched_stats(batch: list[_Deferred]) -> torch.Tensor:
    """Stats rows ``[k, 8]`` of ``k`` casts of one shape: the reductions of ``_cast_parts``, run
    once over the stacked tensors, per row (one compiled loop where compiled kernels serve the
    device: measured in a training step on a 2-core Xeon, fp8_naive's ~110 small casts cost ~2.7 ms
    less per recorded step than with the eager per-row reductions), and finished by the same
    ``_finish_raw`` (so each row is that cast's vector)."""
    first = batch[0]
    dev, n = first.x.device, first.x.numel()
    x = torch.stack([d.x for d in batch])
    dq = torch.stack([d.dq for d in batch])
    nan_free = all(d.nan_free for d in batch)  # the caster knows: 0 non-finite values, as per cast
    fused = FUSED.run(_k_row_stats, (x, dq)) if FUSED.compiles(x) else None
    if fused is not None:  # one compiled loop over the whole stack
        nonzero_hp, amax, sq_err, nonfinite = fused.unbind(1)  # nonzero_hp: the underflow count itself
        nonzero_dq = torch.zeros_like(nonzero_hp)
    else:
        if first.codes is not None:  # a value is zero iff its code's magnitude bits are (NaN is not)
            nonzero_dq = _nonzero_per_row(torch.stack([d.codes for d in batch]) & 0x7F)
        else:
            nonzero_dq = _nonzero_per_row(_magnitude_bits(dq))
        nonzero_hp = _nonzero_per_row(_magnitude_bits(x))
        sq_err = _squared_error(x, dq, dim=1)
        if not nan_free:
            nonfinite = torch.count_nonzero(dq - dq, dim=1)  # 0 where finite, NaN (counted) where not
        if first.amax is None:
            lo, hi = torch.aminmax(x, dim=1)
            amax = torch.maximum(hi, -lo)
    if first.amax is not None:  # the scaler's own amax: the same number, and the row's as logged per cast
        amax = _stack_scalars([d.amax for d in batch])
    if nan_free:
        nonfinite = torch.zeros(len(batch), dtype=torch.float64, device=dev)
    if first.scale_inv is None:
        smin = smax = torch.ones(len(batch), dtype=torch.float64, device=dev)
    elif first.scale_inv.dim() == 0:
        smin = smax = _stack_scalars([d.scale_inv for d in batch])
    else:
        smin, smax = torch.aminmax(torch.stack([d.scale_inv for d in batch]).reshape(len(batch), -1), dim=1)
    saturated = _stack_scalars([d.saturated if isinstance(d.saturated, torch.Tensor)
                                else _const(float(d.saturated), dev) for d in batch])
    numel = torch.full((len(batch),), float(n), dtype=torch.float64, device=dev)
    raw = [nonzero_hp, nonzero_dq, saturated, amax, smin, smax, sq_err, nonfinite, numel]  # the _RAW_* layout
    return _finish_raw(torch.stack([t.to(torch.float64) for t in raw], dim=1))


def _nonzero_per_row(bits: torch.Tensor) -> torch.Tensor:
    """Non-zero integers per row of ``[k, n]`` (``count_nonzero(dim=1)``'s number, without its
    slow conversion of the whole mask to int64)."""
    return (bits != 0).sum(dim=1, dtype=torch.int64)


def _nonfinite_rows(t2d: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """NaN/Inf elements per row of ``t2d``, given its rows' amax (NaN or Inf exactly when the row
    holds a non-finite value). On CPU, where reading a tensor is no device sync, all-finite rows
    (the usual case) skip the count; elsewhere it is always counted (no sync)."""
    if t2d.device.type == "cpu" and bool(torch.isfinite(amax).all()):
        return torch.zeros(t2d.shape[0], dtype=torch.int64)
    return (~torch.isfinite(t2d)).sum(dim=1)


def _stack_scalars(values: list[torch.Tensor]) -> torch.Tensor:
    """0-d tensors stacked into ``[k]`` (one op when they share a dtype, as they do per site)."""
    if all(v.dtype == values[0].dtype for v in values):
        return torch.stack(values)
    return torch.stack([v.to(torch.float64) for v in values])


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
    stats: torch.Tensor | _Parts | _Deferred | None  # None once the rows are on the host (``_entries``)
    static: bool = False


@dataclass
class _Block:
    """Several entries whose stats were computed together: ``keys[i]`` = (layer, kind, numel)
    describes row ``stats[i]`` of a ``[k, 8]`` tensor."""

    keys: list[tuple[str, str, int]]
    stats: torch.Tensor


class Fp8Telemetry:
    """Collects FP8 cast stats during a step and reports them after one transfer."""

    def __init__(self, underflow_threshold_pct: float = 10.0, batch_below_numel: int = BATCH_BELOW_NUMEL) -> None:
        self.underflow_threshold_pct = float(underflow_threshold_pct)
        self.batch_below_numel = int(batch_below_numel)  # 0: every cast measured at once
        self.recording = False
        self.step = -1
        self.events_total = 0
        self._pending: list[_Pending | _Block] = []
        self._deferred: list[_Deferred] = []
        self._deferred_bytes = 0
        self._static: dict[tuple[str, str], _Pending] = {}
        self._static_reported: set[tuple[str, str]] = set()
        self.whatif: Any = None  # a whatif.WhatIf when precision.telemetry.whatif is on

    # -- recording -------------------------------------------------------------------------
    def begin_step(self, step: int, record: bool) -> None:
        """Start step ``step``; cast sites record only when ``record`` is True."""
        self.step = step
        self.recording = bool(record)
        self._pending.clear()
        self._deferred.clear()
        self._deferred_bytes = 0

    def record_cast(
        self,
        layer: str,
        kind: str,
        x_hp: torch.Tensor,
        x_dq: torch.Tensor,
        scale_inv: torch.Tensor | None,
        saturated: torch.Tensor | int = 0,
        codes: torch.Tensor | None = None,
        nan_free: bool = False,
    ) -> None:
        """Append the stats of one cast (device math only). No-op when not recording.
        ``codes``/``nan_free``: see ``cast_stats``."""
        if not self.recording:
            return
        stats = self.measure(x_hp, x_dq, scale_inv, saturated, codes, nan_free)
        self.record_stats(layer, kind, x_hp.numel(), stats)

    def measure(
        self,
        x_hp: torch.Tensor,
        x_dq: torch.Tensor,
        scale_inv: torch.Tensor | None,
        saturated: torch.Tensor | int = 0,
        codes: torch.Tensor | None = None,
        nan_free: bool = False,
        amax: torch.Tensor | None = None,
    ) -> _Parts | _Deferred:
        """The stats of one cast for ``record_stats``: for a large tensor its reductions now
        (``_cast_parts``), stacked with the others' at the end of the step; for a small one
        (``batch_below_numel``) a deferred entry measured with the others of its shape at the end
        of the step (module doc). Arguments as ``cast_stats``."""
        if x_hp.numel() >= self.batch_below_numel:
            return _Parts(_cast_parts(x_hp, x_dq, scale_inv, saturated, codes, nan_free, amax))
        deferred = _Deferred(x_hp, x_dq, scale_inv, saturated, codes, nan_free, amax)
        self._deferred.append(deferred)
        self._deferred_bytes += deferred.nbytes
        if self._deferred_bytes > BATCH_BYTES:
            self._measure_deferred()
        return deferred

    def measured(self, x_hp: torch.Tensor, x_dq: torch.Tensor, scale_inv: torch.Tensor | None,
                 row: torch.Tensor, saturated: torch.Tensor | int) -> _Parts:
        """``measure`` for a cast whose kernel computed its reductions already (``row``, the
        ``_k_row_stats`` layout: ``TensorScaler.quantize_dequantize_measured``)."""
        return _Parts(_cast_parts(x_hp, x_dq, scale_inv, saturated, row=row))

    def record_stats(self, layer: str, kind: str, numel: int, stats: torch.Tensor | _Parts | _Deferred) -> None:
        """Append a stats vector computed already (``cast_stats``) or to be finished (``measure``);
        no-op when not recording. Casts shared by sibling layers report the same vector under
        each layer."""
        if self.recording:
            self._pending.append(_Pending(layer, kind, numel, stats))

    def _measure_deferred(self) -> None:
        """Compute every deferred cast's stats, one stacked batch per shape (``_batched_stats``)."""
        groups: dict[tuple[Any, ...], list[_Deferred]] = {}
        for deferred in self._deferred:
            if deferred.dq._version != deferred.version:
                raise RuntimeError("FP8 telemetry: a cast's output was written in place before its statistics "
                                   "were computed; measure it at once (Fp8Telemetry(batch_below_numel=0))")
            groups.setdefault(deferred.group(), []).append(deferred)
        for batch in groups.values():
            block = _batched_stats(batch)
            for row, deferred in enumerate(batch):
                deferred.block, deferred.row = block, row
                deferred.x = deferred.dq = deferred.codes = None  # type: ignore[assignment]  # free the copies
        self._deferred.clear()
        self._deferred_bytes = 0

    def register_static(self, layer: str, kind: str, stats: torch.Tensor, numel: int) -> None:
        """Stats of a tensor that never changes (frozen FP8 weights), see module docstring."""
        self._static[(layer, kind)] = _Pending(layer, kind, numel, stats, static=True)
        self._static_reported.discard((layer, kind))

    @torch.no_grad()
    def record_lora(self, model: nn.Module) -> None:
        """Per trainable (LoRA) parameter: grad L2 norm and weight std, on device.

        Call after gradients are unscaled and before the optimizer step, so the numbers are
        the ones the optimizer sees. Parameters of the same shape are stacked and reduced
        together (a LoRA model has a handful of shapes and hundreds of parameters), so the cost
        is a few ops per shape, not per parameter.
        """
        if not self.recording:
            return
        groups: dict[tuple[Any, ...], list[tuple[str, torch.Tensor]]] = {}
        for name, p in model.named_parameters():
            if p.requires_grad:
                groups.setdefault((tuple(p.shape), p.dtype, p.device), []).append((name, p))
        for items in groups.values():
            layers = [name.removesuffix(".weight") for name, _ in items]
            numel = items[0][1].numel()
            w = torch.stack([p for _, p in items]).reshape(len(items), -1).float()  # no_grad: no detach needed
            std = w.std(dim=1) if numel > 1 else torch.full((len(items),), _NAN, device=w.device)
            amax = w.abs().amax(dim=1)
            self._pending.append(
                _Block([(layer, "lora_weight_std", numel) for layer in layers],
                       _value_block(std, amax, _nonfinite_rows(w, amax)))
            )
            with_grad = [(layer, p.grad) for layer, (_, p) in zip(layers, items) if p.grad is not None]
            if with_grad:
                g = torch.stack([grad for _, grad in with_grad])
                g = g.reshape(len(with_grad), -1).float()
                amax = g.abs().amax(dim=1)
                self._pending.append(
                    _Block([(layer, "lora_grad_norm", numel) for layer, _ in with_grad],
                           _value_block(torch.linalg.vector_norm(g, dim=1), amax, _nonfinite_rows(g, amax)))
                )

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
        self._measure_deferred()
        if self.whatif is not None:
            self.whatif.end_step(self.step)
        extras = dict(extras or {})
        items = list(self._static.values()) + self._pending
        entries = [e for item in items for e in _entries(item)]
        host_extras = {k: float(v) for k, v in extras.items() if not isinstance(v, torch.Tensor)}
        dev_extras = {k: v for k, v in extras.items() if isinstance(v, torch.Tensor)}
        values = self._transfer(items, list(dev_extras.values()))
        self._pending.clear()
        stats, extra_values = values[: len(entries)], values[len(entries) :]
        rows = self._merge(entries, stats)
        events = self._new_events(rows)
        metrics = _aggregate(rows)
        metrics["underflow/new_events"] = float(len(events))
        metrics[METRIC_UNDERFLOW_EVENTS] = float(self.events_total)
        metrics.update(host_extras)
        metrics.update({k: float(v[0]) for k, v in zip(dev_extras, extra_values, strict=True)})
        return StepTelemetry(self.step, rows, metrics, events)

    @staticmethod
    def _transfer(items: list[_Pending | _Block], extras: list[torch.Tensor]) -> list[list[float]]:
        """Every item's stats rows and the extras, moved to the host in ONE transfer.

        The raw parts of the casts measured during the step are stacked in one op (``_stack_parts``);
        every stats tensor (a vector, a batch's block, a LoRA block) goes into the transfer once,
        however many items report it (shared casts), and the rows are handed out on the host."""
        if not items and not extras:
            return []
        stats = [item.stats for item in items]
        parts = list({id(s): s for s in stats if isinstance(s, _Parts) and s.block is None}.values())
        if parts:
            _stack_parts(parts)
        sources = [(s.block, s.row) if isinstance(s, _Parts | _Deferred) else (s, None) for s in stats]
        device = (sources[0][0] if sources else extras[0]).device
        blocks: list[torch.Tensor] = []
        first_row: dict[int, int] = {}  # id(tensor) -> its first row in the transfer
        rows = 0
        for tensor, _ in sources:
            if id(tensor) not in first_row:
                first_row[id(tensor)] = rows
                blocks.append(tensor.to(device).reshape(-1, 8))
                rows += blocks[-1].shape[0]
        if extras:
            scalars = torch.stack([x.detach().reshape(()).to(device, torch.float64) for x in extras])
            blocks.append(torch.nn.functional.pad(scalars.reshape(-1, 1), (0, 7)))
        host = torch.cat(blocks).tolist()  # SYNC: the one device->host transfer per step
        values: list[list[float]] = []
        for tensor, row in sources:
            start = first_row[id(tensor)]
            if row is not None:
                values.append(host[start + row])
            else:
                values.extend(host[start : start + tensor.numel() // 8])
        return values + host[rows:]

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


def _entries(item: _Pending | _Block) -> list[_Pending]:
    """The entries of a pending item, one per stats row (stats tensors left out: host side)."""
    if isinstance(item, _Block):
        # host side only: the stats rows come back from the one transfer
        return [_Pending(layer, kind, numel, None) for layer, kind, numel in item.keys]
    return [item]


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
        metrics[METRIC_GRAD_NORM] = math.sqrt(sum(v * v for v in grad_norms))
    stds = [r["value"] for r in rows if r["kind"] == "lora_weight_std"]
    if stds:
        metrics[METRIC_LORA_WEIGHT_STD] = _mean(stds)
        metrics[METRIC_LORA_WEIGHT_STD_MIN] = min(stds)
    return metrics


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else _NAN


def _max(values: Any) -> float:
    values = list(values)
    return _NAN if any(math.isnan(v) for v in values) else max(values)
