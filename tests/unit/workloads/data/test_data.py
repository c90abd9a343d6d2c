"""Training data the way users have it: multiple choice, prompt/completion and chat rows, from
JSONL, Parquet or a save_to_disk folder, loaded by `datasets`; the loss only where it belongs
(labels -100 elsewhere); and each format trains on the embedded model in-process."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.config_loader import compose_config, to_container
from workloads.data.load import batches, load_training_data
from workloads.embedded.paths import embedded_paths
from workloads.model.loading import load_base_model

MC = {"prompt": "Which is largest: 3, 8?\nAnswer:", "choices": ["3", "8"], "answer": 1}
PC = {"prompt": "Twice 4 is", "completion": "eight"}
CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "Again"},
                     {"role": "assistant", "content": "bye now"}]}


@pytest.fixture(scope="module")
def base_config() -> dict:
    return to_container(compose_config(["train.max_seq_len=128", "train.steps=2", "train.batch_size=2",
                                        "train.warmup_steps=0", "train.log_every=1", "precision.telemetry.enabled=false"]))


def _config(base: dict, path: Path, **data: Any) -> dict:
    config = copy.deepcopy(base)
    config["data"].update(path=str(path), **data)
    return config


def _tokenizer(model_dir: Path | None = None) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir or embedded_paths().model_dir))


def _load(config: dict, tokenizer: Any):
    return load_training_data(config["data"], tokenizer, config["train"]["max_seq_len"], embedded_paths().data_dir)


def _trained_text(data, tokenizer, row: int = 0) -> str:
    labels = data.labels[row]
    return tokenizer.decode(labels[labels != -100].tolist())


def test_multiple_choice_loss_is_on_the_answer_only(tmp_path: Path, base_config: dict) -> None:
    (tmp_path / "mc.jsonl").write_text(json.dumps(MC) + "\n")
    tokenizer = _tokenizer()
    data = _load(_config(base_config, tmp_path / "mc.jsonl"), tokenizer)
    n_prompt = len(tokenizer(MC["prompt"])["input_ids"])
    n_full = int(data.attention_mask[0].sum())
    assert (data.labels[0, :n_prompt] == -100).all()  # every prompt token masked
    assert (data.labels[0, n_prompt:n_full] == data.input_ids[0, n_prompt:n_full]).all()
    assert _trained_text(data, tokenizer).strip() == "8"


@pytest.mark.parametrize("storage", ["jsonl", "parquet", "save_to_disk"])
def test_prompt_completion_from_every_storage(tmp_path: Path, base_config: dict, storage: str) -> None:
    import datasets

    rows = [PC, {"prompt": "Three plus one is", "completion": "four"}]
    dataset = datasets.Dataset.from_list(rows)
    path = {"jsonl": tmp_path / "pc.jsonl", "parquet": tmp_path / "pc.parquet", "save_to_disk": tmp_path / "saved"}[storage]
    if storage == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif storage == "parquet":
        dataset.to_parquet(str(path))
    else:
        datasets.DatasetDict({"train": dataset}).save_to_disk(str(path))
    tokenizer = _tokenizer()
    data = _load(_config(base_config, path), tokenizer)  # format: auto -> prompt_completion
    assert len(data) == 2
    assert [_trained_text(data, tokenizer, i).strip() for i in range(2)] == ["eight", "four"]
    n_prompt = len(tokenizer(PC["prompt"])["input_ids"])
    assert (data.labels[0, :n_prompt] == -100).all()


def test_chat_loss_is_on_every_assistant_turn(tmp_path: Path, base_config: dict, chat_model_dir: Path) -> None:
    (tmp_path / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    tokenizer = _tokenizer(chat_model_dir)
    data = _load(_config(base_config, tmp_path / "chat.jsonl", format="chat"), tokenizer)
    trained = data.labels[0] != -100
    # the trained tokens are exactly the two assistant replies with their end-of-turn markers
    assert _trained_text(data, tokenizer).replace(" ", "") == "hello<|im_end|>\nbyenow<|im_end|>\n".replace(" ", "")
    first = int(trained.nonzero()[0])
    header = tokenizer.decode(data.input_ids[0, :first].tolist())
    assert header.replace(" ", "").endswith("Hithere<|im_end|>\n<|im_start|>assistant\n")  # prompt side masked
    assert not trained[: first].any() and "Again" not in _trained_text(data, tokenizer)


def _train_two_steps(config: dict, model_dir: Path | None = None) -> Any:
    from workloads.model.loading import attach_lora
    from workloads.precision.backends import apply_backend, select_backend
    from workloads.precision.policy import get_policy
    from workloads.precision.telemetry import Fp8Telemetry
    from workloads.train.loop import run_training
    from workloads.recipe import loop_settings

    cpu = torch.device("cpu")
    if model_dir is not None:
        config["model"]["name_or_path"] = str(model_dir)
    model, tokenizer = load_base_model(config["model"], embedded_paths().model_dir, cpu)
    data = _load(config, tokenizer)
    model = attach_lora(model, config["lora"], 0)
    telemetry = Fp8Telemetry(underflow_threshold_pct=10.0)
    handle = apply_backend(model, get_policy("bf16"), telemetry, select_backend("emulated", cpu))
    settings = loop_settings(config["train"], config["precision"]["telemetry"])
    return run_training(model, handle, telemetry, lambda start: batches(data, 2, settings.steps, 0, start), settings, _NoLogger())


class _NoLogger:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@pytest.fixture
def one_thread() -> Any:
    """A tiny model on a busy 2-core runner: extra threads only add sync overhead."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", ["multiple_choice", "prompt_completion", "chat"])
