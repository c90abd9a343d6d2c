"""FP8 formats and the one codec (encode and decode) that training, export and tests all use.

Encoding: ``scale_operand`` (``x * scale``, per tensor or per tile) then ``encode_scaled``
(saturate, round to float8); ``TensorScaler.quantize`` picks the scale and calls both. Decoding:
``dequantize`` (codes times ``scale_inv``, per tensor or per tile, one rounding to the compute
dtype), which ``Fp8Tensor.dequantize`` calls; ``decode`` is the unscaled case. The round trip
``quantize_dequantize`` is the same two halves. The compiled kernels at the end (``FUSED``) are a
faster route to the very same numbers.

All rounding, subnormal handling and flushing come from torch's own float8 dtypes
(``torch.float8_e4m3fn``, ``torch.float8_e5m2``); this module only adds what torch's cast
does not promise: saturation of finite out-of-range values, and a fixed rule for infinities.

E2M1 (NVFP4's and MXFP4's 4-bit element, values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}) has no torch cast
(``torch.float4_e2m1fn_x2`` is a storage dtype only: torch 2.13 cannot convert to or from it), so it
is a *narrow* format: values are rounded onto its grid here (``round_to_grid``: nearest-even like
torch's casts, or stochastic) and carried in ``float8_e4m3fn`` codes, which hold every E2M1 value
exactly -- so the decoder, the tiles and the scales are the FP8 ones. ``e2m1_codes`` /
``pack_e2m1`` give the real 4-bit codes (packed two per byte as ``float4_e2m1fn_x2``); the carrier
costs a byte per value in memory where hardware stores half of one.

Why clamp ourselves: torch's float -> float8 conversion is not saturating in general
(``e5m2`` turns values above its range into Inf, and ``e4m3fn`` has produced NaN for them on some
builds and devices, while the CPU kernel of torch 2.13 saturates and even maps Inf to 448).
Real FP8 recipes (Transformer Engine, torchao) saturate finite values, so we clamp finite values
to +-max *before* the cast and the result does not depend on the torch build.

Infinity rule: an Inf going into a cast comes out as NaN, in both formats. Saturating an Inf to
+-max would turn a diverged run into a plausible-looking one; we never hide divergence. E5M2
could encode Inf, but one rule for both formats keeps the cast to two cheap elementwise passes
(``nan_to_num`` + ``clamp``) before torch's cast, and telemetry counts NaN and Inf alike as
non-finite. NaN stays NaN.
"""

from __future__ import annotations

import inspect
import os
import shutil
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

