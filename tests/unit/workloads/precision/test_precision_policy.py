"""Policy registry, the policy table, the mechanism ladder and switch validation."""

import dataclasses
import json

import pytest

from workloads.precision.ladder import MECHANISMS, RUNGS, opposite
from workloads.precision.policy import (
    SWITCHES,
    PrecisionPolicy,
    UnknownPolicyError,
    available_policies,
    get_policy,
    register_policy,
)
from workloads.precision.scaling import CastSpec, ScalingRecipe

RUNG_NAMES = [r.name for r in RUNGS]


def test_registry_lists_base_policies_first_then_the_ladder():
    names = available_policies()
    assert names[:6] == ["bf16", "fp8_naive", "fp8_protected", "fp8_unscaled_fp8_adapters", "mxfp8", "nvfp4"]
    assert names[6:] == RUNG_NAMES
    assert {
        "fp8_naive+bf16_lora_gemm",
        "fp8_naive-fp32_adapters_vs_e4m3",
        "fp8_naive-fp32_adapters_vs_scaled_e4m3",
        "fp8_protected-fp32_adapters_vs_scaled_e4m3",
        "fp8_protected-block_scales",
        "fp8_protected-grad_scaler",
        "fp8_protected-calibration",
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


def test_naive_v2_is_the_stock_fp8_conversion():
    """Every linear in FP8 with per-tensor current scaling and exact scales (torchao tensorwise,
    TE Float8CurrentScaling); FP32 masters; nothing LoRA-aware."""
    p = get_policy("fp8_naive")
    exact = ScalingRecipe("current", power_2_scale=False)
    assert p.version == 3
    assert p.base_weight == CastSpec("e4m3", exact)
    assert p.base_activation == CastSpec("e4m3", exact)
    assert p.base_dgrad == CastSpec("e5m2", exact)
    assert (p.lora_storage, p.lora_gemm, p.lora_gemm_scaling, p.lora_grad) == (
        "fp32_master",
        "fp8",
        "current",
        "fp32",
    )
    assert p.lora_gemm_power_2_scale is False
    assert p.lm_head_fp8 and not p.lora_grad_scaler and p.calibration_steps == 0
    assert (p.ladder, p.mechanism, p.ablation) == ("", "", "")


def test_naive_v1_keeps_its_behaviour_under_a_descriptive_name():
    p = get_policy("fp8_unscaled_fp8_adapters")
    plain = ScalingRecipe("none")
    assert (p.base_weight, p.base_activation, p.base_dgrad) == (
        CastSpec("e4m3", plain),
        CastSpec("e4m3", plain),
        CastSpec("e5m2", plain),
    )
    assert (p.lora_storage, p.lora_gemm, p.lora_gemm_scaling, p.lora_grad) == (
        "fp8_e4m3",
        "fp8",
        "none",
        "fp8_e5m2",
    )
    assert p.lm_head_fp8 and not p.lora_grad_scaler and p.calibration_steps == 0 and not p.ladder


def test_protected_row():
    p = get_policy("fp8_protected")
    assert (
        p.base_weight.fmt == "e4m3"
        and p.base_weight.recipe.kind == "block"
        and p.base_weight.recipe.block_size == 128
    )
    assert p.base_activation.fmt == "e4m3" and p.base_activation.recipe.kind == "delayed"
    assert p.base_dgrad.fmt == "e5m2" and p.base_dgrad.recipe.kind == "current"
    assert p.version == 2  # v1 rounded the per-tensor scales to powers of two
    assert not p.base_activation.recipe.power_2_scale and not p.base_dgrad.recipe.power_2_scale
    assert p.base_weight.recipe.power_2_scale  # block scales: TE Float8BlockScaling's default
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
        and p.ladder == ""
    )


@pytest.mark.parametrize("rung", RUNGS, ids=RUNG_NAMES)
def test_each_rung_moves_exactly_one_mechanism_of_its_base(rung):
    base, policy = get_policy(rung.base), get_policy(rung.name)
    mechanism = MECHANISMS[rung.mechanism]
    changed = {s for s in SWITCHES if getattr(base, s) != getattr(policy, s)}
    assert changed and changed <= mechanism.fields, changed
    target = mechanism.protect if rung.direction == "up" else mechanism.expose
    assert policy == policy.with_switches(**target)  # the rung sits at the mechanism's position
    assert (policy.ladder, policy.ladder_base, policy.mechanism) == (
        rung.direction,
        rung.base,
        rung.mechanism,
    )
    assert policy.mechanism_desc == mechanism.description and rung.mechanism in policy.description
    assert policy.ablation == (rung.mechanism if rung.base == "fp8_protected" else "")


@pytest.mark.parametrize("rung", RUNGS, ids=RUNG_NAMES)
def test_each_rungs_base_starts_at_the_opposite_position_of_its_mechanism(rung):
    """Moving the mechanism is the rung's only change: its base sits exactly at the other
    position (a rung whose base was elsewhere would move a second choice along with it, as
    delayed -> plain activations also switched calibration off)."""
    base = get_policy(rung.base)
    assert base.with_switches(**opposite(rung)) == base
    assert get_policy(rung.name) != base


def test_no_rung_leaves_a_setting_that_only_another_mechanism_uses():
    """Calibration only acts with delayed scaling: a rung may not end with calibration steps
    but no delayed cast, unless its base had that dead setting already."""
    for rung in RUNGS:
        policy, base = get_policy(rung.name), get_policy(rung.base)
        dead = policy.calibration_steps > 0 and not policy.uses_delayed_scaling
        assert not dead or (base.calibration_steps > 0 and not base.uses_delayed_scaling), rung.name


def test_adapter_storage_is_two_mechanisms_unscaled_and_scaled_from_both_bases():
    names = set(RUNG_NAMES)
    for base in ("fp8_naive", "fp8_protected"):
        assert get_policy(f"{base}-fp32_adapters_vs_e4m3").lora_storage == "fp8_e4m3"
        assert get_policy(f"{base}-fp32_adapters_vs_scaled_e4m3").lora_storage == "fp8_e4m3_scaled"
        assert {f"{base}-fp32_adapters_vs_e4m3", f"{base}-fp32_adapters_vs_scaled_e4m3"} <= names


def test_power_of_two_scales_are_a_rung_of_the_stock_recipe():
    p = get_policy("fp8_naive-exact_scales")
    assert all(s.recipe.power_2_scale for s in (p.base_weight, p.base_activation, p.base_dgrad))
    assert p.lora_gemm_power_2_scale and p.tag != get_policy("fp8_naive").tag


def test_every_mechanism_is_one_switch_with_two_positions():
    """Both positions set the same fields, no field is left at the same value, and every
    mechanism is reachable as a rung."""
    for m in MECHANISMS.values():
        assert m.protect.keys() == m.expose.keys()
        base = get_policy("fp8_protected")
        on, off = base.with_switches(**m.protect), base.with_switches(**m.expose)
        assert {s for s in SWITCHES if getattr(on, s) != getattr(off, s)} == m.fields
    assert {r.mechanism for r in RUNGS} == set(MECHANISMS)


def test_a_switched_rung_is_no_longer_that_rung():
    rung = get_policy("fp8_protected-calibration")
    assert rung.with_switches(calibration_steps=0).mechanism == "calibration"  # unchanged
    moved = rung.with_switches(lm_head_fp8=True)
    assert (moved.ladder, moved.ladder_base, moved.mechanism) == ("", "", "")


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
