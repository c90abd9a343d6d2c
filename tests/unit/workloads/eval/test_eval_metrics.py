"""workloads.eval.metrics: metric labels, primary-metric choice, per-item rows, the aggregate."""
from __future__ import annotations

import pytest

from workloads.eval.metrics import (TaskInfo, configured_tasks, item_values, metric_label, primary_figure,
                                    resolve_primary, task_metrics)

GSM = TaskInfo(name="gsm", output_type="generate_until", metrics=("exact_match",),
               filters=("strict-match", "flexible-extract"), higher_is_better={"exact_match": True}, num_fewshot=5)
MC = TaskInfo(name="mc", output_type="multiple_choice", metrics=("acc", "acc_norm"), filters=("none",),
              higher_is_better={"acc": True, "acc_norm": True}, num_fewshot=None)


def test_labels_are_valid_mlflow_names():
    assert metric_label("acc,none") == "acc"
    assert metric_label("exact_match,strict-match") == "exact_match.strict-match"
    assert metric_label("exact_match,take-first+regex(1)") == "exact_match.take-first_regex_1_"


@pytest.mark.parametrize(("info", "spec", "key"), [
    (MC, None, "acc,none"), (MC, "acc_norm", "acc_norm,none"),
    (GSM, None, "exact_match,strict-match"), (GSM, "exact_match", "exact_match,strict-match"),
    (GSM, "exact_match,flexible-extract", "exact_match,flexible-extract"),
    (GSM, "exact_match.flexible-extract", "exact_match,flexible-extract"),
])
def test_resolve_primary(info, spec, key):
    assert resolve_primary(info, spec) == key


def test_resolve_primary_names_what_the_task_reports():
    with pytest.raises(ValueError, match=r"no metric 'f1' \(it reports: exact_match.strict-match, exact_match.flexible-extract\)"):
        resolve_primary(GSM, "f1")
    with pytest.raises(ValueError, match="no metric 'acc,strict'"):
        resolve_primary(MC, "acc,strict")


def test_task_metrics_keep_every_number_and_skip_na_stderr():
    raw = {"alias": "gsm", "exact_match,strict-match": 0.5, "exact_match_stderr,strict-match": 0.1,
           "exact_match,flexible-extract": 0.75, "exact_match_stderr,flexible-extract": "N/A"}
    assert task_metrics("gsm", raw) == {"eval/gsm/exact_match.strict-match": 0.5,
                                        "eval/gsm/exact_match.strict-match_stderr": 0.1,
                                        "eval/gsm/exact_match.flexible-extract": 0.75}


def test_item_values_take_one_filter_and_aggregate_tuples():
    logged = [{"doc_id": d, "filter": f, "exact_match": float(d == 1 or f == "flexible-extract")}
              for f in ("strict-match", "flexible-extract") for d in (1, 0)]
    rows = item_values(logged, "exact_match,strict-match")
    assert rows == [{"doc_id": 0, "metric": "exact_match.strict-match", "value": 0.0},
                    {"doc_id": 1, "metric": "exact_match.strict-match", "value": 1.0}]
    ppl = item_values([{"doc_id": 0, "filter": "none", "word_perplexity": (-4.0, 2)}], "word_perplexity,none",
                      aggregate=lambda items: sum(ll for ll, _ in items) * -1 / sum(n for _, n in items))
    assert ppl == [{"doc_id": 0, "metric": "word_perplexity", "value": 2.0}]


def test_primary_figure():
    per_task = {"a": {"value": 0.5, "stderr": 0.3, "higher_is_better": True, "primary": "acc"},
                "b": {"value": 0.9, "stderr": 0.4, "higher_is_better": True, "primary": "acc"}}
    assert primary_figure(per_task, "mean") == pytest.approx((0.7, 0.25))
    assert primary_figure(per_task, "b") == (0.9, 0.4)
    with pytest.raises(ValueError, match="'c' is not one of the evaluated tasks"):
        primary_figure(per_task, "c")


def test_configured_tasks():
    assert configured_tasks({"task": None, "tasks": None}) == ["fp8lab_embedded"]
    assert configured_tasks({"task": "arc_easy", "tasks": None}) == ["arc_easy"]
    assert configured_tasks({"task": None, "tasks": ["a", "b"]}) == ["a", "b"]
