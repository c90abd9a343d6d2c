"""The held-out loss comparison: relative error vs the baseline, paired on seeds x rows, and its
equivalence test against report.loss_margin_pct, on hand-computed cases."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.loss_compare import LossEvidence, loss_cols, loss_comparison, loss_holm, overall_phrase, overall_word
from analysis.options import ReportOptions

OPTS = ReportOptions()


def _rows(run: str, losses: np.ndarray, tokens: np.ndarray | None = None) -> pd.DataFrame:
    tokens = np.ones(len(losses), int) if tokens is None else tokens
    return pd.DataFrame({"run_id": run, "row": np.arange(len(losses)), "loss": losses, "tokens": tokens})


def _evidence(base: list[np.ndarray], other: list[np.ndarray]) -> LossEvidence:
    frames = [_rows(f"b{s}", v) for s, v in enumerate(base)] + [_rows(f"p{s}", v) for s, v in enumerate(other)]
    return LossEvidence.of(pd.concat(frames))


def test_token_weighted_rows_average_to_the_trials_eval_loss() -> None:
    # two rows: 1 token at loss 1.0, 3 tokens at loss 2.0 -> eval/loss = (1 + 6) / 4 = 1.75
    ev = LossEvidence.of(_rows("r", np.array([1.0, 2.0]), np.array([1, 3])))
    assert ev.by_run["r"].mean() == pytest.approx(1.75)


def test_a_one_percent_higher_loss_is_worse_and_not_equivalent() -> None:
    rng = np.random.default_rng(0)
    base = [rng.uniform(0.5, 3.0, 200) for _ in range(3)]
    other = [b * 1.01 for b in base]  # exactly +1% on every row and seed
    c = loss_comparison([(f"p{s}", s) for s in range(3)], [(f"b{s}", s) for s in range(3)], _evidence(base, other), OPTS)
    assert c is not None and c.paired_seeds and c.items == 200
    assert c.delta == pytest.approx(1.0, abs=1e-9)
    assert c.low > 0.5 and c.p < 0.05  # a difference, and bigger than the 0.5% margin
    assert c.tost_p > 0.05


def test_a_tiny_loss_change_is_equivalent_within_half_a_percent() -> None:
    rng = np.random.default_rng(1)
    base = [rng.uniform(0.5, 3.0, 200) for _ in range(3)]
    other = [b * (1 + rng.normal(0.0005, 0.002, 200)) for b in base]  # +0.05% on average, noisy
    c = loss_comparison([(f"p{s}", s) for s in range(3)], [(f"b{s}", s) for s in range(3)], _evidence(base, other), OPTS)
    expected = 100 * (np.mean(other) - np.mean(base)) / np.mean(base)
    assert c.delta == pytest.approx(expected)
    assert -0.5 < c.tost_low < c.tost_high < 0.5 and c.tost_p < 0.05


def test_summary_columns_holm_and_the_overall_verdict_need_both_tests() -> None:
    rng = np.random.default_rng(2)
    base = [rng.uniform(0.5, 3.0, 100) for _ in range(3)]
    ev = _evidence(base, [b * 1.0001 for b in base])
    sub = pd.DataFrame({"run_id": [f"p{s}" for s in range(3)], "seed": range(3), "counted": True})
    base_sub = pd.DataFrame({"run_id": [f"b{s}" for s in range(3)], "seed": range(3), "counted": True})
    row = {"policy": "fp8_naive", **loss_cols(sub, base_sub, ev, OPTS)}
    assert row["loss_rel_pct"] == pytest.approx(0.01)
    frame = loss_holm(pd.DataFrame([row, {"policy": "bf16", **loss_cols(base_sub, None, ev, OPTS)}]), OPTS)
    r = frame.iloc[0].to_dict()
    assert r["loss_equivalent"] is True or r["loss_equivalent"] == np.True_
    assert overall_word({**r, "equivalent": True}) == "as good"
    assert overall_word({**r, "equivalent": False}) == "loss only"
    assert "loss-only pass" in overall_phrase({**r, "equivalent": np.False_}, OPTS)
    assert math.isnan(frame.iloc[1]["loss_rel_pct"])


def test_runs_without_loss_rows_get_no_comparison() -> None:
    ev = _evidence([np.ones(10)], [np.ones(10)])
    assert loss_comparison([("p0", 0)], [("missing", 0)], ev, OPTS) is None


def test_summary_table_and_verdict_show_the_loss_and_need_both_passes() -> None:
    """build_summary with per-item accuracy and per-row losses: fp8_naive is equivalent on both,
    fp8_protected equivalent on accuracy but 2% worse on loss -> an accuracy-only pass."""
    from analysis.compare import Evidence
    from analysis.document import quality_table
    from analysis.summary import build_summary, verdict_lines
    from analysis.tidy import dedupe_trials, tidy_runs
    from tests.unit.analysis.test_report_evidence import _bf16, _close_to_bf16, _raw, _samples, _trial

    trials, losses = [], []
    rng = np.random.default_rng(5)
    base_loss = {s: rng.uniform(0.5, 3.0, 200) for s in range(3)}
    for s in range(3):
        for policy, items, factor in (("bf16", _bf16(s), 1.0), ("fp8_naive", _bf16(s), 1.0001),
                                      ("fp8_protected", _close_to_bf16(s), 1.02)):
            losses.append(_rows(f"r{len(trials)}", base_loss[s] * factor))
            trials.append(_trial(policy, s, items))
    tidy = dedupe_trials(tidy_runs(_raw(trials)))[0]
    summary = build_summary(tidy, OPTS, evidence=Evidence.of(_samples(trials)),
                            loss_evidence=LossEvidence.of(pd.concat(losses)))
    s = summary.set_index("policy")
    assert s.loc["fp8_naive", "loss_rel_pct"] == pytest.approx(0.01)
    assert s.loc["fp8_protected", "loss_rel_pct"] == pytest.approx(2.0)
    assert bool(s.loc["fp8_protected", "loss_significant"]) and not bool(s.loc["fp8_protected", "loss_equivalent"])
    table = quality_table(summary, OPTS).set_index("configuration")
    assert table.loc["fp8_protected", "loss vs bf16, % [95% CI]"].startswith("+2.00")
    assert table.loc["bf16", "overall"] == "—"
    lines = {line.split(":")[0]: line for line in verdict_lines(summary, OPTS)}
    assert "held-out loss 2.00% higher than bf16" in lines["fp8_protected"]
    assert bool(s.loc["fp8_protected", "equivalent"])  # accuracy passes: the verdict says only that half does
    assert "accuracy-only pass" in lines["fp8_protected"] and table.loc["fp8_protected", "overall"] == "accuracy only"
    assert "overall: as good as bf16" in lines["fp8_naive"] and table.loc["fp8_naive", "overall"] == "as good"
    assert "held-out loss" in lines["bf16"] and "nats/token" in lines["bf16"]
