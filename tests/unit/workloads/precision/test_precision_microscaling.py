"""MXFP8 and NVFP4 in the one codec: bit-exact against torch's own ``float8_e8m0fnu`` /
``float4_e2m1fn_x2`` dtypes, against worked examples of the OCP MX rules, and (where torchao is
installed) against torchao's reference quantizers; stochastic rounding and the Hadamard
transform do what TE's recipe says they do."""

from __future__ import annotations

import pytest
import torch

from workloads.precision.formats import E2M1, E4M3, E5M2, e2m1_codes, pack_e2m1, round_to_grid
from workloads.precision.microscaling import (
    mx_scales,
    mx_shared_exponent,
    nvfp4_scales,
    rotation,
)
from workloads.precision.scaling import CastSpec, ScalingRecipe, TensorScaler


def _scaler(spec: str | dict, role: str = "activation") -> TensorScaler:
    cast = CastSpec.parse(spec)
    return TensorScaler(cast.recipe, cast.format, role)


def _torchao_mx():
    try:
        from torchao.prototype.mx_formats import mx_tensor, nvfp4_tensor
    except Exception as exc:  # noqa: BLE001 - any import failure means "not here"
        pytest.skip(f"torchao's mx_formats is not importable here ({type(exc).__name__})")
    return mx_tensor, nvfp4_tensor


# -- E2M1 -----------------------------------------------------------------------------------
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def test_e2m1_nearest_even_on_the_grid_and_at_every_tie():
    """Each value and each midpoint between neighbours (ties go to the even code: OCP MX
    section 5.3.3, round-to-nearest-even as in torch's casts)."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    even = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])
    assert torch.equal(round_to_grid(E2M1_GRID, E2M1), E2M1_GRID)
    assert torch.equal(round_to_grid(ties, E2M1), even)
    assert torch.equal(round_to_grid(-ties, E2M1), -even)
    near = torch.tensor([0.26, 0.74, 2.49, 2.51, 5.01, 5.99, 0.1])
    assert torch.equal(round_to_grid(near, E2M1), torch.tensor([0.5, 0.5, 2.0, 3.0, 6.0, 6.0, 0.0]))


def test_e2m1_codes_pack_into_torchs_float4_dtype():
    """Codes are the OCP bit patterns (sign bit 3, then exponent and mantissa), two per byte in
    ``torch.float4_e2m1fn_x2`` with the first element in the low nibble."""
    values = torch.tensor([0.5, -6.0, 0.0, 3.0, -0.0, 1.5])
    q = values.to(torch.float8_e4m3fn)
    assert e2m1_codes(q).tolist() == [0x1, 0xF, 0x0, 0x5, 0x8, 0x3]
    packed = pack_e2m1(e2m1_codes(q))
    assert packed.dtype == torch.float4_e2m1fn_x2
    assert packed.view(torch.uint8).tolist() == [0xF1, 0x50, 0x38]


def test_e5m2_rounding_still_matches_torch_on_every_bf16_value():
    """``round_to_grid`` also serves the fused E5M2 kernel: it must equal torch's own cast."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = every.float()
    x = x[torch.isfinite(x)].clamp(-E5M2.max, E5M2.max)
    assert torch.equal(round_to_grid(x, E5M2), x.to(torch.float8_e5m2).float())


# -- MX (E8M0 scales) -----------------------------------------------------------------------
def test_mx_shared_exponent_is_the_ocp_rule_on_worked_examples():
    """X = 2**(floor(log2(amax)) - emax_elem), emax_elem = 8 for E4M3, 15 for E5M2, 2 for
    E2M1, clamped to E8M0's [-127, 127]; exactly at and just below a power of two."""
    amax = torch.tensor([1.0, 448.0, 511.99, 512.0, 0.75, 2.0**-130, 0.0, 2.0**127 * 1.5])
    assert mx_shared_exponent(amax, E4M3).tolist() == [-8, 0, 0, 1, -9, -127, -127, 119]
    assert mx_shared_exponent(torch.tensor([1.0, 57344.0]), E5M2).tolist() == [-15, 0]
    assert mx_shared_exponent(torch.tensor([6.0, 3.99]), E2M1).tolist() == [0, -1]
    below = torch.nextafter(torch.tensor(1024.0), torch.tensor(0.0))  # log2 rounds this to 10
    assert mx_shared_exponent(below[None], E4M3).tolist() == [1]


def test_mx_scales_are_bit_exact_e8m0_in_torchs_dtype():
    """The decode scale is a power of two that ``torch.float8_e8m0fnu`` holds exactly, with
    biased code shared + 127; the encode scale is its exact reciprocal."""
    amax = torch.tensor([1.0, 448.0, 3.0e-30, 0.0, 7.0e30])
    scale, scale_inv = mx_scales(amax, E4M3)
    codes = scale_inv.to(torch.float8_e8m0fnu)
    assert torch.equal(codes.float(), scale_inv)
    assert codes.view(torch.uint8).tolist() == (mx_shared_exponent(amax, E4M3) + 127).tolist()
    assert torch.equal(scale * scale_inv, torch.ones_like(scale))


