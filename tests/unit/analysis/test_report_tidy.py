"""analysis.tidy: statuses, retries, missing data — on hand-built search_runs-style frames."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.options import ReportOptions
from analysis.tidy import (
    apply_final_values,
    classify_status,
    clean_history,
    dedupe_trials,
    last_written,
    natural_key,
    step_series,
    tidy_runs,
)


def raw_row(
    run_id: str,
    policy: str = "bf16",
    seed: int = 0,
    trial: str | None = None,
    status: str = "FINISHED",
    mlflow_status: str = "FINISHED",
    start: int = 0,
    **extra: object,
) -> dict[str, object]:
    row: dict[str, object] = {
        "run_id": run_id,
        "run_name": f"{policy}-s{seed}",
        "mlflow_status": mlflow_status,
        "start_time": start,
        "tags.fp8lab.policy": policy,
        "tags.fp8lab.seed": str(seed),
        "tags.fp8lab.status": status,
        "tags.fp8lab.trial_id": trial or f"{policy}-{seed}",
    }
    row.update(extra)
    return row


@pytest.mark.parametrize(
    ("mlflow_status", "tag", "expected"),
    [
        ("FINISHED", "FINISHED", "FINISHED"),
        ("FINISHED", "DIVERGED", "DIVERGED"),
        ("FAILED", "FAILED", "FAILED"),
        ("FAILED", "", "FAILED"),
        ("FINISHED", "", "FINISHED"),
        ("FINISHED", "FAILED", "FAILED"),
        ("FAILED", "FINISHED", "FAILED"),  # someone set the finished run FAILED in MLflow: not a result
        ("FAILED", "DIVERGED", "FAILED"),
        ("KILLED", "FINISHED", "INCOMPLETE"),
        ("RUNNING", "", "INCOMPLETE"),
        ("SCHEDULED", None, "INCOMPLETE"),
        ("FINISHED", "KILLED", "INCOMPLETE"),
        ("FINISHED", "RUNNING", "INCOMPLETE"),
    ],
)
def test_classify_status(mlflow_status: str, tag: str, expected: str) -> None:
    assert classify_status(mlflow_status, tag) == expected


def test_tidy_tolerates_missing_everything() -> None:
    raw = pd.DataFrame([{"run_id": "r1", "mlflow_status": "FINISHED"}])
    t = tidy_runs(raw)
    row = t.iloc[0]
    assert row["policy"] == "unknown" and row["trial_id"] == "r1" and row["status"] == "FINISHED"
    assert math.isnan(row["accuracy"]) and math.isnan(row["tokens_per_epoch"]) and not row["emulated"]


def test_tidy_reads_metrics_axes_and_flags() -> None:
    raw = pd.DataFrame(
        [
            raw_row(
                "r1",
                "fp8_naive",
                2,
                status="DIVERGED",
                **{
                    "metrics.eval/accuracy": 0.61,
                    "metrics.train/tokens_per_s": 1500.0,
                    "metrics.memory/peak_bytes": 2.0 * (1 << 30),
                    "tags.fp8lab.emulated": "true",
                    "tags.fp8lab.axis.lora.r": "16",
                    "tags.fp8lab.reason": "nan loss",
                    "tags.fp8lab.diverged_step": "7",
                    "params.data.train_size": "100",
                    "params.train.max_seq_len": "64",
                },
            )
        ]
    )
    row = tidy_runs(raw).iloc[0]
    assert row["accuracy"] == 0.61 and row["seed"] == 2 and row["emulated"]
    assert row["axis.lora.r"] == "16" and row["status"] == "DIVERGED" and row["counted"]
    assert row["diverged_step"] == 7 and row["reason"] == "nan loss" and row["tokens_per_epoch"] == 6400


def test_tokens_per_epoch_falls_back_to_metric() -> None:
    raw = pd.DataFrame([raw_row("r1", **{"metrics.train/tokens_per_epoch": 5000.0})])
    assert tidy_runs(raw).iloc[0]["tokens_per_epoch"] == 5000.0
    opts = ReportOptions(tokens_per_epoch_params=("data.n", "data.len"))
    raw2 = pd.DataFrame([raw_row("r1", **{"params.data.n": "10", "params.data.len": "3"})])
    assert tidy_runs(raw2, opts).iloc[0]["tokens_per_epoch"] == 30.0


def test_mlflow_infinity_is_not_a_number() -> None:
    raw = pd.DataFrame([raw_row("r1", **{"metrics.train/final_loss": 1.7976931348623157e308})])
    assert math.isnan(tidy_runs(raw).iloc[0]["final_loss"])
    hist = clean_history(
        pd.DataFrame({"run_id": ["a"] * 3, "step": [0, 1, 2], "value": [1.0, -1.7976931348623157e308, float("nan")]})
    )
    assert hist["value"].iloc[0] == 1.0 and hist["value"].isna().sum() == 2


def test_dedupe_prefers_finished_then_latest() -> None:
    raw = pd.DataFrame(
        [
            raw_row("a-finished-old", trial="A", start=1, **{"metrics.eval/accuracy": 0.8}),
            raw_row("a-failed-new", trial="A", status="FAILED", mlflow_status="FAILED", start=9),
            raw_row("b-old", trial="B", start=1, **{"metrics.eval/accuracy": 0.5}),
            raw_row("b-new", trial="B", start=5, **{"metrics.eval/accuracy": 0.7}),
            raw_row("c-killed", trial="C", mlflow_status="KILLED", start=9),
            raw_row("c-diverged", trial="C", status="DIVERGED", start=1),
            raw_row("d-only", trial="D", mlflow_status="RUNNING"),
        ]
    )
    kept, sup = dedupe_trials(tidy_runs(raw))
    assert sorted(kept["run_id"]) == ["a-finished-old", "b-new", "c-diverged", "d-only"]
    assert dict(zip(sup["run_id"], sup["superseded_by"], strict=True)) == {
        "a-failed-new": "a-finished-old",
        "b-old": "b-new",
        "c-killed": "c-diverged",
    }
    assert kept.set_index("run_id").loc["d-only", "status"] == "INCOMPLETE"
    assert not kept.set_index("run_id").loc["d-only", "counted"]


def test_dedupe_empty() -> None:
    kept, sup = dedupe_trials(tidy_runs(pd.DataFrame(columns=["run_id"])))
    assert kept.empty and sup.empty


def test_natural_sort_of_layers_and_values() -> None:
    names = ["layers.10.q", "layers.9.q", "layers.1.q"]
    assert sorted(names, key=natural_key) == ["layers.1.q", "layers.9.q", "layers.10.q"]
    assert sorted(["16", "8", "0.5"], key=natural_key) == ["0.5", "8", "16"]


def test_final_value_is_the_last_write_not_the_highest_step() -> None:
    hist = pd.DataFrame(
        {
            "run_id": ["a", "a", "a", "a", "b"],
            "key": ["train/tokens_per_s"] * 4 + ["train/loss"],
            "step": [0, 1, 2, 0, 0],  # the final write is at step 0, as workloads' log_final does
            "timestamp": [10, 11, 12, 99, 5],
            "value": [500.0, 510.0, 520.0, 1000.0, 2.0],
        }
    )
    assert last_written(hist, "train/tokens_per_s").to_dict() == {"a": 1000.0}
    series = step_series(hist, "train/tokens_per_s")
    assert series["value"].tolist() == [1000.0, 510.0, 520.0]  # the later write of step 0 wins
    raw = pd.DataFrame([raw_row("a", **{"metrics.train/tokens_per_s": 520.0}), raw_row("b", seed=1)])
    trials = apply_final_values(tidy_runs(raw), hist, ReportOptions())
    assert trials["tokens_per_s"].tolist()[0] == 1000.0 and math.isnan(trials["tokens_per_s"].tolist()[1])
