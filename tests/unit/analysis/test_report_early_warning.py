"""analysis.early_warning: outcomes, confusion matrix, precision/recall, saved share and the
stopped-trials table, on a hand-built search_runs-style frame."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.early_warning import early_warning_blocks, outcomes, scoring, stopped_table
from analysis.options import ReportOptions
from analysis.render import Table
from analysis.tidy import dedupe_trials, tidy_runs


def _row(run: str, policy: str, seed: int, acc: float | None, verdict: str, lr: str = "0.0002",
         status: str = "FINISHED", **extra: object) -> dict[str, object]:
    row = {"run_id": run, "run_name": run, "mlflow_status": "FINISHED", "start_time": 0,
           "tags.fp8lab.trial_id": run, "tags.fp8lab.policy": policy, "tags.fp8lab.seed": str(seed),
           "tags.fp8lab.status": status, "tags.fp8lab.axis.train.lr": lr, "tags.fp8lab.health.verdict": verdict,
           "tags.fp8lab.health.step": "10", "tags.fp8lab.health.reasons": "adapters frozen (x)" if verdict == "doomed" else "",
           "metrics.train/wall_s": 100.0, "metrics.eval/wall_s": 10.0, "metrics.trial/wall_s": 120.0,
           "metrics.train/steps_done": 100.0, "params.train.steps": "100"}
    if acc is not None:
        row["metrics.eval/accuracy"] = acc
    row.update(extra)
    return row


@pytest.fixture
def trials() -> pd.DataFrame:
    raw = pd.DataFrame([
        _row("b0", "bf16", 0, 0.90, "healthy"), _row("b1", "bf16", 1, 0.92, "healthy"),
        _row("f0", "fp8_store", 0, 0.20, "doomed"),           # bad, called doomed: TP
        _row("f1", "fp8_store", 1, 0.90, "doomed"),           # ok, called doomed: FP
        _row("n0", "fp8_naive", 0, 0.80, "at_risk"),          # bad (10 pts below), only at risk: FN
        _row("n1", "fp8_naive", 1, 0.89, "healthy"),          # ok: TN
        _row("d0", "fp8_naive", 0, None, "healthy", lr="0.05", status="DIVERGED"),  # bad, missed: FN
        _row("u0", "fp8_naive", 1, 0.5, "healthy", lr="0.05"),  # no bf16 at lr 0.05: unknown, not scored
        _row("s0", "fp8_store", 0, None, "doomed", lr="0.05", status="STOPPED_EARLY",
             **{"metrics.train/steps_done": 10.0, "metrics.train/wall_s": 10.0,
                "tags.fp8lab.stopped_early": "stopped early at step 10: doomed: adapters frozen (x)"}),
    ])
    kept, _ = dedupe_trials(tidy_runs(raw))
    return kept


def test_outcomes_compare_with_bf16_of_the_same_axes_and_seed(trials: pd.DataFrame) -> None:
    got = dict(zip(trials["run_id"], outcomes(trials, ReportOptions()), strict=True))
    assert got == {"b0": "reference", "b1": "reference", "f0": "bad", "f1": "ok", "n0": "bad", "n1": "ok", "d0": "bad",
                   "u0": "unknown", "s0": ""}


def test_exactly_the_margin_below_bf16_is_ok_despite_float_rounding() -> None:
    raw = pd.DataFrame([_row("b1", "bf16", 1, 0.9575, "healthy"), _row("x1", "fp8_store", 1, 0.9075, "healthy")])
    kept, _ = dedupe_trials(tidy_runs(raw))
    assert outcomes(kept, ReportOptions()).tolist() == ["reference", "ok"]


def test_scoring_counts_precision_recall_and_saved_share(trials: pd.DataFrame) -> None:
    score = scoring(trials, ReportOptions())
    assert (score["tp"], score["fp"], score["fn"]) == (1, 1, 2)
    assert score["precision"] == 0.5 and score["recall"] == pytest.approx(1 / 3)
    assert score["warned_recall"] == pytest.approx(2 / 3)  # n0 was at least called at risk
    # two doomed calls, each saves 90% of 100 s of training + 10 s eval, over 5 scored trials of 120 s
    # (the two bf16 trials are the reference, not scored against themselves)
    assert len(score["scored"]) == 5 and "bf16" not in set(score["scored"]["policy"])
    assert score["saved_share"] == pytest.approx(2 * (100 * 0.9 + 10) / (5 * 120))


def test_stopped_trials_are_listed_with_prediction_and_saved_compute(trials: pd.DataFrame) -> None:
    table = stopped_table(trials)
    assert list(table["run"]) == ["s0"]
    row = table.iloc[0]
    assert row["stopped at step"] == "10/100" and row["predicted outcome"] == "doomed: adapters frozen (x)"
    assert row["compute saved, s (est.)"] == "100"  # 90 steps at 1 s/step + median eval 10 s
    assert not trials.loc[trials["run_id"] == "s0", "counted"].item()


def test_report_section_shows_the_confusion_matrix_and_the_wrong_calls(trials: pd.DataFrame) -> None:
    blocks = early_warning_blocks(trials, ReportOptions())
    tables = [b.frame for b in blocks if isinstance(b, Table)]
    confusion = tables[1].set_index("verdict at the verdict step")
    assert confusion.loc["doomed"].tolist() == [1, 1] and confusion.loc["at risk"].tolist() == [1, 0]
    assert sorted(tables[2]["run"]) == ["d0", "f1", "n0"]
    assert early_warning_blocks(trials.assign(health_verdict=""), ReportOptions()) == []
