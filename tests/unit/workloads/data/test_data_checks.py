"""Data preflight: one bad input per case, each reported as one line naming the field, the file
and the line (or row), with a fix; every problem of every split file at once; nothing written."""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from orchestrator.config_loader import compose_config, to_container
from workloads.data.checks import check_data_inputs
from workloads.eval.harness import embedded_paths

GOOD = {"prompt": "Which is largest: 1, 9?", "choices": ["1", "9"], "answer": 1}

@pytest.fixture(scope="module")
def base_config() -> dict:
    return to_container(compose_config([]))


def _lines(*rows: object) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def _write(files: dict[str, bytes]) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        for name, content in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(content)
    return setup


def _parquet(rows: list[dict]) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(folder / "d.parquet"))
    return setup


def _saved(splits: dict[str, list[dict]]) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        import datasets

        datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(str(folder / "saved"))
    return setup


@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[Path], None]
    data: dict  # data.* overrides; "path" is relative to the test folder
    expected: list[tuple[str, str]]  # per problem line: (field it starts with, text it contains)


CASES = [
    Case("invalid-json", _write({"d.jsonl": _lines(GOOD, b'{"prompt": "broken",', GOOD)}), {"path": "d.jsonl"},
         [("data.path", "d.jsonl line 2 is not valid JSON")]),
    Case("not-utf8", _write({"d.jsonl": _lines(GOOD, b'{"prompt": "caf\xe9", "choices": ["a", "b"], "answer": 0}')}),
         {"path": "d.jsonl"}, [("data.path", "d.jsonl line 2 is not UTF-8 text (byte 0xe9")]),
    Case("choices-not-a-list", _write({"d.jsonl": _lines(GOOD, {**GOOD, "choices": "1234"})}), {"path": "d.jsonl"},
         [("data.choices_field", "line 2 'choices' must be a list of at least 2 non-empty strings, got str '1234'")]),
    Case("prompt-null-and-empty", _write({"d.jsonl": _lines({**GOOD, "prompt": None}, GOOD, {**GOOD, "prompt": " "})}),
         {"path": "d.jsonl"}, [("data.prompt_field", "line 1 'prompt' is null (and 1 more line)")]),
    Case("field-missing", _write({"d.jsonl": _lines(GOOD)}), {"path": "d.jsonl", "prompt_field": "question"},
         [("data.prompt_field", "line 1 has no field 'question'")]),
    Case("answer-out-of-range", _write({"d.jsonl": _lines({**GOOD, "answer": 7})}), {"path": "d.jsonl"},
         [("data.answer_field", "answer 7 is not an index into 2 choices")]),
    Case("file-empty", _write({"d.jsonl": b"\n"}), {"path": "d.jsonl"}, [("data.path", "has no examples")]),
    Case("format-fields-missing", _write({"d.jsonl": _lines(GOOD)}), {"path": "d.jsonl", "format": "prompt_completion"},
         [("data.completion_field", "line 1 has no field 'completion'")]),
    Case("format-ambiguous", _write({"d.jsonl": _lines({**GOOD, "completion": "9"})}), {"path": "d.jsonl"},
         [("data.format", "auto matches multiple_choice and prompt_completion")]),
    Case("completion-empty", _write({"d.jsonl": _lines({"prompt": "p", "completion": ""})}), {"path": "d.jsonl"},
         [("data.completion_field", "'completion' is empty")]),
    Case("chat-content-null", _write({"d.jsonl": _lines({"messages": [{"role": "user", "content": None},
                                                                      {"role": "assistant", "content": "hi"}]})}),
         {"path": "d.jsonl"}, [("data.messages_field", "message 0 (user) has content NoneType None"),
                               ("data.format", "embedded has none")]),  # and the embedded tokenizer has no template
    Case("parquet-prompt-null", _parquet([GOOD, {**GOOD, "prompt": None}]), {"path": "d.parquet"},
         [("data.prompt_field", "d.parquet row 2 'prompt' is null")]),
    Case("saved-dataset-bad-split", _saved({"train": [GOOD], "validation": [{**GOOD, "choices": ["only"]}]}), {"path": "saved"},
         [("data.choices_field", "split 'validation' row 1 'choices' must be a list"),
          ("data.path", "train.jsonl, test.jsonl missing")]),  # the embedded task reads <split>.jsonl files only
    # a data folder: every split file is checked, and the embedded task reads validation/test.jsonl too
    Case("folder-validation-malformed", _write({"f/train.jsonl": _lines(GOOD), "f/test.jsonl": _lines(GOOD),
                                                "f/validation.jsonl": _lines(GOOD, b"[1, 2]")}), {"path": "f"},
         [("data.path", "f/validation.jsonl line 2 is not a JSON object")]),
    Case("folder-eval-needs-index", _write({"f/train.jsonl": _lines(GOOD), "f/test.jsonl": _lines({**GOOD, "answer": "9"})}),
         {"path": "f"}, [("data.answer_field", "test.jsonl (read by eval.task=fp8lab_embedded) line 1 answer '9' is text")]),
    Case("folder-chat-with-embedded-eval", _write({"f/train.jsonl": _lines({"prompt": "p", "completion": "c"}),
                                                   "f/test.jsonl": _lines({"prompt": "p", "completion": "c"})}),
         {"path": "f"}, [("eval.task", "scores"), ]),
    Case("all-problems-together", _write({"d.jsonl": _lines({**GOOD, "prompt": None}, b"{", {**GOOD, "choices": "12"}, b"\xff")}),
         {"path": "d.jsonl"}, [("data.prompt_field", "line 1"), ("data.path", "line 2 is not valid JSON"),
                               ("data.choices_field", "line 3"), ("data.path", "line 4 is not UTF-8")]),
]


def _check(tmp_path: Path, base_config: dict, data: dict, model: dict | None = None, task: str | None = None) -> list[str]:
    config = copy.deepcopy(base_config)
    config["eval"]["task"] = task or config["eval"]["task"]
    config["data"].update({k: (str(tmp_path / v) if k == "path" and v != "embedded" else v) for k, v in data.items()})
    config["model"].update(model or {})
    paths = embedded_paths()
    return check_data_inputs(config, paths.data_dir, paths.model_dir)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_data_is_one_line_per_problem(case: Case, tmp_path: Path, base_config: dict) -> None:
    case.setup(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    problems = _check(tmp_path, base_config, case.data)
    assert len(problems) == len(case.expected), problems
    for (key, text), line in zip(sorted(case.expected), sorted(problems)):
        assert line.startswith(f"{key}: ") and text in line and "(fix: " in line, (key, text, line)
    assert sorted(tmp_path.rglob("*")) == before  # checking writes nothing


def test_good_data_of_every_format_passes(tmp_path: Path, base_config: dict, chat_model_dir: Path) -> None:
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "4"}]}
    _write({"mc.jsonl": _lines(GOOD), "pc.jsonl": _lines({"prompt": "2+2=", "completion": "4"}), "chat.jsonl": _lines(chat)})(tmp_path)
    _saved({"train": [GOOD], "test": [GOOD]})(tmp_path)
    for path in ("mc.jsonl", "pc.jsonl"):
        assert _check(tmp_path, base_config, {"path": path}) == [], path
    assert _check(tmp_path, base_config, {"path": "saved"}, task="another_task") == []
    assert _check(tmp_path, base_config, {"path": "chat.jsonl"}, {"name_or_path": str(chat_model_dir)}) == []
    assert _check(tmp_path, base_config, {"path": "embedded"}) == []
