"""Integration fixtures: run the real `fp8lab` CLI in a temp folder on the embedded model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

# Tiny but real: a few optimizer steps, a small eval slice, one thread per trial.
TINY = ["train.steps=6", "train.log_every=2", "precision.telemetry.every=2", "train.warmup_steps=1",
        "eval.limit=16", "train.num_threads=1"]


def run_cli(args: list[str], cwd: Path, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"fp8lab {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def store_uri(workdir: Path) -> str:
    return f"sqlite:///{workdir}/mlflow.db"


def client_for(workdir: Path) -> MlflowClient:
    return MlflowClient(store_uri(workdir))


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
