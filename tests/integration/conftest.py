"""Integration fixtures: run the real `fp8lab` CLI in a temp folder on the embedded model."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import filelock
import pytest
from mlflow.tracking import MlflowClient

# Tiny but real: a few optimizer steps, a small eval slice, one thread per trial.
TINY = ["train.steps=6", "train.log_every=2", "precision.telemetry.every=2", "train.warmup_steps=1",
        "eval.limit=16", "train.num_threads=1"]


# For the tests of orchestration (retries, resumes, task plumbing, early stop) whose trials happen to
# run an FP8 policy: eager casts instead of the compiled ones (FP8LAB_FUSED_CASTS, see
# workloads/precision/formats.py). Compiling cost a TINY fp8_naive `fp8lab trial` ~5 s more CPU
# than eager casts with a warm inductor cache, and one kernel ~12 s more with a cold one (a fresh
# CI machine), for a 6-step trial that never repays it; both paths give the same bits (tests/unit/workloads/precision), and the CLI-trial,
# diverged-trial, GPT-2, real-model and two-node tests keep the compiled path end to end.
EAGER_CASTS = {"FP8LAB_FUSED_CASTS": "off"}


def run_cli(args: list[str], cwd: Path, timeout: float = 600, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`fp8lab ARGS` in `cwd`, offline, with `env` added to this process's environment."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"fp8lab {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="session")
def store_template(run_shared_dir: Path) -> Path:
    """An empty MLflow SQLite store, created and migrated once per run.

    Why: creating a store runs MLflow's whole chain of schema migrations, ~3 s of CPU in a fresh
    `fp8lab` process, paid again by every test that starts in an empty folder, for a step none of
    those tests is about. `seed_store` copies this one in instead (milliseconds). The tests whose
    subject is what a command writes, or that it writes nothing, start in a bare `tmp_path`."""
    target = store_path(run_shared_dir / "store-template")
    with filelock.FileLock(str(target.parent) + ".lock"):
        if not target.exists():
            target.parent.mkdir(exist_ok=True)
            partial = target.with_name("partial.db")
            partial.unlink(missing_ok=True)
            MlflowClient(f"sqlite:///{partial}").search_experiments()  # creates and migrates it
            partial.rename(target)
    return target


def seed_store(folder: Path, template: Path) -> Path:
    """`folder` with a copy of the empty store as its `mlflow.db`, as if MLflow had created it
    there: the Default experiment's artifact folder is the one MLflow gives a store created from
    `folder` (`<folder>/mlruns/0`), not the template's."""
    db = store_path(folder)
    shutil.copyfile(template, db)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (str(folder / "mlruns" / "0"),))
    return folder


@pytest.fixture
def workdir(tmp_path: Path, store_template: Path) -> Path:
    """A folder for the CLI to run in, with an empty store (`store_template`). A test of what a
    command writes, or that it writes nothing, uses a bare `tmp_path`."""
    return seed_store(tmp_path, store_template)


def store_path(workdir: Path) -> Path:
    """The store the CLI creates in `workdir` by default (tracking.uri=sqlite:///mlflow.db)."""
    return workdir / "mlflow.db"


def store_uri(workdir: Path) -> str:
    return f"sqlite:///{store_path(workdir)}"


def client_for(workdir: Path) -> MlflowClient:
    return MlflowClient(store_uri(workdir))


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def trial_runs(workdir: Path, experiment: str) -> list:
    """The trial (child) runs of an experiment in the workdir's SQLite store."""
    client = client_for(workdir)
    exp = client.get_experiment_by_name(experiment)
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("fp8lab.role") == "trial"]


def trial_statuses(workdir: Path, experiment: str) -> list[str]:
    """Sorted MLflow statuses of the trial runs; [] until the store is ready. Meant for polling
    while a sweep runs: read-only plain SQLite, because an MLflow client opened on a store that
    the sweep is still creating would run the schema migration a second time, concurrently, and
    leave a half-migrated store. A run the driver has created but whose trial has not started
    (fp8lab.status SCHEDULED) reads SCHEDULED: MLflow creates every run RUNNING and the driver
    sets SCHEDULED a moment later (orchestrator/runs.py), and "RUNNING" must mean the trial runs."""
    db = store_path(workdir)
    if not db.exists():
        return []
    query = ("SELECT CASE WHEN s.value = 'SCHEDULED' THEN 'SCHEDULED' ELSE r.status END FROM runs r "
             "JOIN experiments e ON e.experiment_id = r.experiment_id "
             "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'fp8lab.role' AND t.value = 'trial' "
             "LEFT JOIN tags s ON s.run_uuid = r.run_uuid AND s.key = 'fp8lab.status' "
             "WHERE e.name = ?")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as conn:
            return sorted(row[0] for row in conn.execute(query, (experiment,)))
    except sqlite3.Error:  # tables not created yet, or locked for a moment
        return []


POLL_S = 0.25  # a poll is a SQLite read or a `pgrep`: cheap, and a test waits at most this long past the event


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(POLL_S)
    raise AssertionError(f"{what}: not reached within {timeout:.0f}s")


def session_processes(session_id: int, grace_s: int = 20) -> list[str]:
    """Processes still alive in a session (driver, raylet, GCS, workers), after up to `grace_s`
    seconds for Ray's shutdown to finish."""
    left: list[str] = []
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-a", "-s", str(session_id)], capture_output=True, text=True).stdout
        left = out.split("\n") if out.strip() else []
        if not left:
            break
        time.sleep(POLL_S)
    return left


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def free_port() -> int:
    """A TCP port nothing listens on (now) on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
