"""`fp8lab data preview`: rows rendered with exactly the trained tokens marked, their counts, and
the truncation of the whole split (with the refusal a trial would get); bad rows exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _preview(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["data", "preview", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_prompt_completion_rows_mark_the_completion_and_the_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"prompt": "Twice 4 is", "completion": "eight"}, {"prompt": "seven" + " seven" * 15, "completion": "nine"}]
    (tmp_path / "pc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = _preview(capsys, f"data.path={tmp_path / 'pc.jsonl'}", "train.max_seq_len=16", "-n", "2")
    assert code == 0
    assert "<s>Twice 4 is[[ eight]]\n" in out  # only the completion is trained (the loss mask)
    assert "-- row 0: 12 tokens, 4 trained, nothing cut" in out
    assert "-- row 1: 67 tokens, 3 trained, 51 cut from the start to fit" in out
    assert "seven seven[[ nine]]\n" in out  # the cut row keeps its end
    assert "truncation: 1 of 2 rows (50.0%) and 51 of 79 tokens (64.6%) cut" in out
    assert "a trial would be refused: train.max_seq_len: 16 tokens cuts 1 of 2 training rows" in out


def test_chat_rows_with_a_chat_template_key_train_the_assistant_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chat = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    (tmp_path / "chat.jsonl").write_text(json.dumps(chat) + "\n")
    (tmp_path / "chatml.jinja").write_text(CHATML)
    code, out, _ = _preview(capsys, f"data.path={tmp_path / 'chat.jsonl'}", f"data.chat_template={tmp_path / 'chatml.jinja'}")
    assert code == 0
    assert "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n[[4<|im_end|>\n]]" in out
    assert "train.max_seq_len=64 (from the data" in out  # 57 tokens, rounded up to 16


def test_tokens_view_and_the_embedded_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _preview(capsys, "-n", "1", "--tokens")
    assert code == 0 and "train.max_seq_len=32 (from the data" in out
    assert "truncation: 0 of 3000 rows (0.0%)" in out
    assert "Answer(390, -100) :(28, -100) [[Ġ89(619, 619)]]" in out  # Axolotl's text(id, label)


def test_bad_rows_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": None, "completion": "x"}) + "\n")
    code, out, err = _preview(capsys, f"data.path={tmp_path / 'bad.jsonl'}", "data.format=prompt_completion")
    assert code == 2 and out == ""
    assert err.startswith("fp8lab: error: data.prompt_field: training row 0 'prompt' is null") and len(err.splitlines()) == 1, err
