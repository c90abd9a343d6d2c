"""Exports on the embedded model, in-process: a trained adapter round-trips through PEFT's own
loader, and the fp8-block128 folder has the documented layout, decodes to the merged BF16 weights
within FP8 rounding, and loads in transformers."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from torch import nn

from workloads.embedded.paths import embedded_paths
from workloads.export.adapter import load_with_adapter, merged_model, save_adapter
from workloads.export.fp8_block import (BLOCK, NothingToQuantize, dequantize_checkpoint, expected_scale_shape,
                                        has_partial_blocks, load_fp8_checkpoint, plan_linears,
                                        write_fp8_checkpoint)
from workloads.export.run import ExportError, check_exportable
from workloads.model.loading import attach_lora, load_base_model
from workloads.precision.backends import apply_backend, select_backend
from workloads.precision.policy import get_policy
from workloads.precision.telemetry import Fp8Telemetry

E4M3_HALF_ULP = 2.0**-4  # relative rounding error of E4M3 (3 mantissa bits), normal range
E4M3_MIN_SUBNORMAL = 2.0**-9


def _trained_like(policy: str) -> tuple[nn.Module, object]:
    """The embedded model with non-zero LoRA weights under `policy`, as a trial holds it after training."""
    cpu = torch.device("cpu")
    model, tokenizer = load_base_model({"name_or_path": "embedded", "dtype": "bfloat16"}, embedded_paths().model_dir, cpu)
    model = attach_lora(model, {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    apply_backend(model, get_policy(policy), Fp8Telemetry(underflow_threshold_pct=10.0), select_backend("emulated", cpu))
    return model.eval(), tokenizer


def _logits(model: nn.Module, tokenizer: object) -> torch.Tensor:
    batch = tokenizer(["Question: which is larger, 3 or 7? Answer:", "The quick brown fox"], return_tensors="pt",
                      padding=True)
    with torch.no_grad():
        return model(**batch).logits.float()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("export")
    model, tokenizer = _trained_like("bf16")
    adapter = save_adapter(model, root / "adapter")
    merged, tok = merged_model(str(embedded_paths().model_dir), adapter)
    fp8 = write_fp8_checkpoint(merged, tok, root / "fp8")
    return SimpleNamespace(model=model, tokenizer=tokenizer, adapter=adapter, merged=merged, fp8=fp8)


def test_adapter_reloads_with_peft_and_reproduces_the_logits(exported: SimpleNamespace) -> None:
    assert {p.name for p in exported.adapter.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    reloaded, _ = load_with_adapter(str(embedded_paths().model_dir), exported.adapter, torch.bfloat16)
    ref, got = _logits(exported.model, exported.tokenizer), _logits(reloaded, exported.tokenizer)
    base, _ = load_base_model({"name_or_path": "embedded", "dtype": "bfloat16"}, embedded_paths().model_dir, torch.device("cpu"))
    untrained = _logits(base, exported.tokenizer)
    # BF16 noise only (the trial runs its LoRA GEMMs in BF16, PEFT in FP32): ~4% of the largest logit
    # here, against a change of more than half of it that the adapter makes
    assert (got - ref).abs().max() < 0.06 * ref.abs().max()
    assert (untrained - ref).abs().max() > 10 * (got - ref).abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    saved = dict(reloaded.named_parameters())
    for name, param in exported.model.named_parameters():
        if "lora_" in name:  # the file holds the trial's LoRA weights bit for bit
            assert torch.equal(saved[name].float(), param.detach().float()), name


def test_adapter_of_an_fp8_policy_saves_fp32_lora_weights(tmp_path: Path) -> None:
    model, _ = _trained_like("fp8_protected")
    adapter = save_adapter(model, tmp_path / "adapter")
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as handle:
        keys = list(handle.keys())
        assert keys and all("lora_" in k for k in keys)
        assert {handle.get_tensor(k).dtype for k in keys} == {torch.float32}


def test_fp8_checkpoint_layout(exported: SimpleNamespace) -> None:
    folder = exported.fp8.out_dir
    assert not has_partial_blocks(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "fp8", "activation_scheme": "dynamic",
                                             "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}
    plan = plan_linears(exported.merged)
    convert = plan.convert
    assert plan.kept == {"lm_head": "output head"} and len(convert) == 4 * 7  # q k v o gate up down per layer
    assert plan.ragged == [] and exported.fp8.plan == plan
    tensors = {}
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            tensors.update({k: handle.get_tensor(k) for k in handle.keys()})
    for name in convert:
        weight, scale = tensors[f"{name}.weight"], tensors[f"{name}.weight_scale_inv"]
        assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert tuple(scale.shape) == expected_scale_shape(weight.shape)
    fp8_keys = {k for k, v in tensors.items() if v.dtype == torch.float8_e4m3fn}
    assert fp8_keys == {f"{n}.weight" for n in convert}
    others = {k: v for k, v in tensors.items() if k not in fp8_keys and not k.endswith("_scale_inv")}
    assert "lm_head.weight" in others and "model.embed_tokens.weight" in others
    assert {v.dtype for v in others.values()} == {torch.bfloat16}


def test_fp8_weights_decode_to_the_merged_weights_within_fp8_rounding(exported: SimpleNamespace) -> None:
    decoded = dequantize_checkpoint(exported.fp8.out_dir)
    merged = {k: v.float() for k, v in exported.merged.state_dict().items()}
    assert set(decoded) == set(merged)
    for name in exported.fp8.plan.convert:
        w, d = merged[f"{name}.weight"], decoded[f"{name}.weight"]
        amax = w.abs().amax()
        # per element: half an E4M3 ulp of |w|, or the smallest subnormal step of its block's scale
        scale_bound = amax / 448.0 * 2 * E4M3_MIN_SUBNORMAL  # power-of-2 scales lose at most one binade
        err = (d - w).abs()
        assert torch.all(err <= w.abs() * E4M3_HALF_ULP + scale_bound), name
        assert err.max() > 0  # really quantized
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert torch.equal(decoded[name], merged[name])


def test_transformers_loads_the_fp8_checkpoint(exported: SimpleNamespace) -> None:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(exported.fp8.out_dir))  # on CPU: dequantized to BF16
    ref, got = _logits(exported.merged, exported.tokenizer), _logits(loaded, exported.tokenizer)
    assert (got - ref).abs().max() < 0.2 * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8


def test_a_model_without_linears_to_quantize_is_refused(tmp_path: Path) -> None:
    class HeadOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(8, 4)
            self.lm_head = nn.Linear(4, 8)

        def get_output_embeddings(self) -> nn.Module:
            return self.lm_head

    with pytest.raises(NothingToQuantize, match="no linear layers to quantize"):
        write_fp8_checkpoint(HeadOnly(), None, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_partial_blocks_stay_bf16_unless_asked_and_fused_groups_with_a_ragged_output_always() -> None:
    class Block(nn.Module):  # SmolLM2's shapes at a quarter of the width: q 144, k/v 48, gate/up 384
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = nn.Linear(144, 144), nn.Linear(144, 48), nn.Linear(144, 48)
            self.o_proj = nn.Linear(144, 144)
            self.gate_proj, self.up_proj, self.down_proj = nn.Linear(144, 384), nn.Linear(144, 384), nn.Linear(384, 144)

    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers, self.lm_head = nn.ModuleList([Block(), Block()]), nn.Linear(144, 8)

        def get_output_embeddings(self) -> nn.Module:
            return self.lm_head

    assert plan_linears(Small()).convert == []  # every linear has a 144 dim: no whole blocks
    assert plan_linears(Small()).kept["layers.0.down_proj"] == "[144, 384] is not whole 128-blocks (--partial-blocks converts it)"
    plan = plan_linears(Small(), partial_blocks=True)
    assert plan.convert == [f"layers.{i}.{p}" for i in (0, 1) for p in ("o_proj", "gate_proj", "up_proj", "down_proj")]
    assert plan.ragged == plan.convert  # 144 is not a multiple of 128: a partial last block, as vLLM allows
    assert plan.kept["lm_head"] == "output head"
    assert plan.kept["layers.1.k_proj"] == "vLLM fuses it into qkv_proj, and q_proj's 144 outputs are not a multiple of 128"
    assert plan.kept_lines() == ["layers.*.q_proj (x2): vLLM fuses it into qkv_proj, and q_proj's 144 outputs are "
                                 "not a multiple of 128",
                                 "layers.*.k_proj (x2): vLLM fuses it into qkv_proj, and q_proj's 144 outputs are "
                                 "not a multiple of 128",
                                 "layers.*.v_proj (x2): vLLM fuses it into qkv_proj, and q_proj's 144 outputs are "
                                 "not a multiple of 128",
                                 "lm_head: output head"]


def _partial_block_export(tmp_path: Path, hidden: int) -> tuple[nn.Module, object]:
    """A 2-layer Llama of width `hidden` (3 query / 1 KV heads, intermediate 512, tied head) whose
    128x128 blocks have different scales (each block of every weight scaled by its own power of 2,
    so a decoder with the wrong block size gets wrong weights), written as fp8-block128."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    config = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module is not model.lm_head:
                rows, cols = (torch.arange(n) // BLOCK for n in module.weight.shape)
                module.weight.mul_(2.0 ** ((rows[:, None] + 2 * cols[None, :]) % 3 - 1))
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_paths().model_dir))
    with pytest.raises(NothingToQuantize):  # without --partial-blocks: every linear has a partial block
        write_fp8_checkpoint(model, tokenizer, tmp_path / "fp8")
    return model, write_fp8_checkpoint(model, tokenizer, tmp_path / "fp8", partial_blocks=True)


