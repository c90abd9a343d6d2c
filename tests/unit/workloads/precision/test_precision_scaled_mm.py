"""fp8lab's emulated GEMM against ``torch._scaled_mm`` on CPU, per scaling kind, on the very same
FP8 operands (codes and scales from fp8lab's codec).

Tolerance, and why: both GEMMs multiply the same FP8 values exactly (decoding a code times a
power-of-two scale into BF16 is exact, and every product of two FP8 values is exact in FP32),
both accumulate in FP32 -- oneDNN's BF16 GEMM and ``_scaled_mm``'s CPU kernel, which decodes to
FP32 -- and both round the sum once to BF16. So each lies within half a BF16 ulp of the exact
(FP64) product plus the FP32 accumulation error, bounded by ``K * 2**-24 * sum|a_i * b_i|``;
they differ from each other only by accumulation order, i.e. by at most one BF16 ulp where the
two FP32 sums straddle a rounding boundary. The tests pin both bounds.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from tests.support.tiny_lora import tiny_lora_model, train_steps
from workloads.precision.formats import E4M3, E5M2
from workloads.precision.scaled_mm import (
    ScaledMmGemm,
    enable_scaled_mm,
    gemm_problems,
    scaled_matmul,
    transpose,
    unsupported,
)
from workloads.precision.scaling import Fp8Tensor, ScalingRecipe, TensorScaler

M, N = 48, 64


def _operands(kind: str, k: int, seed: int = 0) -> tuple[Fp8Tensor, Fp8Tensor]:
    """An activation ``[M, K]`` and a weight ``[N, K]`` quantized by fp8lab's codec.

    ``rowwise`` is the codec's 1 x K tiles (one scale per row, for both operands); ``block`` is
    1x128 activation tiles and 128x128 weight blocks, the DeepSeek-V3 / TE layout."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, k, generator=g) * torch.rand(M, 1, generator=g) * 8).to(torch.bfloat16)
    w = (torch.randn(N, k, generator=g) * 0.05).to(torch.bfloat16)
    if kind == "rowwise":
        recipe, w_role = ScalingRecipe("block", block_size=k), "activation"  # 1 x K tiles
    else:
        recipe, w_role = ScalingRecipe(kind), "weight"
    a, _ = TensorScaler(recipe, E4M3, "activation").quantize(x)
    b, _ = TensorScaler(recipe, E4M3, w_role).quantize(w)
    return a, b


def _emulated(a: Fp8Tensor, b: Fp8Tensor) -> torch.Tensor:
    """What fp8lab's emulated linears compute: decode both operands, one BF16 GEMM."""
    return F.linear(a.dequantize(torch.bfloat16), b.dequantize(torch.bfloat16))


