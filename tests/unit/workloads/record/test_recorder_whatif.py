"""The recorder writes the what-if telemetry as its own Parquet artifact, next to telemetry.parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab_conf.contracts import WHATIF_COLUMNS, WHATIF_PATH
from workloads.record.recorder import TrialRecorder


class _Files:
    """Keeps what ``log_file`` is handed (the recorder deletes its temp file afterwards)."""

    def __init__(self) -> None:
        self.files: dict[str, pd.DataFrame] = {}

    def log_file(self, path: Path, artifact_dir: str) -> None:
        self.files[f"{artifact_dir}/{Path(path).name}"] = pd.read_parquet(path)

    def __getattr__(self, name: str) -> Any:  # every other logger call: not under test
        return lambda *args, **kwargs: None


def test_whatif_rows_become_telemetry_whatif_parquet_and_none_write_nothing():
    files = _Files()
    recorder = TrialRecorder("sqlite:///unused.db", "run", logger=files)
    recorder.whatif([])
    assert files.files == {}
    row = {"step": 10, "layer": "l0", "kind": "activation", "recipe": "mxfp8", "underflow_pct": 0.5,
           "overflow_pct": 0.1, "mse": 1e-6, "numel": 64}  # fmt: skip
    recorder.whatif([row])
    frame = files.files[WHATIF_PATH]
    assert tuple(frame.columns) == WHATIF_COLUMNS and frame.iloc[0]["recipe"] == "mxfp8"