def _logit_check(reference: nn.Module, loaded: nn.Module) -> None:
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, got = reference(ids).logits.float(), loaded(ids).logits.float()
    assert 0 < (got - ref).abs().max() < 0.1 * ref.abs().max()  # E4M3 rounding, nothing more


@pytest.mark.parametrize("hidden", [192, 576])
def test_partial_blocks_load_on_cpu_through_the_independent_reader(tmp_path: Path, hidden: int) -> None:
    from transformers import AutoModelForCausalLM

    model, written = _partial_block_export(tmp_path, hidden)
    assert [n.split(".")[-1] for n in written.plan.convert[:4]] == ["o_proj", "gate_proj", "up_proj", "down_proj"]
    assert len(written.plan.kept) == 2 * 3 + 1 and written.plan.ragged == written.plan.convert  # q/k/v x 2, head
    assert has_partial_blocks(tmp_path / "fp8")
    loaded = load_fp8_checkpoint(tmp_path / "fp8")
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()  # still tied
    decoded, state = dequantize_checkpoint(tmp_path / "fp8", torch.bfloat16), loaded.state_dict()
    assert all(torch.equal(state[f"{n}.weight"], decoded[f"{n}.weight"]) for n in written.plan.convert)
    _logit_check(model, loaded)
    # Why the reader exists (transformers 5.24's CPU dequantizer takes the block as dim / grid): if
    # this part fails, transformers reads partial blocks now and `load_fp8_checkpoint` can go.
    if hidden % math.ceil(hidden / BLOCK):
        with pytest.raises(RuntimeError, match="automatic conversion"):
            AutoModelForCausalLM.from_pretrained(str(tmp_path / "fp8"))
    else:
        theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "fp8")).state_dict()
        assert not all(torch.equal(theirs[f"{n}.weight"], decoded[f"{n}.weight"]) for n in written.plan.convert)


