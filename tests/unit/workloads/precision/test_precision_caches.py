"""The emulator's caches and shortcuts change no bit: trained with and without them, a tiny LoRA
model gives identical losses, LoRA weights and telemetry rows.

Under test (``workloads/precision/linear.py``, ``scaling.py``, ``telemetry.py``): the cast of a
frozen high-precision weight kept across GEMMs (``_FrozenCast``), stateless casts shared by
sites fed the same tensor (``_SharedCastCache``, stats included on recorded steps), the scaler's
amax reused by the stats, and the skipped saturation count when the peak fits.
"""

import math

import pytest
import torch

from workloads.precision import linear
from workloads.precision.apply import apply_policy
from workloads.precision.formats import E4M3, E5M2, FUSED
from workloads.precision.linear import Fp8BaseLinear, Fp8TiedLinear
from workloads.precision.scaling import CastSpec, ScalingRecipe, TensorScaler
from workloads.precision.telemetry import Fp8Telemetry, cast_stats
from tests.unit.workloads.precision.test_precision_apply import tiny_lora_model


def _uncached(monkeypatch) -> None:
    """Every cast computed afresh, stats as before the caches (no amax reuse)."""

    def cast_with_stats(site, x, dtype):
        q, saturated = site.scaler.quantize(x, count_saturated=True)
        x_dq = q.dequantize(dtype)
        return x_dq, cast_stats(x, x_dq, q.scale_inv, saturated, q.data, not q.may_have_nan)

    monkeypatch.setattr(linear.CastSite, "cast_with_stats", cast_with_stats)
    monkeypatch.setattr(linear._SharedCastCache, "get", lambda cache, x, dtype, site, rec: site.uncached(x, dtype, rec))
    monkeypatch.setattr(linear._FrozenCast, "get", lambda cache, source, dtype, compute: compute())


def _train(policy: str, steps: int = 3):
    model = tiny_lora_model(seed=1)
    tel = Fp8Telemetry()
    handle = apply_policy(model, policy, tel)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses, rows = [], []
    for step in range(steps):
        tel.begin_step(step, record=step != 1)  # recorded and unrecorded steps
        ids = torch.randint(0, 100, (8, 40), generator=torch.Generator().manual_seed(step))
        loss = model(input_ids=ids, labels=ids).loss  # 320 tokens: the CPU fast paths engage
        handle.scale_loss(loss).backward()
        if handle.prepare_step(opt):
            opt.step()
            handle.after_step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        report = tel.end_step({"loss": loss.detach()})
        rows += report.rows if report else []
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return torch.stack(losses), lora, rows


def _same_rows(a: list[dict], b: list[dict]) -> bool:
    def norm(v):
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    return [{k: norm(v) for k, v in r.items()} for r in a] == [{k: norm(v) for k, v in r.items()} for r in b]


@pytest.mark.parametrize("policy", ["fp8_naive", "fp8_protected", "fp8_unscaled_fp8_adapters"])
def test_training_is_bit_identical_without_the_caches(policy, monkeypatch):
    """Statistics on the eager path in both runs: its batched rows equal one cast at a time bit for
    bit, whatever the batches hold (the caches change how casts group into batches; the compiled
    batch kernel is compared with one cast at a time in test_precision_telemetry.py)."""
    monkeypatch.setattr(FUSED, "mode", "off")
    losses, lora, rows = _train(policy)
    linear._SHARED_CASTS.clear()
    with monkeypatch.context() as m:
        _uncached(m)
        ref_losses, ref_lora, ref_rows = _train(policy)
    assert torch.equal(losses, ref_losses)
    assert lora.keys() == ref_lora.keys() and all(torch.equal(lora[k], ref_lora[k]) for k in lora)
    assert rows and _same_rows(rows, ref_rows)


def test_frozen_weight_cast_is_kept_and_redone_after_a_write():
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 128, bias=False).to(torch.bfloat16)
    spec = CastSpec("e4m3", ScalingRecipe("current"))
    mod = Fp8BaseLinear(lin, weight=spec, activation=spec, dgrad=CastSpec("e5m2"), store_fp8=False)
    first = mod.dequantized_weight()
    assert mod.dequantized_weight() is first  # frozen: one cast
    assert torch.equal(first, mod._decode_stored(torch.bfloat16))
    with torch.no_grad():
        mod.weight_hp.mul_(3)  # a write (e.g. load_state_dict) bumps the version: cast again
    again = mod.dequantized_weight()
    fresh = TensorScaler(spec.recipe, E4M3, "weight").quantize_dequantize(mod.weight_hp, torch.bfloat16)
    assert again is not first and torch.equal(again, fresh)


def test_tied_weight_cast_is_kept_while_the_weight_is_unchanged():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 100, bias=False).to(torch.bfloat16).requires_grad_(False)
    spec = CastSpec("e4m3", ScalingRecipe("current"))
    mod = Fp8TiedLinear(lin, weight=spec, activation=spec, dgrad=CastSpec("e5m2"))
    first = mod.dequantized_weight()
    assert mod.dequantized_weight() is first
    ref = TensorScaler(spec.recipe, E4M3, "weight").quantize_dequantize(lin.weight, torch.bfloat16)
    assert torch.equal(first, ref)


@pytest.mark.parametrize("kind", ["delayed", "none"])
@pytest.mark.parametrize("peak", [0.5, 3.0])
def test_skipped_saturation_count_is_the_count(kind, peak):
    fmt = E5M2 if kind == "none" else E4M3
    scaler = TensorScaler(ScalingRecipe(kind), fmt, "activation")
    x = torch.randn(200, 100).to(torch.bfloat16)
    if kind == "delayed":
        scaler.observe(x)  # history amax = amax(x): scaled peak at fmax ...
        x = x * peak  # ... then this tensor fits (0.5) or saturates (3.0)
    else:
        x = x * fmt.max * peak / 4
    q, saturated = scaler.quantize(x, count_saturated=True)
    scale = scaler.scale_inv.reciprocal() if scaler.scale_inv is not None else torch.tensor(1.0)
    expected = torch.count_nonzero((x.float() * scale).abs() > fmt.max)
    assert int(saturated) == int(expected) and (int(expected) > 0) == (peak > 1)


def test_inference_mode_tensors_are_cast_without_the_cache():
    site = linear.CastSite(CastSpec("e4m3", ScalingRecipe("current")), "activation", "a", "activation", None)
    with torch.inference_mode():
        x = torch.randn(64, 64).to(torch.bfloat16)
        ref = TensorScaler(ScalingRecipe("current"), E4M3, "activation").quantize_dequantize(x, torch.bfloat16)
        assert torch.equal(site(x, torch.bfloat16), ref)
