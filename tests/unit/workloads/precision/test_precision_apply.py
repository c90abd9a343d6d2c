"""apply_policy on a tiny random Llama + PEFT LoRA, for every registered policy."""

import json

import pytest
import torch
from peft.tuners.lora import LoraLayer

from tests.support.tiny_lora import tiny_lora_model as shared_tiny_lora_model
from workloads.precision.apply import apply_policy
from workloads.precision.formats import E4M3, E5M2, saturating_cast
from workloads.precision.linear import Fp8BaseLinear, Fp8LoraLinear, LoraComputeLinear
from workloads.precision.policy import available_policies, get_policy
from workloads.precision.telemetry import Fp8Telemetry


def tiny_lora_model(seed: int = 0):
    return shared_tiny_lora_model(seed, vocab_size=100)


def batch(seed: int) -> torch.Tensor:
    return torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(seed))


def train(model, handle, tel, steps: int = 2, lr: float = 1e-2):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    outputs = []
    for step in range(steps):
        tel.begin_step(step, record=True)
        ids = batch(step)
        loss = model(input_ids=ids, labels=ids).loss
        handle.scale_loss(loss).backward()
        if handle.prepare_step(opt):
            opt.step()
            handle.after_step()
        opt.zero_grad(set_to_none=True)
        outputs.append(tel.end_step({"train/loss": loss.detach()}))
    return outputs


@pytest.fixture(scope="module")
def bf16_base_bytes() -> int:
    return apply_policy(tiny_lora_model(), "bf16").base_weight_bytes()


@pytest.mark.parametrize("name", available_policies())
def test_policy_trains_only_lora_and_stores_what_it_says(name, bf16_base_bytes):
    policy = get_policy(name)
    model = tiny_lora_model()
    tel = Fp8Telemetry()
    handle = apply_policy(model, name, tel)
    frozen_before = {
        k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" not in k
    }
    lora_before = {k: v.detach().clone() for k, v in handle.lora_params.items()}

    calibrated = handle.calibrate(lambda b: model(input_ids=b), [batch(100 + i) for i in range(3)])
    assert calibrated == (min(3, policy.calibration_steps) if policy.uses_delayed_scaling else 0)
    outs = train(model, handle, tel)

    assert all(torch.isfinite(torch.tensor(o.metrics["train/loss"])) for o in outs)
    # Only LoRA parameters train; everything else is bit-identical.
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in frozen_before.items())
    assert any(not torch.equal(handle.lora_params[k], v) for k, v in lora_before.items())
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    assert all(p.dtype == torch.float32 for p in handle.lora_params.values())

    # Base weights are float8 exactly where the policy says, and PEFT still routes through them.
    lora_layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert lora_layers
    for layer in lora_layers:
        base = layer.base_layer
        if policy.base_fp8:
            assert isinstance(base, Fp8BaseLinear)
            stored = policy.base_weight.enabled and policy.base_weight_storage == "fp8"
            assert base.weight_is_fp8 == stored
            if stored:
                assert base.weight_fp8.dtype == torch.float8_e4m3fn
            else:  # the stock recipe: the BF16 weight is kept and cast per GEMM
                assert base.weight_hp.dtype == torch.bfloat16
        else:
            assert isinstance(base, torch.nn.Linear) and base.weight.dtype == torch.bfloat16
        lora_cls = Fp8LoraLinear if policy.lora_gemm == "fp8" else LoraComputeLinear
        assert all(isinstance(m, lora_cls) for m in layer.lora_A.values())
    if policy.base_fp8 and policy.base_weight.enabled and policy.base_weight_storage == "fp8":
        assert handle.base_weight_bytes() < 0.75 * bf16_base_bytes
    elif not policy.lm_head_fp8 or policy.base_weight_storage == "compute":
        assert handle.base_weight_bytes() == bf16_base_bytes

    # The plan names the lm_head's format.
    head = [r for r in handle.plan if r["role"] == "lm_head" and r["tensor"] == "weight"]
    assert len(head) == 1 and head[0]["module"].endswith("lm_head")
    assert head[0]["format"] == (policy.base_weight.tag if policy.lm_head_fp8 else "bf16")
    assert isinstance(model.get_output_embeddings(), Fp8BaseLinear) == policy.lm_head_fp8
    json.dumps(handle.plan)

    assert handle.loss_scale == (policy.grad_scaler.init_scale if policy.lora_grad_scaler else None)
    assert handle.backend == "emulated" and handle.emulated
    if policy.base_fp8:
        assert outs[-1].metrics["telemetry/activation/amax"] > 0
        assert "telemetry/dgrad/underflow_pct" in outs[-1].metrics
    assert outs[-1].metrics["train/grad_norm"] > 0


