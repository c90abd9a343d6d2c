"""analysis.speed_probe: the sweep's paired probe replaces the sweep-time speed ratio where it applies."""
from __future__ import annotations

import math

import pytest

from analysis.options import ReportOptions
from analysis.speed_probe import INDICATIVE, PAIRED, apply_probe, probe_ratios
from analysis.summary import build_summary, verdict_lines
from orchestrator.speed_probe_run import probe_metrics
from test_report_summary import trials_of

PROBE = {"rounds": 6, "chunk": 5, "loadavg_start": 1.0, "loadavg_end": 1.2,
         "policies": {"bf16": {"wall": {"ratio": {"median": 1.0, "low": 1.0, "high": 1.0}}},
                      "fp8_protected": {"wall": {"ratio": {"median": 1.25, "low": 1.2, "high": 1.3}}}}}


def test_the_logged_step_time_ratio_comes_back_as_a_throughput_ratio():
    ratio, low, high = probe_ratios(probe_metrics(PROBE))["fp8_protected"]
    assert (ratio, low, high) == pytest.approx((0.8, 1 / 1.3, 1 / 1.2))
    assert probe_ratios(None) == {}


def test_axis_free_groups_take_the_paired_ratio_and_say_so():
    spec = [("bf16", s, 0.8, 3000.0, 4.0, "FINISHED", {}, "") for s in range(3)]
    spec += [("fp8_protected", s, 0.8, 100.0, 2.8, "FINISHED", {}, "") for s in range(3)]  # a busy moment
    summary = apply_probe(build_summary(trials_of(spec), ReportOptions()), probe_ratios(probe_metrics(PROBE)))
    prot = summary.set_index("policy").loc["fp8_protected"]
    assert prot["tps_ratio"] == pytest.approx(0.8) and prot["tps_ratio_source"] == PAIRED
    line = next(x for x in verdict_lines(summary, ReportOptions()) if x.startswith("fp8_protected"))
    assert "0.80x its throughput" in line and PAIRED in line


def test_groups_with_other_axes_keep_their_indicative_ratio():
    spec = [("bf16", s, 0.8, 1000.0, 4.0, "FINISHED", {"lora.r": "8"}, "") for s in range(3)]
    spec += [("fp8_protected", s, 0.8, 1100.0, 2.8, "FINISHED", {"lora.r": "8"}, "") for s in range(3)]
    summary = apply_probe(build_summary(trials_of(spec), ReportOptions()), probe_ratios(probe_metrics(PROBE)))
    prot = summary.set_index("policy").loc["fp8_protected"]
    assert prot["tps_ratio"] == pytest.approx(1.1) and prot["tps_ratio_source"] == INDICATIVE
    assert not math.isnan(prot["tps_ratio_low"])
