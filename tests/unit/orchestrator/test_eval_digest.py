"""Reliability round 3, case 1: the trial id covers what decides an evaluation's score: the
task YAMLs of eval.include_path (and what they include), the task's data files (edited answers),
and the lm-eval version. Before, a rerun after editing a task's test.jsonl skipped the trial as
FINISHED and reported accuracies scored against the old answers."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator import content_digest, eval_digest
from orchestrator.config_loader import compose_config, to_container
from orchestrator.trial_id import compute_trial_id

EMBEDDED = Path(__file__).resolve().parents[3] / "workloads" / "embedded"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(content_digest, "_CACHE", content_digest._Cache())


@pytest.fixture
def user_task(tmp_path: Path) -> tuple[Path, Path]:
    """A task folder (include path) whose YAML reads its rows from a data folder elsewhere."""
    tasks, data = tmp_path / "tasks", Path(shutil.copytree(EMBEDDED / "assets" / "task", tmp_path / "rows"))
    tasks.mkdir()
    (tasks / "my_task.yaml").write_text(f"include: {EMBEDDED / 'tasks' / '_fp8lab_mc.yaml'}\ntask: my_task\n"
                                        f"metadata:\n  version: 1.0\n  data_dir: {data}\n")
    return tasks, data


def _id(tasks: Path) -> str:
    return compute_trial_id(to_container(compose_config([f"eval.include_path={tasks}", "eval.task=my_task"])))


def test_editing_the_answers_of_an_include_path_task_changes_the_trial_id(user_task: tuple[Path, Path]) -> None:
    tasks, data = user_task
    before = _id(tasks)
    rows = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    rows[0]["answer"] = (rows[0]["answer"] + 1) % len(rows[0]["choices"])  # one answer changed
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _id(tasks) != before


def test_editing_the_task_yaml_or_a_file_it_includes_changes_the_trial_id(user_task: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    tasks, _ = user_task
    template = Path(shutil.copy(EMBEDDED / "tasks" / "_fp8lab_mc.yaml", tmp_path / "_template.yaml"))
    yaml_file = tasks / "my_task.yaml"
    yaml_file.write_text(yaml_file.read_text().replace(str(EMBEDDED / "tasks" / "_fp8lab_mc.yaml"), "../_template.yaml"))
    before = _id(tasks)
    template.write_text(template.read_text().replace('target_delimiter: " "', 'target_delimiter: "\\n"'))
    after_template = _id(tasks)
    assert after_template != before  # the included template lives outside the include path
    yaml_file.write_text(yaml_file.read_text() + "num_fewshot: 1\n")
    assert _id(tasks) != after_template


def test_another_lm_eval_version_changes_the_trial_id(user_task: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    tasks, _ = user_task
    before = _id(tasks)
    monkeypatch.setattr(eval_digest, "_lm_eval_version", lambda: "0.0.1-other")
    assert _id(tasks) != before


def test_relative_data_files_are_followed(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    (tasks / "data").mkdir(parents=True)
    (tmp_path / "outside.jsonl").write_text('{"q": 1}\n')
    (tasks / "t.yaml").write_text("task: t\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: ../outside.jsonl\n"
                                  "doc_to_text: !function utils.text\n")
    files = eval_digest._eval_files(eval_digest._task_roots(str(tasks)), ["t"])
    assert (tmp_path / "outside.jsonl").resolve() in files


def test_the_same_task_folder_elsewhere_gives_the_same_digest(tmp_path: Path) -> None:
    """Eval files are named relative to their task folder, so a checkout, a virtual environment or
    an include path in another place is the same trial (absolute names made every fresh clone's
    trial ids new); a different file still changes the digest."""
    first = Path(shutil.copytree(EMBEDDED / "tasks", tmp_path / "a" / "tasks"))
    second = Path(shutil.copytree(EMBEDDED / "tasks", tmp_path / "b" / "elsewhere"))
    config = {"eval": {"task": "fp8lab_embedded", "tasks": None}}
    digest = {root: eval_digest.eval_digests({"eval": {**config["eval"], "include_path": str(root)}})["eval_files"]
              for root in (first, second)}
    assert digest[first] == digest[second]
    (second / "extra.yaml").write_text("task: extra\n")
    assert eval_digest.eval_digests({"eval": {**config["eval"], "include_path": str(second)}})["eval_files"] != digest[first]
