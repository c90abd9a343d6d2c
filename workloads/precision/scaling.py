"""Scaling recipes (names follow Transformer Engine) and the per-tensor state that applies them.

A scale maps a tensor into the FP8 range before the cast (``q = cast(x * scale)``) and
``scale_inv = 1 / scale`` maps it back. Recipes:

- ``none``: plain cast, scale 1 -- what a naive FP8 conversion does.
- ``current``: per-tensor ``scale = fmax / amax(x) * 2**-margin`` from this very tensor.
- ``delayed``: per-tensor scale from an amax *history* of earlier casts (TE's DelayedScaling):
  the scale used now was decided before this tensor was seen, then this tensor's amax is pushed
  into the history. Cheap on real hardware (one pass), but lags behind the data, which is why
  it needs calibration steps before training.
- ``block``: one scale per tile -- 1x128 tiles along the last dim for activations and
  gradients, 128x128 blocks for weights (DeepSeek-V3 / TE Float8BlockScaling layout), FP32 scales.
  Dims that are not multiples of the block are zero-padded for the amax only; zeros never raise
  an amax, and the padding is cropped again, so results equal a ragged last tile.

Scales are powers of two by default (``power_2_scale=True``, as in TE's Float8BlockScaling and
MXFP8): multiplying a BF16 tensor by 2**k is exact, so the scale is applied in BF16 without an
FP32 copy and the cast is still a single rounding -- the emulation gets cheaper at no cost in
fidelity. The price is at most one binade of headroom (amax lands in (fmax/2, fmax]).
``power_2_scale=False`` gives TE's DelayedScaling/CurrentScaling arithmetic (FP32 multiply).

Everything stays on the device: no ``.item()``, no host sync. An amax of 0 (all-zero tensor) or
a non-finite amax gives scale 1, so zeros stay zeros and Inf/NaN still reach the cast and show up
as non-finite instead of being scaled to 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from workloads.precision.formats import (
    FORMATS,
    Fp8Format,
    FUSED,
    decode_fp32,
    decode_fp32_factor,
    get_format,
    restore_nan,
    saturating_cast,
)

__all__ = [
    "SCALING_KINDS",
    "ScalingRecipe",
    "CastSpec",
    "Role",
    "Fp8Tensor",
    "TensorScaler",
    "amax_to_scale",
    "tensor_amax",
    "tile_shape_for",
    "block_amax",
    "expand_blocks",
]

SCALING_KINDS = ("none", "current", "delayed", "block")
AMAX_ALGOS = ("max", "most_recent")
Role = Literal["activation", "grad", "weight"]


@dataclass(frozen=True)
class ScalingRecipe:
    """How one tensor is scaled into FP8. Validated on construction (ValueError, not assert)."""

    kind: str = "none"
    amax_history_len: int = 16
    amax_compute_algo: str = "max"
    margin: int = 0
    block_size: int = 128
    power_2_scale: bool = True

    def __post_init__(self) -> None:
        errors = []
        if self.kind not in SCALING_KINDS:
            errors.append(f"kind={self.kind!r} not in {SCALING_KINDS}")
        if self.amax_compute_algo not in AMAX_ALGOS:
            errors.append(f"amax_compute_algo={self.amax_compute_algo!r} not in {AMAX_ALGOS}")
        if self.amax_history_len < 1:
            errors.append(f"amax_history_len={self.amax_history_len} must be >= 1")
        if self.block_size < 1:
            errors.append(f"block_size={self.block_size} must be >= 1")
        if errors:
            raise ValueError("invalid ScalingRecipe: " + "; ".join(errors))

    @property
    def tag(self) -> str:
        """Short name for plans and run names, e.g. 'delayed16', 'block128', 'current'."""
        if self.kind == "delayed":
            return f"delayed{self.amax_history_len}"
        if self.kind == "block":
            return f"block{self.block_size}"
        return self.kind


@dataclass(frozen=True)
class CastSpec:
    """Where one tensor goes: an FP8 format name ('e4m3' | 'e5m2') plus its scaling recipe,
    or ``fmt=None`` to stay in the compute dtype (BF16)."""

    fmt: str | None = None
    recipe: ScalingRecipe = ScalingRecipe()

    def __post_init__(self) -> None:
        if self.fmt is not None and self.fmt not in FORMATS:
            raise ValueError(f"invalid CastSpec: fmt={self.fmt!r} not in {(None, *FORMATS)}")

    @property
    def enabled(self) -> bool:
        return self.fmt is not None

    @property
    def format(self) -> Fp8Format:
        if self.fmt is None:
            raise ValueError("this CastSpec keeps the tensor in the compute dtype (fmt=None)")
        return get_format(self.fmt)

    @property
    def tag(self) -> str:
        """'e4m3/block128', 'e5m2/current', 'e4m3/none' or 'bf16' (fmt None)."""
        return "bf16" if self.fmt is None else f"{self.fmt}/{self.recipe.tag}"

    @classmethod
    def parse(cls, value: CastSpec | str | Mapping | None) -> CastSpec:
        """Accept a CastSpec, None / 'bf16' / 'none', 'e4m3' / 'e4m3:block', or a mapping
        ``{fmt: e4m3, kind: delayed, amax_history_len: 16, ...}`` (handy from Hydra YAML)."""
        if isinstance(value, CastSpec):
            return value
        if value is None or value in ("bf16", "none", "off"):
            return cls()
        if isinstance(value, str):
            fmt, _, kind = value.partition(":")
            return cls(fmt, ScalingRecipe(kind or "none"))
        if isinstance(value, Mapping):  # also OmegaConf's DictConfig
            fields = dict(value)
            fmt = fields.pop("fmt", None)
            recipe = fields.pop("recipe", None)
            if isinstance(recipe, Mapping):
                fields.update(recipe)
            return cls(
                fmt, recipe if isinstance(recipe, ScalingRecipe) else ScalingRecipe(**fields)
            )
        raise ValueError(f"cannot read a CastSpec from {value!r}")

    def to_dict(self) -> dict:
        return {"fmt": self.fmt, **dataclasses.asdict(self.recipe)}


class Fp8Tensor(NamedTuple):
    """FP8 data plus what is needed to decode it.

    ``scale_inv`` is ``None`` (plain cast), a 0-d FP32 tensor (per-tensor) or an FP32 tensor of
    shape ``[ceil(R/br), ceil(C/bc)]`` for a ``tile=(br, bc)`` over the 2-D view ``[R, C]``.
    ``power_2`` says the scales are powers of two (then decoding in BF16 is exact);
    ``may_have_nan=False`` lets the decoder skip restoring NaN codes (checked frozen weights).
    """

    data: torch.Tensor
    scale_inv: torch.Tensor | None
    tile: tuple[int, int] | None = None
    power_2: bool = False
    may_have_nan: bool = True

    @torch.no_grad()
    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """Decode to ``dtype``: the codes exactly in FP32, one FP32 multiply by ``scale_inv``
        (with the decoder's power-of-two factor folded in, see ``formats.decode_fp32``), one
        rounding to ``dtype``. Exact whenever the result is representable (plain cast, or
        power-of-2 scales into BF16/FP32); otherwise the same single rounding as TE.

        Large CPU tensors are decoded in row blocks that stay in the L2 cache (the FP32
        intermediate is twice the size of the BF16 result), into one preallocated output.
        """
        data, scale_inv, tile = self.data, self.scale_inv, self.tile
        fused = dtype in (torch.bfloat16, torch.float16) and data.dim() == 2
        if fused and FUSED.usable(data) and _tiles_divide(data, scale_inv, tile):
            out = FUSED.decode(data, scale_inv, tile, dtype)
            if out is not None:
                return out
        factor = decode_fp32_factor(data)
        mult = scale_inv * factor if scale_inv is not None and factor != 1.0 else scale_inv  # exact
        rows = _row_block(data, tile, mult)
        if rows is None:
            return _decode_block(data, mult, tile, dtype, self.may_have_nan)
        q2d = data.reshape(-1, data.shape[-1])
        out = torch.empty(q2d.shape, dtype=dtype, device=data.device)
        per_tile = mult is not None and mult.dim() > 0
        for r0 in range(0, q2d.shape[0], rows):
            m = mult[r0 // tile[0] : (r0 + rows) // tile[0]] if per_tile else mult
            block = slice(r0, r0 + rows)
            _decode_block(q2d[block], m, tile, dtype, self.may_have_nan, out[block])
        return out.view(data.shape)


_FINITE_CHECK_NUMEL = 1 << 14  # smaller: nan_to_num costs less than the check
_ROW_BLOCK_ELEMS = 1 << 17  # 128 Ki elements: 512 KiB of FP32 scratch per block


def _tiles_divide(
    data: torch.Tensor, scale_inv: torch.Tensor | None, tile: tuple[int, int] | None
) -> bool:
    """Per-tile scales that tile ``data`` (2-D) exactly, or no per-tile scales at all."""
    if scale_inv is None or scale_inv.dim() == 0 or tile is None:
        return True
    return data.shape[0] % tile[0] == 0 and data.shape[1] % tile[1] == 0


def _row_block(
    data: torch.Tensor, tile: tuple[int, int] | None, mult: torch.Tensor | None
) -> int | None:
    """Rows per block when ``data`` is worth decoding blockwise (large, on CPU, tiles that
    divide it evenly), else None."""
    if data.device.type != "cpu" or data.numel() < 4 * _ROW_BLOCK_ELEMS or data.dim() < 2:
        return None
    cols = data.shape[-1]
    rows = max(1, _ROW_BLOCK_ELEMS // cols)
    if tile is not None and mult is not None and mult.dim() > 0:
        n_rows = data.numel() // cols
        if n_rows % tile[0] or cols % tile[1]:
            return None
        rows = max(tile[0], rows // tile[0] * tile[0])
    return rows


def _decode_block(
    q: torch.Tensor,
    mult: torch.Tensor | None,
    tile: tuple[int, int] | None,
    dtype: torch.dtype,
    may_have_nan: bool,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode ``q`` times ``mult`` (None: plain cast) into ``dtype`` (or into ``out``)."""
    y, factor = decode_fp32(q)
    if mult is None:
        if factor != 1.0:
            y *= factor
    else:  # mult already holds the factor (Fp8Tensor.dequantize)
        y = _mul_scale(y, mult, tile, inplace=True)
    if out is not None:
        out.copy_(y)
        y = out
    elif y.dtype != dtype:
        y = y.to(dtype)
    return restore_nan(y, q) if may_have_nan else y


_MAX_SCALE = 2.0**100  # scale and 1/scale stay far from FP32/BF16 overflow (amax near 0 or huge)


def amax_to_scale(
    amax: torch.Tensor, fmax: float, margin: int = 0, power_2: bool = True
) -> torch.Tensor:
    """``fmax / amax * 2**-margin`` elementwise (rounded down to a power of two when ``power_2``);
    1 where amax is 0 or not finite (see module doc). FP32, on amax's device."""
    amax = amax.float()
    ok = (amax > 0) & torch.isfinite(amax)
    scale = (fmax * 2.0**-margin) / torch.where(ok, amax, torch.ones_like(amax))
    scale = scale.clamp(min=1.0 / _MAX_SCALE, max=_MAX_SCALE)
    if power_2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return torch.where(ok, scale, torch.ones_like(scale))


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| in one pass without an ``abs`` copy (NaN propagates)."""
    lo, hi = torch.aminmax(x.detach())
    return torch.maximum(hi, -lo).float()


def tile_shape_for(role: Role, block_size: int) -> tuple[int, int]:
    """1 x block tiles for activations/gradients, block x block for weights (module doc)."""
    return (block_size, block_size) if role == "weight" else (1, block_size)


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def _tiles(x2d: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """View ``[R, C]`` as ``[R/br, br, C/bc, bc]``, zero-padding R and C up to the tile."""
    br, bc = tile
    rows, cols = x2d.shape
    pad_r, pad_c = (-rows) % br, (-cols) % bc
    if pad_r or pad_c:
        x2d = F.pad(x2d, (0, pad_c, 0, pad_r))
    return x2d.view(x2d.shape[0] // br, br, x2d.shape[1] // bc, bc)


def _untile(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r_blocks, br, c_blocks, bc = t.shape
    return t.reshape(r_blocks * br, c_blocks * bc)[:rows, :cols]


def block_amax(x: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """Per-tile amax of the 2-D view of ``x``, shape ``[ceil(R/br), ceil(C/bc)]`` (FP32)."""
    tiles = _tiles(_as_2d(x.detach()), tile)
    if tile[0] == 1:  # 1 x b tiles: one reduction over the last dim, no abs copy
        lo, hi = torch.aminmax(tiles.squeeze(1), dim=-1)
        return torch.maximum(hi, -lo).float()
    # two reductions instead of an |x| copy (frozen weights are converted once, but a copy of
    # the largest weight would set the process's peak memory)
    hi = tiles.amax(dim=(1, 3))
    lo = tiles.amin(dim=(1, 3))
    return torch.maximum(hi, -lo).float()


def _mul_scale(
    x: torch.Tensor, scale: torch.Tensor, tile: tuple[int, int] | None, inplace: bool = False
) -> torch.Tensor:
    """``x * scale`` where ``scale`` is 0-d or per tile (broadcast over tiles with views, no loop).

    ``inplace`` overwrites ``x`` when that is possible (a temporary the caller owns)."""
    if tile is None or scale.dim() == 0:
        return x.mul_(scale) if inplace else x * scale
    shape = x.shape
    x2d = _as_2d(x)
    br, bc = tile
    if inplace and x.is_contiguous() and x2d.shape[0] % br == 0 and x2d.shape[1] % bc == 0:
        _tiles(x2d, tile).mul_(scale[:, None, :, None])
        return x
    y = _tiles(x2d, tile) * scale[:, None, :, None]
    return _untile(y, *x2d.shape).reshape(shape)


def expand_blocks(scale: torch.Tensor, tile: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Per-tile values broadcast to every element of a 2-D ``shape`` (for tests and telemetry)."""
    br, bc = tile
    full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)
    return full[: shape[0], : shape[1]]


