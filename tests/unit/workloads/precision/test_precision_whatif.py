"""What-if telemetry: every registered recipe on the very tensors a policy casts, by the
telemetry's own definitions, without changing the trial's numbers."""

from __future__ import annotations

import pytest
import torch

from fp8lab_conf.contracts import WHATIF_COLUMNS, WHATIF_RECIPES
from tests.support.tiny_lora import tiny_lora_model, train_steps
from workloads.precision.apply import apply_policy
from workloads.precision.telemetry import Fp8Telemetry
from workloads.precision.whatif import WhatIf, recipe_stats


def _by_recipe(stats: torch.Tensor) -> dict[str, list[float]]:
    return dict(zip(WHATIF_RECIPES, stats.tolist(), strict=True))


def test_each_recipe_shows_its_own_failure_on_one_tensor():
    """Rows 2**-12 apart in magnitude: one per-tensor scale flushes the small rows (underflow),
    per-row and per-block scales keep them; the OCP MX rule saturates a block whose amax is just
    below a power of two (500 -> 448), the others do not; without that outlier NVFP4's 4 bits
    cost the most MSE."""
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0)).abs() + 0.5
    x[:4] *= 2.0**-12
    mse = {r: v[2] for r, v in _by_recipe(recipe_stats(x, "activation")).items()}
    assert mse["nvfp4"] == max(mse.values())
    x[7, 0] = 500.0
    s = _by_recipe(recipe_stats(x, "activation"))
    under, sat = ({r: v[i] for r, v in s.items()} for i in range(2))
    assert under["tensorwise"] > 0 and under["rowwise"] == under["block"] == under["mxfp8"] == 0
    assert sat["mxfp8"] >= 1 and sat["tensorwise"] == sat["rowwise"] == sat["block"] == 0


def test_gradients_use_e5m2_under_tensorwise_like_tes_hybrid():
    g = torch.full((4, 64), 2.0**-20)
    g[0, 0] = 1.0
    under = {r: v[0] for r, v in _by_recipe(recipe_stats(g, "dgrad")).items()}
    act = {r: v[0] for r, v in _by_recipe(recipe_stats(g, "activation")).items()}
    assert under["tensorwise"] == 0 < act["tensorwise"]  # E5M2's range keeps 2**-20 * 57344 / 1


def test_rows_one_per_tensor_and_recipe_shared_inputs_counted_once_statics_once():
    w = WhatIf()
    x = torch.randn(4, 64)
    w.observe_static("l0", "weight", torch.randn(32, 64))
    w.observe("l0.q", "activation", x)
    w.observe("l0.k", "activation", x)  # the same tensor: its stats are reused
    w.observe("l0.q", "activation", torch.randn(4, 64))  # a second micro-batch: first one counts
    w.end_step(10)
    w.observe("l0.q", "activation", x)
    w.end_step(20)
    assert len(w.rows) == (3 + 1) * len(WHATIF_RECIPES)
    assert {tuple(r) for r in w.rows} == {WHATIF_COLUMNS}
    first = [r for r in w.rows if r["step"] == 10]
    assert {(r["layer"], r["kind"]) for r in first} == {("l0", "weight"), ("l0.q", "activation"), ("l0.k", "activation")}
    q = [r["mse"] for r in first if r["layer"] == "l0.q"]
    assert q == [r["mse"] for r in first if r["layer"] == "l0.k"]
    assert not any(r["layer"] == "l0" for r in w.rows if r["step"] == 20)


@pytest.mark.parametrize("policy", ["fp8_naive", "nvfp4"])
def test_a_trial_with_whatif_trains_the_same_numbers_and_logs_every_cast(policy):
    """The what-if casts are side computations: losses are bit-identical with it on and off,
    and the recorded step has rows for every tensor kind the policy's own telemetry has."""
    results = {}
    for on in (False, True):
        model = tiny_lora_model(seed=0)
        tel = Fp8Telemetry()
        tel.whatif = WhatIf() if on else None
        handle = apply_policy(model, policy, tel)
        torch.manual_seed(0)
        results[on] = (*train_steps(model, handle, tel), tel.whatif)
    (loss_off, rows_off, _), (loss_on, rows_on, whatif) = results[False], results[True]
    assert loss_on == loss_off
    cast = {(r["layer"], r["kind"]) for r in rows_on if r["kind"] in ("activation", "weight", "dgrad")}
    assert cast and {(r["layer"], r["kind"]) for r in whatif.rows} >= cast
    assert {r["recipe"] for r in whatif.rows} == set(WHATIF_RECIPES)
