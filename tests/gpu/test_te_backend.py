"""Transformer Engine backend on a real FP8 GPU (SM 8.9+). Skipped cleanly anywhere else.

    pip install 'fp8lab[te]'  &&  pytest -m gpu tests/gpu/test_te_backend.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("needs compute capability 8.9+ (FP8 tensor cores)", allow_module_level=True)
try:  # TE raises OSError/RuntimeError (not only ImportError) without its CUDA libraries
    import transformer_engine.pytorch as te
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"transformer_engine unavailable: {exc}", allow_module_level=True)

from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from workloads.precision.backends import apply_backend, select_backend  # noqa: E402
from workloads.precision.backends.te_backend import TePolicyError, map_policy_te  # noqa: E402
from workloads.precision.policy import get_policy  # noqa: E402
from workloads.precision.telemetry import Fp8Telemetry  # noqa: E402

DEVICE = torch.device("cuda")


def tiny_lora_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).to(DEVICE)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))


def ids(seed: int) -> torch.Tensor:  # 2 x 32 tokens: TE's FP8 GEMMs want multiples of 16
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (2, 32), generator=g).to(DEVICE)


POLICIES = [
    ("fp8_protected-block_scales", "DelayedScaling"),
    ("fp8_naive-activation_scaling", None),  # plain casts: TE raises
    ("fp8_protected", "Float8BlockScaling"),
    ("mxfp8", "MXFP8BlockScaling"),  # Blackwell (SM 10.0) only: unverified until one is at hand
    ("nvfp4", "NVFP4BlockScaling"),
]
_AVAILABLE = {"MXFP8BlockScaling": "is_mxfp8_available", "NVFP4BlockScaling": "is_nvfp4_available"}


def test_select_backend_picks_te():
    choice = select_backend("auto", DEVICE)
    assert choice.name == "transformer_engine" and choice.emulated is False
    assert select_backend("transformer_engine", DEVICE).name == "transformer_engine"


def test_current_scaling_policy_maps_to_float8currentscaling():
    policy = get_policy("fp8_protected-block_scales").with_switches(
        base_activation="e4m3:current", calibration_steps=0
    )
    mapping = map_policy_te(policy)
    assert (mapping.recipe, mapping.fp8_format) == ("Float8CurrentScaling", "HYBRID")
    mapping.build()


@pytest.mark.parametrize(("name", "recipe"), POLICIES)
def test_te_swaps_base_linears_and_trains_only_lora(name, recipe):
    if recipe is None:
        with pytest.raises(TePolicyError, match="plain"):
            map_policy_te(name)
        return
    if recipe == "Float8BlockScaling" and not te.is_fp8_block_scaling_available()[0]:
        pytest.skip("Float8BlockScaling needs Hopper (SM 9.0)")
    if recipe in _AVAILABLE:
        probe = getattr(te, _AVAILABLE[recipe], None)
        if probe is None or not probe()[0]:
            pytest.skip(f"{recipe} needs a Blackwell GPU (SM 10.0) and a TE that has it")
    model = tiny_lora_model()
    tel = Fp8Telemetry()
    handle = apply_backend(model, name, tel, select_backend("transformer_engine", DEVICE))
    assert (handle.backend, handle.emulated, handle.recipe) == ("transformer_engine", False, recipe)
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert layers and all(isinstance(m.base_layer, te.Linear) for m in layers)
    for layer in layers:  # LoRA adapters stay PEFT modules (BF16 compute, FP32 masters)
        assert not any(isinstance(a, te.Linear) for a in (*layer.lora_A.values(), *layer.lora_B.values()))  # noqa: E501
    assert not isinstance(model.get_output_embeddings(), te.Linear)  # lm_head excluded

    calibrated = handle.calibrate(lambda b: model(input_ids=b), [ids(100 + i) for i in range(3)])
    assert calibrated == (3 if recipe == "DelayedScaling" else 0)

    frozen = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k and torch.is_tensor(v)}  # noqa: E501
    lora = {k: v.detach().clone() for k, v in handle.lora_params.items()}
    opt = torch.optim.AdamW(list(handle.lora_params.values()), lr=1e-2)
    for step in range(2):
        tel.begin_step(step, record=True)
        loss = model(input_ids=ids(step), labels=ids(step)).loss
        handle.scale_loss(loss).backward()
        if handle.prepare_step(opt):
            opt.step()
            handle.after_step()
        opt.zero_grad(set_to_none=True)
        stats = tel.end_step({"train/loss": loss.detach()})
        assert torch.isfinite(torch.tensor(stats.metrics["train/loss"]))
    after = model.state_dict()
    base_weights = [k for k in frozen if k.endswith("base_layer.weight")]
    assert base_weights and all(torch.equal(after[k], frozen[k]) for k in base_weights)
    assert all(not torch.equal(handle.lora_params[k], v) for k, v in lora.items())
    assert any(r["module"] == "*" and r["tensor"] == "transformer_engine" for r in handle.plan)
