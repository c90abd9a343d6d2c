"""Policy registry, the DESIGN.md table, ablations and switch validation."""

import dataclasses
import json

import pytest

from workloads.precision.policy import (
    SWITCHES,
    PrecisionPolicy,
    UnknownPolicyError,
    available_policies,
    get_policy,
    register_policy,
)
from workloads.precision.scaling import CastSpec, ScalingRecipe

ABLATIONS = [n for n in available_policies() if n.startswith("fp8_protected-")]


def test_registry_lists_base_policies_first_then_ablations():
    names = available_policies()
    assert names[:3] == ["bf16", "fp8_naive", "fp8_protected"]
    assert {
        "fp8_protected-no_block_scales",
        "fp8_protected-no_scaler",
        "fp8_protected-no_calibration",
        "fp8_protected-fp8_lora",
        "fp8_protected-fp8_lm_head",
        "fp8_protected-plain_dgrad",
    } <= set(names)


def test_unknown_policy_says_did_you_mean_and_lists_available():
    with pytest.raises(UnknownPolicyError) as err:
        get_policy("fp8_protcted")
    msg = str(err.value)
    assert msg.startswith(
        "unknown precision policy 'fp8_protcted' — did you mean 'fp8_protected'?"
        " available: bf16, fp8_naive, fp8_protected"
    )
    assert isinstance(err.value, ValueError)
    with pytest.raises(UnknownPolicyError, match="'zzz'; available: bf16"):
        get_policy("zzz")


def test_bf16_row_of_the_design_table():
    p = get_policy("bf16")
    assert not p.base_fp8 and not p.lm_head_fp8 and p.tag == "bf16"
    assert (p.lora_storage, p.lora_gemm, p.lora_grad, p.lora_grad_scaler) == (
        "fp32_master",
        "bf16",
        "fp32",
        False,
    )


def test_naive_row_is_all_plain_casts():
    p = get_policy("fp8_naive")
    assert p.base_weight == CastSpec("e4m3", ScalingRecipe("none"))
    assert p.base_activation == CastSpec("e4m3", ScalingRecipe("none"))
    assert p.base_dgrad == CastSpec("e5m2", ScalingRecipe("none"))
    assert (p.lora_storage, p.lora_gemm, p.lora_grad) == ("fp8_e4m3", "fp8", "fp8_e5m2")
    assert (
        p.lm_head_fp8 and not p.lora_grad_scaler and p.calibration_steps == 0 and p.ablation == ""
    )


def test_protected_row():
    p = get_policy("fp8_protected")
    assert (
        p.base_weight.fmt == "e4m3"
        and p.base_weight.recipe.kind == "block"
        and p.base_weight.recipe.block_size == 128
    )
    assert p.base_activation.fmt == "e4m3" and p.base_activation.recipe.kind == "delayed"
    assert p.base_dgrad.fmt == "e5m2" and p.base_dgrad.recipe.kind == "current"
    assert (p.lora_storage, p.lora_gemm, p.lora_grad, p.lora_grad_scaler) == (
        "fp32_master",
        "bf16",
        "fp32",
        True,
    )
    assert (
        not p.lm_head_fp8
        and p.calibration_steps > 0
        and p.uses_delayed_scaling
        and p.ablation == ""
    )


@pytest.mark.parametrize("name", ABLATIONS)
def test_each_ablation_flips_exactly_one_switch_of_protected(name):
    base, ablation = get_policy("fp8_protected"), get_policy(name)
    changed = [s for s in SWITCHES if getattr(base, s) != getattr(ablation, s)]
    assert len(changed) == 1, changed
    assert ablation.ablation and ablation.ablation in ablation.description


def test_policies_never_carry_hyperparameters():
    fields = {f.name for f in dataclasses.fields(PrecisionPolicy)}
    assert not fields & {
        "lr",
        "learning_rate",
        "rank",
        "r",
        "lora_alpha",
        "steps",
        "max_steps",
        "batch_size",
    }


def test_tags_are_distinct_and_to_dict_is_json():
    policies = [get_policy(n) for n in available_policies()]
    assert len({p.tag for p in policies}) == len(policies)
    for p in policies:
        data = json.loads(json.dumps(p.to_dict()))
        assert data["name"] == p.name and data["base_weight"]["fmt"] == p.base_weight.fmt


def test_with_switches_returns_a_validated_copy():
    base = get_policy("fp8_protected")
    p = base.with_switches(
        lora_grad_scaler=False, base_activation="e4m3:current", grad_scaler={"init_scale": 8.0}
    )
    assert base.lora_grad_scaler and not p.lora_grad_scaler
    assert p.base_activation == CastSpec("e4m3", ScalingRecipe("current"))
    assert p.grad_scaler.init_scale == 8.0
    assert p.tag != base.tag


def test_with_switches_rejects_unknown_names_and_bad_values():
    base = get_policy("fp8_protected")
    with pytest.raises(ValueError) as err:
        base.with_switches(lora_gem="fp8")
    assert "did you mean 'lora_gemm'" in str(err.value) and "valid switches: base_weight" in str(
        err.value
    )
    with pytest.raises(ValueError, match="lora_gemm='fp4'"):
        base.with_switches(lora_gemm="fp4")
    with pytest.raises(ValueError, match="delayed"):
        base.with_switches(base_weight="e4m3:delayed")
    with pytest.raises(ValueError) as err:
        base.with_switches(name="x")
    assert "unknown precision switch" in str(err.value)


def test_validation_reports_all_errors_at_once():
    with pytest.raises(ValueError) as err:
        PrecisionPolicy(name="bad", lora_storage="fp4", lora_grad="fp16", calibration_steps=-1)
    msg = str(err.value)
    assert "lora_storage" in msg and "lora_grad" in msg and "calibration_steps" in msg


def test_register_refuses_silent_overwrite():
    with pytest.raises(ValueError, match="already registered"):
        register_policy(PrecisionPolicy(name="bf16"))
