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
- ``mx``: OCP Microscaling -- one E8M0 (power-of-two) scale per 1x32 block along the last
  (reduction) dim of every tensor, weights included; with ``e4m3`` elements this is MXFP8
  (TE MXFP8BlockScaling), with ``e2m1`` MXFP4.
- ``nvfp4``: E2M1 values, one E4M3 scale per 1x16 block plus one FP32 scale per tensor (TE
  NVFP4BlockScaling); ``stochastic_rounding`` and ``hadamard`` (the random Hadamard transform)
  are switches of the recipe. The maths of both is ``microscaling.py``.
  Dims that are not multiples of the block are zero-padded for the amax only; zeros never raise
  an amax, and the padding is cropped again, so results equal a ragged last tile.

Scales are powers of two by default (``power_2_scale=True``, as in TE's Float8BlockScaling and
MXFP8): multiplying a BF16 tensor by 2**k is exact, so the scale is applied in BF16 without an
FP32 copy and the cast is still a single rounding -- the emulation gets cheaper at no cost in
fidelity. The price is at most one binade of headroom (amax lands in (fmax/2, fmax]).
``power_2_scale=False`` gives TE's DelayedScaling/CurrentScaling arithmetic (FP32 multiply).

Each kind is a small class (``PlainKind``, ``CurrentKind``, ``DelayedKind``, ``BlockKind``, one
instance each in ``KINDS``) that says where its amax comes from, whether it keeps a history,
whether a cast can saturate, whether the fused per-tensor kernel may run it, and its tags.
Configs keep the names (``scaling: current``); ``ScalingRecipe.scaling`` is the parsed object and
nothing compares kind names. A new recipe (static scales, MX blocks, ...) is one subclass passed
to ``register_kind`` plus its mapping in each GPU backend (``map_policy`` in ``backends/torchao_backend.py``,
``map_policy_te`` in ``backends/te_backend.py``), which refuse a kind they cannot map.

Everything stays on the device: no ``.item()``, no host sync. An amax of 0 (all-zero tensor) or
a non-finite amax gives scale 1, so zeros stay zeros and Inf/NaN still reach the cast and show up
as non-finite instead of being scaled to 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

import torch

from workloads.registry import Registry, unknown_name_message
from workloads.precision import microscaling as mxs
from workloads.precision.formats import (
    FORMATS,
    FUSED,
    Fp8Format,
    as_2d,
    dequantize,
    encode_scaled,
    get_format,
    scale_operand,
    tiles,
)

