"""workloads.bench: interleaved, paired step-time ratios with a CI of the median (fake trials, no training)."""
from __future__ import annotations

import math

import pytest

from orchestrator.bench_cmd import format_probe, probe_policies
from workloads.bench import ProbeSettings, interleave, median_ci, run_probe


class FakeTrial:
    """Step time = policy cost x the machine's load at the moment, which drifts from round to round."""

    load = [1.0]

    def __init__(self, cost: float) -> None:
        self.cost = cost

    def run_chunk(self, n: int) -> dict[str, float]:
        FakeTrial.load[0] *= 1.37  # another process ramps up: absolute times drift a lot
        return {"wall": self.cost * FakeTrial.load[0], "cpu": self.cost}


def test_median_ci_is_the_binomial_order_statistics():
    assert median_ci([5.0, 1.0, 3.0]) == (1.0, 5.0)  # too few for 95%: the range
    assert median_ci([float(i) for i in range(10)]) == (1.0, 8.0)  # P = 1 - 2*11/1024 >= 0.95
    assert all(math.isnan(v) for v in median_ci([]))


def test_probe_ratios_are_paired_within_rounds_and_bf16_is_the_reference():
    costs = {"bf16": 1.0, "fp8_protected": 1.3}
    FakeTrial.load[0] = 1.0
    out = run_probe({p: {} for p in costs}, ProbeSettings(rounds=8, chunk=2), build=lambda p, _c: FakeTrial(costs[p]))
    prot = out["policies"]["fp8_protected"]["cpu"]["ratio"]
    assert prot["median"] == pytest.approx(1.3) and prot["low"] <= 1.3 <= prot["high"]
    wall = out["policies"]["fp8_protected"]["wall"]["ratio"]["median"]
    assert 1.3 / 1.37 <= wall <= 1.3 * 1.37  # the drift moves a paired ratio by one step of load at most
    assert out["policies"]["bf16"]["cpu"]["ratio"]["median"] == 1.0 and out["rounds"] == 8
    assert "fp8_protected" in format_probe(out) and "load average" in format_probe(out)


def test_probe_needs_the_reference_and_bf16_comes_first():
    with pytest.raises(ValueError, match="bf16"):
        run_probe({"fp8_naive": {}}, ProbeSettings(), build=lambda p, _c: FakeTrial(1.0))
    config = {"sweep": {"axes": {"precision": ["fp8_naive", "bf16", "fp8_protected"]}}, "precision": {"policy": "bf16"}}
    assert probe_policies(config) == ["bf16", "fp8_naive", "fp8_protected"]


def test_interleave_sums_a_rounds_passes_rotating_the_order_every_pass():
    """A round of 3 passes: each variant is called once per pass, the order rotates every pass
    (not only every round), `before_pass` runs before each pass, and a round's sample is the sum
    of its passes, key by key for dict figures."""
    calls: list[str] = []
    passes: list[int] = []

    def variant(name: str, value: float):
        def call():
            calls.append(name)
            return {"cpu": value, "wall": 2 * value}
        return call

    samples = interleave({"a": variant("a", 1.0), "b": variant("b", 3.0)}, rounds=2, passes=3,
                         before_pass=lambda: passes.append(len(calls)))
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert passes == [0, 2, 4, 6, 8, 10]
    assert samples == {"a": {"cpu": [3.0, 3.0], "wall": [6.0, 6.0]}, "b": {"cpu": [9.0, 9.0], "wall": [18.0, 18.0]}}
    assert interleave({"x": lambda: 2.0}, rounds=2) == {"x": [2.0, 2.0]}  # one pass: a round is one call
