"""The held-out loss: the token-weighted mean of the policy's own forward on fixed rows, and a
measurement during training that leaves the policy's scaling state (what it trains with) alone."""
from __future__ import annotations

import torch

from tests.unit.workloads.precision.test_precision_apply import batch, tiny_lora_model
from workloads.data.load import TokenizedData
from workloads.eval.heldout import curve_hook, heldout_loss
from workloads.precision.apply import apply_policy
from workloads.precision.telemetry import Fp8Telemetry


def _rows() -> TokenizedData:
    ids = torch.randint(0, 100, (5, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[3, 9:] = 0  # a shorter, right-padded row
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    labels[:, :4] = -100  # a prompt that is not scored
    return TokenizedData(ids, mask, labels)


def test_mean_is_the_token_weighted_loss_of_the_models_own_forward() -> None:
    model, data = tiny_lora_model(), _rows()
    apply_policy(model, "fp8_naive")
    model.train()
    out = heldout_loss(model, data, batch_size=2, device=torch.device("cpu"))
    assert model.training  # the caller's mode is put back
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=data.input_ids, attention_mask=data.attention_mask, labels=data.labels).loss
    assert abs(out.mean - float(expected)) < 2e-3  # HF's mean over all scored tokens, its own numerics
    assert [r["tokens"] for r in out.rows] == [8, 8, 8, 5, 8]  # labels 4..11 (4..8 in the short row)


def test_curve_leaves_the_amax_histories_as_they_were() -> None:
    model = tiny_lora_model()
    handle = apply_policy(model, "fp8_protected", Fp8Telemetry())
    handle.calibrate(lambda b: model(input_ids=b), [batch(i) for i in range(4)])
    delayed = [s.scaler for s in handle.cast_sites if s.scaler is not None and s.scaler.uses_history]
    before = [(s.amax_history.clone(), s._pos) for s in delayed]
    hook = curve_hook(model, _rows(), every=5, batch_size=2, device=torch.device("cpu"), handle=handle)
    assert hook(3) == {}
    curve = hook(5)
    assert set(curve) == {"eval/loss"} and torch.isfinite(torch.tensor(curve["eval/loss"]))
    assert all(torch.equal(s.amax_history, h) and s._pos == pos for s, (h, pos) in zip(delayed, before))
    with torch.no_grad():
        model(input_ids=batch(9))  # a plain forward does move them: the test can fail
    assert any(s._pos != pos for s, (_, pos) in zip(delayed, before))
