"""torchao for real on CPU: ``emulate=False`` (torchao's ``Float8Linear`` casts, ``torch._scaled_mm``
GEMMs) trains the tiny LoRA model, and its losses are compared with fp8lab's emulated backend on
the same seed and batches.

Tolerances, and why:
- ``fp8_naive`` maps to torchao's stock tensorwise recipe with no deviation: same casts, same
  codes, GEMMs that differ by accumulation order at most. Pinned to 1e-5 relative; on this model
  the losses are bit-identical.
- ``fp8_protected`` runs torchao's mapping, which deviates on purpose (rowwise scales instead of
  128x128 / 1x128 blocks, current instead of delayed scaling, calibration skipped; each is in
  ``handle.deviations``): different numerics, the same model. Pinned to 1e-3 relative (measured:
  4e-4), which a wrong GEMM or a lost scale would exceed by far.
"""

from __future__ import annotations

import pytest
import torch

from workloads.precision.apply import apply_policy
from workloads.precision.telemetry import Fp8Telemetry

pytest.importorskip("torchao.float8")
from workloads.precision.backends import torchao_backend as tb  # noqa: E402

STEPS = 3


def _tiny_lora_model() -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)  # fmt: skip
    return get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))


def _train(policy: str, backend: str) -> tuple[list[float], object, list[dict]]:
    """Losses of a few AdamW steps on fixed batches under ``backend`` ('emulated' | 'torchao'),
    the handle and the telemetry rows of the one recorded step."""
    model, tel = _tiny_lora_model(), Fp8Telemetry()
    if backend == "emulated":
        handle = apply_policy(model, policy, tel)
    else:
        handle = tb.apply_torchao(model, policy, tel, emulate=False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses, rows = [], []
    for step in range(STEPS):
        tel.begin_step(step, record=step == 1)
        batch = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(step))
        loss = model(input_ids=batch, labels=batch).loss
        handle.scale_loss(loss).backward()
        if handle.prepare_step(opt):
            opt.step()
            handle.after_step()
        opt.zero_grad(set_to_none=True)
        recorded = tel.end_step({"train/loss": loss.detach()})
        rows += recorded.rows if recorded is not None else []
        losses.append(float(loss.detach()))
    return losses, handle, rows


@pytest.fixture
def scaled_mm_calls(monkeypatch):
    """Counts the calls of ``torch._scaled_mm`` (proof that the real FP8 GEMM ran)."""
    calls = []
    real = torch._scaled_mm

    def counting(*args, **kwargs):
        calls.append(args[0].dtype)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", counting)
    return calls


@pytest.mark.parametrize(("policy", "rel_tol"), [("fp8_naive", 1e-5), ("fp8_protected", 1e-3)])
def test_torchao_real_fp8_trains_on_cpu_like_the_emulated_backend(policy, rel_tol, scaled_mm_calls):
    emulated, _, _ = _train(policy, "emulated")
    assert not scaled_mm_calls  # the emulated backend never calls it (precision.gemm=emulated)
    real, handle, rows = _train(policy, "torchao")
    assert (handle.backend, handle.emulated) == ("torchao", False)
    assert handle.recipe == ("tensorwise" if policy == "fp8_naive" else "rowwise")
    frozen = [m for m in handle.model.modules() if isinstance(m, tb.frozen_base_float8_linear_cls())]
    assert len(frozen) == len(handle.converted) >= 14 and not any(m.config.emulate for m in frozen)
    # forward + dgrad of every converted linear, every step (layer 0's q/k/v need no dgrad)
    assert len(scaled_mm_calls) >= STEPS * len(frozen)
    assert torch.float8_e4m3fn in scaled_mm_calls
    assert all(abs(a - b) <= rel_tol * abs(a) for a, b in zip(emulated, real)), (emulated, real)
    # every deviation the backend reports is still shown: in the handle and as plan rows
    shown = {r["note"] for r in handle.plan if r["tensor"] == "deviation"}
    assert set(handle.deviations) <= shown
    assert bool(handle.deviations) is (policy != "fp8_naive")
    if policy == "fp8_protected":
        assert any("torchao has no delayed scaling" in d for d in handle.deviations)
    # telemetry still comes from the very casts the real GEMMs use
    q_proj = [r["kind"] for r in rows if r["layer"].endswith("layers.1.self_attn.q_proj")]
    assert {"activation", "dgrad", "weight"} <= set(q_proj)