def test_fp8_adapter_storage_keeps_lora_weights_on_the_e4m3_grid():
    model = tiny_lora_model()
    tel = Fp8Telemetry()
    handle = apply_policy(model, "fp8_unscaled_fp8_adapters", tel)
    outs = train(model, handle, tel)
    for p in handle.lora_params.values():
        assert torch.equal(saturating_cast(p, E4M3).float(), p)
    kinds = {r["kind"] for r in outs[-1].rows}
    assert {"activation", "weight", "dgrad", "wgrad", "lora_weight", "lora_grad_norm"} <= kinds
    # The gradients the optimizer sees are E5M2 values (cast before the optimizer, no scale).
    ids = batch(7)
    handle.scale_loss(model(input_ids=ids, labels=ids).loss).backward()
    assert handle.prepare_step(torch.optim.SGD(list(handle.lora_params.values()), lr=0.0))
    for p in handle.lora_params.values():
        assert torch.equal(saturating_cast(p.grad, E5M2).float(), p.grad)


def test_naive_v2_runs_scaled_fp8_lora_gemms_on_fp32_masters():
    """The stock conversion: LoRA GEMMs in FP8 with per-tensor current scaling, adapters kept as
    FP32 masters -- so an AdamW step of lr 2e-4 moves lora_B off zero, which E4M3 adapter
    storage (fp8_naive v1) rounds straight back to zero."""
    lora_b = {}
    for name in ("fp8_naive", "fp8_unscaled_fp8_adapters"):
        model = tiny_lora_model()
        tel = Fp8Telemetry()
        handle = apply_policy(model, name, tel)
        train(model, handle, tel, lr=2e-4)
        lora_b[name] = max(p.abs().max().item() for n, p in handle.lora_params.items() if "lora_B" in n)
        recipes = {
            m.act_cast.scaler.recipe.kind for m in model.modules() if isinstance(m, Fp8LoraLinear)
        }
        lora_rows = {r["format"] for r in handle.plan if r["role"] == "lora" and r["tensor"] == "dgrad"}
        if name == "fp8_naive":
            assert recipes == {"current"} and lora_rows == {"e5m2/current"}
    assert lora_b["fp8_naive"] > 0 and lora_b["fp8_unscaled_fp8_adapters"] == 0


def test_protected_calibration_fills_activation_histories():
    model = tiny_lora_model()
    handle = apply_policy(model, "fp8_protected", Fp8Telemetry())
    handle.calibrate(lambda b: model(input_ids=b), [batch(i) for i in range(20)])
    delayed = [
        s.scaler for s in handle.cast_sites if s.scaler is not None and s.scaler.uses_history
    ]
    steps = get_policy("fp8_protected").calibration_steps  # < the history length of 16
    assert delayed and all(s._pos == steps and s.amax_history[steps:].eq(0).all() for s in delayed)
    assert all(s.amax_history.max() > 0 for s in delayed)


def test_model_dtype_cast_after_apply_keeps_fp8_storage():
    model = tiny_lora_model()
    apply_policy(model, "fp8_protected")
    with pytest.raises(ValueError, match="already applied"):
        apply_policy(model, "bf16")
    model.to(torch.bfloat16)
    bases = [m for m in model.modules() if isinstance(m, Fp8BaseLinear)]
    assert bases and all(b.weight_fp8.dtype == torch.float8_e4m3fn for b in bases)
    assert all(b.weight_scale_inv.dtype == torch.float32 for b in bases)


def test_scaled_e4m3_adapter_storage_moves_lora_b_where_unscaled_storage_cannot():
    """At lr 2e-4 an AdamW step moves lora_B by ~2e-4, below half of E4M3's smallest subnormal
    (2^-10): unscaled storage rounds it back to 0; an exact per-tensor scale (amax -> 448) keeps
    every entry, on the scaled E4M3 grid."""
    nonzero = {}
    for name in ("fp8_naive-fp32_adapters_vs_e4m3", "fp8_naive-fp32_adapters_vs_scaled_e4m3"):
        model = tiny_lora_model()
        tel = Fp8Telemetry()
        handle = apply_policy(model, name, tel)
        outs = train(model, handle, tel, lr=2e-4)
        b = [p for n, p in handle.lora_params.items() if "lora_B" in n]
        nonzero[name] = sum(int(torch.count_nonzero(p)) for p in b) / sum(p.numel() for p in b)
        rows = {r["format"] for r in handle.plan if r["tensor"] == "weight_storage"}
        assert "lora_weight" in {r["kind"] for r in outs[-1].rows}
        if name.endswith("scaled_e4m3"):
            assert rows == {"e4m3/current (rounded after each update)"}
            for p in handle.lora_params.values():
                scale = 448.0 / p.detach().abs().max()  # re-encoding a stored tensor is exact
                on_grid = saturating_cast(p.detach() * scale, E4M3).float() / scale
                torch.testing.assert_close(on_grid, p.detach(), rtol=1e-6, atol=0.0)
    assert nonzero["fp8_naive-fp32_adapters_vs_e4m3"] == 0.0
    assert nonzero["fp8_naive-fp32_adapters_vs_scaled_e4m3"] == 1.0
