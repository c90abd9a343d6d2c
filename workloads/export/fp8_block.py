"""Block-scaled FP8 checkpoints ("fp8-block128"), the layout inference servers load.

Every ``nn.Linear`` of the model except the output head (and linears whose dims are not multiples
of 128, see ``quantizable_linears``) is stored as

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
plain tensor arithmetic, so a test of the file does not trust the writer.
"""
from __future__ import annotations

import copy
import json
import math
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


def quantizable_linears(model: nn.Module) -> tuple[list[str], list[str]]:
    """(names of the linears to store in FP8, names kept in BF16).

    Kept: the output head, and any linear whose dims are not multiples of 128. The file format
    allows a ragged last block, but transformers' dequantizer infers the block size from the scale
    grid and vLLM refuses ragged blocks in fused (qkv, gate_up) layers, so such a layer would load
    wrong or not at all; in BF16 it loads everywhere."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    convert, keep = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            ragged = any(dim % BLOCK for dim in module.weight.shape)
            (keep if module is head or ragged else convert).append(name)
    return convert, keep


@dataclass(frozen=True)
class Fp8Checkpoint:
    """What `write_fp8_checkpoint` wrote."""

    out_dir: Path
    quantized: list[str]
    kept: list[str]


def write_fp8_checkpoint(model: nn.Module, tokenizer: Any, out_dir: Path) -> Fp8Checkpoint:
    """Write `model` (merged, any float dtype) as an fp8-block128 folder into `out_dir`."""
    from huggingface_hub import save_torch_state_dict

    convert, keep = quantizable_linears(model)
    if not convert:
        raise NothingToQuantize(f"{type(model).__name__} has no linear layers to quantize (besides its output head, "
                                f"none has both dims a multiple of {BLOCK})")
    state = {k: v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()
             for k, v in model.state_dict().items()}
    for name in convert:
        codes, scale_inv = quantize_weight(model.get_submodule(name).weight)
        state[f"{name}.weight"] = codes
        state[f"{name}.weight{SCALE_SUFFIX}"] = scale_inv
    out_dir.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(state, out_dir)  # shards (with an index) and de-duplicates tied tensors
    config = copy.deepcopy(model.config)  # the in-memory model itself is not quantized
    config.quantization_config = quant_config(keep)
    config.dtype = torch.bfloat16
    config.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Fp8Checkpoint(out_dir, convert, keep)


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