def test_scale_grid_covers_ragged_shapes() -> None:
    assert expected_scale_shape(torch.Size([200, 128])) == (2, 1)
    assert expected_scale_shape(torch.Size([BLOCK * 3, 1])) == (3, 1)
    assert math.prod(expected_scale_shape(torch.Size([1, 1]))) == 1


def _run(status: str, role: str = "trial") -> SimpleNamespace:
    return SimpleNamespace(info=SimpleNamespace(run_id="abc", status="FINISHED" if status != "FAILED" else "FAILED"),
                           data=SimpleNamespace(tags={"fp8lab.role": role, "fp8lab.status": status, "mlflow.runName": "x-s0"}))


@pytest.mark.parametrize("status", ["DIVERGED", "FAILED", "RUNNING"])
def test_only_finished_trials_are_exportable(status: str, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=f"is {status}, not FINISHED"):
        check_exportable(_run(status), "merged", tmp_path / "new")
    check_exportable(_run("FINISHED"), "merged", tmp_path / "new")


def test_export_refuses_a_sweep_run_a_bad_format_and_a_used_folder(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="not an fp8lab trial run"):
        check_exportable(_run("FINISHED", role="sweep"), "merged", tmp_path / "new")
    with pytest.raises(ExportError, match="unknown format"):
        check_exportable(_run("FINISHED"), "gguf", tmp_path / "new")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        check_exportable(_run("FINISHED"), "merged", tmp_path / "used")
