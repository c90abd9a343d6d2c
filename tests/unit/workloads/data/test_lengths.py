"""Row lengths decide before training: the default `train.max_seq_len` (from the data), the
refusal of a limit that cuts rows, and the steps of `train.epochs`; plus `data.chat_template`
for a model without one. Each through `workloads.preflight` where the orchestrator meets it."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config_loader import compose_config, to_container
from orchestrator.schema import validate_config
from orchestrator.trial_id import compute_trial_id
from workloads import preflight
from workloads.data.chat_template import training_tokenizer
from workloads.data.lengths import derived_max_seq_len, epoch_steps, loss_every_steps, measure, row_lengths
from workloads.embedded.paths import embedded_paths

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHAT = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}


@pytest.fixture(scope="module")
def base_config() -> dict:
    return to_container(compose_config([]))


def _config(base: dict, path: Path | str, train: dict | None = None, **data: Any) -> dict:
    config = copy.deepcopy(base)
    config["data"].update(path=str(path), **data)
    config["train"].update(train or {})
    config["eval"]["task"] = "another_task"  # the embedded task does not score these rows
    return config


def _data_problems(config: dict) -> list[str]:
    """What the preflight says about the data (the eval task here is a placeholder)."""
    preflight.check_many([])  # clear the per-process caches
    return [p for p in preflight.check_config(config) if not p.startswith("eval.")]


def _row_of(tokens: int, tokenizer: Any) -> dict:
    """A prompt/completion row of exactly `tokens` tokens as training tokenizes it."""
    row = {"prompt": "seven " * 55, "completion": "eight"}
    while _length(row, tokenizer) < tokens:
        row["prompt"] += "x"
    assert _length(row, tokenizer) == tokens
    return row


def _length(row: dict, tokenizer: Any) -> int:
    import datasets

    data_cfg = {**to_container(compose_config([]))["data"], "path": "x"}
    return row_lengths(datasets.Dataset.from_list([row]), data_cfg, tokenizer)[0]


def test_a_227_token_row_at_a_32_token_limit_is_refused_with_the_fix(tmp_path: Path, base_config: dict) -> None:
    tokenizer = training_tokenizer(base_config["model"], base_config["data"], embedded_paths().model_dir)
    (tmp_path / "d.jsonl").write_text(json.dumps(_row_of(227, tokenizer)) + "\n")
    problems = _data_problems(_config(base_config, tmp_path / "d.jsonl", {"max_seq_len": 32}))
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith("train.max_seq_len: 32 tokens cuts 1 of 1 training rows (100.0%; the longest has 227 tokens)")
    assert "85.9% of their tokens" in line  # 195 of 227 tokens cut
    assert "(fix: train.max_seq_len=240 to fit every row, or data.max_truncated_pct=100 to accept the cut)" in line
    # the fix it names works: the limit it proposes, or accepting the cut
    assert _data_problems(_config(base_config, tmp_path / "d.jsonl", {"max_seq_len": 240})) == []
    assert _data_problems(_config(base_config, tmp_path / "d.jsonl", {"max_seq_len": 32}, max_truncated_pct=100)) == []
    # and the default (null) fits the data: the row's length rounded up to 16
    config = _config(base_config, tmp_path / "d.jsonl")
    assert _data_problems(config) == [] and preflight.resolve_config(config)["train"]["max_seq_len"] == 240


def test_cut_above_the_model_positions_names_the_rows_to_shorten(tmp_path: Path, base_config: dict) -> None:
    long = {"prompt": "seven " * 200, "completion": "eight"}  # > the embedded model's 256 positions
    (tmp_path / "d.jsonl").write_text(json.dumps(long) + "\n")
    problems = _data_problems(_config(base_config, tmp_path / "d.jsonl"))
    assert len(problems) == 1 and problems[0].startswith("train.max_seq_len: 256 tokens cuts 1 of 1")
    assert "(fix: shorten or drop the rows over 256 tokens (the model's positions)" in problems[0]


def test_the_embedded_default_is_32_and_keeps_its_trial_id(base_config: dict) -> None:
    """All 3000 embedded training rows are 19 tokens: p99 = 19, rounded up to 16 -> 32 (= the old
    fixed default), under the model's 256 positions; the resolved config is the trial an explicit
    32 is, so the README's sweep keeps its trial ids."""
    assert base_config["train"]["max_seq_len"] is None
    assert _data_problems(base_config) == []
    resolved = preflight.resolve_config(base_config)
    assert resolved["train"]["max_seq_len"] == 32 and resolved["train"]["steps"] == 400
    explicit = to_container(compose_config(["train.max_seq_len=32"]))
    assert preflight.resolve_config(explicit) == explicit  # an explicit limit is kept as it is
    assert compute_trial_id(resolved) == compute_trial_id(explicit)


