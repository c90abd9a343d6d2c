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


def test_data_derived_limit_is_the_trials_param_and_its_cut_is_logged(tmp_path: Path) -> None:
    from tests.integration.conftest import client_for, read_json

    rows = [{"prompt": "seven " * 40, "completion": "eight"}, {"prompt": "Twice 4 is", "completion": "eight"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "result.json"
    run_cli(["trial", "data.path=./d.jsonl", "eval.task=fp8lab_embedded", "eval.limit=4", "train.steps=2",
             "train.batch_size=2", "train.warmup_steps=0", "train.log_every=1", "tracking.log_adapter=false",
             f"trial.output={out}"], tmp_path)
    result = read_json(out)
    assert result["status"] == "FINISHED", result
    run = client_for(tmp_path).get_run(result["mlflow_run_id"])
    longest = int(run.data.metrics["data/longest_row_tokens"])
    assert int(run.data.params["train.max_seq_len"]) == run.data.metrics["data/max_seq_len"] == -(-longest // 16) * 16
    assert run.data.metrics["data/truncated_rows_pct"] == 0.0 and run.data.metrics["data/rows"] == 2.0
