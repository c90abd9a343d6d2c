"""FP8 casts are torch's float8 casts plus saturation; checked bit for bit at the format edges."""

import math

import pytest
import torch

from workloads.precision.formats import (
    E4M3,
    E5M2,
    decode,
    get_format,
    mul_scale,
    quantize_dequantize,
    saturating_cast,
)

FORMATS = [E4M3, E5M2]


def bits(t: torch.Tensor) -> list[int]:
    return t.view(torch.uint8).tolist()


def torch_bits(values: list[float], fmt) -> list[int]:
    return bits(torch.tensor(values, dtype=torch.float32).to(fmt.dtype))


def test_format_constants_match_the_fp8_specs():
    assert (E4M3.dtype, E4M3.max, E4M3.smallest_normal, E4M3.smallest_subnormal) == (
        torch.float8_e4m3fn,
        448.0,
        2.0**-6,
        2.0**-9,
    )
    assert (E5M2.dtype, E5M2.max, E5M2.smallest_normal, E5M2.smallest_subnormal) == (
        torch.float8_e5m2,
        57344.0,
        2.0**-14,
        2.0**-16,
    )
    assert get_format("e4m3") is E4M3
    with pytest.raises(ValueError, match="available: e4m3, e5m2"):
        get_format("e3m4")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_range_edges_are_bit_exact_torch_casts(fmt, dtype):
    sub = fmt.smallest_subnormal
    edges = [
        fmt.max,
        -fmt.max,
        fmt.smallest_normal,
        -fmt.smallest_normal,
        sub,
        -sub,
        sub / 2,  # exact tie -> round to even -> 0
        sub * 0.75,  # rounds up to the smallest subnormal
        sub * 0.25,  # flushes to zero
        0.0,
        -0.0,
        1.0,
        3.3,
    ]
    x = torch.tensor(edges, dtype=dtype)
    expected = bits(x.to(fmt.dtype))
    assert bits(saturating_cast(x, fmt)) == expected
    assert bits(saturating_cast(x, fmt))[:6] == torch_bits(edges[:6], fmt)
    # Known encodings: the smallest subnormal is code 1, half of it is +0.
    assert (
        expected[4] == 0x01 and expected[6] == 0x00 and expected[7] == 0x01 and expected[8] == 0x00
    )
    assert expected[0] == (0x7E if fmt is E4M3 else 0x7B)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_out_of_range_values_saturate_at_max(fmt):
    above = [fmt.max * 1.01, fmt.max * 1.2, 1e6, 1e30]
    x = torch.tensor(above + [-v for v in above])
    out = saturating_cast(x, fmt)
    max_bits, min_bits = torch_bits([fmt.max], fmt)[0], torch_bits([-fmt.max], fmt)[0]
    assert bits(out) == [max_bits] * 4 + [min_bits] * 4


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_nan_stays_nan_and_inf_becomes_nan(fmt):
    x = torch.tensor([math.nan, math.inf, -math.inf, 1.0])
    out = saturating_cast(x, fmt).float()
    assert torch.isnan(out[:3]).all(), "non-finite inputs must stay non-finite (never saturate)"
    assert out[3] == 1.0


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_bf16_value_casts_like_torch(fmt):
    """Exhaustive over all 65536 BF16 bit patterns: in range -> torch's cast bit for bit."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    out = saturating_cast(x, fmt)
    finite_in_range = torch.isfinite(x) & (x.float().abs() <= fmt.max)
    assert torch.equal(
        out.view(torch.uint8)[finite_in_range], x[finite_in_range].to(fmt.dtype).view(torch.uint8)
    )
    big = torch.isfinite(x) & (x.float().abs() > fmt.max)
    assert torch.equal(out[big].float(), torch.sign(x[big].float()) * fmt.max)
    assert torch.isnan(out[~torch.isfinite(x)].float()).all()


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_decode_matches_torch_for_all_256_codes(fmt, dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt.dtype)
    ref, got = codes.to(dtype), decode(codes, dtype)
    assert got.dtype == dtype
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(ref[~nan], got[~nan])
    assert torch.equal(torch.signbit(ref[~nan]), torch.signbit(got[~nan]))  # -0 stays -0


def test_quantize_dequantize_keeps_dtype_and_applies_scale():
    x = torch.tensor([1e-5, 3e-4, -2e-3], dtype=torch.bfloat16)
    plain = quantize_dequantize(x, E4M3)
    assert plain.dtype == torch.bfloat16
    assert plain[0] == 0  # below E4M3's subnormal range: flushed
    scaled = quantize_dequantize(x, E4M3, scale=2.0**16)
    assert scaled.dtype == torch.bfloat16
    rel = ((scaled.float() - x.float()) / x.float()).abs()
    assert (rel <= 2.0**-4).all()  # 3 mantissa bits: half an ulp is 1/16 relative


@pytest.mark.parametrize("fmt", FORMATS)
def test_training_round_trip_is_the_codec_round_trip(fmt):
    """The scaler (training) and ``quantize_dequantize`` (the references above) run one codec:
    a tensor large enough for the integer decoder and the row-blocked decode gives the same bits."""
    from workloads.precision.scaling import ScalingRecipe, TensorScaler

    x = torch.randn(1024, 640, generator=torch.Generator().manual_seed(0)) * 3
    x[0, :4] = torch.tensor([math.nan, math.inf, -1e9, 1e-30])
    scaler = TensorScaler(ScalingRecipe("current", power_2_scale=False), fmt, "activation")
    q, _ = scaler.quantize(x[1:])
    ref = quantize_dequantize(x[1:], fmt, scaler.scale(x[1:]))
    assert torch.equal(q.dequantize(torch.float32), ref)
    plain = TensorScaler(ScalingRecipe("none"), fmt, "activation").quantize(x)[0]
    assert bits(plain.dequantize(torch.float32)) == bits(quantize_dequantize(x, fmt))


@pytest.mark.parametrize("shape", [(576, 576), (192, 576), (1536, 576), (64, 300), (256, 256), (3, 5, 200)])
@pytest.mark.parametrize("tile", [(128, 128), (1, 128)])
def test_per_tile_scales_multiply_every_element_once_whatever_the_tiles_leave_over(shape, tile):
    """``mul_scale`` with tiles that do not divide the tensor (SmolLM2's 576 and 192 under 128x128)
    multiplies the edge strips as views instead of padding a copy: each element must still get
    exactly its tile's scale, in place when asked and in the product's dtype (FP32 from BF16)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    rows, cols = x.reshape(-1, shape[-1]).shape
    br, bc = tile
    scale = torch.rand(-(-rows // br), -(-cols // bc), generator=g) * 3 + 0.25
    per_element = scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols].reshape(shape)
    for source in (x, x.to(torch.bfloat16)):
        expected = source.float() * per_element
        got = mul_scale(source, scale, tile)
        assert got.dtype == torch.float32 and torch.equal(got, expected)
    owned = x.clone()
    assert mul_scale(owned, scale, tile, inplace=True) is owned and torch.equal(owned, x * per_element)
    assert torch.equal(x, torch.randn(shape, generator=torch.Generator().manual_seed(0)))  # the input untouched
