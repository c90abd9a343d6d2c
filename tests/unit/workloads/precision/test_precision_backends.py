"""FP8 backends on CPU: backend selection, policy -> torchao mapping, and the torchao backend
with ``emulate=True`` on a tiny Llama + PEFT LoRA ('all-linear')."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from workloads.precision.apply import PrecisionHandle
from workloads.precision.backends import (
    BackendChoice,
    apply_backend,
    backend_policy_errors,
    select,
    select_backend,
)
from workloads.precision.policy import available_policies, get_policy
from workloads.precision.telemetry import Fp8Telemetry

torchao_float8 = pytest.importorskip("torchao.float8")
from workloads.precision.backends import te_backend  # noqa: E402
from workloads.precision.backends import torchao_backend as tb  # noqa: E402

TORCHAO_CPU = BackendChoice("torchao", emulated=True, reason="test", requested="torchao")
UNSCALED = "fp8_unscaled_fp8_adapters"  # fp8_naive v1: plain casts everywhere


# -- select_backend (probes monkeypatched) ---------------------------------------------------
@pytest.fixture
def probes(monkeypatch):
    """Set what the machine looks like: probes(gpu=..., te=..., ao=...)."""

    def set_(gpu: bool = False, te: bool = False, ao: bool = True) -> None:
        monkeypatch.setattr(select, "_fp8_gpu", lambda d: (gpu, "H200 has compute capability 9.0" if gpu else "device is cpu, not a CUDA GPU"))  # noqa: E501
        monkeypatch.setattr(select, "_te_importable", lambda: (te, "te ok" if te else "no te"))
        monkeypatch.setattr(select, "_torchao_importable", lambda: (ao, "ao ok" if ao else "no ao"))

    return set_


@pytest.mark.parametrize(
    ("gpu", "te", "ao", "expected"),
    [
        (True, True, True, ("transformer_engine", False)),
        (True, False, True, ("torchao", False)),
        (True, False, False, ("emulated", True)),
        (False, True, True, ("emulated", True)),  # no FP8 GPU: auto never emulates torchao
    ],
)
def test_auto_prefers_te_then_torchao_then_emulated(probes, gpu, te, ao, expected, caplog):
    probes(gpu=gpu, te=te, ao=ao)
    with caplog.at_level("INFO", logger=select.__name__):
        choice = select_backend("auto", "cuda" if gpu else "cpu")
    assert (choice.name, choice.emulated) == expected
    assert choice.reason.startswith("auto:") and choice.requested == "auto"
    assert f"-> {choice.name}" in caplog.text and choice.reason in caplog.text


def test_explicit_torchao_emulates_without_fp8_gpu(probes):
    probes(gpu=False)
    choice = select_backend("torchao", torch.device("cpu"))
    assert choice == BackendChoice("torchao", True, choice.reason, "torchao")
    assert "emulate=True" in choice.reason
    probes(gpu=True)
    assert select_backend("torchao", "cuda").emulated is False


def test_explicit_backends_fail_clearly(probes):
    probes(gpu=False, te=False, ao=False)
    with pytest.raises(ValueError, match=r"precision.backend=transformer_engine .*no te.*device is cpu.*fp8lab\[te\]"):  # noqa: E501
        select_backend("transformer_engine", "cpu")
    probes(gpu=True, te=False)
    with pytest.raises(ValueError, match="precision.backend=emulated"):
        select_backend("transformer_engine", "cuda")
    probes(gpu=True, ao=False)
    with pytest.raises(ValueError, match=r"fp8lab\[torchao\]"):
        select_backend("torchao", "cuda")
    with pytest.raises(ValueError, match="did you mean 'torchao'"):
        select_backend("torchoa", "cpu")
    assert select_backend("emulated", "cuda") == BackendChoice(
        "emulated", True, "requested explicitly", "emulated"
    )


def test_real_probes_on_this_machine():
    assert select._fp8_gpu(torch.device("cpu"))[0] is False
    assert select._torchao_importable()[0] is True


# -- policy -> torchao mapping ---------------------------------------------------------------
def test_mapping_of_the_named_policies():
    assert tb.map_policy("bf16").recipe is None
    unscaled = tb.map_policy(UNSCALED)
    assert unscaled.recipe == "tensorwise"
    assert unscaled.plain == {"input", "weight", "grad_output"} and unscaled.grad_fmt == "e5m2"
    naive = tb.map_policy("fp8_naive")  # v3 is torchao's own default recipe, exact scales included
    assert (naive.recipe, naive.plain, naive.grad_fmt) == ("tensorwise", set(), "e5m2")
    assert naive.round_scales_to_power_of_2 is False and not naive.deviations
    assert tb.map_policy("fp8_naive-exact_scales").round_scales_to_power_of_2 is True
    prot = tb.map_policy("fp8_protected")
    assert prot.recipe == "rowwise" and not prot.plain
    text = " | ".join(prot.deviations)
    for expected in ("delayed16", "block128", "e5m2 -> e4m3", "calibration", "BF16 in memory"):
        assert expected in text
    assert tb.map_policy("fp8_protected-block_scales").recipe == "tensorwise"
    plain_dgrad = tb.map_policy("fp8_protected-dgrad_scaling")  # plain E5M2 grads need tensorwise
    assert plain_dgrad.recipe == "tensorwise" and plain_dgrad.plain == {"grad_output"}
    assert tb.map_policy("fp8_naive-activation_scaling").plain == {"input"}
    assert tb.map_policy("fp8_protected", recipe="rowwise_with_gw_hp").recipe == (
        "rowwise_with_gw_hp"
    )


BLACKWELL = {"mxfp8", "nvfp4"}


@pytest.mark.parametrize("name", available_policies())
def test_every_registered_policy_maps_and_builds_a_config(name):
    """Every FP8 policy maps onto torchao; the Blackwell block formats are refused with the fix
    (torchao's float8 training has no MX/NVFP4 recipe), never run as per-row FP8."""
    policy = get_policy(name)
    if name in BLACKWELL or policy.ladder_base in BLACKWELL:
        (error,) = backend_policy_errors("torchao", name)
        assert "Blackwell block format" in error and "precision.backend=emulated" in error
        return
    mapping = tb.map_policy(name)
    assert backend_policy_errors("torchao", name) == []
    if mapping.recipe:
        config = mapping.float8_config(emulate=True)
        assert config.emulate is True
        assert config.cast_config_input.target_dtype == torch.float8_e4m3fn


def test_blackwell_policies_map_to_tes_mxfp8_and_nvfp4_recipes():
    """mxfp8 -> MXFP8BlockScaling (E4M3), nvfp4 -> NVFP4BlockScaling with TE's switches taken from
    the policy; what TE does differently is a sentence; FP32 block scales have no TE recipe.
    (Data only: building the recipe needs TE, unverified on GPU.)"""
    mx = te_backend.map_policy_te("mxfp8")
    assert (mx.recipe, mx.fp8_format, mx.kwargs) == ("MXFP8BlockScaling", "E4M3", {})
    assert any("rounds amax / fmax *up*" in d for d in mx.deviations)
    nv = te_backend.map_policy_te("nvfp4")
    assert nv.recipe == "NVFP4BlockScaling" and nv.deviations == ()
    assert nv.kwargs == {"disable_stochastic_rounding": False, "disable_rht": True, "disable_2d_quantization": False}
    assert te_backend.map_policy_te("nvfp4-stochastic_rounding").kwargs["disable_stochastic_rounding"]
    rht = te_backend.map_policy_te("nvfp4+hadamard")
    assert not rht.kwargs["disable_rht"] and "weight-gradient GEMM operands only" in rht.deviations[0]
    for name, says in (("mxfp8+mx_fp32_scales", "FP32 block scales"), ("mxfp8-mx_block32", "blocks are 32 values")):
        with pytest.raises(te_backend.TePolicyError, match=says):
            te_backend.map_policy_te(name)
    mixed = get_policy("mxfp8").with_switches(base_dgrad="e5m2:current")
    with pytest.raises(te_backend.TePolicyError, match="one block format"):
        te_backend.map_policy_te(mixed)


def test_policies_torchao_cannot_run_raise_with_the_fix():
    partial = get_policy("fp8_protected").with_switches(base_dgrad=None)
    with pytest.raises(tb.TorchaoPolicyError, match="base_dgrad stay BF16.*backend=emulated"):
        tb.map_policy(partial)
    e5m2_act = get_policy("fp8_protected").with_switches(base_activation="e5m2:current")
    with pytest.raises(ValueError, match="base_activation=e5m2/current"):
        tb.map_policy(e5m2_act)
    assert backend_policy_errors("torchao", partial)[0].startswith("precision.backend=torchao:")
    # TE has no plain casts; the check imports no TE.
    assert "plain" in backend_policy_errors("transformer_engine", UNSCALED)[0]
    assert backend_policy_errors("transformer_engine", "fp8_protected") == []


# -- the torchao backend on a tiny model -----------------------------------------------------
def tiny_lora_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
    )  # fmt: skip
    return get_peft_model(
        LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )


def ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(seed))


def one_step(model, handle, tel, step: int = 0):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    tel.begin_step(step, record=True)
    batch = ids(step)
    loss = model(input_ids=batch, labels=batch).loss
    handle.scale_loss(loss).backward()
    stepped = handle.prepare_step(opt)
    if stepped:
        opt.step()
        handle.after_step()
    opt.zero_grad(set_to_none=True)
    return stepped, tel.end_step({"train/loss": loss.detach()})


@pytest.mark.parametrize("name", ["fp8_protected", "fp8_naive", UNSCALED])
def test_torchao_converts_base_linears_only_and_trains_only_lora(name):
    policy = get_policy(name)
    model = tiny_lora_model()
    tel = Fp8Telemetry()
    handle = apply_backend(model, name, tel, TORCHAO_CPU)
    frozen_cls = tb.frozen_base_float8_linear_cls()
    assert isinstance(handle, PrecisionHandle)
    assert (handle.backend, handle.emulated) == ("torchao", True)

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert len(layers) == 14 and all(isinstance(m.base_layer, frozen_cls) for m in layers)
    assert all(m.base_layer.config.emulate for m in layers)
    for layer in layers:  # PEFT's adapters are nn.Linear subclasses, and stay unconverted
        for adapter in (*layer.lora_A.values(), *layer.lora_B.values()):
            assert not isinstance(adapter, torchao_float8.float8_linear.Float8Linear)
    lm_head = model.get_output_embeddings()
    assert isinstance(lm_head, frozen_cls) is policy.lm_head_fp8
    assert len(handle.converted) == 14 + policy.lm_head_fp8

    frozen_before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    lora_before = {k: v.detach().clone() for k, v in handle.lora_params.items()}
    stepped, stats = one_step(model, handle, tel)
    assert stepped and torch.isfinite(torch.tensor(stats.metrics["train/loss"]))
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in frozen_before.items())
    changed = [not torch.equal(handle.lora_params[k], v) for k, v in lora_before.items()]
    # FP8 adapter storage rounds every update back into E4M3: small updates can vanish.
    assert all(changed) if policy.lora_storage == "fp32_master" else any(changed)
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)

    kinds = {(r["layer"], r["kind"]) for r in stats.rows}
    # layers.1: the input of layers.0 needs no gradient (frozen embeddings), so it has no dgrad
    q_proj = next(n for n in handle.converted if n.endswith("layers.1.self_attn.q_proj"))
    assert {(q_proj, k) for k in ("activation", "weight", "dgrad")} <= kinds
    for kind in ("activation", "weight", "dgrad"):
        assert f"telemetry/{kind}/underflow_pct" in stats.metrics
    plan = {(r["module"], r["tensor"]): r for r in handle.plan}
    assert plan[(q_proj, "activation")]["format"].startswith("e4m3/")
    assert "emulate=True" in plan[(q_proj, "activation")]["note"]
    # fp8_naive v2 *is* torchao's stock tensorwise recipe: nothing to deviate from.
    assert any(r["tensor"] == "deviation" for r in handle.plan) == (name != "fp8_naive")
    assert (handle.deviations == ()) == (name == "fp8_naive")


