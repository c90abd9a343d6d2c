"""A broken model folder and a trial that cannot fit are refused by the real CLI before Ray or
MLflow start: exit 2, one line per problem, nothing written."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import run_cli

pytestmark = pytest.mark.integration

EMBEDDED = Path(__file__).resolve().parents[2] / "workloads" / "embedded" / "assets" / "base_model"
ONE_CELL = ["sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]"]


def _refused(args: list[str], workdir: Path) -> list[str]:
    before = set(workdir.iterdir())
    proc = run_cli(args, workdir, check=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert set(workdir.iterdir()) == before  # no store, no lock, no report
    return [line for line in proc.stderr.splitlines() if line.strip()]


def test_truncated_weights_and_impossible_trials_are_refused_before_work(tmp_path: Path, tmp_path_factory) -> None:
    workdir = tmp_path  # bare: the check is that nothing, a store included, gets written
    model = Path(shutil.copytree(EMBEDDED, tmp_path_factory.mktemp("models") / "model"))
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])  # an interrupted download
    lines = _refused(["sweep", f"model.name_or_path={model}", *ONE_CELL], workdir)
    assert len(lines) == 1 and lines[0].startswith("fp8lab: error: model.name_or_path: ") and "truncated" in lines[0], lines

    lines = _refused(["sweep", "lora.r=4096", "train.max_seq_len=100000", *ONE_CELL], workdir)  # within the schema's bounds
    assert [line.split(":")[2].strip() for line in lines] == ["train.max_seq_len", "lora.r"], lines
