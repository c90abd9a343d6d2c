"""Bad input catalogue: every case runs the real CLI in an empty folder and must end with exit
code 2, one `fp8lab: error:` line per problem (naming the field and the fix), no MLflow store,
no Ray started and no file left behind.

Config mistakes are caught by Hydra + the schema in the CLI process (a few seconds); mistakes
about the world (files, GPUs, lm-eval tasks, addresses, folders) by the preflight checks, which
import the training stack but still run before any MLflow run or Ray worker exists.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tests.integration.conftest import run_cli

pytestmark = pytest.mark.integration

ONE_CELL = ["sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]"]


@dataclass(frozen=True)
class Case:
    id: str
    command: str  # trial | sweep
    args: list[str]
    fields: list[str]  # one error line per field, each naming it
    setup: Callable[[Path], None] | None = None
    contains: list[str] = field(default_factory=list)  # extra text the errors must carry


def _jsonl(name: str, rows: list[str]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        (folder / name).write_text("".join(r + "\n" for r in rows))
    return write


GOOD_ROW = json.dumps({"prompt": "Which is largest?", "choices": ["1", "9"], "answer": 1})


def _bad_data_folder(folder: Path) -> None:
    """`"prompt": null` (trained on "None" before), non-UTF-8 bytes, `"choices": "1234"`."""
    (folder / "d").mkdir()
    (folder / "d" / "train.jsonl").write_text(GOOD_ROW + "\n" + GOOD_ROW.replace('"Which is largest?"', "null") + "\n")
    (folder / "d" / "validation.jsonl").write_bytes(GOOD_ROW.replace("largest", "gr\u00f6\u00dfte").encode("latin-1") + b"\n")
    (folder / "d" / "test.jsonl").write_text(GOOD_ROW.replace('["1", "9"]', '"1234"') + "\n")


def _model_without_weights(folder: Path) -> None:
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))


def _read_only_folder(folder: Path) -> None:
    (folder / "ro").mkdir()
    (folder / "ro").chmod(stat.S_IRUSR | stat.S_IXUSR)


def _unwritable() -> str:
    """A folder this process cannot create files in. Root ignores permission bits, so as root
    use sysfs, which refuses new files to everyone."""
    return "/sys/kernel" if os.geteuid() == 0 else "ro"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


CASES = [
    # --- config: Hydra + schema, in the CLI process --------------------------------------------
    Case("unknown-policy", "trial", ["precision=fp8_nave"], ["precision=fp8_nave"], contains=["did you mean fp8_naive?"]),
    Case("unknown-policy-sweep-axis", "sweep", ["sweep.axes.precision=[bf16,fp8_protectd]", "sweep.axes.seed=[0]"],
         ["precision=fp8_protectd"], contains=["did you mean fp8_protected?"]),
    Case("unknown-key", "trial", ["lora.rr=16"], ["lora.rr"], contains=["did you mean lora.r?"]),
    Case("unknown-key-appended", "trial", ["+train.lrr=0.1"], ["train.lrr"], contains=["did you mean train.lr?"]),
    Case("unknown-group-option", "trial", ["model=llama"], ["model=llama"], contains=["available: embedded"]),
    Case("lr-not-a-number", "trial", ["train.lr=abc"], ["train.lr"]),
    Case("steps-not-a-number", "trial", ["train.steps=ten"], ["train.steps"]),
    Case("bool-not-a-bool", "trial", ["model.trust_remote_code=maybe"], ["model.trust_remote_code"]),
    Case("lr-negative", "trial", ["train.lr=-2e-4"], ["train.lr"]),
    Case("lr-zero", "sweep", ["train.lr=0", *ONE_CELL], ["train.lr"]),
    Case("rank-zero", "trial", ["lora.r=0"], ["lora.r"]),
    Case("rank-negative", "sweep", ["lora.r=-8", *ONE_CELL], ["lora.r"]),
    Case("steps-zero", "trial", ["train.steps=0"], ["train.steps"]),
    Case("steps-negative", "sweep", ["train.steps=-5", *ONE_CELL], ["train.steps"]),
    Case("seed-not-integer", "trial", ["seed=1.5"], ["seed"]),
    Case("sweep-seeds-not-integers", "sweep", ["sweep.axes.seed=[0,a]"], ["sweep.axes.seed"]),
    Case("sweep-axis-unknown-key", "sweep", ["sweep.axes.lora.rank=[8,16]"], ["sweep.axes.lora.rank"]),
    Case("sweep-axis-empty", "sweep", ["sweep.axes.seed=[]"], ["sweep.axes.seed"]),
    Case("choice-misspelled", "trial", ["train.lr_schedule=cosinus"], ["train.lr_schedule"]),
    Case("dropout-out-of-range", "trial", ["lora.dropout=1.5"], ["lora.dropout"]),
    Case("cpus-per-trial-zero", "sweep", ["cluster.cpus_per_trial=0", *ONE_CELL], ["cluster.cpus_per_trial"]),
    Case("override-unparsable", "trial", ["train.lr=[1"], ["train.lr"]),
    Case("config-dir-missing", "trial", ["--config-dir", "no-such-dir"], ["--config-dir"]),
    Case("three-config-errors-at-once", "trial", ["lora.r=0", "train.lr=0", "train.steps=0"],
         ["lora.r", "train.lr", "train.steps"]),
    # --- the world: preflight, before any MLflow run or Ray worker ------------------------------
    Case("model-folder-without-weights", "sweep", ["model.name_or_path=./model", *ONE_CELL], ["model.name_or_path"],
         setup=_model_without_weights, contains=["no weights"]),
    Case("dataset-row-without-prompt-field", "trial", ["data.path=./d.jsonl", "data.prompt_field=question"],
         ["data.prompt_field"], setup=_jsonl("d.jsonl", [GOOD_ROW]), contains=["line 1 has no field 'question'"]),
    Case("dataset-empty", "trial", ["data.path=./d.jsonl"], ["data.path"], setup=_jsonl("d.jsonl", []),
         contains=["no examples"]),
    Case("dataset-malformed-line", "sweep", ["data.path=./d.jsonl", *ONE_CELL], ["data.path"],
         setup=_jsonl("d.jsonl", [GOOD_ROW, GOOD_ROW, '{"prompt": "broken",', GOOD_ROW]), contains=["line 3"]),
    # every split file of a data folder, all problems at once (the data folder's validation.jsonl is what eval reads)
    Case("dataset-folder-bad-rows-in-every-split", "sweep", ["data.path=./d", *ONE_CELL],
         ["data.prompt_field", "data.path", "data.choices_field"], setup=_bad_data_folder,
         contains=["d/train.jsonl line 2 'prompt' is null", "d/validation.jsonl line 1 is not UTF-8",
                   "d/test.jsonl line 1 'choices' must be a list"]),
    Case("lm-eval-task-unknown", "trial", ["eval.task=no_such_task_xyz"], ["eval.task"], contains=["no_such_task_xyz"]),
    Case("eval-task-and-tasks-together", "trial", ["eval.task=fp8lab_embedded", "eval.tasks=[fp8lab_embedded]"],
         ["eval.task"]),
    Case("cuda-device-without-gpu", "trial", ["train.device=cuda"], ["train.device"]),
    Case("gpu-per-trial-without-gpu", "sweep", ["cluster.gpus_per_trial=1", *ONE_CELL], ["cluster.gpus_per_trial"]),
    Case("cluster-address-unreachable", "sweep", ["cluster.address=127.0.0.1:{port}", *ONE_CELL], ["cluster.address"],
         contains=["nothing answers"]),
    Case("output-folder-unwritable", "trial", ["trial.output={unwritable}/result.json"], ["trial.output"],
         setup=_read_only_folder, contains=["not writable"]),
    Case("report-folder-unwritable", "sweep", ["report.out={unwritable}/report", *ONE_CELL], ["report.out"],
         setup=_read_only_folder),
    # missing model folder + missing dataset file + missing output folder, reported together
    Case("model-data-output-missing-at-once", "sweep",
         ["model.name_or_path=./no-model", "data.path=./no-data.jsonl", "report.out=./no-file/report", *ONE_CELL],
         ["model.name_or_path", "data.path", "report.out"], setup=lambda d: (d / "no-file").write_text(""),
         contains=["folder ./no-model does not exist", "./no-data.jsonl does not exist"]),
]


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case: Case, tmp_path: Path) -> None:
    if case.setup:
        case.setup(tmp_path)
    before = _files(tmp_path)
    args = [a.format(port=_closed_port(), unwritable=_unwritable()) for a in case.args]
    started = time.monotonic()
    proc = run_cli([case.command, *args], tmp_path, timeout=180, check=False)
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr

    assert proc.returncode == 2, output[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fp8lab: error:")]
    assert len(errors) == len(case.fields), errors
    for wanted in case.fields:
        assert sum(wanted in line for line in errors) >= 1, (wanted, errors)
    for line in errors:
        assert "fix" in line or "did you mean" in line, line  # every line says how to fix it
    for text in case.contains:
        assert text in output, (text, errors)
    assert "Traceback" not in output, output[-3000:]
    # nothing written, nothing started
    assert _files(tmp_path) == before, sorted(_files(tmp_path) - before)
    assert "Token authentication is enabled" not in output, "Ray was started for bad input"
    print(f"{case.id}: {elapsed:.1f}s")
