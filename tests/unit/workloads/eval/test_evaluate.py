"""workloads.eval.harness: lm-eval on an in-memory model, task lookup and custom data."""
from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workloads.eval.harness import check_task_exists, embedded_paths, evaluate_model


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny model: one thread is as fast, and immune to oversubscription on a shared box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(embedded_paths().model_dir)


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(embedded_paths().model_dir, dtype=torch.bfloat16)


def _write_rows(folder, rows_by_split):
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in rows_by_split.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _counting_rows(n):
    """A task the base model already knows: what comes next when counting up."""
    rows = []
    for i in range(n):
        start = 10 + 3 * i
        right = start + 4
        choices = [str(right), str(right + 30), str(right - 9), str(right + 17)]
        rows.append({"prompt": f"Count up from {start}: {start}, {start + 1}, {start + 2}, {start + 3},",
                     "choices": choices, "answer": 0})
    return rows


def test_embedded_paths_exist():
    paths = embedded_paths()
    assert paths.model_dir.is_dir() and paths.data_dir.is_dir() and paths.tasks_dir.is_dir()


def test_small_limit(model, tokenizer):
    result = evaluate_model(model, tokenizer, limit=16, batch_size=16)
    assert set(result) == {"accuracy", "accuracy_stderr", "task", "n", "raw", "samples", "results"}
    assert result["task"] == "fp8lab_embedded"
    assert result["n"] == 16
    assert 0.0 <= result["accuracy"] <= 1.0
    assert result["accuracy_stderr"] >= 0.0
    # per-item values of the primary metric: one row per document, averaging to the accuracy
    assert [row["doc_id"] for row in result["samples"]] == list(range(16))
    assert {row["metric"] for row in result["samples"]} == {"acc"}
    assert {row["value"] for row in result["samples"]} <= {0.0, 1.0}
    assert sum(row["value"] for row in result["samples"]) / 16 == pytest.approx(result["accuracy"])
    json.dumps(result["results"])  # plain JSON: configs' functions are strings
    assert result["results"]["results"]["fp8lab_embedded"]["acc,none"] == result["accuracy"]
    assert "samples" not in result["results"]


def test_base_model_is_near_chance(model, tokenizer):
    result = evaluate_model(model, tokenizer, limit=200, batch_size=64)
    assert result["n"] == 200
    assert result["accuracy"] < 0.5  # 4 choices: chance is 0.25


def test_matches_expected_accuracy_on_a_task_the_base_knows(model, tokenizer, tmp_path):
    """data_dir swaps in other JSONL rows; counting is in the pretraining corpus, so the base
    model scores near 100% there (and the scoring is not just returning chance)."""
    data = _write_rows(tmp_path / "counting", {"train": _counting_rows(4), "test": _counting_rows(24)})
    result = evaluate_model(model, tokenizer, data_dir=data, batch_size=32)
    assert result["n"] == 24
    assert result["accuracy"] > 0.9


def test_variant_task_from_include_path(model, tokenizer, tmp_path):
    """A user YAML that `include:`s fp8lab's template and points at its own data."""
    data = _write_rows(tmp_path / "data", {"train": _counting_rows(4), "test": _counting_rows(10)})
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    template = embedded_paths().tasks_dir / "_fp8lab_mc.yaml"
    (tasks / "my_counting.yaml").write_text(
        f"include: {template}\ntask: my_counting\nmetadata:\n  version: 0.1\n  data_dir: {data}\n"
    )
    result = evaluate_model(model, tokenizer, task="my_counting", include_path=tasks, batch_size=32)
    assert result["task"] == "my_counting" and result["n"] == 10


def test_peft_model_restores_mode_and_rng(model, tokenizer):
    """A PeftModel in training mode evaluates as-is; its mode and the global RNGs are restored."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    try:
        peft_model.train()
        torch.manual_seed(123)
        random.seed(123)
        expected = (torch.rand(1).item(), random.random())
        torch.manual_seed(123)
        random.seed(123)
        result = evaluate_model(peft_model, tokenizer, limit=8, batch_size=8)
        assert result["n"] == 8
        assert peft_model.training
        assert (torch.rand(1).item(), random.random()) == expected
    finally:
        peft_model.unload()


def test_unknown_task_has_did_you_mean():
    with pytest.raises(ValueError, match=r"unknown lm-eval task 'fp8lab_embeded'.*Did you mean 'fp8lab_embedded'"):
        check_task_exists("fp8lab_embeded")


def test_known_tasks_pass_the_check():
    check_task_exists("fp8lab_embedded")  # fp8lab's own: no full index needed


def test_bad_data_dir_and_include_path(model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="data_dir"):
        evaluate_model(model, tokenizer, data_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match="include_path"):
        check_task_exists("fp8lab_embedded", include_path=tmp_path / "missing")


def test_data_dir_requires_an_fp8lab_task(model, tokenizer, tmp_path):
    data = _write_rows(tmp_path / "data", {"train": _counting_rows(2), "test": _counting_rows(2)})
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "plain_json.yaml").write_text(
        "task: plain_json\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data / 'test.jsonl'}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: prompt\n"
        "doc_to_choice: choices\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n"
    )
    with pytest.raises(ValueError, match="only understood by fp8lab JSONL tasks"):
        evaluate_model(model, tokenizer, task="plain_json", include_path=tasks, data_dir=data)
