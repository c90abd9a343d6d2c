"""The shipped lm-eval task YAML loads in lm-eval's TaskManager and reads the shipped JSONL."""
from __future__ import annotations

import pytest
from lm_eval.tasks import TaskManager

from workloads.eval.harness import embedded_paths


@pytest.fixture(scope="module")
def task():
    manager = TaskManager(include_path=str(embedded_paths().tasks_dir), include_defaults=False)
    assert "fp8lab_embedded" in manager.all_tasks
    assert not any(name.startswith("_") for name in manager.all_tasks)  # the template is no task
    return manager.load(["fp8lab_embedded"])["tasks"]["fp8lab_embedded"]


def test_task_config(task):
    assert task.OUTPUT_TYPE == "multiple_choice"
    assert task.config.metadata["version"] == 1.0
    assert [m["metric"] for m in task.config.metric_list] == ["acc"]
    assert task.config.target_delimiter == " "


def test_task_reads_the_shipped_rows(task):
    docs = list(task.test_docs())
    assert len(docs) == 400
    doc = docs[0]
    assert task.doc_to_text(doc) == doc["prompt"]
    assert task.doc_to_choice(doc) == doc["choices"]
    assert task.doc_to_target(doc) == doc["answer"]
    assert len(list(task.training_docs())) == 3000
