"""FP8 formats and the one cast every other module goes through.

All rounding, subnormal handling and flushing come from torch's own float8 dtypes
(``torch.float8_e4m3fn``, ``torch.float8_e5m2``); this module only adds what torch's cast
does not promise: saturation of finite out-of-range values, and a fixed rule for infinities.

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

from dataclasses import dataclass

import torch

__all__ = [
    "Fp8Format",
    "E4M3",
    "E5M2",
    "FORMATS",
    "get_format",
    "saturating_cast",
    "decode",
    "decode_deferred",
    "restore_nan",
    "dequantize",
    "quantize_dequantize",
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

FORMATS: dict[str, Fp8Format] = {E4M3.name: E4M3, E5M2.name: E5M2}


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
    return y.clamp_(-fmt.max, fmt.max).to(fmt.dtype)  # clamp keeps NaN


def decode(q: torch.Tensor, dtype: torch.dtype, *, may_have_nan: bool = True) -> torch.Tensor:
    """float8 -> ``dtype``, bit-identical to ``q.to(dtype)`` (every FP8 value is exact there).

    ``may_have_nan=False`` skips restoring NaN codes (see ``decode_deferred``).
    """
    y, factor = decode_deferred(q, dtype)
    if factor != 1.0:
        y *= factor
    return restore_nan(y, q) if may_have_nan else y


def decode_deferred(q: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """``(y, factor)`` with ``q``'s values equal to ``y * factor``: lets a caller fold the
    factor into the multiply by its scale, so dequantizing costs one multiply pass, not two.

    E4M3 -> BF16 is the hot path of the emulation and torch's CPU kernel for it is several
    times slower than the BF16 GEMM it feeds, so on CPU it is done with integer ops: the sign
    and the 7 magnitude bits, shifted into an FP16 bit pattern, encode ``value * 2**-8`` for
    normals and subnormals alike (FP16 has E4M3's subnormals as its own subnormals), and FP16 ->
    BF16 is a fast, exact hardware conversion; multiplying by 256 then acts on normal numbers
    only, so nothing pays the x86 penalty for subnormal arithmetic. The NaN code (0x7F/0xFF)
    comes out finite here: call ``restore_nan`` unless the data is known NaN-free. Decoding is
    not rounding: the unit tests compare all 256 codes against torch's cast. Every other
    (format, dtype, device) uses torch's cast with factor 1.
    """
    if q.dtype != torch.float8_e4m3fn or dtype != torch.bfloat16 or q.device.type != "cpu":
        return q.to(dtype), 1.0
    bits = q.view(torch.int8).to(torch.int16)  # sign-extended: bit 15 is the FP8 sign bit
    bits <<= 7  # eeeemmm -> FP16 exponent/mantissa bits 7..13 ...
    bits &= _E4M3_TO_FP16_MASK  # ... and drop the sign-extension copy left in bit 14
    return bits.view(torch.float16).to(torch.bfloat16), _E4M3_FROM_FP16_FACTOR


def restore_nan(y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Put NaN where ``q`` holds an E4M3 NaN code (in place); other formats decode NaN already."""
    if q.dtype == torch.float8_e4m3fn and y.dtype == torch.bfloat16 and q.device.type == "cpu":
        y.masked_fill_((q.view(torch.uint8) & 0x7F) == 0x7F, float("nan"))
    return y


_E4M3_TO_FP16_MASK = -0x4080  # int16 0xBF80: sign bit + the 7 shifted magnitude bits
_E4M3_FROM_FP16_FACTOR = 256.0  # 2**(15 - 7): FP16 exponent bias minus E4M3 bias


def dequantize(
    q: torch.Tensor, scale_inv: torch.Tensor | float | None, dtype: torch.dtype
) -> torch.Tensor:
    """Decode float8 data and multiply by ``scale_inv`` in FP32, then cast to ``dtype``."""
    if scale_inv is None:
        return decode(q, dtype)
    return (q.float() * scale_inv).to(dtype)


def quantize_dequantize(
    x: torch.Tensor, fmt: Fp8Format, scale: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Round-trip ``x`` through ``fmt``: ``cast(x * scale) / scale``, returned in ``x.dtype``.

    ``scale`` may be a scalar or any tensor broadcastable to ``x``; ``None`` is a plain cast.
    The multiply happens in FP32 so that the only rounding is FP8's (as in TE's cast kernels).
    """
    if scale is None:
        return decode(saturating_cast(x, fmt), x.dtype)
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    q = saturating_cast(x.float() * scale, fmt)
    return dequantize(q, scale.reciprocal(), x.dtype)
