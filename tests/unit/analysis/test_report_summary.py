"""analysis.summary: table, baseline matching, verdicts, ablations — from hand-built trials."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from analysis.options import ReportOptions
from analysis.summary import Group, ablation_lines, ablation_table, build_summary, find_reference, verdict_lines
from analysis.tidy import dedupe_trials, tidy_runs

GIB = float(1 << 30)


def trials_of(spec: list[tuple], emulated: bool = False) -> pd.DataFrame:
    """spec rows: (policy, seed, acc, tps, mem_gib, status, axes dict, ablation)."""
    rows = []
    for i, (policy, seed, acc, tps, mem, status, axes, abl) in enumerate(spec):
        row = {
            "run_id": f"r{i}",
            "run_name": f"{policy}-s{seed}",
            "start_time": i,
            "mlflow_status": "FAILED" if status == "FAILED" else ("KILLED" if status == "KILLED" else "FINISHED"),
            "tags.fp8lab.policy": policy,
            "tags.fp8lab.seed": str(seed),
            "tags.fp8lab.status": "" if status == "KILLED" else status,
            "tags.fp8lab.trial_id": f"{policy}-{seed}-{sorted(axes.items())}",
            "tags.fp8lab.ablation": abl,
            "tags.fp8lab.emulated": str(emulated).lower(),
        }
        if acc is not None:
            row["metrics.eval/accuracy"] = acc
        if tps is not None:
            row["metrics.train/tokens_per_s"] = tps
        if mem is not None:
            row["metrics.memory/peak_bytes"] = mem * GIB
        row.update({f"tags.fp8lab.axis.{k}": v for k, v in axes.items()})
        rows.append(row)
    return dedupe_trials(tidy_runs(pd.DataFrame(rows)))[0]


BASIC = [
    ("bf16", 0, 0.80, 1000.0, 4.0, "FINISHED", {}, ""),
    ("bf16", 1, 0.82, 1010.0, 4.0, "FINISHED", {}, ""),
    ("bf16", 2, 0.84, 990.0, 4.1, "FINISHED", {}, ""),
    ("fp8_naive", 0, 0.60, 1500.0, 2.4, "FINISHED", {}, ""),
    ("fp8_naive", 1, 0.66, 1550.0, 2.5, "FINISHED", {}, ""),
    ("fp8_naive", 2, 0.30, 1450.0, 2.5, "DIVERGED", {}, ""),
    ("fp8_naive", 3, None, None, None, "FAILED", {}, ""),
    ("fp8_protected", 0, 0.79, 1400.0, 2.8, "FINISHED", {}, ""),
    ("fp8_protected", 1, 0.81, 1420.0, 2.8, "FINISHED", {}, ""),
    ("fp8_protected", 2, 0.83, 1380.0, 2.9, "FINISHED", {}, ""),
    ("fp8_protected", 3, 0.10, 1.0, 1.0, "KILLED", {}, ""),
    ("fp8_protected-no_scaler", 0, 0.70, 1400.0, 2.8, "FINISHED", {}, "scaler"),
    ("fp8_protected-no_scaler", 1, 0.72, 1410.0, 2.8, "FINISHED", {}, "scaler"),
    ("fp8_protected-no_scaler", 2, 0.74, 1390.0, 2.8, "FINISHED", {}, "scaler"),
]


@pytest.fixture()
def basic() -> pd.DataFrame:
    return build_summary(trials_of(BASIC, emulated=True), ReportOptions()).set_index("policy")


def test_summary_rows_and_counts(basic: pd.DataFrame) -> None:
    assert list(basic.index) == ["bf16", "fp8_naive", "fp8_protected", "fp8_protected-no_scaler"]
    naive = basic.loc["fp8_naive"]
    assert (naive["n_trials"], naive["n_finished"], naive["n_diverged"], naive["n_failed"]) == (4, 2, 1, 1)
    assert naive["n_seeds"] == 3  # the diverged seed counts, the failed one does not
    prot = basic.loc["fp8_protected"]
    assert prot["n_incomplete"] == 1 and prot["n_seeds"] == 3  # the KILLED run is not counted


def test_summary_statistics_match_scipy(basic: pd.DataFrame) -> None:
    base_acc = np.array([80.0, 82.0, 84.0])
    naive_acc = np.array([60.0, 66.0, 30.0])
    naive = basic.loc["fp8_naive"]
    assert naive["acc_mean"] == pytest.approx(naive_acc.mean())
    lo, hi = st.t.interval(0.95, 2, loc=naive_acc.mean(), scale=st.sem(naive_acc))
    assert (naive["acc_low"], naive["acc_high"]) == pytest.approx((lo, hi))
    ref = st.ttest_ind(naive_acc, base_acc, equal_var=False)
    assert naive["delta_pts"] == pytest.approx(naive_acc.mean() - base_acc.mean())
    assert naive["p"] == pytest.approx(ref.pvalue)
    assert naive["significant"] == (ref.pvalue < 0.05)
    prot = basic.loc["fp8_protected"]
    assert prot["delta_pts"] == pytest.approx(-1.0)
    assert prot["p"] == pytest.approx(st.ttest_ind([79, 81, 83], base_acc, equal_var=False).pvalue)
    assert prot["significant"] is not None and not prot["significant"]
    assert prot["tps_ratio"] == pytest.approx(1400.0 / 1000.0)
    assert prot["mem_ratio"] == pytest.approx(np.mean([2.8, 2.8, 2.9]) / np.mean([4.0, 4.0, 4.1]))
    assert prot["tps_ratio_low"] < 1.4 < prot["tps_ratio_high"]
    base = basic.loc["bf16"]
    assert math.isnan(base["delta_pts"]) and base["delta_note"] == "baseline"


def test_cost_columns(basic: pd.DataFrame) -> None:
    b = basic.loc["bf16"]  # 1000 tok/s, default 2.5 USD/h, U=0.8, 1 GPU, no tokens/epoch logged
    assert b["cost_per_1m_tokens"] == pytest.approx(2.5 / 0.8 / 3.6)
    assert math.isnan(b["cost_per_epoch"])


def test_pareto_flags(basic: pd.DataFrame) -> None:
    # bf16 most accurate; naive fastest; protected (80.9, 1400) vs no_scaler (72, 1400): protected dominates
    assert basic["pareto"].to_dict() == {
        "bf16": True,
        "fp8_naive": True,
        "fp8_protected": True,
        "fp8_protected-no_scaler": False,
    }


def test_verdicts(basic: pd.DataFrame) -> None:
    lines = verdict_lines(basic.reset_index(), ReportOptions())
    text = "\n".join(lines)
    prot = next(line for line in lines if line.startswith("fp8_protected:"))
    assert "not distinguishable from bf16 with this evidence: Δ -1.0 points" in prot and "1.40x its throughput" in prot
    assert "as good as" not in prot and "would take ~" in prot  # says how much evidence equivalence would take
    assert "emulated FP8 — speed not representative of FP8 hardware" in prot
    naive = next(line for line in lines if line.startswith("fp8_naive:"))
    assert "go back to BF16" in naive and "1 of 4 trial(s) diverged" in naive and "1 of 4 trial(s) failed" in naive
    assert "1 of 4 trial(s) incomplete" in prot
    assert text.count("baseline") >= 1


def test_ablation_attribution() -> None:
    trials = trials_of(BASIC)
    abl = ablation_table(trials, ReportOptions())
    assert len(abl) == 1
    r = abl.iloc[0]
    prot, var, naive = np.array([79.0, 81, 83]), np.array([70.0, 72, 74]), np.array([60.0, 66, 30])
    ref = st.ttest_ind(prot, var, equal_var=False)
    assert r["protection"] == "scaler" and r["effect_pts"] == pytest.approx(9.0)
    assert r["p"] == pytest.approx(ref.pvalue)
    ci = ref.confidence_interval(0.95)
    assert (r["effect_low"], r["effect_high"]) == pytest.approx((ci.low, ci.high))
    assert r["gap_pts"] == pytest.approx(prot.mean() - naive.mean())
    assert r["share_of_gap"] == pytest.approx(9.0 / (prot.mean() - naive.mean()))
    line = ablation_lines(abl, ReportOptions())[0]
    assert "removing scaler from fp8_protected costs +9.0 points" in line and "of the fp8_naive→fp8_protected gap" in line
    assert "Holm-corrected" in line


def test_no_share_of_a_gap_smaller_than_the_margin() -> None:
    """fp8_naive and fp8_protected 0.2 points apart: a rung worth 75 points is not '45000% of the gap'."""
    spec = [(p, s, acc, 1000.0, 1.0, "FINISHED", {}, abl) for p, abl, accs in (
        ("bf16", "", (0.94, 0.95, 0.945)), ("fp8_naive", "", (0.945, 0.95, 0.947)),
        ("fp8_protected", "", (0.947, 0.952, 0.949)), ("fp8_protected-no_scaler", "scaler", (0.19, 0.19, 0.195)),
    ) for s, acc in enumerate(accs)]
    abl = ablation_table(trials_of(spec), ReportOptions())
    assert math.isnan(abl.iloc[0]["share_of_gap"]) and abl.iloc[0]["effect_pts"] > 70
    assert "too small to share out" in ablation_lines(abl, ReportOptions())[0]


def test_axes_get_their_own_baseline_and_n1_is_graceful() -> None:
    spec = [
        ("bf16", 0, 0.70, 100.0, 1.0, "FINISHED", {"lora.r": "8"}, ""),
        ("bf16", 1, 0.72, 101.0, 1.0, "FINISHED", {"lora.r": "8"}, ""),
        ("fp8_protected", 0, 0.68, 150.0, 0.8, "FINISHED", {"lora.r": "8"}, ""),
        ("fp8_protected", 1, 0.66, 151.0, 0.8, "FINISHED", {"lora.r": "8"}, ""),
        ("bf16", 0, 0.75, 100.0, 1.0, "FINISHED", {"lora.r": "16"}, ""),
        ("bf16", 1, 0.75, 100.0, 1.0, "FINISHED", {"lora.r": "16"}, ""),
        ("fp8_protected", 0, 0.74, 140.0, 0.8, "FINISHED", {"lora.r": "16"}, ""),
    ]
    s = build_summary(trials_of(spec), ReportOptions())
    assert s["group"].tolist() == [
        "bf16 [lora.r=8]",
        "fp8_protected [lora.r=8]",
        "bf16 [lora.r=16]",
        "fp8_protected [lora.r=16]",
    ]
    r8 = s[s["group"] == "fp8_protected [lora.r=8]"].iloc[0]
    assert r8["baseline"] == "bf16 [lora.r=8]" and r8["delta_pts"] == pytest.approx(67.0 - 71.0)
    r16 = s[s["group"] == "fp8_protected [lora.r=16]"].iloc[0]
    assert r16["baseline"] == "bf16 [lora.r=16]" and r16["delta_pts"] == pytest.approx(-1.0)
    assert r16["n_seeds"] == 1 and r16["acc_note"] == "n=1: no CI" and math.isnan(r16["p"])
    assert r16["significant"] is None and "seed noise not estimable" in r16["delta_note"]
    line = next(v for v in verdict_lines(s, ReportOptions()) if v.startswith("fp8_protected [lora.r=16]"))
    assert "no test" in line
    b16 = s[s["group"] == "bf16 [lora.r=16]"].iloc[0]
    assert b16["acc_low"] == b16["acc_high"] == 75.0  # zero variance: a degenerate, not a missing, interval


def test_find_reference_fallback_for_fp8_only_axis() -> None:
    base = Group("bf16", (("axis.recipe", ""),))
    fp8 = Group("fp8_protected", (("axis.recipe", "delayed"),))
    assert find_reference(fp8, "bf16", [base, fp8]) == base
    two = [Group("bf16", (("axis.recipe", "a"),)), Group("bf16", (("axis.recipe", "b"),)), fp8]
    assert find_reference(fp8, "bf16", two) is None


def test_no_baseline_in_sweep() -> None:
    s = build_summary(trials_of([("fp8_naive", 0, 0.5, 10.0, 1.0, "FINISHED", {}, "")]), ReportOptions())
    assert s.iloc[0]["delta_note"] == "no bf16 baseline"
    assert "no bf16 baseline" in verdict_lines(s, ReportOptions())[0]


def test_all_metrics_missing_does_not_crash() -> None:
    s = build_summary(
        trials_of(
            [("bf16", 0, None, None, None, "FINISHED", {}, ""), ("fp8_naive", 0, None, None, None, "FINISHED", {}, "")]
        ),
        ReportOptions(),
    )
    assert s["acc_mean"].isna().all() and not s["pareto"].any()
    assert "no accuracy measured" in verdict_lines(s, ReportOptions())[1]


def test_unevaluated_diverged_seed_is_disclosed() -> None:
    spec = [
        ("bf16", 0, 0.80, 100.0, 1.0, "FINISHED", {}, ""),
        ("bf16", 1, 0.82, 100.0, 1.0, "FINISHED", {}, ""),
        ("fp8_naive", 0, 0.70, 150.0, 0.8, "FINISHED", {}, ""),
        ("fp8_naive", 1, 0.72, 150.0, 0.8, "FINISHED", {}, ""),
        ("fp8_naive", 2, None, 150.0, 0.8, "DIVERGED", {}, ""),  # workloads skip eval after divergence
    ]
    s = build_summary(trials_of(spec), ReportOptions())
    naive = s.set_index("policy").loc["fp8_naive"]
    assert naive["n_seeds"] == 2 and naive["n_diverged"] == 1 and naive["n_diverged_no_acc"] == 1
    line = next(v for v in verdict_lines(s, ReportOptions()) if v.startswith("fp8_naive"))
    assert "1 of 3 trial(s) diverged" in line and "missing from the accuracy mean" in line


def test_collapse_detector_flags_lora_weights_that_never_moved() -> None:
    trials = trials_of([("bf16", 0, 0.9, 1000.0, 1.0, "FINISHED", {}, ""), ("fp8_naive", 0, 0.2, 900.0, 1.0, "FINISHED", {}, "")])
    trials.loc[trials["policy"] == "bf16", "lora_std_min"] = 5e-3
    trials.loc[trials["policy"] == "fp8_naive", "lora_std_min"] = 0.0
    lines = dict(line.split(": ", 1) for line in verdict_lines(build_summary(trials, ReportOptions()), ReportOptions()))
    assert "adapters frozen at init" in lines["fp8_naive"]  # the mechanism of the loss, said once
    assert "LoRA collapse detector fired" not in lines["fp8_naive"]
    assert "collapse" not in lines["bf16"]