def test_mxfp8_block_worked_example_saturates_like_the_spec():
    """One 32-block, amax 500: shared exponent floor(log2 500) - 8 = 0, so 500 clamps to 448
    (counted as saturated) while 1.0 and 0.0146 keep E4M3's own rounding; a second block with
    amax 1.0 has scale 2**-8, where 1/3 is 85.33 * 2**-8 -> 88 * 2**-8 (E4M3 step 8 at 64..128)."""
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1], x[0, 2] = 500.0, 1.0, 0.0146
    x[0, 32], x[0, 33] = 1.0, 1.0 / 3.0
    q, saturated = _scaler("e4m3:mx").quantize(x, count_saturated=True)
    assert q.tile == (1, 32)
    assert q.scale_inv.tolist() == [[1.0, 2.0**-8]]
    y = q.dequantize(torch.float32)
    assert y[0, :3].tolist() == [448.0, 1.0, torch.tensor(0.0146).to(torch.float8_e4m3fn).item()]
    assert y[0, 32:34].tolist() == [1.0, 88.0 * 2.0**-8]
    assert int(saturated) == 1


def test_mxfp8_codes_and_scales_equal_torchaos_to_mx():
    mx_tensor, _ = _torchao_mx()
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(32, 256) * torch.logspace(-4, 4, 256)).to(dtype)
        q, _ = _scaler("e4m3:mx").quantize(x)
        ref_scale, ref_data = mx_tensor.to_mx(x, torch.float8_e4m3fn, 32)
        assert torch.equal(q.data.view(torch.uint8), ref_data.view(torch.uint8))
        ours = q.scale_inv.to(torch.float8_e8m0fnu).view(torch.uint8).flatten()
        assert torch.equal(ours, ref_scale.view(torch.uint8).flatten())


def test_mx_blocks_run_along_the_last_dim_of_weights_too():
    """The reduction dim of ``x @ W.T`` is W's last dim: weights get 1x32 blocks, not 2-D."""
    assert _scaler("e4m3:mx", role="weight").tile == (1, 32)


# -- NVFP4 ----------------------------------------------------------------------------------
def test_nvfp4_worked_example_two_level_scales():
    """Tensor amax 2688 = 448 * 6 makes the FP32 global scale 1; a block with amax 6 has E4M3
    block scale 1 and its values are E2M1 as they are; a block with amax 0.75 has block scale
    0.125 (exact in E4M3), so 0.3 -> 2.4 -> 2 (E2M1) -> 0.25."""
    x = torch.zeros(1, 48)
    x[0, 0], x[0, 1], x[0, 2] = 2688.0, 6.0, 1.0  # block 0 (amax 2688: scale 448)
    x[0, 16], x[0, 17], x[0, 18] = 6.0, 2.9, -0.2  # block 1
    x[0, 32], x[0, 33] = 0.75, 0.3  # block 2
    q, _ = _scaler("e2m1:nvfp4").quantize(x)
    assert q.tile == (1, 16)
    assert q.scale_inv.tolist() == [[448.0, 1.0, 0.125]]
    y = q.dequantize(torch.float32)[0]
    assert y[[0, 1, 2]].tolist() == [2688.0, 0.0, 0.0]  # 6/448 and 1/448 flush to 0 in E2M1
    assert y[[16, 17, 18]].tolist() == [6.0, 3.0, -0.0]
    assert y[[32, 33]].tolist() == [0.75, 0.25]


def test_nvfp4_codes_and_scales_equal_torchaos_nvfp4_quantize():
    _, nvfp4_tensor = _torchao_mx()
    torch.manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(32, 128) * torch.logspace(-3, 3, 128)).to(dtype)
        q, _ = _scaler("e2m1:nvfp4").quantize(x)
        per_tensor = nvfp4_tensor.per_tensor_amax_to_scale(x.float().abs().amax())
        ref_scales, ref_data = nvfp4_tensor.nvfp4_quantize(x.contiguous(), 16, per_tensor)
        assert torch.equal(pack_e2m1(e2m1_codes(q.data)).view(torch.uint8), ref_data.view(torch.uint8))
        amax = x.float().abs().reshape(32, 8, 16).amax(-1)
        _, scale_inv = nvfp4_scales(amax, amax.amax(), E2M1)
        assert torch.equal(scale_inv, ref_scales.float() * per_tensor)


def test_fp32_block_scales_switch_keeps_each_blocks_exact_scale():
    """``block_scale_fmt: fp32`` (the fp32_block_scales rung): scale fmax / block amax, so the
    block's largest value maps exactly onto fmax and nothing saturates."""
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 500.0, 1.0
    q, saturated = _scaler({"fmt": "e4m3", "kind": "mx", "block_scale_fmt": "fp32"}).quantize(
        x, count_saturated=True
    )
    assert torch.allclose(q.scale_inv, torch.tensor([[500.0 / 448.0]]))
    assert q.dequantize(torch.float32)[0, 0].item() == pytest.approx(500.0, rel=1e-6)
    assert int(saturated) == 0


