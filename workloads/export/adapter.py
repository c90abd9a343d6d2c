"""LoRA adapters in PEFT's own `save_pretrained` layout, and the merged model built from one.

A trial's model has been rewritten by its precision backend (FP8 base linears, FP32-master LoRA
modules), but the LoRA tensors keep PEFT's names (`...lora_A.default.weight`), so PEFT's own
`save_pretrained` writes an adapter any PEFT user (and lm-eval's `peft=`) loads onto the plain
base model. The tensors are saved in FP32, whatever the policy stored them in during training.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ADAPTER_ARTIFACT = "adapter"


def save_adapter(model: Any, out_dir: Path) -> Path:
    """Write the PEFT adapter of `model` (a PeftModel) into `out_dir` (safetensors + adapter_config.json)."""
    from peft import get_peft_model_state_dict

    state = {k: v.detach().to(torch.float32) for k, v in get_peft_model_state_dict(model).items()}
    model.save_pretrained(str(out_dir), state_dict=state)
    return out_dir


def load_with_adapter(base_path: str, adapter_dir: Path, dtype: torch.dtype = torch.float32,
                      trust_remote_code: bool = False) -> tuple[Any, Any]:
    """(PeftModel on the base model in `dtype`, tokenizer): the adapter as a PEFT user loads it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype, trust_remote_code=trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(base_path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return PeftModel.from_pretrained(base, str(adapter_dir)), tokenizer


def merged_model(base_path: str, adapter_dir: Path, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """(base + adapter merged into plain weights, BF16; tokenizer). The merge runs in FP32 so the
    BF16 result is rounded once."""
    model, tokenizer = load_with_adapter(base_path, adapter_dir, torch.float32, trust_remote_code)
    merged = model.merge_and_unload()
    return merged.to(torch.bfloat16), tokenizer
