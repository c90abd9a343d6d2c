"""A trial reused from another context (an earlier sweep, `fp8lab trial`) never enters a speed ratio.

The case this guards: fp8_protected first run alone by `fp8lab trial` on a busy machine (61 tokens/s),
reused by a sweep whose bf16 ran at ~3140 tokens/s: the report said "0.02x its throughput".
"""
from __future__ import annotations

import math

import pytest

from analysis.document import speed_table
from analysis.options import ReportOptions
from analysis.summary import OTHER_CONTEXT_NOTE, build_summary, verdict_lines
from test_report_summary import trials_of

SPEC = [
    ("bf16", 0, 0.80, 3140.0, 4.0, "FINISHED", {}, ""),
    ("bf16", 1, 0.81, 3120.0, 4.0, "FINISHED", {}, ""),
    ("fp8_protected", 0, 0.80, 61.0, 2.8, "FINISHED", {}, ""),
    ("fp8_protected", 1, 0.79, 64.0, 2.8, "FINISHED", {}, ""),
]


def _summary(reused_policies: set[str], extra: list | None = None):
    t = trials_of(SPEC + (extra or []), emulated=True)
    t["reused"] = t["policy"].isin(reused_policies) & t["seed"].isin([0, 1])
    return build_summary(t, ReportOptions())


def test_a_reused_trial_cannot_produce_a_0_01x_line():
    s = _summary({"fp8_protected"})
    prot = s.set_index("policy").loc["fp8_protected"]
    assert math.isnan(prot["tps_ratio"]) and prot["tps_ratio_note"] == OTHER_CONTEXT_NOTE
    line = next(x for x in verdict_lines(s, ReportOptions()) if x.startswith("fp8_protected"))
    assert "x its throughput" not in line and OTHER_CONTEXT_NOTE in line
    row = speed_table(s, ReportOptions()).set_index("configuration").loc["fp8_protected"]
    assert "another context" in row.iloc[0] and "0.0" not in row.iloc[1]


def test_a_reused_baseline_is_flagged_and_not_compared():
    s = _summary({"bf16"}).set_index("policy")
    assert bool(s.loc["bf16", "tps_other_context"]) and math.isnan(s.loc["fp8_protected", "tps_ratio"])


def test_fresh_trials_are_compared_and_reused_ones_left_out_of_the_ratio():
    fresh = [("fp8_protected", 2, 0.80, 3300.0, 2.8, "FINISHED", {}, ""),
             ("fp8_protected", 3, 0.80, 3340.0, 2.8, "FINISHED", {}, "")]
    prot = _summary({"fp8_protected"}, fresh).set_index("policy").loc["fp8_protected"]
    assert prot["tps_ratio"] == pytest.approx(3320.0 / 3130.0)
    assert not prot["tps_other_context"] and prot["tps_mean"] == pytest.approx(3320.0)
