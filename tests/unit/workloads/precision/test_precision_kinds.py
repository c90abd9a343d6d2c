"""Scaling kinds are objects: a new recipe is one ScalingKind subclass (here a static scale,
defined in the test) -- the scaler, the policy tag and the plan use it, and each GPU backend
refuses it with a sentence until it gets a mapping."""

from __future__ import annotations

import pytest
import torch

from workloads.precision.backends import te_backend, torchao_backend
from workloads.precision.formats import E4M3, quantize_dequantize
from workloads.precision.policy import get_policy
from workloads.precision.scaling import (
    KINDS,
    SCALING_KINDS,
    ScalingKind,
    ScalingRecipe,
    TensorScaler,
    get_kind,
    register_kind,
)


class StaticKind(ScalingKind):
    """A fixed amax of 2.0: scale = 448 / 2 for every tensor, nothing observed."""

    name, short = "static_test", "st"

    def amax(self, scaler, x):
        return torch.full((), 2.0, device=x.device)


@pytest.fixture
def static_kind():
    kind = register_kind(StaticKind())
    yield kind
    del KINDS[kind.name]


def test_builtin_kinds_say_what_the_strings_used_to():
    assert SCALING_KINDS == ("none", "current", "delayed", "block", "mx", "nvfp4")
    assert [k.short for k in KINDS.values()][:4] == ["pl", "cur", "dly", "blk"]
    assert get_kind("none").plain and get_kind("delayed").from_history
    assert not get_kind("current").saturates and get_kind("block").tiled
    assert not get_kind("delayed").frozen_weight_ok and not get_kind("block").fused
    assert ScalingRecipe("delayed", amax_history_len=4).tag == "delayed4"
    assert get_kind("mx").tiled and get_kind("nvfp4").saturates and not get_kind("mx").fused
    with pytest.raises(ValueError, match="unknown scaling kind 'mxfp6'.* available: none, current, delayed, block, mx, nvfp4"):
        get_kind("mxfp6")


def test_a_new_kind_is_one_class(static_kind):
    x = torch.randn(64, 96) * 4  # some values above the static amax: saturated
    scaler = TensorScaler(ScalingRecipe("static_test", power_2_scale=False), E4M3, "activation")
    q, saturated = scaler.quantize(x, count_saturated=True)
    assert torch.equal(q.dequantize(torch.float32), quantize_dequantize(x, E4M3, E4M3.max / 2))
    assert int(saturated) == int((x.abs() > 2.0).sum()) > 0
    assert not scaler.uses_history and scaler.tile is None

    policy = get_policy("fp8_naive").with_switches(
        base_activation={"fmt": "e4m3", "kind": "static_test"}
    )
    assert policy.tag.split(".")[1] == "A8st" and policy.base_activation.tag == "e4m3/static_test"
    with pytest.raises(torchao_backend.TorchaoPolicyError, match="static_test scaling has no torchao"):
        torchao_backend.map_policy(policy)
    with pytest.raises(te_backend.TePolicyError, match="no TE recipe for base_activation=e4m3/static_test"):
        te_backend.map_policy_te(policy)