def test_bf16_on_torchao_converts_nothing():
    model = tiny_lora_model()
    handle = apply_backend(model, "bf16", None, TORCHAO_CPU)
    assert handle.recipe is None and handle.converted == [] and handle.deviations == ()
    float8_linear = torchao_float8.float8_linear.Float8Linear
    assert not any(isinstance(m, float8_linear) for m in model.modules())


def test_dims_not_multiple_of_16_stay_bf16():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=120, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
    )  # fmt: skip
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, target_modules="all-linear"))
    handle = apply_backend(model, "fp8_protected", None, TORCHAO_CPU)
    assert sorted(n.rsplit(".", 1)[-1] for n in handle.skipped) == ["down_proj", "gate_proj", "up_proj"]  # noqa: E501
    assert len(handle.converted) == 4
    assert any("multiples of 16" in r["note"] for r in handle.plan)


def test_plain_casts_match_the_emulated_backend_telemetry():
    """Plain casts are the same numbers on both backends: the first layer's input
    is identical, so its activation underflow% must be too (same telemetry definitions)."""
    rows = {}
    for choice in (TORCHAO_CPU, BackendChoice("emulated", True, "test")):
        model = tiny_lora_model()
        tel = Fp8Telemetry()
        apply_backend(model, UNSCALED, tel, choice)
        tel.begin_step(0, record=True)
        with torch.no_grad():
            model(input_ids=ids(0))
        out = tel.end_step()
        rows[choice.name] = {
            r["kind"]: r for r in out.rows if r["layer"].endswith("layers.0.self_attn.q_proj")
        }
    a, e = rows["torchao"]["activation"], rows["emulated"]["activation"]
    assert a["underflow_pct"] == e["underflow_pct"] > 0
    assert a["amax"] == e["amax"] and a["numel"] == e["numel"]
    assert rows["torchao"]["weight"]["underflow_pct"] == pytest.approx(
        rows["emulated"]["weight"]["underflow_pct"], abs=1.0
    )