__all__ = [
    "Fp8Format",
    "E2M1",
    "round_to_grid",
    "e2m1_codes",
    "pack_e2m1",
    "scale_operand",
    "encode_scaled",
    "as_2d",
    "tiles",
    "E4M3",
    "E5M2",
    "FORMATS",
    "get_format",
    "saturating_cast",
    "decode",
    "decode_fp32",
    "decode_fp32_factor",
    "restore_nan",
    "has_nan_code",
    "dequantize",
    "mul_scale",
    "quantize_dequantize",
    "FUSED",
    "FUSED_MIN_NUMEL",
]


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 encoding: its torch dtype and the edges of its range (taken from torch.finfo)."""

    name: str
    dtype: torch.dtype
    max: float
    smallest_normal: float
    smallest_subnormal: float
    has_inf: bool
    narrow_mantissa_bits: int | None = None  # set: a narrower format carried in ``dtype`` codes

    @property
    def narrow(self) -> bool:
        """Rounded onto its own grid by this module, then carried exactly in ``dtype``."""
        return self.narrow_mantissa_bits is not None

    def __repr__(self) -> str:
        return f"Fp8Format({self.name})"


def _make(name: str, dtype: torch.dtype, mantissa_bits: int, has_inf: bool) -> Fp8Format:
    info = torch.finfo(dtype)
    # finfo has no "smallest subnormal" field: it is the smallest normal shifted by the mantissa.
    return Fp8Format(
        name=name,
        dtype=dtype,
        max=float(info.max),
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_normal) * 2.0**-mantissa_bits,
        has_inf=has_inf,
    )


E4M3 = _make("e4m3", torch.float8_e4m3fn, mantissa_bits=3, has_inf=False)  # max 448
E5M2 = _make("e5m2", torch.float8_e5m2, mantissa_bits=2, has_inf=True)  # max 57344

# E2M1: 1 mantissa bit, smallest normal 1.0 (exponent bias 1), max 6, no Inf/NaN (OCP MX spec
# section 5.3.3); carried in E4M3 codes, which hold all 15 of its values exactly.
E2M1 = Fp8Format(
    name="e2m1",
    dtype=torch.float8_e4m3fn,
    max=6.0,
    smallest_normal=1.0,
    smallest_subnormal=0.5,
    has_inf=False,
    narrow_mantissa_bits=1,
)

FORMATS: dict[str, Fp8Format] = {E4M3.name: E4M3, E5M2.name: E5M2, E2M1.name: E2M1}


def get_format(name: str | Fp8Format) -> Fp8Format:
    """Look a format up by name ('e4m3' | 'e5m2'); a Fp8Format passes through."""
    if isinstance(name, Fp8Format):
        return name
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown FP8 format {name!r}; available: {', '.join(FORMATS)}") from None


def saturating_cast(x: torch.Tensor, fmt: Fp8Format, *, inplace: bool = False) -> torch.Tensor:
    """Cast ``x`` to ``fmt``'s float8 dtype, saturating finite values at +-max.

    NaN stays NaN and +-Inf becomes NaN (module docstring). Rounding (nearest-even) and
    subnormals are torch's own float8 conversion. ``inplace=True`` reuses ``x`` as scratch
    (for callers that own a temporary, e.g. ``x * scale``), saving one allocation.
    """
    nan = float("nan")
    y = x.nan_to_num_(nan, nan, nan) if inplace else x.nan_to_num(nan, nan, nan)  # Inf -> NaN
    return _to_codes(y.clamp_(-fmt.max, fmt.max), fmt)  # clamp keeps NaN


def _to_codes(clamped: torch.Tensor, fmt: Fp8Format, stochastic: bool = False) -> torch.Tensor:
    """Already clamped values -> ``fmt``'s codes: torch's cast, after rounding onto the grid
    for a narrow format (``stochastic``: see ``round_to_grid``)."""
    if fmt.narrow:
        clamped = round_to_grid(clamped.float(), fmt, stochastic)
    return clamped.to(fmt.dtype)


def round_to_grid(p: torch.Tensor, fmt: Fp8Format, stochastic: bool = False) -> torch.Tensor:
    """FP32 ``p`` (already within +-fmax) rounded onto ``fmt``'s grid, in FP32; NaN passes.

    Nearest-even on the FP32 bits, as torch's float8 casts round: keep
    ``m`` mantissa bits by adding half an ulp minus one plus the lowest kept bit, then clearing
    the dropped bits (a carry moves into the exponent as it should); below the smallest normal
    the grid is fixed (``smallest_subnormal`` apart) and ``torch.round`` is half-to-even.
    ``stochastic`` (TE's NVFP4 gradients): round down or up to the two neighbours with
    probabilities proportional to closeness, so the expected value is ``p`` itself --
    ``floor(|p| / step + u) * step`` with ``u`` uniform in [0, 1) from torch's RNG (seeded by the
    trial's seed, so a run repeats) and ``step`` the grid spacing at ``|p|`` (one binade's ulp,
    or the subnormal spacing).
    """
    m = fmt.narrow_mantissa_bits if fmt.narrow else _MANTISSA_BITS[fmt.dtype]
    tiny, sub = fmt.smallest_normal, fmt.smallest_subnormal
    nan = p != p
    finite = torch.where(nan, 0.0, p)
    a = finite.abs()
    if not stochastic:
        drop = 23 - m
        bits = a.view(torch.int32)
        half = (1 << (drop - 1)) - 1
        normal = ((bits + half + ((bits >> drop) & 1)) & ~((1 << drop) - 1)).view(torch.float32)
        subnormal = torch.round(a * (1.0 / sub)) * sub
        magnitude = torch.where(a < tiny, subnormal, normal)
    else:
        exponent = torch.frexp(torch.maximum(a, torch.full_like(a, tiny)))[1] - 1
        step = torch.ldexp(torch.ones_like(a), exponent - m)  # ulp of |p|'s binade (>= sub)
        u = torch.rand(a.shape, device=a.device)
        magnitude = torch.minimum(torch.floor(a / step + u) * step, torch.full_like(a, fmt.max))
    return torch.where(nan, p, torch.copysign(magnitude, finite))


_MANTISSA_BITS = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # code 0..7 (OCP MX table 5)


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """The 4-bit E2M1 codes (uint8, sign in bit 3) of E2M1 values carried in E4M3 ``q``."""
    v = q.float()
    grid = torch.tensor(_E2M1_VALUES, device=v.device)
    magnitude = torch.searchsorted(grid, v.abs()).to(torch.uint8)
    if not bool((grid[magnitude.long().clamp(max=7)] == v.abs()).all()):
        raise ValueError("e2m1_codes: a value is not on the E2M1 grid")
    return magnitude | (torch.signbit(v).to(torch.uint8) << 3)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte as ``torch.float4_e2m1fn_x2`` (element 2i in the low nibble,
    as torchao's ``pack_uint4`` and the PTX ``cvt...e2m1x2`` layout); last dim must be even."""
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).view(torch.float4_e2m1fn_x2)


