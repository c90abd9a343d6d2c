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

from tests.support.tiny_lora import tiny_lora_model, train_steps
from workloads.precision.apply import apply_policy
from workloads.precision.telemetry import Fp8Telemetry

pytest.importorskip("torchao.float8")
from workloads.precision.backends import torchao_backend as tb  # noqa: E402

STEPS = 3


def _train(policy: str, backend: str) -> tuple[list[float], object, list[dict]]:
    """Losses under ``backend`` ('emulated' | 'torchao' real), the handle, the recorded rows."""
    model, tel = tiny_lora_model(), Fp8Telemetry()
    if backend == "emulated":
        handle = apply_policy(model, policy, tel)
    else:
        handle = tb.apply_torchao(model, policy, tel, emulate=False)
    losses, rows = train_steps(model, handle, tel, STEPS)
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


# Power-of-two scales (fp8_naive-exact_scales, the rung of the old fp8_naive v2): bit-identical to
# torchao's real path, pinned at 1e-5. Exact scales (fp8_naive v3, torchao tensorwise's own default):
# measured 5.6e-4 relative over 3 steps, pinned at 1e-3; the cause is the emulator's rounding of each
# scaled operand before its matmul, where _scaled_mm scales the FP32 accumulator (docs/real_gemms.md).
@pytest.mark.parametrize(("policy", "rel_tol"),
                         [("fp8_naive-exact_scales", 1e-5), ("fp8_naive", 1e-3), ("fp8_protected", 1e-3)])
def test_torchao_real_fp8_trains_on_cpu_like_the_emulated_backend(policy, rel_tol, scaled_mm_calls):
    emulated, _, _ = _train(policy, "emulated")
    assert not scaled_mm_calls  # the emulated backend never calls it (precision.gemm=emulated)
    real, handle, rows = _train(policy, "torchao")
    assert (handle.backend, handle.emulated) == ("torchao", False)
    assert handle.recipe == ("tensorwise" if policy.startswith("fp8_naive") else "rowwise")
    frozen = [m for m in handle.model.modules() if isinstance(m, tb.frozen_base_float8_linear_cls())]
    assert len(frozen) == len(handle.converted) >= 14 and not any(m.config.emulate for m in frozen)
    # forward + dgrad of every converted linear, every step (layer 0's q/k/v need no dgrad)
    assert len(scaled_mm_calls) >= STEPS * len(frozen)
    assert torch.float8_e4m3fn in scaled_mm_calls
    assert all(abs(a - b) <= rel_tol * abs(a) for a, b in zip(emulated, real)), (emulated, real)
    # every deviation the backend reports is still shown: in the handle and as plan rows
    shown = {r["note"] for r in handle.plan if r["tensor"] == "deviation"}
    assert set(handle.deviations) <= shown
    assert bool(handle.deviations) is not policy.startswith("fp8_naive")  # the stock recipe and its power-of-two rung map exactly
    if policy == "fp8_protected":
        assert any("torchao has no delayed scaling" in d for d in handle.deviations)
    # telemetry still comes from the very casts the real GEMMs use
    q_proj = [r["kind"] for r in rows if r["layer"].endswith("layers.1.self_attn.q_proj")]
    assert {"activation", "dgrad", "weight"} <= set(q_proj)
