"""Load the base causal LM + tokenizer with the real HF loaders, and attach PEFT LoRA.

Works for any HF causal LM folder or hub id; "embedded" means the model shipped with fp8lab.
LoRA targets default to PEFT's "all-linear" rule, which finds the linears of any architecture
(and leaves the output head alone), so nothing here assumes Llama module names. PEFT and the model
classes are imported where they are used: importing PEFT costs ~3 s of CPU (it imports
transformers' generation and modeling code), which the preflight child, measuring the data with
the tokenizer only, would otherwise pay on every sweep.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workloads.model.pretrained import ensure_folder, is_packaged

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_model_path(name_or_path: str, embedded_model_dir: Path) -> str:
    """"embedded" -> the shipped folder; a packaged model (workloads.model.pretrained) -> its built
    folder; a local path is expanded; anything else is a hub id."""
    if name_or_path == "embedded":
        return str(embedded_model_dir)
    if is_packaged(name_or_path):
        return str(ensure_folder(name_or_path))
    local = Path(name_or_path).expanduser()
    return str(local) if local.exists() else name_or_path


def load_base_model(model_cfg: dict[str, Any], embedded_model_dir: Path, device: torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) in the configured dtype, frozen, in eval-free train mode on `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(model_cfg["name_or_path"], embedded_model_dir)
    trust = bool(model_cfg.get("trust_remote_code", False))
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[model_cfg["dtype"]], trust_remote_code=trust)
    model.config.use_cache = False
    return model.to(device), tokenizer


def attach_lora(model: Any, lora_cfg: dict[str, Any], seed: int) -> Any:
    """Wrap `model` with fresh LoRA adapters (seeded), only adapters trainable."""
    from peft import LoraConfig, get_peft_model  # here, not at import: the data checks need only resolve_model_path

    torch.manual_seed(seed)
    targets = lora_cfg["target_modules"]
    config = LoraConfig(
        r=int(lora_cfg["r"]),
        lora_alpha=float(lora_cfg["alpha"]),
        lora_dropout=float(lora_cfg["dropout"]),
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def base_weight_norms(model: Any) -> dict[str, float]:
    """||W_base||_F of every LoRA layer, by module name (the health signals' adapter movement is
    relative to it). Taken by the model stage, before the precision backend converts the base
    layers: an FP8-stored weight is no longer a plain high-precision tensor."""
    norms = {}
    for name, module in model.named_modules():
        weight = getattr(module.get_base_layer(), "weight", None) if is_lora_layer(module) else None
        if isinstance(weight, torch.Tensor):
            norms[name] = float(torch.linalg.vector_norm(weight.detach().float()))
    return norms


def is_lora_layer(module: Any) -> bool:
    """A PEFT LoRA layer: ``lora_A`` / ``lora_B`` module dicts around a base layer."""
    return (isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict)
            and isinstance(getattr(module, "lora_B", None), torch.nn.ModuleDict) and hasattr(module, "get_base_layer"))


def meta_model(model_cfg: dict[str, Any]) -> Any | None:
    """The model's module structure without its weights (meta device: no memory, no file reads
    beyond config.json), for checks before training; None for the embedded model (a Llama)."""
    if model_cfg["name_or_path"] == "embedded":
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve_model_path(model_cfg["name_or_path"], Path("."))
    trust = bool(model_cfg.get("trust_remote_code", False))
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust)
    return model.requires_grad_(False)


def lora_parameters(model: Any) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
