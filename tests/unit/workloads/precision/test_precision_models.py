"""Every architecture family x bf16 / fp8_naive / fp8_protected, from tiny random configs.

What a user bringing their own causal LM needs: the policy covers every frozen linear
(``nn.Linear``, GPT-2's ``Conv1D``, fused qkv / gate_up, biased q/k/v), the plan lists each one,
two training steps run, and the model still evaluates the way lm-eval's HFLM drives it
(``tie_weights()``, then an eval-mode forward) with tied embeddings still tied.
"""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    GemmaConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    OPTConfig,
    Phi3Config,
    Qwen2Config,
)

from workloads.precision.apply import apply_policy
from workloads.precision.backends import BackendChoice, apply_backend
from workloads.precision.linear import Fp8BaseLinear, Fp8TiedLinear
from workloads.precision.telemetry import Fp8Telemetry
from workloads.precision.walker import frozen_linears
from workloads.preflight import check_model_policy

V = 96
_IDS = {"vocab_size": V, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_DECODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, **_IDS}  # fmt: skip
CONFIGS = {
    "llama": lambda: LlamaConfig(**_DECODER, tie_word_embeddings=False),
    "llama_tied": lambda: LlamaConfig(**_DECODER, tie_word_embeddings=True),
    "qwen2": lambda: Qwen2Config(**_DECODER),  # q/k/v biases
    "mistral": lambda: MistralConfig(**_DECODER),
    "gemma": lambda: GemmaConfig(**_DECODER, head_dim=8),  # tied
    "phi3": lambda: Phi3Config(**_DECODER),  # fused qkv_proj / gate_up_proj
    "gpt2": lambda: GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=64, **_IDS),  # Conv1D
    "gpt_neox": lambda: GPTNeoXConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, **_IDS
    ),
    "opt": lambda: OPTConfig(
        hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=4,
        word_embed_proj_dim=32, max_position_embeddings=64, **_IDS,
    ),  # fmt: skip
}
POLICIES = ["bf16", "fp8_naive", "fp8_protected"]


def tiny(arch: str, targets="all-linear"):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[arch]())
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))


def is_tied(model) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def ids(seed: int) -> torch.Tensor:
    return torch.randint(3, V, (2, 10), generator=torch.Generator().manual_seed(seed))


def two_steps(model, handle) -> list[float]:
    opt = torch.optim.AdamW(list(handle.lora_params.values()), lr=1e-2)
    losses = []
    for step in range(2):
        loss = model(input_ids=ids(step), labels=ids(step)).loss
        handle.scale_loss(loss).backward()
        if handle.prepare_step(opt):
            opt.step()
            handle.after_step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def evaluate_like_hflm(model) -> torch.Tensor:
    """lm-eval's HFLM re-ties the embeddings, then scores in eval mode."""
    model.tie_weights()
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids(7)).logits


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_every_architecture_trains_plans_and_evaluates(arch, policy):
    model = tiny(arch)
    tied = is_tied(model)
    linears = {s.layer_name: s.role for s in frozen_linears(model)}
    assert "lm_head" in linears.values() and len(linears) >= 5
    handle = apply_policy(model, policy, Fp8Telemetry())

    weight_rows = {r["module"]: r for r in handle.plan if r["tensor"] == "weight" and r["role"] != "lora"}
    assert set(weight_rows) == set(linears)  # every linear, with its format or why not
    fp8 = policy != "bf16"
    for name, role in linears.items():
        in_fp8 = fp8 and (role == "base" or handle.policy.lm_head_fp8)
        assert weight_rows[name]["format"].startswith("e4m3/") == in_fp8, name
    converted = [m for m in model.modules() if isinstance(m, (Fp8BaseLinear, Fp8TiedLinear))]
    assert len(converted) == (0 if not fp8 else len(linears) - (not handle.policy.lm_head_fp8))

    lora_before = {k: v.detach().clone() for k, v in handle.lora_params.items()}
    losses = two_steps(model, handle)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(handle.lora_params[k], v) for k, v in lora_before.items())

    logits = evaluate_like_hflm(model)
    assert torch.isfinite(logits).all() and logits.shape[-1] >= V
    assert is_tied(model) == tied  # tied embeddings stay tied (one Parameter)


@pytest.mark.parametrize("policy", ["fp8_naive", "fp8_protected"])
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_torchao_emulate_converts_what_it_can_and_names_the_rest(arch, policy):
    """torchao converts nn.Linear only; a Conv1D model or a tied lm_head stays BF16 there, and
    the handle says so in ``deviations`` (a trial tags and reports them)."""
    model = tiny(arch)
    tied = is_tied(model)
    choice = BackendChoice("torchao", emulated=True, reason="test", requested="torchao")
    handle = apply_backend(model, policy, Fp8Telemetry(), choice)
    assert all(torch.isfinite(torch.tensor(two_steps(model, handle))))
    text = " | ".join(handle.deviations)
    assert ("Conv1D linears (torchao converts nn.Linear only) kept BF16" in text) == (arch == "gpt2")
    tied_head = tied and handle.policy.lm_head_fp8
    assert ("lm_head tied to the input embeddings kept BF16" in text) == tied_head
    if arch != "gpt2":  # every other linear really runs torchao's FP8 GEMM
        expected = {s.layer_name for s in frozen_linears(model) if s.role == "base"}
        assert expected <= set(handle.converted)
    assert torch.isfinite(evaluate_like_hflm(model)).all() and is_tied(model) == tied


def test_untargeted_linears_follow_the_base_rule_and_are_all_planned():
    model = tiny("llama", targets=["q_proj", "v_proj"])
    handle = apply_policy(model, "fp8_protected", Fp8Telemetry())
    rows = {r["module"].rsplit(".", 1)[-1]: r for r in handle.plan if r["tensor"] == "weight" and r["role"] != "lora"}
    for name in ("q_proj", "v_proj", "k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert rows[name]["format"] == "e4m3/block128", name
    assert "no LoRA adapter" in rows["k_proj"]["note"] and "LoRA-targeted" in rows["q_proj"]["note"]
    assert rows["lm_head"]["format"] == "bf16" and "excluded by the policy" in rows["lm_head"]["note"]
    assert sum(isinstance(m, Fp8BaseLinear) for m in model.modules()) == 7


def test_preflight_refuses_an_fp8_policy_on_fused_moe_experts(tmp_path):
    """Fused expert tensors (3-D, not linears) cannot be cast by any backend: one line before
    training, naming them; bf16 runs the same model; a model of linears passes."""
    MixtralConfig(**_DECODER, num_local_experts=2).save_pretrained(tmp_path / "moe")
    Phi3Config(**_DECODER).save_pretrained(tmp_path / "phi3")
    moe = {"name_or_path": str(tmp_path / "moe"), "trust_remote_code": False}
    problems = check_model_policy(moe, {"policy": "fp8_naive", "switches": {}})
    assert len(problems) == 1 and problems[0].startswith("precision.policy: fp8_naive")
    assert "model.layers.0.mlp.experts.gate_up_proj" in problems[0] and "fix: precision=bf16" in problems[0]
    assert check_model_policy(moe, {"policy": "bf16", "switches": {}}) == []
    phi3 = {"name_or_path": str(tmp_path / "phi3"), "trust_remote_code": False}
    assert check_model_policy(phi3, {"policy": "fp8_protected", "switches": {}}) == []
