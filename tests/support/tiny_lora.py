"""The tiny LoRA Llama and the few-step training loop that the real-kernel tests compare backends
and GEMM modes on (same seed, same batches, so differences are the numerics')."""

from __future__ import annotations

from typing import Any

import torch


def tiny_lora_model(seed: int = 0, vocab_size: int = 128) -> torch.nn.Module:
    """2 layers, hidden 64, rank-4 LoRA on every linear; every dim a multiple of 16 at the default
    vocabulary (the precision unit tests use 100)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=64)  # fmt: skip
    return get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))


def train_steps(model: torch.nn.Module, handle: Any, tel: Any, steps: int = 3) -> tuple[list[float], list[dict]]:
    """Losses of ``steps`` AdamW steps on fixed batches, and the telemetry rows of step 1 (the
    one recorded step)."""
    losses, reports = train_recorded(model, handle, tel, steps)
    return losses, [row for report in reports for row in report.rows]


def train_recorded(model: torch.nn.Module, handle: Any, tel: Any, steps: int = 3,
                   batch_shape: tuple[int, int] = (2, 16)) -> tuple[list[float], list[Any]]:
    """Losses of ``steps`` AdamW steps on fixed batches of ``batch_shape`` token ids, and the
    telemetry reports (rows and aggregates) of the recorded step, step 1."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses, reports = [], []
    for step in range(steps):
        tel.begin_step(step, record=step == 1)
        batch = torch.randint(0, 128, batch_shape, generator=torch.Generator().manual_seed(step))
        loss = model(input_ids=batch, labels=batch).loss
        handle.scale_loss(loss).backward()
        if handle.prepare_step(opt):
            opt.step()
            handle.after_step()
        opt.zero_grad(set_to_none=True)
        recorded = tel.end_step({"train/loss": loss.detach()})
        reports += [recorded] if recorded is not None else []
        losses.append(float(loss.detach()))
    return losses, reports
