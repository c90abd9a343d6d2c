"""`train.grad_accum`: k micro-batches per optimizer step give the gradient of one batch k times
larger (same rows, same order), and train to the same losses.

The rows have different trained-token counts, so the naive accumulation (the mean of the
micro-batch means) gives another gradient: the first test tells the token weighting
(`num_items_in_batch`) from it. Whole runs are compared on the loss only: AdamW turns the last-bit
differences of near-zero gradients (bf16 GEMMs of another shape) into full-size updates of single
LoRA weights, so their weights differ more than their losses do.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig

from tests.unit.workloads.train.test_train_loop import BATCH, SETTINGS, V, Logger, counting_data, tiny_model
from workloads.data.load import batches
from workloads.train.loop import accumulate, run_training

GRAD_RTOL = 1e-5  # fp32: two summation orders of the same gradient
LOSS_ATOL = 1e-3  # bf16 GEMMs over 4 vs 8 rows, 12 AdamW steps; a step per micro-batch moves it ~0.1


class _Unscaled:
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss


def _fp32_model() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, pad_token_id=0)
    model = get_peft_model(AutoModelForCausalLM.from_config(config), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                                                target_modules="all-linear"))
    return model.train()


def _grads(model: Any) -> torch.Tensor:
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
    model.zero_grad(set_to_none=True)
    return grads


def test_accumulated_gradient_equals_the_whole_batch() -> None:
    data, rows = counting_data(), torch.tensor([0, 5, 10, 15, 1, 2, 3, 4])  # the short rows in the first half
    model, batch = _fp32_model(), {k: getattr(data, k)[rows] for k in ("input_ids", "attention_mask", "labels")}
    counts = (batch["labels"][:, 1:] != -100).sum(1).chunk(2)
    assert int(counts[0].sum()) != int(counts[1].sum())
    whole_loss = model(**batch).loss
    whole_loss.backward()
    whole = _grads(model)
    split_loss = accumulate(model, batch, _Unscaled(), 2)
    split = _grads(model)
    assert float(split_loss) == pytest.approx(float(whole_loss), rel=GRAD_RTOL)
    assert float((split - whole).norm() / whole.norm()) < GRAD_RTOL
    for part in torch.arange(2 * BATCH).chunk(2):  # naive: each half's mean loss, halved
        (model(**{k: v[part] for k, v in batch.items()}).loss / 2).backward()
    assert float((_grads(model) - whole).norm() / whole.norm()) > 100 * GRAD_RTOL


def _train(grad_accum: int, policy: str) -> tuple[Any, Logger]:
    model, handle, telemetry = tiny_model(policy)
    settings = dataclasses.replace(SETTINGS, grad_accum=grad_accum)
    data, logger = counting_data(), Logger()
    # the loop's batch is the effective batch (Trial.batches: train.batch_size x grad_accum rows)
    result = run_training(model, handle, telemetry, lambda s: batches(data, 2 * BATCH, settings.steps, 0, s),
                          settings, logger)
    return result, logger


def test_grad_accum_trains_like_the_larger_batch() -> None:
    """bf16 only: an FP8 policy scales each micro-batch by its own amax (as Transformer Engine
    does under accumulation), a real numerical difference, not a tolerance to widen."""
    (whole, whole_log), (split, split_log) = _train(1, "bf16"), _train(2, "bf16")
    assert (split.steps_done, split.tokens) == (whole.steps_done, whole.tokens)
    assert sorted(split_log.steps) == sorted(whole_log.steps)
    for step in whole_log.steps:
        assert split_log.steps[step]["train/loss"] == pytest.approx(whole_log.steps[step]["train/loss"], abs=LOSS_ATOL)
