"""analysis.recommend: the report's opening line names a policy, its evidence and what the speed rests on."""
from __future__ import annotations

from analysis.options import ReportOptions
from analysis.recommend import EMULATED_SPEED, recommendation
from analysis.summary import build_summary
from test_report_summary import trials_of


def _spec(prot_acc: tuple[float, ...], prot_tps: float) -> list[tuple]:
    bf16 = [("bf16", s, a, 1000.0 + s, 4.0, "FINISHED", {}, "") for s, a in enumerate((0.800, 0.802, 0.798, 0.801, 0.799))]
    prot = [("fp8_protected", s, a, prot_tps + s, 2.8, "FINISHED", {}, "") for s, a in enumerate(prot_acc)]
    naive = [("fp8_naive", s, 0.40 + 0.01 * s, 1900.0, 2.4, "FINISHED", {}, "") for s in range(5)]
    return bf16 + prot + naive


GOOD = (0.801, 0.799, 0.800, 0.802, 0.798)


def _line(spec: list[tuple], emulated: bool) -> str:
    return recommendation(build_summary(trials_of(spec, emulated=emulated), ReportOptions()), ReportOptions())


def test_emulated_names_the_equivalent_policy_and_claims_no_speed():
    line = _line(_spec(GOOD, 600.0), emulated=True)  # emulated FP8 is slower than bf16 on CPU
    assert line.startswith("Recommendation: `fp8_protected`") and "as good as bf16" in line
    assert EMULATED_SPEED in line and "x `bf16`" not in line


def test_real_fp8_names_the_measured_speed_ratio():
    line = _line(_spec(GOOD, 1500.0), emulated=False)
    assert line.startswith("Recommendation: `fp8_protected`") and "measured on real FP8" in line and "1.50x" in line


def test_real_fp8_that_is_not_faster_keeps_bf16():
    assert _line(_spec(GOOD, 900.0), emulated=False).startswith("Recommendation: stay with `bf16`")


def test_no_equivalent_fp8_policy_keeps_bf16_whatever_its_speed():
    line = _line(_spec((0.60, 0.62, 0.61, 0.63, 0.59), 5000.0), emulated=False)
    assert line.startswith("Recommendation: stay with `bf16`") and "speed does not enter" in line