def _bound(a: Fp8Tensor, b: Fp8Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact FP64 product, allowed |error| per element: half a BF16 ulp + FP32 accumulation)."""
    da, db = a.dequantize(torch.float64), b.dequantize(torch.float64)
    ref = da @ db.t()
    k = da.shape[1]
    return ref, 2.0**-8 * ref.abs() + k * 2.0**-24 * (da.abs() @ db.abs().t()) + 1e-30


@pytest.mark.parametrize(
    ("kind", "k"),
    [("none", 128), ("current", 128), ("delayed", 128), ("rowwise", 96), ("block", 384),
     ("block", 320)],  # fmt: skip
)
def test_emulated_gemm_agrees_with_scaled_mm(kind, k):
    a, b = _operands(kind, k)
    assert unsupported(a, b) is None
    emu, real = _emulated(a, b), scaled_matmul(a, b, torch.bfloat16)
    ref, tol = _bound(a, b)
    assert ((emu.double() - ref).abs() <= tol).all()
    assert ((real.double() - ref).abs() <= tol).all()
    # Between the two: accumulation order only, one BF16 ulp (2**-7 relative) at most.
    ulp = 2.0**-7 * torch.maximum(emu.double().abs(), real.double().abs()) + 1e-30
    assert ((emu.double() - real.double()).abs() <= ulp).all()
    assert (emu == real).float().mean() > 0.9  # mostly bit-identical, not just close
    if kind in ("none", "current", "delayed"):  # per-tensor: _scaled_mm's own tensorwise layout too
        one = torch.ones((), dtype=torch.float32)
        sa, sb = (one if q.scale_inv is None else q.scale_inv for q in (a, b))
        tensorwise = torch._scaled_mm(a.data, b.data.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        assert torch.equal(tensorwise, real)  # the rowwise call scaled_matmul makes: same numbers


def test_block_scales_really_vary_per_block():
    """The composed block GEMM must use each K block's own scales: swapping two blocks' scales of
    the weight (a bug it would have) moves the result far outside the tolerance."""
    a, b = _operands("block", 384)
    assert b.scale_inv.shape == (1, 3) and a.scale_inv.shape == (M, 3)
    broken = Fp8Tensor(b.data, b.scale_inv.flip(1).contiguous(), b.tile)
    ref, tol = _bound(a, b)
    if torch.equal(broken.scale_inv, b.scale_inv):
        pytest.skip("all blocks got the same scale")
    assert not ((scaled_matmul(a, broken, torch.float32).double() - ref).abs() <= tol).all()


def test_e5m2_gradient_times_e4m3_weight_dgrad():
    """The dgrad GEMM: an E5M2 gradient [M, N] times the E4M3 weight [N, K] (weight transposed,
    its 128x128 block scales with it)."""
    g = torch.Generator().manual_seed(3)
    grad = (torch.randn(M, 256, generator=g) * 1e-3).to(torch.bfloat16)
    w = (torch.randn(256, 128, generator=g) * 0.05).to(torch.bfloat16)
    gq, _ = TensorScaler(ScalingRecipe("current"), E5M2, "grad").quantize(grad)
    wq, _ = TensorScaler(ScalingRecipe("block"), E4M3, "weight").quantize(w)
    wt = transpose(wq)  # [K=128, N=256] with tile (128, 128) over that layout
    assert unsupported(gq, wt) is None
    ref, tol = _bound(gq, wt)
    assert ((scaled_matmul(gq, wt, torch.bfloat16).double() - ref).abs() <= tol).all()
    emu = gq.dequantize(torch.bfloat16) @ wq.dequantize(torch.bfloat16)
    assert ((emu.double() - ref).abs() <= tol).all()


def test_shapes_fp8_hardware_cannot_take_fall_back_logged(caplog):
    a, b = _operands("current", 128)
    rank8 = Fp8Tensor(b.data[:8], b.scale_inv, b.tile)  # a rank-8 LoRA A: N = 8
    assert "N=8" in unsupported(a, rank8)
    tiny_k = Fp8Tensor(a.data[:, :8], a.scale_inv), Fp8Tensor(b.data[:, :8], b.scale_inv)
    assert "K=8" in unsupported(*tiny_k)
    gemm = ScaledMmGemm("layers.0.q_proj.lora_A")
    with caplog.at_level(logging.WARNING, logger="workloads.precision.scaled_mm"):
        assert gemm.mm(a, rank8, torch.bfloat16, "forward") is None
        assert gemm.mm(a, rank8, torch.bfloat16, "forward") is None  # logged once only
        assert gemm.mm(a, None, torch.bfloat16, "dgrad") is None
        assert gemm.mm(a, b, torch.bfloat16, "forward").shape == (M, N)
    assert gemm.counts == {"fallback": 3, "scaled_mm": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "forward GEMM runs emulated (K=128, N=8" in lines[0]
    assert "first at layers.0.q_proj.lora_A" in lines[0]


# -- precision.gemm=scaled_mm on a tiny LoRA model ---------------------------------------------
def _train(policy: str, real: bool) -> tuple[list[float], dict[str, Counter], list[dict]]:
    """Losses of a few steps, the GEMM counts of base and LoRA modules, and the extra plan rows."""
    from workloads.precision.apply import apply_policy
    from workloads.precision.telemetry import Fp8Telemetry

    model, tel = tiny_lora_model(), Fp8Telemetry()
    handle = apply_policy(model, policy, tel)
    rows = enable_scaled_mm(model) if real else []
    losses, _ = train_steps(model, handle, tel)  # one recorded step: telemetry on the real path too
    counts: dict[str, Counter] = {"base": Counter(), "lora": Counter()}
    for name, mod in model.named_modules():
        if getattr(mod, "real_gemm", None) is not None:
            counts["lora" if ".lora_" in name else "base"].update(mod.real_gemm.counts)
    return losses, counts, rows


# Power-of-two scales (fp8_naive-exact_scales): the losses agree to 1e-4 relative (the GEMMs differ
# by accumulation order at most; on this tiny model every FP32 sum of FP8 products is exact and the
# losses come out bit-identical). Exact (non-power-of-two) scales, fp8_naive v3 and fp8_protected
# v2: measured 5.6e-4 relative over 3 steps, pinned at 1e-3. The emulator multiplies each decoded
# operand by its scale and rounds it before the matmul; a real FP8 GEMM applies both scales once to
# the FP32 accumulator. With power-of-two scales both are exact; with exact scales the emulator's
# operand rounding is the deviation (docs/real_gemms.md).
@pytest.mark.parametrize(
    ("policy", "lora_fp8", "rel_tol"),
    [("fp8_naive-exact_scales", True, 1e-4), ("fp8_naive", True, 1e-3), ("fp8_protected-block_scales", False, 1e-3)],
)
def test_policy_trains_the_same_through_scaled_mm(policy, lora_fp8, rel_tol, caplog):
    """Same seed, same batches: the losses agree within ``rel_tol`` (see above). Base GEMMs (dims
    multiples of 16) run for real; rank-4 LoRA GEMMs fall back, logged."""
    emulated, none, _ = _train(policy, real=False)
    assert none == {"base": Counter(), "lora": Counter()}
    with caplog.at_level(logging.WARNING, logger="workloads.precision.scaled_mm"):
        real, counts, rows = _train(policy, real=True)
    assert all(abs(a - b) <= rel_tol * abs(a) for a, b in zip(emulated, real)), (emulated, real)
    # Every base GEMM runs for real: forward, and dgrad except where no input needs a gradient
    # (layer 0's q/k/v see the frozen embedding): per step 14 + 11, plus fp8_naive's lm_head.
    lm_head = 2 if lora_fp8 else 0
    assert counts["base"] == Counter(scaled_mm=3 * (25 + lm_head))
    assert {r["format"] for r in rows} == {"scaled_mm"}
    assert len(rows) == 14 + lm_head // 2 + 14 * 2 * lora_fp8
    # this module's own warnings only: a kernel compiled during the run may log torch's trace records too
    fallbacks = [r.getMessage() for r in caplog.records if r.name == "workloads.precision.scaled_mm"]
    assert bool(fallbacks) is lora_fp8
    if lora_fp8:  # rank 4: only lora_A's wgrad (K = 32 tokens, N = in) fits; logged once per shape
        assert counts["lora"] == Counter(scaled_mm=3 * 14, fallback=3 * (14 * 3 + 14 + 11))  # B: all 3; A: fwd, dgrad
        assert len(fallbacks) == len(set(fallbacks)) < 20
        assert any("N=4: both must be multiples of 16" in line for line in fallbacks)


def test_scaled_mm_refused_where_fp8lab_runs_no_fp8_gemm():
    from workloads.precision.policy import get_policy

    assert gemm_problems("scaled_mm", get_policy("fp8_protected"), "emulated") == []
    assert gemm_problems("emulated", get_policy("bf16"), "emulated") == []
    (bf16,) = gemm_problems("scaled_mm", get_policy("bf16"), "emulated")
    assert "has no FP8 GEMM" in bf16 and "fix: precision.gemm=emulated" in bf16
    (torchao,) = gemm_problems("scaled_mm", get_policy("fp8_protected"), "torchao")
    assert "run by backend torchao" in torchao and "precision.backend=emulated" in torchao
    assert "precision.backend" not in bf16
    assert gemm_problems("scaled_mm", get_policy("fp8_naive"), "torchao") == []  # its LoRA FP8 GEMMs
    assert "not one of" in gemm_problems("cublas", get_policy("bf16"), "emulated")[0]
    with pytest.raises(ValueError, match="no FP8 GEMM of fp8lab's own"):
        enable_scaled_mm(tiny_lora_model())