def test_derived_limit_percentile_rounding_and_cap() -> None:
    assert derived_max_seq_len([19] * 3000, 256) == 32
    assert derived_max_seq_len([100] * 99 + [5000], None) == 112  # one outlier in 100 rows does not set it
    assert derived_max_seq_len([1000] * 10, 512) == 512  # at most the model's positions
    cut = measure([10, 40, 50], 32)
    assert (cut.rows_cut, cut.tokens_cut, cut.longest) == (2, 26, 50)
    assert cut.rows_pct == pytest.approx(200 / 3) and cut.tokens_pct == pytest.approx(2600 / 100)


def test_epochs_become_steps_and_never_silently_lose_to_steps(tmp_path: Path, base_config: dict) -> None:
    assert epoch_steps(2, 100, 16, 1) == 14  # ceil(100 / 16) = 7 per epoch
    assert epoch_steps(1, 100, 8, 2) == 7 and epoch_steps(0.5, 100, 16, 1) == 4
    both = to_container(compose_config(["train.epochs=2"]))
    assert validate_config(both) == ["train.epochs: set together with train.steps=400; use one "
                                      "(fix: train.steps=null train.epochs=2, or train.epochs=null)"]
    epochs = to_container(compose_config(["train.steps=null", "train.epochs=2", "train.batch_size=16"]))
    assert validate_config(epochs) == []
    preflight.check_many([])
    assert preflight.check_config(epochs) == []
    assert preflight.resolve_config(epochs)["train"]["steps"] == 2 * 188  # 3000 rows / 16 -> 188 per epoch


def test_chat_template_key_for_a_model_without_one(tmp_path: Path, base_config: dict) -> None:
    (tmp_path / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    refused = _data_problems(_config(base_config, tmp_path / "chat.jsonl"))
    assert any(p.startswith("data.format: chat rows") and "data.chat_template=" in p for p in refused), refused
    (tmp_path / "chatml.jinja").write_text(CHATML)
    for template in (str(tmp_path / "chatml.jinja"), CHATML):  # a file or the text itself
        config = _config(base_config, tmp_path / "chat.jsonl", chat_template=template)
        assert _data_problems(config) == []
        tokenizer = training_tokenizer(config["model"], config["data"], embedded_paths().model_dir)
        assert tokenizer.apply_chat_template(CHAT["messages"], tokenize=False).startswith("<|im_start|>user\n2+2?")


@pytest.mark.parametrize("template, text", [("missing.jinja", "neither a Jinja template"),
                                            ("{% for m in messages %}", "not a valid Jinja template")])
def test_bad_chat_template_is_one_line(tmp_path: Path, base_config: dict, template: str, text: str) -> None:
    (tmp_path / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    problems = _data_problems(_config(base_config, tmp_path / "chat.jsonl", chat_template=template))
    assert len(problems) == 1 and problems[0].startswith("data.chat_template: ") and text in problems[0], problems
    assert "(fix: " in problems[0]


def test_held_out_loss_every_epoch() -> None:
    assert loss_every_steps("epoch", 3000, 16, 1) == 188 and loss_every_steps("epoch", 3000, 8, 2) == 188
    assert loss_every_steps(200, 3000, 16, 1) == 200
    assert validate_config(to_container(compose_config(["eval.loss_every=epoch"]))) == []
    assert validate_config(to_container(compose_config(["eval.loss_every=epochs"])))[0].startswith(
        "eval.loss_every: must be an integer >= 0, or epoch, got 'epochs'")
