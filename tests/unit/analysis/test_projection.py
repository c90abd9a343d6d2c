"""The GPU roofline projection: its physics, and the gate that keeps it out of reports."""
from __future__ import annotations

import pytest

from analysis import projection_check
from analysis.projection import DEVICES, Cast, Fp8Plan, Gemm, StepWork, linear_gemms, speedup, step_seconds

H200 = DEVICES["H200"]
BIG = (16384, 8192, 8192)


def _one(kind: str | None, shape=BIG, device=H200) -> float:
    bf16 = StepWork((Gemm("g", *shape),))
    cast = Cast(kind, copies=2) if kind not in (None, "free") else Cast()
    fp8 = StepWork((Gemm("g", *shape, fp8=True, cast_a=cast, cast_b=cast),))
    return speedup(bf16, fp8, device)


def test_a_large_gemm_without_casts_reaches_the_datasheet_ratio():
    assert _one("free") == pytest.approx(H200.fp8_tflops / H200.bf16_tflops)


def test_casts_cost_and_an_amax_pass_costs_more():
    assert _one("current") < _one("delayed") < _one("free") <= H200.fp8_tflops / H200.bf16_tflops + 1e-9


def test_a_small_memory_bound_gemm_gains_less():
    assert _one("current", (64, 4096, 4096)) < _one("current")


def test_block_scaling_pays_the_promotion_only_without_native_support():
    assert _one("block", device=DEVICES["H200"]) < _one("delayed", device=DEVICES["H200"])
    assert _one("block", device=DEVICES["B200"]) == pytest.approx(_one("delayed", device=DEVICES["B200"]))


def test_a_frozen_linear_has_no_wgrad_and_stored_weights_cost_no_cast():
    plan = Fp8Plan(Cast("delayed", 2), Cast("stored"), Cast("current"))
    gemms = linear_gemms("q", 512, 1024, 1024, plan, wgrad=False)
    assert [g.name for g in gemms] == ["q.fprop", "q.dgrad"]
    assert Cast("stored").bytes_per_element() == 0.0
    assert step_seconds(StepWork(tuple(gemms)), H200)["cast_s"] > 0


def test_the_checks_are_the_published_figures_and_the_gate_is_all_of_them():
    published = {c.setup.split(",")[0]: c.published for c in projection_check.checks()}
    assert published == {"DelayedScaling": 1.69, "Float8CurrentScaling": 1.57, "Float8BlockScaling": 1.41,
                         "Llama3-8B tensorwise (float8 all-gather)": 1.2503, "Llama3-8B rowwise (bf16 all-gather)": 1.1005}
    assert projection_check.validated() == all(c.ok for c in projection_check.checks())


def test_te_per_layer_figures_are_reproduced_within_the_tolerance():
    te = [c for c in projection_check.checks() if c.source == "Transformer Engine"]
    assert len(te) == 3 and all(c.ok for c in te), [(c.setup, round(c.error, 3)) for c in te]