def _zero_count(device: torch.device) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=device)


class TensorScaler:
    """Scaling state for one tensor of one layer (e.g. ``layers.3.q_proj`` activations).

    ``quantize(x)`` picks the scale per the recipe, casts, and for delayed scaling pushes this
    tensor's amax into the history afterwards (TE order: the scale in use never depends on the
    tensor being cast). In ``calibrating`` mode the caller computes in high precision and only
    calls ``observe(x)`` to fill the history.
    """

    def __init__(self, recipe: ScalingRecipe, fmt: Fp8Format, role: Role) -> None:
        self.recipe = recipe
        self.fmt = fmt
        self.role = role
        self.tile = tile_shape_for(role, recipe.block_size) if recipe.kind == "block" else None
        self.calibrating = False
        self.amax_history: torch.Tensor | None = None  # delayed only; created on first use
        self.scale_inv: torch.Tensor | None = None  # last scale_inv used, for telemetry
        self.last_amax: torch.Tensor | None = None  # amax|x| of the last quantize, when computed
        self._pos = 0  # next history slot (host int: indexing with it needs no sync)
        self._seen = 0

    @property
    def uses_history(self) -> bool:
        return self.recipe.kind == "delayed"

    def scale(self, x: torch.Tensor) -> torch.Tensor | None:
        """The scale to multiply ``x`` by before the cast; None for a plain cast."""
        return self._scale_and_amax(x)[0]

    def _scale_and_amax(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(scale, amax the scale came from: of ``x`` itself for current/block, of the history
        for delayed, None for a plain cast)."""
        kind = self.recipe.kind
        if kind == "none":
            return None, None
        if kind == "current":
            amax = tensor_amax(x)
        elif kind == "block":
            amax = block_amax(x, self.tile)
        else:
            amax = self._history_amax(x.device)
        scale = amax_to_scale(amax, self.fmt.max, self.recipe.margin, self.recipe.power_2_scale)
        return scale, amax

    def observe(self, x: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        """Delayed scaling: push ``amax(x)`` into the circular history (no-op for other recipes).
        ``amax`` saves the pass when the caller has it already."""
        if not self.uses_history:
            return
        history = self._history(x.device)
        history[self._pos] = tensor_amax(x) if amax is None else amax
        self._pos = (self._pos + 1) % len(history)
        self._seen += 1

    @torch.no_grad()
    def quantize(
        self, x: torch.Tensor, count_saturated: bool = False
    ) -> tuple[Fp8Tensor, torch.Tensor | None]:
        """Cast ``x`` to FP8 per the recipe.

        Returns the FP8 tensor and, when ``count_saturated``, the on-device number of elements
        with ``|x * scale| > fmax`` (TE's overflow count, taken before saturation) else None.

        On CPU, where reading a tensor on the host is no device sync, one host check of the amax
        tells whether ``x * scale`` is all finite; then the cast skips ``nan_to_num`` (a no-op on
        finite data) and the decoder skips restoring NaN codes (there are none). Elsewhere, or
        when something is not finite, the general path runs. The FP8 codes are the same.
        """
        kind = self.recipe.kind
        scale, amax = self._scale_and_amax(x)
        power_2 = self.recipe.power_2_scale
        if scale is None:
            scaled = x
            self.scale_inv = None
        else:
            # Power-of-2 scales are exact in x's own dtype; otherwise multiply in FP32 like TE.
            work = x if power_2 and x.dtype in (torch.bfloat16, torch.float32) else x.float()
            scaled = _mul_scale(work, scale.to(work.dtype), self.tile)
            self.scale_inv = scale.reciprocal()
        x_amax = amax if kind == "current" else None  # amax of x itself, when at hand
        finite, peak = False, None
        if x.device.type == "cpu" and x.numel() >= _FINITE_CHECK_NUMEL:
            if kind in ("current", "block"):  # the scale came from x's amax: |x * scale| <~ fmax
                finite = bool(torch.isfinite(amax).all())
            else:
                x_amax = tensor_amax(x)  # delayed needs it for the history anyway
                peak = x_amax if scale is None else x_amax * scale  # exact, or the same rounding
                finite = bool(torch.isfinite(peak))
        saturated = None
        if count_saturated:
            # On CPU, a finite peak |x| * scale within fmax means nothing saturates (the multiply
            # is monotonic): skip the counting pass; the count is 0 either way.
            fits = finite and kind in ("delayed", "none") and bool(peak <= self.fmt.max)
            saturated = _zero_count(scaled.device) if fits else self._count_saturated(scaled)
        self.last_amax = x_amax
        if finite:
            fmax = self.fmt.max
            clamped = scaled.clamp_(-fmax, fmax) if scaled is not x else x.clamp(-fmax, fmax)
            data = clamped.to(self.fmt.dtype)
        else:
            data = saturating_cast(scaled, self.fmt, inplace=scaled is not x)
        self.observe(x, x_amax)
        return Fp8Tensor(data, self.scale_inv, self.tile, power_2, may_have_nan=not finite), saturated

    @torch.no_grad()
    def quantize_dequantize(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``quantize(x)`` then ``dequantize(dtype)``, when nothing but the result is needed
        (the cast sites of a step that telemetry does not record). Per-tensor recipes on large
        CPU tensors run as one fused kernel (``formats.FUSED``); the FP8 codes, scales and amax
        history are the same as on the two-step path."""
        kind = self.recipe.kind
        if kind != "block" and FUSED.usable(x):
            scale, _ = self._scale_and_amax(x)
            scale_inv = None if scale is None else scale.reciprocal()
            out = FUSED.qdq(
                x, scale, scale_inv, self.fmt, dtype, self.uses_history
            )
            if out is not None:
                x_dq, x_amax = out
                self.scale_inv = scale_inv
                self.observe(x, x_amax)
                return x_dq
        q, _ = self.quantize(x)
        return q.dequantize(dtype)

    def _count_saturated(self, scaled: torch.Tensor) -> torch.Tensor:
        if self.recipe.kind in ("current", "block"):
            # The scale came from this very tensor's (tile's) amax: nothing exceeds fmax beyond
            # FP32 rounding (none at all with power-of-2 scales), so skip the pass. NaN/Inf
            # are reported as non-finite instead.
            return _zero_count(scaled.device)
        return torch.count_nonzero(scaled.abs() > self.fmt.max)

    def reset(self) -> None:
        """Forget the amax history (e.g. between independent runs on the same model)."""
        self.amax_history = None
        self._pos = self._seen = 0

    def _history(self, device: torch.device) -> torch.Tensor:
        if self.amax_history is None or self.amax_history.device != device:
            self.amax_history = torch.zeros(self.recipe.amax_history_len, device=device)
        return self.amax_history

    def _history_amax(self, device: torch.device) -> torch.Tensor:
        history = self._history(device)
        if self.recipe.amax_compute_algo == "most_recent":
            return history[(self._pos - 1) % len(history)]
        return history.max()  # all zeros before the first observation -> scale 1 (TE's start)