# -- stochastic rounding and the Hadamard transform ------------------------------------------
def test_stochastic_rounding_is_unbiased_repeatable_and_stays_on_the_grid():
    """Rounding noise comes from torch's RNG: the same seed draws the same noise."""
    torch.manual_seed(0)
    x = torch.full((1, 16 * 2048), 2.5)  # between E2M1's 2 and 3
    x[0, ::16] = 6.0  # each block's amax: block scale 448 and global 6 / 2688, decode scale 1
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[0, ::16] = False
    sr = _scaler({"fmt": "e2m1", "kind": "nvfp4", "stochastic_rounding": True})
    values = sr.quantize(x)[0].dequantize(torch.float32)[keep]
    assert set(values.unique().tolist()) == {2.0, 3.0}
    assert values.mean().item() == pytest.approx(2.5, abs=0.02)  # nearest-even gives 2.0
    rne = _scaler("e2m1:nvfp4").quantize(x)[0].dequantize(torch.float32)[keep]
    assert set(rne.unique().tolist()) == {2.0}
    torch.manual_seed(0)
    again = _scaler({"fmt": "e2m1", "kind": "nvfp4", "stochastic_rounding": True}).quantize(x)[0]
    assert torch.equal(again.dequantize(torch.float32)[keep], values)


def test_hadamard_quantizes_the_rotated_blocks_and_rotates_back():
    """``H S`` is orthogonal with entries +-1/4 (so a GEMM of two operands rotated alike is
    unchanged); with ``hadamard`` the codes are those of ``x @ HS`` per 16-block, and decoding
    multiplies ``(HS)^T`` back in, so the error equals the rotated tensor's error. (It is no
    per-tensor win: on these inputs, one outlier per block, the rotated tensor's error is larger;
    TE applies the transform to the weight-gradient GEMM only.)"""
    hs = rotation(16, torch.device("cpu"))
    assert torch.allclose(hs @ hs.t(), torch.eye(16), atol=1e-6)
    assert set(hs.abs().unique().tolist()) == {0.25}
    torch.manual_seed(0)
    x = torch.randn(64, 64) * 0.1
    x[:, ::16] = 2.0
    rht = _scaler({"fmt": "e2m1", "kind": "nvfp4", "hadamard": True}).quantize(x)[0]
    rotated = (x.reshape(64, 4, 16) @ hs).reshape(64, 64)
    direct = _scaler("e2m1:nvfp4").quantize(rotated)[0]
    assert torch.equal(rht.data.view(torch.uint8), direct.data.view(torch.uint8))
    y = rht.dequantize(torch.float32)
    y_rot = direct.dequantize(torch.float32)
    assert torch.allclose((y - x).norm(), (y_rot - rotated).norm(), rtol=1e-5)
    plain = _scaler("e2m1:nvfp4").quantize(x)[0].dequantize(torch.float32)
    assert (y - x).norm() > (plain - x).norm()


# -- configuration ---------------------------------------------------------------------------
def test_a_kind_name_alone_gets_the_kinds_block_size():
    assert CastSpec.parse("e4m3:mx").recipe.block_size == 32
    assert CastSpec.parse({"fmt": "e2m1", "kind": "nvfp4"}).recipe.block_size == 16
    assert CastSpec.parse({"fmt": "e4m3", "kind": "mx", "block_size": 64}).recipe.tag == "mx64"
    assert CastSpec.parse("e4m3:block").recipe.block_size == 128


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("e4m3:nvfp4", "scaling nvfp4 casts to e2m1, not e4m3"),
        ("e2m1:current", "scaling current casts to e4m3|e5m2, not e2m1"),
        ({"fmt": "e4m3", "kind": "mx", "stochastic_rounding": True}, "needs a narrow format (e2m1)"),
        ({"fmt": "e4m3", "kind": "current", "hadamard": True}, "hadamard=true needs a block format"),
        ({"fmt": "e4m3", "kind": "block", "block_scale_fmt": "fp32"}, "needs a block format"),
        ({"fmt": "e4m3", "kind": "mx", "block_scale_fmt": "e8m0"}, "not in ('native', 'fp32')"),
        ({"fmt": "e2m1", "kind": "nvfp4", "hadamard": True, "block_size": 24}, "power-of-two"),
    ],
)
def test_impossible_block_format_settings_are_refused_with_a_sentence(spec, says):
    with pytest.raises(ValueError, match=None) as err:
        CastSpec.parse(spec)
    assert says in str(err.value)


def test_tags_name_the_block_format_switches():
    parse = CastSpec.parse
    assert parse("e4m3:mx").tag == "e4m3/mx32"
    assert parse({"fmt": "e2m1", "kind": "nvfp4", "stochastic_rounding": True, "hadamard": True}).tag == "e2m1/nvfp416srh"
    assert parse({"fmt": "e4m3", "kind": "mx", "block_scale_fmt": "fp32"}).tag == "e4m3/mx32f"
    assert ScalingRecipe("nvfp4", block_size=16).tag == "nvfp416"
