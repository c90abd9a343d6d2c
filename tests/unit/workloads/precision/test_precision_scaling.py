"""Scaling recipes: current, delayed (amax history, calibration) and block (1x128 / 128x128)."""

import math

import pytest
import torch

from workloads.precision.formats import E4M3, E5M2, decode, saturating_cast
from workloads.precision.scaling import (
    CastSpec,
    ScalingRecipe,
    TensorScaler,
    amax_to_scale,
    block_amax,
    expand_blocks,
    tensor_amax,
)


def test_recipe_validation_lists_every_problem():
    with pytest.raises(ValueError) as err:
        ScalingRecipe(kind="dynamic", amax_compute_algo="mean", amax_history_len=0)
    msg = str(err.value)
    assert (
        "kind='dynamic'" in msg
        and "amax_compute_algo='mean'" in msg
        and "amax_history_len=0" in msg
    )


def test_amax_to_scale_guards_zero_and_non_finite():
    amax = torch.tensor([0.0, math.inf, math.nan, 448.0, 1.0, 3.0])
    exact = amax_to_scale(amax, 448.0, power_2=False)
    assert exact.tolist()[:4] == [1.0, 1.0, 1.0, 1.0]
    assert exact[4] == 448.0 and exact[5] == pytest.approx(448.0 / 3)
    pow2 = amax_to_scale(amax, 448.0)
    assert pow2[4] == 256.0  # largest power of two with amax * scale <= 448
    assert amax_to_scale(torch.tensor(1.0), 448.0, margin=2, power_2=False) == 112.0


def test_tensor_amax_is_max_abs_and_propagates_nan():
    assert tensor_amax(torch.tensor([-5.0, 2.0])) == 5.0
    assert torch.isnan(tensor_amax(torch.tensor([1.0, math.nan])))


@pytest.mark.parametrize("power_2", [True, False])
def test_current_scaling_maps_amax_near_fmax(power_2):
    x = torch.randn(64, 256) * 1e-5
    scaler = TensorScaler(ScalingRecipe("current", power_2_scale=power_2), E4M3, "activation")
    q, _ = scaler.quantize(x)
    top = q.data.float().abs().max().item()
    assert (E4M3.max / 2 < top <= E4M3.max) if power_2 else top == E4M3.max
    assert scaler.scale_inv.dim() == 0
    # The whole tensor survives the cast (nothing flushed), unlike a plain cast.
    assert (q.dequantize(torch.float32) != 0).float().mean() > 0.999
    assert (saturating_cast(x, E4M3).float() != 0).float().mean() < 0.01


def test_block_shapes_for_activations_and_weights_including_ragged_dims():
    act = TensorScaler(ScalingRecipe("block"), E4M3, "activation")
    q, _ = act.quantize(torch.randn(3, 5, 300))  # leading dims flatten to 15 rows
    assert q.data.shape == (3, 5, 300) and q.scale_inv.shape == (15, 3)
    wgt = TensorScaler(ScalingRecipe("block"), E4M3, "weight")
    q, _ = wgt.quantize(torch.randn(200, 260))
    assert q.data.shape == (200, 260) and q.scale_inv.shape == (2, 3)


@pytest.mark.parametrize(
    "role,shape", [("weight", (200, 260)), ("activation", (7, 300)), ("weight", (256, 128))]
)
def test_block_scaling_equals_a_per_tile_reference(role, shape):
    torch.manual_seed(0)
    x = torch.randn(*shape) * torch.logspace(-6, 2, shape[0])[:, None]  # rows span 8 decades
    scaler = TensorScaler(ScalingRecipe("block"), E4M3, role)
    q, _ = scaler.quantize(x)
    br, bc = scaler.tile
    ref = torch.empty_like(x)
    for r in range(0, shape[0], br):  # the loop the implementation avoids
        for c in range(0, shape[1], bc):
            tile = x[r : r + br, c : c + bc]
            s = amax_to_scale(tile.abs().max(), E4M3.max)
            ref[r : r + br, c : c + bc] = saturating_cast(tile * s, E4M3).float() / s
    assert torch.equal(q.dequantize(torch.float32), ref)
    full = expand_blocks(block_amax(x, scaler.tile), scaler.tile, x.shape)
    assert full.shape == x.shape
    r0, c0 = (shape[0] - 1) // br * br, (shape[1] - 1) // bc * bc  # the ragged last tile
    assert full[-1, -1] == x[r0:, c0:].abs().max()
    assert full[0, 0] == x[:br, :bc].abs().max()