# -- the frozen-base module vs torchao's own Float8Linear ------------------------------------
def _linear(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(128, 64, bias=False).to(torch.bfloat16)
    lin.weight.requires_grad_(False)
    return lin


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_frozen_module_matches_torchao_float8linear_bitwise(recipe):
    """Same casts and GEMMs as torchao's Float8Linear: identical output and input gradient;
    only the (discarded) weight-gradient GEMM is gone."""
    config = tb.map_policy("fp8_protected", recipe=recipe).float8_config(emulate=True)
    lin = _linear()
    stock = torchao_float8.convert_to_float8_training(copy.deepcopy(lin), config=config)
    ours = tb.frozen_base_float8_linear_cls().from_float8_linear(
        torchao_float8.convert_to_float8_training(copy.deepcopy(lin), config=config),
        name="lin", plain=frozenset(), telemetry=None,
    )  # fmt: skip
    x = torch.randn(3, 5, 128, dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = stock(xa), ours(xb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)


@pytest.mark.parametrize(
    ("policy", "low", "high"),
    [("fp8_protected", 25.0, 35.0), ("fp8_protected-block_scales", 25.0, 35.0)],
)
def test_sqnr_of_emulated_base_gemm_vs_fp32(policy, low, high):
    """E4M3 keeps 3 mantissa bits: one scaled cast is ~31 dB, a GEMM of two casts ~28 dB."""
    mapping = tb.map_policy(policy)
    lin = _linear()
    mod = tb.frozen_base_float8_linear_cls().from_float8_linear(
        torchao_float8.convert_to_float8_training(
            copy.deepcopy(lin), config=mapping.float8_config(emulate=True)
        ),
        name="lin", plain=mapping.plain, telemetry=None,
    )  # fmt: skip
    x = torch.randn(4, 32, 128, generator=torch.Generator().manual_seed(1))
    ref = x @ lin.weight.float().t()
    y = mod(x.to(torch.bfloat16).requires_grad_())
    assert low < tb.sqnr(ref, y) < high
    # Plain casts of small activations lose far more (the unscaled-cast failure mode).
    naive = tb.map_policy(UNSCALED)
    plain_mod = tb.frozen_base_float8_linear_cls().from_float8_linear(
        torchao_float8.convert_to_float8_training(
            copy.deepcopy(lin), config=naive.float8_config(emulate=True)
        ),
        name="lin", plain=naive.plain, telemetry=None,
    )  # fmt: skip
    small = x * 1e-3  # mostly below E4M3's smallest subnormal (2**-9): flushed to zero
    assert tb.sqnr(small @ lin.weight.float().t(), plain_mod(small.to(torch.bfloat16))) < 10


def test_real_scaled_mm_path_equals_emulation_on_cpu():
    """emulate=False goes through torch._scaled_mm (slow on CPU, tiny here): same numbers."""
    mapping = tb.map_policy(UNSCALED)
    outs = []
    for emulate in (True, False):
        mod = tb.frozen_base_float8_linear_cls().from_float8_linear(
            torchao_float8.convert_to_float8_training(
                _linear(), config=mapping.float8_config(emulate=emulate)
            ),
            name="lin", plain=mapping.plain, telemetry=None,
        )  # fmt: skip
        x = torch.randn(16, 128, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2))
        x.requires_grad_()
        y = mod(x)
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), x.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_auto_falls_back_when_the_backend_cannot_run_the_policy():
    model = tiny_lora_model()
    choice = BackendChoice("transformer_engine", False, "auto: test", requested="auto")
    # TE cannot run plain casts -> torchao (no TE import needed for that decision).
    handle = apply_backend(model, UNSCALED, None, choice)
    assert handle.backend == "torchao" and handle.emulated is False  # as the choice said