__all__ = [
    "KINDS",
    "SCALING_KINDS",
    "ScalingKind",
    "get_kind",
    "register_kind",
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

AMAX_ALGOS = ("max", "most_recent")
BLOCK_SCALE_FMTS = ("native", "fp32")  # a block kind's hardware scale format | exact FP32
Role = Literal["activation", "grad", "weight"]


class ScalingKind:
    """One kind of scaling recipe (module docstring). Subclasses set the class attributes and
    ``amax``; the flags replace comparisons of kind names everywhere else."""

    name: ClassVar[str]
    short: ClassVar[str]  # in policy tags: W8cur, A8dly, G8pl ...
    plain: ClassVar[bool] = False  # no scale at all (scale 1)
    from_history: ClassVar[bool] = False  # the amax of earlier tensors: needs calibration
    own_amax: ClassVar[bool] = False  # the amax is this very tensor's (reusable by a history)
    saturates: ClassVar[bool] = True  # |x * scale| can exceed fmax (the scale is not from x)
    tiled: ClassVar[bool] = False  # one scale per tile
    fused: ClassVar[bool] = True  # the fused per-tensor quantize-dequantize kernel may run it
    frozen_weight_ok: ClassVar[bool] = True  # a frozen weight, cast once, may use it
    shared_cast: ClassVar[bool] = False  # per tensor and a pure function of x: sites fed the same x share one cast
    native_scale_fmt: ClassVar[str] = "fp32"  # what a scale is stored in on hardware
    default_block: ClassVar[int] = 128  # block_size when a config names the kind only
    element_fmts: ClassVar[tuple[str, ...]] = ("e4m3", "e5m2")  # the formats it may cast to

    def tag(self, recipe: ScalingRecipe) -> str:
        """Short name for plans and run names, e.g. 'delayed16', 'block128', 'current'."""
        return self.name

    def tile(self, role: Role, block_size: int) -> tuple[int, int] | None:
        """The tile one scale covers, or None for a per-tensor scale."""
        return None

    def amax(self, scaler: TensorScaler, x: torch.Tensor) -> torch.Tensor | None:
        """The amax the scale of ``x`` comes from (None: no scale)."""
        raise NotImplementedError

    def scales(self, scaler: TensorScaler, x: torch.Tensor) -> tuple[Any, Any, Any]:
        """``(scale, scale_inv, amax)``: what ``x`` is multiplied by before the cast, what the
        codes are multiplied by to decode, and the amax the scale came from (all None for a
        plain cast). Per-tensor kinds: ``fmax / amax`` and its reciprocal."""
        amax = self.amax(scaler, x)
        if amax is None:
            return None, None, None
        r = scaler.recipe
        scale = amax_to_scale(amax, scaler.fmt.max, r.margin, r.power_2_scale)
        return scale, scale.reciprocal(), amax

    def check(self, recipe: ScalingRecipe) -> list[str]:
        """Problems with ``recipe``'s kind-specific fields, as sentences (none by default)."""
        return []

    def __repr__(self) -> str:
        return f"<scaling kind {self.name}>"


class PlainKind(ScalingKind):
    """``none``: plain cast, scale 1 -- what a naive FP8 conversion does."""

    name, short, plain, shared_cast = "none", "pl", True, True

    def amax(self, scaler: TensorScaler, x: torch.Tensor) -> torch.Tensor | None:
        return None


class CurrentKind(ScalingKind):
    """``current``: per-tensor scale from this very tensor's amax."""

    name, short, own_amax, saturates, shared_cast = "current", "cur", True, False, True

    def amax(self, scaler: TensorScaler, x: torch.Tensor) -> torch.Tensor | None:
        return tensor_amax(x)


class DelayedKind(ScalingKind):
    """``delayed``: per-tensor scale from an amax history of earlier casts (TE DelayedScaling)."""

    name, short, from_history, frozen_weight_ok = "delayed", "dly", True, False

    def tag(self, recipe: ScalingRecipe) -> str:
        return f"delayed{recipe.amax_history_len}"

    def amax(self, scaler: TensorScaler, x: torch.Tensor) -> torch.Tensor | None:
        return scaler._history_amax(x.device)


class BlockKind(ScalingKind):
    """``block``: one scale per 1x128 (activations, gradients) or 128x128 (weights) tile."""

    name, short, saturates, tiled, fused = "block", "blk", False, True, False

    def tag(self, recipe: ScalingRecipe) -> str:
        return f"block{recipe.block_size}"

    def tile(self, role: Role, block_size: int) -> tuple[int, int] | None:
        return tile_shape_for(role, block_size)

    def amax(self, scaler: TensorScaler, x: torch.Tensor) -> torch.Tensor | None:
        return block_amax(x, scaler.tile)


class _MicroscalingKind(ScalingKind):
    """A Blackwell block format: 1 x block tiles along the last dim (the reduction dim of the
    forward GEMM and of dgrad's gradient), a per-block scale in the kind's scale format,
    saturating casts (the scale format is coarser than ``fmax / amax``)."""

    saturates, tiled, fused, frozen_weight_ok = True, True, False, True

    def tag(self, recipe: ScalingRecipe) -> str:
        extras = {"fp32": "f"}.get(recipe.block_scale_fmt, "")
        extras += ("sr" if recipe.stochastic_rounding else "") + ("h" if recipe.hadamard else "")
        return f"{self.name}{recipe.block_size}{extras}"

    def tile(self, role: Role, block_size: int) -> tuple[int, int] | None:
        return (1, block_size)

    def amax(self, scaler: TensorScaler, x: torch.Tensor) -> torch.Tensor | None:
        return block_amax(x, scaler.tile)

    def scales(self, scaler: TensorScaler, x: torch.Tensor) -> tuple[Any, Any, Any]:
        amax = self.amax(scaler, x)
        if scaler.recipe.block_scale_fmt == "fp32":
            return (*mxs.exact_block_scales(amax, scaler.fmt), amax)
        return (*self.native_scales(amax, x, scaler.fmt), amax)

    def native_scales(self, amax: torch.Tensor, x: torch.Tensor, fmt: Fp8Format) -> tuple[Any, Any]:
        raise NotImplementedError


class MxKind(_MicroscalingKind):
    """``mx``: one E8M0 scale per 1x32 block, the OCP MX shared-exponent rule."""

    name, short, native_scale_fmt, default_block = "mx", "mx", "e8m0", 32
    element_fmts = ("e4m3", "e5m2", "e2m1")

    def native_scales(self, amax: torch.Tensor, x: torch.Tensor, fmt: Fp8Format) -> tuple[Any, Any]:
        return mxs.mx_scales(amax, fmt)


class Nvfp4Kind(_MicroscalingKind):
    """``nvfp4``: E2M1 values, an E4M3 scale per 1x16 block (16x16 for weights, TE's default
    2-D weight quantization: the forward and dgrad GEMMs see the same quantized weight) and an
    FP32 scale per tensor."""

    name, short, native_scale_fmt, default_block = "nvfp4", "nv", "e4m3", 16
    element_fmts = ("e2m1",)

    def tile(self, role: Role, block_size: int) -> tuple[int, int] | None:
        return tile_shape_for(role, block_size)

    def native_scales(self, amax: torch.Tensor, x: torch.Tensor, fmt: Fp8Format) -> tuple[Any, Any]:
        return mxs.nvfp4_scales(amax, amax.amax(), fmt)  # the tensor's amax is its blocks' max


KINDS: Registry[ScalingKind] = Registry("scaling kind")


def register_kind(kind: ScalingKind) -> ScalingKind:
    """Make ``kind`` usable as ``ScalingRecipe(kind.name)`` (and ``scaling: <name>`` in YAML)."""
    return KINDS.register(kind.name, kind)


for _kind in (PlainKind(), CurrentKind(), DelayedKind(), BlockKind(), MxKind(), Nvfp4Kind()):
    register_kind(_kind)
SCALING_KINDS = tuple(KINDS)  # the built-in kinds


def get_kind(name: str) -> ScalingKind:
    """The kind object for a config name ('none' | 'current' | 'delayed' | 'block' | 'mx' |
    'nvfp4')."""
    return KINDS.get(name)


@dataclass(frozen=True)
class ScalingRecipe:
    """How one tensor is scaled into FP8. Validated on construction (ValueError, not assert)."""

    kind: str = "none"
    amax_history_len: int = 16
    amax_compute_algo: str = "max"
    margin: int = 0
    block_size: int = 128
    power_2_scale: bool = True
    block_scale_fmt: str = "native"  # block kinds (mx, nvfp4): "fp32" = exact per-block scales
    stochastic_rounding: bool = False  # round to a narrow format (E2M1) stochastically
    hadamard: bool = False  # random Hadamard transform of each block before scaling

    def __post_init__(self) -> None:
        errors = []
        if self.kind not in KINDS:
            errors.append(f"kind={self.kind!r}: {unknown_name_message(KINDS.what, self.kind, KINDS)}")
        if self.amax_compute_algo not in AMAX_ALGOS:
            errors.append(f"amax_compute_algo={self.amax_compute_algo!r} not in {AMAX_ALGOS}")
        if self.amax_history_len < 1:
            errors.append(f"amax_history_len={self.amax_history_len} must be >= 1")
        if self.block_size < 1:
            errors.append(f"block_size={self.block_size} must be >= 1")
        errors += self._block_format_errors()
        if errors:
            raise ValueError("invalid ScalingRecipe: " + "; ".join(errors))

    def _block_format_errors(self) -> list[str]:
        """The Blackwell switches make sense for the 1 x block kinds only (mx, nvfp4)."""
        errors = []
        kind = KINDS.get(self.kind) if self.kind in KINDS else None
        block_kind = isinstance(kind, _MicroscalingKind)
        fix = "use kind mx or nvfp4, or leave it at its default"
        if self.block_scale_fmt not in BLOCK_SCALE_FMTS:
            errors.append(f"block_scale_fmt={self.block_scale_fmt!r} not in {BLOCK_SCALE_FMTS}")
        elif self.block_scale_fmt != "native" and not block_kind:
            errors.append(f"block_scale_fmt={self.block_scale_fmt!r} needs a block format: {fix}")
        if self.hadamard and not block_kind:
            errors.append(f"hadamard=true needs a block format: {fix}")
        if self.hadamard and self.block_size & (self.block_size - 1):
            errors.append(f"hadamard=true needs a power-of-two block_size, not {self.block_size}")
        return errors

    @property
    def scaling(self) -> ScalingKind:
        """The kind object the ``kind`` name stands for (validated on construction)."""
        return KINDS[self.kind]

    @property
    def tag(self) -> str:
        """Short name for plans and run names, e.g. 'delayed16', 'block128', 'current'."""
        return self.scaling.tag(self)


@dataclass(frozen=True)
class CastSpec:
    """Where one tensor goes: an FP8 format name ('e4m3' | 'e5m2') plus its scaling recipe,
    or ``fmt=None`` to stay in the compute dtype (BF16)."""

    fmt: str | None = None
    recipe: ScalingRecipe = ScalingRecipe()

    def __post_init__(self) -> None:
        if self.fmt is not None and self.fmt not in FORMATS:
            raise ValueError(f"invalid CastSpec: fmt={self.fmt!r} not in {(None, *FORMATS)}")
        if self.fmt is None:
            return
        kind = self.recipe.scaling
        if self.fmt not in kind.element_fmts:
            raise ValueError(
                f"invalid CastSpec: scaling {kind.name} casts to {'|'.join(kind.element_fmts)}, "
                f"not {self.fmt}"
            )
        if self.recipe.stochastic_rounding and not get_format(self.fmt).narrow:
            raise ValueError(
                f"invalid CastSpec: stochastic_rounding=true needs a narrow format (e2m1), "
                f"not {self.fmt} (torch's float8 casts round to nearest)"
            )

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
            return cls(fmt, ScalingRecipe(**_with_default_block({"kind": kind or "none"})))
        if isinstance(value, Mapping):  # also OmegaConf's DictConfig
            fields = dict(value)
            fmt = fields.pop("fmt", None)
            recipe = fields.pop("recipe", None)
            if isinstance(recipe, Mapping):
                fields.update(recipe)
            if not isinstance(recipe, ScalingRecipe):
                recipe = ScalingRecipe(**_with_default_block(fields))
            return cls(fmt, recipe)
        raise ValueError(f"cannot read a CastSpec from {value!r}")

    def to_dict(self) -> dict:
        return {"fmt": self.fmt, **dataclasses.asdict(self.recipe)}


def _with_default_block(fields: dict[str, Any]) -> dict[str, Any]:
    """A config that names a kind without a block size gets the kind's own (mx: 32, nvfp4: 16),
    so ``e4m3:mx`` is MXFP8 and not 1x128 blocks with E8M0 scales."""
    kind = KINDS.get(fields["kind"]) if fields.get("kind", "none") in KINDS else None
    if kind is not None and "block_size" not in fields:
        fields = {**fields, "block_size": kind.default_block}
    return fields


class Fp8Tensor(NamedTuple):
    """FP8 data plus what is needed to decode it (``formats.dequantize``).

    ``scale_inv`` is ``None`` (plain cast), a 0-d FP32 tensor (per-tensor) or an FP32 tensor of
    shape ``[ceil(R/br), ceil(C/bc)]`` for a ``tile=(br, bc)`` over the 2-D view ``[R, C]``.
    ``may_have_nan=False`` lets the decoder skip restoring NaN codes (checked frozen weights).
    ``rotation``: the codes hold the tensor times this block rotation (random Hadamard
    transform); decoding multiplies it back out.
    """

    data: torch.Tensor
    scale_inv: torch.Tensor | None
    tile: tuple[int, int] | None = None
    may_have_nan: bool = True
    rotation: torch.Tensor | None = None

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """Decode to ``dtype`` with the one codec (``formats.dequantize``)."""
        if self.rotation is not None:
            y = dequantize(self.data, self.scale_inv, torch.float32, self.tile)
            return mxs.unrotate(y, self.rotation, dtype)
        return dequantize(
            self.data, self.scale_inv, dtype, self.tile, may_have_nan=self.may_have_nan
        )


_FINITE_CHECK_NUMEL = 1 << 14  # smaller: nan_to_num costs less than the check


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


def block_amax(x: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """Per-tile amax of the 2-D view of ``x``, shape ``[ceil(R/br), ceil(C/bc)]`` (FP32)."""
    tiles_ = tiles(as_2d(x.detach()), tile)
    if tile[0] == 1:  # 1 x b tiles: one reduction over the last dim, no abs copy
        lo, hi = torch.aminmax(tiles_.squeeze(1), dim=-1)
        return torch.maximum(hi, -lo).float()
    # two reductions instead of an |x| copy (frozen weights are converted once, but a copy of
    # the largest weight would set the process's peak memory)
    hi = tiles_.amax(dim=(1, 3))
    lo = tiles_.amin(dim=(1, 3))
    return torch.maximum(hi, -lo).float()


def expand_blocks(scale: torch.Tensor, tile: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Per-tile values broadcast to every element of a 2-D ``shape`` (for tests and telemetry)."""
    br, bc = tile
    full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)
    return full[: shape[0], : shape[1]]


def _zero_count(device: torch.device) -> torch.Tensor:
    """A 0-d int64 zero: the saturation count of a cast that cannot saturate. On CPU one shared
    tensor (nothing writes a count in place; a recorded step asks ~200 times)."""
    if device.type == "cpu":
        return _CPU_ZERO_COUNT
    return torch.zeros((), dtype=torch.int64, device=device)


_CPU_ZERO_COUNT = torch.zeros((), dtype=torch.int64)


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
        self.kind = recipe.scaling
        self.tile = self.kind.tile(role, recipe.block_size)
        self.calibrating = False
        self.amax_history: torch.Tensor | None = None  # delayed only; created on first use
        self.scale_inv: torch.Tensor | None = None  # last scale_inv used, for telemetry
        self.last_amax: torch.Tensor | None = None  # amax|x| of the last quantize, when computed
        self._pos = 0  # next history slot (host int: indexing with it needs no sync)

    @property
    def uses_history(self) -> bool:
        return self.kind.from_history

    def snapshot(self) -> tuple[Any, ...]:
        """The state a forward changes (history, its position, the last scale and amax)."""
        history = None if self.amax_history is None else self.amax_history.clone()
        return history, self._pos, self.scale_inv, self.last_amax

    def restore(self, state: tuple[Any, ...]) -> None:
        """Put back what `snapshot` took: forwards in between leave no trace."""
        self.amax_history, self._pos, self.scale_inv, self.last_amax = state

    def scale(self, x: torch.Tensor) -> torch.Tensor | None:
        """The scale to multiply ``x`` by before the cast; None for a plain cast."""
        return self.kind.scales(self, self._rotated(x))[0]

    def _rotated(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` itself, or its random Hadamard transform when the recipe asks for one."""
        if not self.recipe.hadamard:
            return x
        return mxs.rotate(x, mxs.rotation(self.recipe.block_size, x.device))

    def observe(self, x: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        """Delayed scaling: push ``amax(x)`` into the circular history (no-op for other recipes).
        ``amax`` saves the pass when the caller has it already."""
        if not self.uses_history:
            return
        history = self._history(x.device)
        history[self._pos] = tensor_amax(x) if amax is None else amax
        self._pos = (self._pos + 1) % len(history)

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
        kind = self.kind
        rotated = self._rotated(x)
        scale, self.scale_inv, amax = kind.scales(self, rotated)
        scaled = scale_operand(rotated, scale, self.tile, self._power_2_operand)
        x_amax = amax if kind.own_amax else None  # amax of x itself, when at hand
        finite, peak = False, None
        if x.device.type == "cpu" and x.numel() >= _FINITE_CHECK_NUMEL:
            if not kind.saturates or kind.tiled:  # amax per tile of x itself: all finite?
                finite = bool(torch.isfinite(amax).all())
            else:
                x_amax = tensor_amax(x)  # delayed needs it for the history anyway
                peak = x_amax if scale is None else x_amax * scale  # exact, or the same rounding
                finite = bool(torch.isfinite(peak))
        saturated = None
        if count_saturated:
            # On CPU, a finite peak |x| * scale within fmax means nothing saturates (the multiply
            # is monotonic): skip the counting pass; the count is 0 either way.
            fits = peak is not None and finite and kind.saturates and bool(peak <= self.fmt.max)
            saturated = _zero_count(scaled.device) if fits else self._count_saturated(scaled)
        self.last_amax = x_amax
        data = encode_scaled(scaled, self.fmt, owned=scaled is not x, finite=finite,
                             stochastic=self.recipe.stochastic_rounding)
        self.observe(x, x_amax)
        rotation = mxs.rotation(self.recipe.block_size, x.device) if self.recipe.hadamard else None
        fp8 = Fp8Tensor(data, self.scale_inv, self.tile, may_have_nan=not finite, rotation=rotation)
        return fp8, saturated

    @property
    def _power_2_operand(self) -> bool:
        """Whether the scales are powers of two, so ``x * scale`` is exact in x's own dtype."""
        if self.kind.native_scale_fmt == "fp32" or self.recipe.block_scale_fmt == "fp32":
            return self.recipe.power_2_scale
        return self.kind.native_scale_fmt == "e8m0"

    @torch.no_grad()
    def quantize_dequantize(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``quantize(x)`` then ``dequantize(dtype)``, when nothing but the result is needed
        (the cast sites of a step that telemetry does not record). Per-tensor recipes on large
        CPU tensors run as one fused kernel (``formats.FUSED``); the FP8 codes, scales and amax
        history are the same as on the two-step path."""
        if self.kind.fused and not self.fmt.narrow and FUSED.usable(x):
            scale, scale_inv, _ = self.kind.scales(self, x)
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

    def quantize_dequantize_measured(
        self, x: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int] | None:
        """A recorded step's ``quantize_dequantize``, with its telemetry row (``FUSED.qdq(stats=)``,
        the ``_k_row_stats`` layout) and saturated count: the same codes, scales, decoded values
        and history, and the statistics from the same loop. None where that kernel does not
        serve: the kinds ``quantize_dequantize`` runs eagerly, or no compiled kernels on ``x``'s
        device."""
        if not (self.kind.fused and not self.fmt.narrow and FUSED.compiles(x)):
            return None
        scale, scale_inv, _ = self.kind.scales(self, x)
        out = FUSED.qdq(x, scale, scale_inv, self.fmt, dtype, True, stats=self.kind.saturates)
        if out is None:
            return None
        x_dq, row = out
        self.scale_inv = scale_inv
        self.observe(x, row[1])  # the row's amax is |x|'s, as the history wants
        return x_dq, row[:4], (row[4] if self.kind.saturates else 0)

    def _count_saturated(self, scaled: torch.Tensor) -> torch.Tensor:
        if not self.kind.saturates:
            # The scale came from this very tensor's (tile's) amax: nothing exceeds fmax beyond
            # FP32 rounding (none at all with power-of-2 scales), so skip the pass. NaN/Inf
            # are reported as non-finite instead.
            return _zero_count(scaled.device)
        return torch.count_nonzero(scaled.abs() > self.fmt.max)

    def reset(self) -> None:
        """Forget the amax history (e.g. between independent runs on the same model)."""
        self.amax_history = None
        self._pos = 0

    def _history(self, device: torch.device) -> torch.Tensor:
        if self.amax_history is None or self.amax_history.device != device:
            self.amax_history = torch.zeros(self.recipe.amax_history_len, device=device)
        return self.amax_history

    def _history_amax(self, device: torch.device) -> torch.Tensor:
        history = self._history(device)
        if self.recipe.amax_compute_algo == "most_recent":
            return history[(self._pos - 1) % len(history)]
        return history.max()  # all zeros before the first observation -> scale 1 (TE's start)