def test_block_scales_isolate_an_outlier_tile():
    x = torch.randn(4, 256) * 1e-3
    x[0, 0] = 1e4  # one outlier in the first 1x128 tile of row 0
    block = (
        TensorScaler(ScalingRecipe("block"), E4M3, "activation")
        .quantize(x)[0]
        .dequantize(torch.float32)
    )
    per_tensor = (
        TensorScaler(ScalingRecipe("current"), E4M3, "activation")
        .quantize(x)[0]
        .dequantize(torch.float32)
    )
    assert (block[1:] != 0).all()  # other rows keep full precision
    assert (per_tensor[1:] == 0).float().mean() > 0.5  # per-tensor scale flushes them


def test_delayed_scaling_uses_history_before_the_current_tensor():
    recipe = ScalingRecipe("delayed", amax_history_len=3)
    scaler = TensorScaler(recipe, E4M3, "activation")
    q, _ = scaler.quantize(torch.full((4,), 2.0))
    assert scaler.scale_inv == 1.0  # empty history -> scale 1, like TE's initial scale
    assert scaler.amax_history.tolist() == [2.0, 0.0, 0.0]
    scaler.quantize(torch.full((4,), 0.5))
    assert scaler.scale_inv == 1 / amax_to_scale(torch.tensor(2.0), E4M3.max)  # max of history
    scaler.quantize(torch.full((4,), 0.25))
    scaler.quantize(torch.full((4,), 0.25))  # rolls: the 2.0 drops out
    assert sorted(scaler.amax_history.tolist()) == [0.25, 0.25, 0.5]
    assert scaler.scale(torch.zeros(1)) == amax_to_scale(torch.tensor(0.5), E4M3.max)


def test_delayed_most_recent_and_calibration_observe_only():
    scaler = TensorScaler(ScalingRecipe("delayed", amax_compute_algo="most_recent"), E5M2, "grad")
    scaler.calibrating = True
    for amax in (8.0, 1.0):
        scaler.observe(torch.tensor([amax, -amax / 2]))
    assert scaler.scale(torch.zeros(1)) == amax_to_scale(torch.tensor(1.0), E5M2.max)
    scaler.reset()
    assert scaler.scale(torch.zeros(1)) == 1.0


def test_non_delayed_scalers_ignore_observe():
    scaler = TensorScaler(ScalingRecipe("current"), E4M3, "activation")
    scaler.observe(torch.ones(3))
    assert scaler.amax_history is None


def test_inf_input_stays_non_finite_under_scaling():
    x = torch.tensor([1.0, math.inf, 2.0])
    q, _ = TensorScaler(ScalingRecipe("current"), E4M3, "activation").quantize(x)
    out = q.dequantize(torch.float32)
    assert torch.isnan(out[1]) and out[0] == 1.0  # non-finite amax -> scale 1, no silent zeros


@pytest.mark.parametrize("kind", ["none", "current", "delayed", "block"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nan_and_inf_reach_the_output_on_every_path(kind, dtype):
    x = torch.randn(4, 256).to(dtype)
    x[1, 3], x[2, 200] = math.nan, -math.inf
    scaler = TensorScaler(ScalingRecipe(kind), E4M3, "activation")
    scaler.observe(torch.ones(1))  # a finite history for delayed
    out = scaler.quantize(x)[0].dequantize(dtype)
    assert torch.isnan(out[1, 3]) and torch.isnan(out[2, 200])
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[3]).all()


def test_power_2_scaling_is_exact_in_bf16():
    torch.manual_seed(0)
    x = torch.randn(8, 256, dtype=torch.bfloat16) * 3e-4
    q, _ = TensorScaler(ScalingRecipe("block"), E4M3, "activation").quantize(x)
    fp32_path = (
        decode(q.data, torch.float32) * torch.repeat_interleave(q.scale_inv, 128, dim=1)
    ).to(torch.bfloat16)
    assert torch.equal(q.dequantize(torch.bfloat16), fp32_path)


def test_cast_spec_parse_forms():
    assert CastSpec.parse(None) == CastSpec() and CastSpec.parse("bf16") == CastSpec()
    assert CastSpec.parse("e4m3:block") == CastSpec("e4m3", ScalingRecipe("block"))
    assert CastSpec.parse("e5m2") == CastSpec("e5m2", ScalingRecipe("none"))
    spec = CastSpec.parse({"fmt": "e4m3", "kind": "delayed", "amax_history_len": 4})
    assert spec.recipe.amax_history_len == 4 and spec.tag == "e4m3/delayed4"
    with pytest.raises(ValueError, match="fmt='e4m4'"):
        CastSpec.parse("e4m4:current")