@pytest.mark.usefixtures("one_thread")
def test_each_format_trains_on_the_embedded_model(tmp_path: Path, base_config: dict, chat_model_dir: Path, fmt: str) -> None:
    row = {"multiple_choice": MC, "prompt_completion": PC, "chat": CHAT}[fmt]
    (tmp_path / "d.jsonl").write_text((json.dumps(row) + "\n") * 4)
    result = _train_two_steps(_config(base_config, tmp_path / "d.jsonl", format=fmt), chat_model_dir if fmt == "chat" else None)
    assert result.status == "FINISHED" and result.steps_done == 2 and math.isfinite(result.final_loss) and result.final_loss > 0


class _ThinkingTemplate:
    """Like templates that drop the reasoning of assistant turns before the last user message: a
    turn renders differently once later turns exist, so its boundaries cannot come from prefixes."""

    def apply_chat_template(self, messages: list[dict], tokenize: bool, add_generation_prompt: bool) -> str:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        turns = [f"<{m['role']}>{m['content'].split('|')[-1] if m['role'] == 'assistant' and i < last_user else m['content']}</>"
                 for i, m in enumerate(messages)]
        return "".join(turns) + ("<assistant>" if add_generation_prompt else "")


def test_chat_template_that_rewrites_earlier_turns_trains_the_final_turn_only() -> None:
    from workloads.data.formats import chat_segments

    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "think|one"},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "think|two"}]
    segments = chat_segments(messages, _ThinkingTemplate())
    assert [s.text for s in segments if s.trained] == ["think|two</>"]
    assert "".join(s.text for s in segments) == _ThinkingTemplate().apply_chat_template(messages, False, False)


def test_row_chunks_give_every_row_once_in_order_with_its_index() -> None:
    """`row_chunks` replaces row-by-row iteration of a Dataset (12x less CPU): the same dicts in
    the same order, the last chunk short, each chunk starting at its first row's index."""
    import datasets

    from workloads.data.load import row_chunks

    rows = datasets.Dataset.from_list([{"prompt": f"row {i}", "completion": str(i), "n": i} for i in range(10)])
    chunks = list(row_chunks(rows, size=4))
    assert [(start, len(chunk)) for start, chunk in chunks] == [(0, 4), (4, 4), (8, 2)]
    assert [row for _, chunk in chunks for row in chunk] == list(rows)
    assert all(chunk[0]["n"] == start for start, chunk in chunks)
    assert list(row_chunks(rows.select([]))) == []
