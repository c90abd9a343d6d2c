"""The synthetic corpus and task generators are pure functions of the seed, and the shipped
task files are exactly what the generator makes."""
from __future__ import annotations

import json

from workloads.embedded import synth
from workloads.eval.harness import embedded_paths


def test_corpus_is_deterministic_in_seed():
    first = list(synth.pretraining_corpus(0, 300))
    assert first == list(synth.pretraining_corpus(0, 300))
    assert first != list(synth.pretraining_corpus(1, 300))
    assert all(isinstance(doc, str) and doc for doc in first)


def test_corpus_never_states_the_task():
    """The base must not learn the downstream question from pretraining."""
    docs = synth.pretraining_corpus(0, 5000)
    assert not any(synth.TASK_QUESTION in doc or "largest number" in doc for doc in docs)


def test_task_is_deterministic_and_splits_are_disjoint():
    sizes = {"train": 200, "validation": 20, "test": 50}
    task = synth.make_task(0, sizes)
    assert task == synth.make_task(0, sizes)
    assert task != synth.make_task(1, sizes)
    assert {k: len(v) for k, v in task.items()} == sizes
    prompts = [row["prompt"] for rows in task.values() for row in rows]
    assert len(prompts) == len(set(prompts))


def test_task_rows_are_correct():
    for row in synth.make_task(3, {"test": 200})["test"]:
        numbers = [int(c) for c in row["choices"]]
        assert len(set(numbers)) == synth.N_CHOICES
        assert numbers[row["answer"]] == max(numbers)
        assert row["prompt"].startswith(synth.TASK_QUESTION)
        assert ", ".join(row["choices"]) in row["prompt"]


def test_answer_positions_are_balanced():
    rows = synth.make_task(0, {"train": 2000})["train"]
    counts = [sum(r["answer"] == k for r in rows) for k in range(synth.N_CHOICES)]
    assert min(counts) > 0.2 * len(rows)


def test_shipped_task_files_match_the_generator():
    info = json.loads((embedded_paths().model_dir.parent / "BUILD_INFO.json").read_text())
    sizes = info["task"]["sizes"]
    expected = synth.make_task(info["seed"], sizes)
    for split, rows in expected.items():
        lines = (embedded_paths().data_dir / f"{split}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == rows


def test_shipped_jsonl_schema():
    for split in ("train", "validation", "test"):
        path = embedded_paths().data_dir / f"{split}.jsonl"
        for line in path.read_text().splitlines():
            row = json.loads(line)
            assert set(row) == {"prompt", "choices", "answer"}
            assert isinstance(row["prompt"], str)
            assert isinstance(row["choices"], list) and all(isinstance(c, str) for c in row["choices"])
            assert isinstance(row["answer"], int) and 0 <= row["answer"] < len(row["choices"])