def decode(q: torch.Tensor, dtype: torch.dtype, *, may_have_nan: bool = True) -> torch.Tensor:
    """float8 -> ``dtype``, bit-identical to ``q.to(dtype)`` (every FP8 value is exact there):
    ``dequantize`` with no scale.

    ``may_have_nan=False`` skips restoring NaN codes (see ``decode_fp32``).
    """
    return dequantize(q, None, dtype, may_have_nan=may_have_nan)


def decode_fp32(q: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(y, factor)``: a fresh FP32 tensor ``y`` with ``q``'s values equal to ``y * factor``
    exactly. Lets a caller fold ``factor`` into its multiply by the scale, so dequantizing costs
    one multiply pass, not two, and then round once to the compute dtype.

    Decoding is the hot path of the emulation, and torch's CPU float8 conversions are scalar
    loops several times slower than the BF16 GEMM they feed, so on CPU the codes become FP16 bit
    patterns with integer ops and FP16 -> FP32 is the (vectorised, exact) hardware conversion:

    - E5M2 is the upper byte of FP16: ``code << 8`` is the value itself (Inf/NaN included);
    - E4M3: the sign and the 7 magnitude bits, shifted to FP16 bits 7..13, encode
      ``value * 2**-8`` for normals and subnormals alike (FP16 has E4M3's subnormals as its own
      subnormals), hence ``factor = 256``. The result of FP16 -> FP32 is always an FP32
      normal, so multiplying by the factor never pays the x86 penalty for subnormal operands
      (FP16 -> BF16 directly, or decoding straight into BF16 bits, would). The NaN code
      (0x7F/0xFF) comes out finite: call ``restore_nan`` unless the data is known NaN-free.

    Decoding is not rounding: the unit tests compare all 256 codes with torch's cast. Other
    devices, and tensors too small for the extra ops to pay off, use torch's cast with factor 1.
    """
    if q.device.type == "cpu" and q.numel() >= SMALL_NUMEL:
        if q.dtype == torch.float8_e4m3fn:
            bits = q.view(torch.int8).to(torch.int16)  # sign-extended: bit 15 is the FP8 sign bit
            bits <<= 7  # eeeemmm -> FP16 exponent/mantissa bits 7..13 ...
            bits &= _E4M3_TO_FP16_MASK  # ... and drop the sign-extension copy left in bit 14
            return bits.view(torch.float16).float(), _E4M3_FROM_FP16_FACTOR
        if q.dtype == torch.float8_e5m2:
            bits = q.view(torch.uint8).to(torch.int16)
            bits <<= 8  # the E5M2 byte is the upper byte of the same FP16 value
            return bits.view(torch.float16).float(), 1.0
    return q.float(), 1.0


def decode_fp32_factor(q: torch.Tensor) -> float:
    """The ``factor`` that ``decode_fp32(q)`` returns, without decoding."""
    return _E4M3_FROM_FP16_FACTOR if _int_decoded_e4m3(q) else 1.0


def _int_decoded_e4m3(q: torch.Tensor) -> bool:
    return q.dtype == torch.float8_e4m3fn and q.device.type == "cpu" and q.numel() >= SMALL_NUMEL


def has_nan_code(q: torch.Tensor) -> bool:
    """Whether float8 ``q`` holds a NaN code, checked on the codes (one byte per element, no
    decoded copy). Reads the answer on the host: a sync on GPU, meant for one-off checks."""
    magnitude = q.view(torch.uint8) & 0x7F
    nan_from = 0x7F if q.dtype == torch.float8_e4m3fn else 0x7D  # E5M2: 0x7C is Inf, above is NaN
    return bool((magnitude >= nan_from).any())


def restore_nan(y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Put NaN where ``q`` holds an E4M3 NaN code (in place): needed after ``decode_fp32``'s
    integer path only (E5M2 and torch's own casts decode NaN already)."""
    if _int_decoded_e4m3(q):
        y.masked_fill_((q.view(torch.uint8) & 0x7F) == 0x7F, float("nan"))
    return y


SMALL_NUMEL = 4096  # below this, per-op overhead dominates: fewer, plainer ops win
_E4M3_TO_FP16_MASK = -0x4080  # int16 0xBF80: sign bit + the 7 shifted magnitude bits
_E4M3_FROM_FP16_FACTOR = 256.0  # 2**(15 - 7): FP16 exponent bias minus E4M3 bias


# -- encode ----------------------------------------------------------------------------------
def scale_operand(
    x: torch.Tensor, scale: torch.Tensor | None, tile: tuple[int, int] | None, power_2: bool
) -> torch.Tensor:
    """``x * scale`` before the cast (``x`` itself when ``scale`` is None: a plain cast).

    Power-of-2 scales are exact in x's own dtype (BF16/FP32), so no FP32 copy is made; otherwise
    the product is taken in FP32 like TE's cast kernels, so the only rounding is FP8's."""
    if scale is None:
        return x
    work = x if power_2 and x.dtype in (torch.bfloat16, torch.float32) else x.float()
    return mul_scale(work, scale.to(work.dtype), tile)


def encode_scaled(
    scaled: torch.Tensor,
    fmt: Fp8Format,
    *,
    owned: bool,
    finite: bool = False,
    stochastic: bool = False,
) -> torch.Tensor:
    """The float8 codes of an already scaled tensor (``scale_operand``), saturating.

    ``owned``: ``scaled`` is a temporary the caller owns and may be overwritten. ``finite``: the
    caller has checked that it holds no NaN/Inf, so the ``nan_to_num`` pass (a no-op then) is
    skipped; the codes are the same. ``stochastic``: round stochastically (a narrow format
    only, ``round_to_grid``)."""
    if finite or stochastic:
        if not finite:  # Inf -> NaN first (module docstring)
            nan = float("nan")
            scaled = scaled.nan_to_num_(nan, nan, nan) if owned else scaled.nan_to_num(nan, nan, nan)
            owned = True
        fmax = fmt.max
        clamped = scaled.clamp_(-fmax, fmax) if owned else scaled.clamp(-fmax, fmax)
        return _to_codes(clamped, fmt, stochastic)
    return saturating_cast(scaled, fmt, inplace=owned)


# -- decode --------------------------------------------------------------------------------
@torch.no_grad()
def dequantize(
    q: torch.Tensor,
    scale_inv: torch.Tensor | float | None,
    dtype: torch.dtype,
    tile: tuple[int, int] | None = None,
    *,
    may_have_nan: bool = True,
) -> torch.Tensor:
    """Decode float8 ``q`` times ``scale_inv`` into ``dtype``: the codes exactly in FP32, one
    FP32 multiply by ``scale_inv`` (None: plain cast; 0-d: per tensor; one value per ``tile`` of
    the 2-D view ``[R, C]``, shape ``[ceil(R/br), ceil(C/bc)]``) with the decoder's power-of-two
    factor folded in (``decode_fp32``), one rounding to ``dtype``. Exact whenever the result is
    representable (plain cast, or power-of-2 scales into BF16/FP32); otherwise the same single
    rounding as TE. ``may_have_nan=False`` skips restoring NaN codes (checked frozen weights).

    Large CPU tensors are decoded in row blocks that stay in the L2 cache (the FP32
    intermediate is twice the size of the BF16 result), into one preallocated output; large 2-D
    BF16/FP16 decodes run as one compiled kernel (``FUSED``) when available.
    """
    if scale_inv is not None and not isinstance(scale_inv, torch.Tensor):
        scale_inv = torch.as_tensor(scale_inv, dtype=torch.float32, device=q.device)
    fused = dtype in (torch.bfloat16, torch.float16) and q.dim() == 2
    if fused and FUSED.usable(q) and _tiles_divide(q, scale_inv, tile):
        out = FUSED.decode(q, scale_inv, tile, dtype)
        if out is not None:
            return out
    factor = decode_fp32_factor(q)
    mult = scale_inv * factor if scale_inv is not None and factor != 1.0 else scale_inv  # exact
    rows = _row_block(q, tile, mult)
    if rows is None:
        return _decode_block(q, mult, tile, dtype, may_have_nan)
    q2d = q.reshape(-1, q.shape[-1])
    out = torch.empty(q2d.shape, dtype=dtype, device=q.device)
    per_tile = mult is not None and mult.dim() > 0
    for r0 in range(0, q2d.shape[0], rows):
        m = mult[r0 // tile[0] : (r0 + rows) // tile[0]] if per_tile else mult
        block = slice(r0, r0 + rows)
        _decode_block(q2d[block], m, tile, dtype, may_have_nan, out[block])
    return out.view(q.shape)


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
    if mult is not None and mult.dim() > 0:
        if tile is None:  # a broadcast scale (tests), not per tile: decode in one piece
            return None
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
    else:  # mult already holds the factor (dequantize)
        y = mul_scale(y, mult, tile, inplace=True)
    if out is not None:
        out.copy_(y)
        y = out
    elif y.dtype != dtype:
        y = y.to(dtype)
    return restore_nan(y, q) if may_have_nan else y


# -- tiles -----------------------------------------------------------------------------------
def as_2d(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def tiles(x2d: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """View ``[R, C]`` as ``[R/br, br, C/bc, bc]``, zero-padding R and C up to the tile."""
    br, bc = tile
    rows, cols = x2d.shape
    pad_r, pad_c = (-rows) % br, (-cols) % bc
    if pad_r or pad_c:
        x2d = F.pad(x2d, (0, pad_c, 0, pad_r))
    return x2d.view(x2d.shape[0] // br, br, x2d.shape[1] // bc, bc)


def mul_scale(
    x: torch.Tensor, scale: torch.Tensor, tile: tuple[int, int] | None, inplace: bool = False
) -> torch.Tensor:
    """``x * scale`` where ``scale`` is 0-d or per tile (broadcast over tiles with views, no loop).

    ``inplace`` overwrites ``x`` when that is possible (a contiguous temporary the caller owns,
    already of the product's dtype); otherwise the product is written into a new tensor, in one
    pass either way. Tiles that do not divide ``x`` (SmolLM2's 576 and 192 under 128x128 tiles)
    are handled as views too, edge strips on their own (``_mul_tiles``): padding a copy to whole
    tiles and cutting it back made the multiply of a 576x576 decode ~10x slower than the
    multiply itself."""
    if tile is None or scale.dim() == 0:
        return x.mul_(scale) if inplace else x * scale
    dtype = torch.result_type(x, scale)
    x2d = as_2d(x)
    if inplace and x.is_contiguous() and x.dtype == dtype:
        out = x
    elif x2d.shape[0] % tile[0] == 0 and x2d.shape[1] % tile[1] == 0:  # whole tiles: one product of views
        return (tiles(x2d, tile) * scale[:, None, :, None]).view(x.shape)
    else:
        out = torch.empty(x.shape, dtype=dtype, device=x.device)
    _mul_tiles(x2d, scale, tile, as_2d(out))
    return out


def _mul_tiles(x2d: torch.Tensor, scale: torch.Tensor, tile: tuple[int, int], out2d: torch.Tensor) -> None:
    """``out2d = x2d * scale`` per tile (``out2d`` may be ``x2d``): the whole tiles as one 4-D
    view, then the partial column strip at the right, the partial row strip at the bottom and
    their corner (each a view with its own slice of ``scale``, whose shape is
    ``[ceil(R/br), ceil(C/bc)]``). Every element gets the same single multiply as with whole tiles."""
    br, bc = tile
    rows, cols = x2d.shape
    nr, nc = rows // br, cols // bc  # whole tiles down and across
    r0, c0 = nr * br, nc * bc

    def mul(region: tuple[slice, slice], split: Callable[[torch.Tensor], torch.Tensor], s: torch.Tensor) -> None:
        torch.mul(split(x2d[region]), s, out=split(out2d[region]))

    if nr and nc:
        mul((slice(0, r0), slice(0, c0)), lambda t: t.unflatten(1, (nc, bc)).unflatten(0, (nr, br)),
            scale[:nr, None, :nc, None])
    if nr and c0 < cols:
        mul((slice(0, r0), slice(c0, cols)), lambda t: t.unflatten(0, (nr, br)), scale[:nr, nc, None, None])
    if r0 < rows and nc:
        mul((slice(r0, rows), slice(0, c0)), lambda t: t.unflatten(1, (nc, bc)), scale[nr, None, :nc, None])
    if r0 < rows and c0 < cols:
        mul((slice(r0, rows), slice(c0, cols)), lambda t: t, scale[nr:, nc:])  # [1, 1], not 0-d: it promotes like x * scale


# -- round trip ------------------------------------------------------------------------------
def quantize_dequantize(
    x: torch.Tensor, fmt: Fp8Format, scale: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Round-trip ``x`` through ``fmt``: ``cast(x * scale) / scale``, returned in ``x.dtype``.

    ``scale`` may be a scalar or any tensor broadcastable to ``x``; ``None`` is a plain cast.
    The same two halves as training (``scale_operand`` + ``encode_scaled``, then
    ``dequantize``), with the multiply in FP32 so that the only rounding is FP8's.
    """
    if scale is not None:
        scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    scaled = scale_operand(x, scale, None, power_2=False)
    q = encode_scaled(scaled, fmt, owned=scaled is not x)
    return dequantize(q, None if scale is None else scale.reciprocal(), x.dtype)


# -- fused kernels (torch.compile) -------------------------------------------------------------
# On CPU every eager op above is a separate pass over memory, and a quantize-dequantize is about
# ten of them. For large tensors the same arithmetic compiled by inductor runs as one or two
# vectorised loops. The kernels below compute exactly what the eager path computes (same FP32
# products, the same rounding, the same saturation and Inf -> NaN rule; the unit tests
# compare them bit for bit, all 256 codes and every BF16 value included); scales are still
# computed by the eager code and passed in, so no transcendental is ever evaluated twice in two
# implementations. Used for CPU tensors of at least FUSED_MIN_NUMEL elements, when a C++
# compiler is available; any compile or run failure switches them off for the process (with a
# warning) and the eager path takes over. FP8LAB_FUSED_CASTS=off|on|auto (default auto).

FUSED_MIN_NUMEL = 1 << 18  # 256 Ki elements: below this, compiling does not pay for itself
_INF = float("inf")


def _k_qdq(
    x: torch.Tensor,
    scale: torch.Tensor | None,
    scale_inv: torch.Tensor | None,
    fmt_dtype: torch.dtype,
    out_dtype: torch.dtype,
    want_amax: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dequantize(cast(x * scale))`` in one loop (plus amax|x| when asked): ``x * scale`` as
    an FP32 product, Inf -> NaN, clamp to +-fmax, round to the format, times ``scale_inv``."""
    xf, p, fmax = _scaled_fp32(x, scale, fmt_dtype)
    # abs() == inf rather than isinf(): the same values, and inductor vectorises it
    p = torch.where(p.abs() == _INF, float("nan"), p).clamp(-fmax, fmax)
    y = p.to(torch.float8_e4m3fn).to(torch.float32) if fmt_dtype == torch.float8_e4m3fn else _round_e5m2(p)
    if scale_inv is not None:
        y = y * scale_inv
    return y.to(out_dtype), (xf.abs().amax() if want_amax else None)


def _scaled_fp32(
    x: torch.Tensor, scale: torch.Tensor | None, fmt_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``x`` in FP32, its FP32 product with ``scale`` (``x`` itself for a plain cast) and the
    format's max: the start of every compiled cast."""
    xf = x.float()
    return xf, (xf if scale is None else xf * scale), (E4M3.max if fmt_dtype == torch.float8_e4m3fn else E5M2.max)


def _k_row_stats(x_hp: torch.Tensor, x_dq: torch.Tensor) -> torch.Tensor:
    """``[k, 4]``: per row of ``[k, n]`` casts, [underflow count, amax, squared-error sum,
    non-finite count] in one loop over both tensors (compiled: ``_cast_parts`` on one large cast,
    ``_batched_stats`` on a stack of casts of one shape; the eager reductions compute the same,
    bar FP32 summation order)."""
    xf, yf = x_hp.float(), x_dq.float()
    diff = xf - yf
    self_diff = yf - yf  # 0 where finite, NaN where not
    # int32 counts where a row's count fits (any row below 2**31 elements): inductor's int64 vector
    # accumulators made the whole loop ~20% slower (a 152 Ki-element cast, 1 thread)
    count = torch.int32 if x_hp.shape[-1] < 2**31 else torch.int64
    return torch.stack([  # each column FP64 first: stacking integer counts with FP32 sums would round them above 2**24
        ((xf != 0).sum(1, dtype=count) - (yf != 0).sum(1, dtype=count)).double(),
        xf.abs().amax(1).double(),
        (diff * diff).sum(1).double(),
        (self_diff != self_diff).sum(1, dtype=count).double(),
    ], dim=1)


def _k_qdq_stats(
    x: torch.Tensor,
    scale: torch.Tensor | None,
    scale_inv: torch.Tensor | None,
    fmt_dtype: torch.dtype,
    out_dtype: torch.dtype,
    count_saturated: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_k_qdq``'s decoded cast of flat ``x`` and ``_k_row_stats`` of the pair in one loop (a
    recorded step's cast and its telemetry without reading ``x`` twice), plus, when
    ``count_saturated``, a fifth column: the elements with ``|x * scale| > fmax`` before the cast
    (the FP32 product ``scale_operand`` takes, or the same value when its product is exact)."""
    y, _ = _k_qdq(x, scale, scale_inv, fmt_dtype, out_dtype, False)
    row = _k_row_stats(x.reshape(1, -1), y.reshape(1, -1))[0]
    if not count_saturated:
        return y, row
    _, p, fmax = _scaled_fp32(x, scale, fmt_dtype)  # the product _k_qdq took: inductor computes it once
    return y, torch.cat([row, (p.abs() > fmax).sum().double().reshape(1)])


# Inductor keeps a low-precision intermediate in FP32 when the same loop uses it again, unless told
# to round it as eager does: ``_k_qdq_stats`` measures the BF16 decoded values it returns, so its
# squared error must see them rounded (without this, ``mse`` differs from the eager one by ~0.3%).
_INDUCTOR_OPTIONS: dict[Any, dict[str, Any]] = {_k_qdq_stats: {"emulate_precision_casts": True}}


def _round_e5m2(p: torch.Tensor) -> torch.Tensor:
    """FP32 ``p`` (already clamped to +-57344) rounded to E5M2, in FP32.

    Inductor's FP32 -> E5M2 conversion is a scalar loop on CPU, so the rounding is done on the
    FP32 bits instead (``round_to_grid``, nearest-even; elementwise integer ops that inductor
    vectorises). The unit tests compare every BF16 value with torch's own cast.
    """
    return round_to_grid(p, E5M2)


def _k_decode(
    q: torch.Tensor, mult: torch.Tensor | None, tile: tuple[int, int] | None, out_dtype: torch.dtype
) -> torch.Tensor:
    """``q`` times ``mult`` (None, 0-d, or one value per ``tile`` of 2-D ``q``) in ``out_dtype``."""
    y = q.to(torch.float32)
    if mult is not None and tile is not None and mult.dim() > 0:
        rows, cols = q.shape
        br, bc = tile
        y = (y.view(rows // br, br, cols // bc, bc) * mult[:, None, :, None]).view(rows, cols)
    elif mult is not None:
        y = y * mult
    return y.to(out_dtype)


# One compiled variant per frozen-weight shape: allow a model's worth of them, and never silently
# run a kernel's Python eagerly past the limit (slow: torch's scalar float8 conversions); hitting
# it raises, and `_Fused.run` falls back to the eager path instead.
RECOMPILE_LIMIT = 64
# torch >= 2.13 takes the limit per function (`torch.compile(recompile_limit=, fullgraph=True)`
# raises past it). Older ones need the global config patched around every call, which costs
# ~30-45 us a call (measured on a 2-core AVX2 EPYC): as much as a mid-sized kernel's own work.
_PER_FUNCTION_LIMIT = "recompile_limit" in inspect.signature(torch.compile).parameters


def _compile(fn: Any, dynamic: bool, backend: str = "inductor") -> Any:
    """``torch.compile(fn)`` that raises past ``RECOMPILE_LIMIT`` variants, on any torch version
    (``backend``: for tests), with ``fn``'s own inductor options (``_INDUCTOR_OPTIONS``)."""
    options = _INDUCTOR_OPTIONS.get(fn) if backend == "inductor" else None
    if _PER_FUNCTION_LIMIT:
        return torch.compile(fn, dynamic=dynamic, backend=backend, fullgraph=True, recompile_limit=RECOMPILE_LIMIT,
                             options=options)
    compiled = torch.compile(fn, dynamic=dynamic, backend=backend, options=options)

    def limited(*args: Any) -> Any:
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
            return compiled(*args)

    return limited


class _Fused:
    """Lazily compiled kernels with an eager fallback (see the section comment)."""

    def __init__(self) -> None:
        self.mode = os.environ.get("FP8LAB_FUSED_CASTS", "auto").strip().lower()
        self.min_numel = FUSED_MIN_NUMEL
        self._available: bool | None = None
        self._compiled: dict[Any, Any] = {}

    def usable(self, t: torch.Tensor) -> bool:
        """Whether ``t`` should take the compiled path (large, on CPU, compiler available)."""
        return t.numel() >= self.min_numel and self.compiles(t)

    def compiles(self, t: torch.Tensor) -> bool:
        """Whether compiled kernels serve tensors on ``t``'s device at all, whatever their size
        (on CPU with a compiler; a batch of small tensors stacked into one is worth a kernel)."""
        if self.mode in ("off", "0", "false", "no") or t.device.type != "cpu":
            return False
        if self._available is None:
            self._available = self._probe()
        return self._available

    def _probe(self) -> bool:
        if not hasattr(torch, "compile"):
            return False
        if self.mode in ("on", "1", "true", "yes"):
            return True
        cxx = os.environ.get("CXX") or "c++"
        return any(shutil.which(c) for c in (cxx, "g++", "clang++"))

    def qdq(
        self,
        x: torch.Tensor,
        scale: torch.Tensor | None,
        scale_inv: torch.Tensor | None,
        fmt: Fp8Format,
        out_dtype: torch.dtype,
        want_amax: bool,
        stats: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``(dequantize(cast(x * scale)), amax|x| or None)`` with a per-tensor ``scale`` (or
        None for a plain cast); None when the compiled path is unavailable.

        One compiled loop (``_k_qdq``). ``stats`` (a recorded step: whether to count saturated
        elements too) returns the telemetry row in place of the amax, from the same loop
        (``_k_qdq_stats``; the row's amax is |x|'s).
        """
        if stats is None:
            kernel, extra = _k_qdq, want_amax
        else:
            kernel, extra = _k_qdq_stats, stats
        out = self.run(kernel, (x.detach().reshape(-1), scale, scale_inv, fmt.dtype, out_dtype, extra))
        return None if out is None else (out[0].view(x.shape), out[1])

    def decode(
        self,
        q: torch.Tensor,
        mult: torch.Tensor | None,
        tile: tuple[int, int] | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor | None:
        """Frozen weights: static shapes (a model has a handful), the fastest code."""
        return self.run(_k_decode, (q, mult, tile, out_dtype), dynamic=False)

    def run(self, fn: Any, args: tuple[Any, ...], dynamic: bool = True) -> Any:
        """``torch.compile(fn)(*args)``, compiled on first use; None after a failure."""
        if not self._available:
            return None
        key = (fn, dynamic)
        compiled = self._compiled.get(key)
        try:
            if compiled is None:
                compiled = self._compiled[key] = _compile(fn, dynamic)
            return compiled(*args)
        except Exception as exc:  # noqa: BLE001 - no compiler, inductor bug...: fall back to eager
            self._available = False
            warnings.warn(
                f"fp8lab: compiled FP8 casts disabled, using eager ops ({type(exc).__name__}: {exc})",
                RuntimeWarning,
                stacklevel=3,
            )
            return None


FUSED = _Fused()
