"""workloads.eval.checks: one line per problem of the eval section, before any training."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.unit.workloads.eval.eval_task_files import GEN, MC, PPL, write_tasks
from workloads.eval.checks import check_eval_tasks
from workloads.eval.harness import embedded_paths


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("preflight_tasks"))


def _config(task_dir=None, model="embedded", **eval_cfg):
    ev = {"task": None, "tasks": None, "metrics": {}, "primary": "mean", "include_path": task_dir and str(task_dir),
          "num_fewshot": None, "apply_chat_template": False, "fewshot_as_multiturn": False, **eval_cfg}
    return {"eval": ev, "data": {"path": "embedded"}, "model": {"name_or_path": model}}


def _one(problems: list[str], starts: str, *contains: str) -> None:
    assert len(problems) == 1, problems
    assert problems[0].startswith(starts) and "(fix: " in problems[0], problems
    for text in contains:
        assert text in problems[0], problems


def test_good_configs_pass(task_dir):
    assert check_eval_tasks(_config()) == []
    assert check_eval_tasks(_config(task_dir, tasks=[MC, GEN, PPL], primary=GEN,
                                    metrics={GEN: "exact_match,flexible-extract"})) == []


def test_unknown_task_has_did_you_mean():
    """Named by the key the user wrote (the shorthand `eval.task` or the list `eval.tasks`)."""
    _one(check_eval_tasks(_config(tasks=["fp8lab_embeded"])), "eval.tasks: unknown lm-eval task 'fp8lab_embeded'",
         "Did you mean 'fp8lab_embedded'")
    _one(check_eval_tasks(_config(task="fp8lab_embeded")), "eval.task: unknown lm-eval task")


def test_data_that_does_not_load(task_dir, tmp_path):
    broken = tmp_path / "tasks"
    broken.mkdir()
    (broken / "no_data.yaml").write_text(
        f"task: no_data\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'missing.jsonl'}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: q\ndoc_to_choice: c\ndoc_to_target: a\n")
    _one(check_eval_tasks(_config(broken, task="no_data")), "eval.task: task 'no_data' could not load its data")


def test_a_task_without_metrics(tmp_path):
    (tmp_path / "silent.yaml").write_text(
        f"include: {embedded_paths().tasks_dir / '_fp8lab_mc.yaml'}\ntask: silent\nmetric_list: []\n")
    _one(check_eval_tasks(_config(tmp_path, task="silent")), "eval.tasks: task 'silent' reports no metric")


def test_primary_metric_the_task_does_not_report(task_dir):
    _one(check_eval_tasks(_config(task_dir, tasks=[GEN], metrics={GEN: "exact_match,loose"})),
         f"eval.metrics.{GEN}: task '{GEN}' has no metric 'exact_match,loose'", "exact_match.flexible-extract")


def test_metrics_and_primary_must_name_evaluated_tasks(task_dir):
    _one(check_eval_tasks(_config(task_dir, tasks=[MC], metrics={GEN: "exact_match"})), f"eval.metrics.{GEN}: ")
    _one(check_eval_tasks(_config(task_dir, tasks=[MC], primary=GEN)), "eval.primary: must be mean or an evaluated task")


def test_perplexity_is_not_an_accuracy(task_dir):
    _one(check_eval_tasks(_config(task_dir, tasks=[MC, PPL])), "eval.primary: eval/accuracy would include 'tiny_ppl'")
    assert check_eval_tasks(_config(task_dir, tasks=[MC, PPL], primary=MC)) == []
    _one(check_eval_tasks(_config(task_dir, tasks=[MC, PPL], primary=MC, num_fewshot=2)), "eval.num_fewshot: task 'tiny_ppl'")


def test_generation_needs_an_eos_token(task_dir, tmp_path):
    model = tmp_path / "no_eos"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(embedded_paths().model_dir / name, model / name)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["eos_token"] = None
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    _one(check_eval_tasks(_config(task_dir, model=str(model), tasks=[GEN])), "model.name_or_path: task 'tiny_gen' is generate_until")
    assert check_eval_tasks(_config(task_dir, model=str(model), tasks=[MC])) == []


def test_chat_template_must_exist(task_dir):
    _one(check_eval_tasks(_config(task_dir, tasks=[MC], apply_chat_template=True)),
         "eval.apply_chat_template: the tokenizer has no chat template")


def test_include_path_must_be_a_folder(tmp_path):
    _one(check_eval_tasks(_config(tmp_path / "nowhere", task=MC)), "eval.include_path: ")
