"""Training on your own rows with no eval task set is refused before training (one line, the
fix), never scored on fp8lab's synthetic task without a word; a data folder keeps its meaning
(the embedded task scores its test.jsonl)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config_loader import compose_config, to_container
from workloads.eval.checks import check_eval_tasks

ROW = {"prompt": "Which is largest: 1, 9?", "choices": ["1", "9"], "answer": 1}


def _problems(*overrides: str) -> list[str]:
    return [p for p in check_eval_tasks(to_container(compose_config(list(overrides)))) if p.startswith("eval.tasks: training on")]


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).write_text(json.dumps(ROW) + "\n")
    return tmp_path


def test_user_file_without_eval_task_is_refused(data: Path) -> None:
    problems = _problems(f"data.path={data / 'train.jsonl'}")
    assert len(problems) == 1 and "would score fp8lab's embedded synthetic task, not your data" in problems[0]
    assert "(fix: eval.tasks=[<an lm-eval task for your data>]" in problems[0]


@pytest.mark.parametrize("overrides", [["eval.task=fp8lab_embedded"], ["eval.tasks=[fp8lab_embedded]"], []])
def test_explicit_task_folder_or_embedded_data_pass(data: Path, overrides: list[str]) -> None:
    if overrides:  # a task named explicitly, even the embedded one: the user chose it
        assert _problems(f"data.path={data / 'train.jsonl'}", *overrides) == []
    assert _problems(f"data.path={data}", *overrides) == []  # a folder: its test.jsonl is scored
    assert _problems(*overrides) == []  # the embedded data
