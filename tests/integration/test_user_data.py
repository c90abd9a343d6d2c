"""User data through the CLI: a limit that cuts the rows is refused by a sweep (the preflight
child) and by `fp8lab trial`, one line with the fix, exit 2, nothing written; the data-derived
limit reaches the trial's params."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import run_cli

LONG = {"prompt": "seven " * 60, "completion": "eight"}  # > 32 tokens on the embedded tokenizer
ONE_CELL = ["sweep.axes.seed=[0]", "sweep.axes.precision=[bf16]"]


@pytest.mark.parametrize("command", ["sweep", "trial"])
def test_truncating_limit_is_refused_before_anything_is_written(tmp_path: Path, command: str) -> None:
    (tmp_path / "d.jsonl").write_text(json.dumps(LONG) + "\n")
    before = sorted(tmp_path.rglob("*"))
    args = ["data.path=./d.jsonl", "train.max_seq_len=32", "eval.task=fp8lab_embedded", *(ONE_CELL if command == "sweep" else [])]
    proc = run_cli([command, *args], tmp_path, timeout=300, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fp8lab: error:")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith("fp8lab: error: train.max_seq_len: 32 tokens cuts 1 of 1 training rows")
    assert "(fix: train.max_seq_len=" in errors[0]
    assert sorted(tmp_path.rglob("*")) == before
