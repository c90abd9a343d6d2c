"""Fixtures for the analysis tests: a real SQLite MLflow store with synthetic sweeps of known values.

Building the store costs a few seconds, so it is built once per session and only read by tests.
Tests that write (artifact logging) use their own store or only add artifacts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
for _p in (ROOT, Path(__file__).resolve().parent):  # run without PYTHONPATH too
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from _report_data import PARAMS, SynthTrial, axes_trials, main_trials  # noqa: E402

from tests.support.synthetic import artifacts_beside, write_sweep  # noqa: E402


@dataclass(frozen=True)
class Store:
    uri: str
    root: Path
    main_parent: str
    old_parent: str
    axes_parent: str


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    t0 = 1_700_000_000_000
    old = write_sweep(
        uri,
        "exp-a",
        "sw-old",
        [SynthTrial("bf16", 0), SynthTrial("fp8_naive", 0, accuracy=0.5)],
        base_time_ms=t0,
        telemetry=False,
    )
    axes = write_sweep(uri, "exp-b", "sw-axes", axes_trials(), base_time_ms=t0 + 1_000_000, telemetry=False, n_steps=5)
    main = write_sweep(
        uri,
        "exp-a",
        "sw-main",
        main_trials(),
        base_time_ms=t0 + 2_000_000,
        params=PARAMS,
        n_steps=12,
        layers=3,
        telemetry_every=3,
        parent_tags={"fp8lab.versions.torch": "2.13.0", "mlflow.source.git.commit": "abc1234"},
    )
    from mlflow.tracking import MlflowClient

    # exp-c: "sw-ext" extends "sw-first" by one seed; the orchestrator skips the two finished trials,
    # so only their trial ids (in the parent's sweep/trials.json) link them to the new sweep.
    first = [SynthTrial("bf16", 0, accuracy=0.70), SynthTrial("bf16", 1, accuracy=0.72)]
    write_sweep(uri, "exp-c", "sw-first", first, base_time_ms=t0 + 100_000, telemetry=False, n_steps=3)
    ext = write_sweep(
        uri,
        "exp-c",
        "sw-ext",
        [SynthTrial("bf16", 2, accuracy=0.74)],
        base_time_ms=t0 + 200_000,
        telemetry=False,
        n_steps=3,
    )
    ids = [t.resolved_trial_id() for t in [*first, SynthTrial("bf16", 2)]]
    # an experiment without sweeps
    MlflowClient(uri).create_experiment("exp-empty", artifact_location=artifacts_beside(uri))
    MlflowClient(uri).log_dict(ext["parent_run_id"], {"trial_ids": ids}, "sweep/trials.json")
    MlflowClient(uri).log_dict(
        axes["parent_run_id"], {"device": {"name": "cpu", "cores": 2}, "versions": {"mlflow": "3.17.2"}}, "env.json"
    )
    return Store(uri, root, main["parent_run_id"], old["parent_run_id"], axes["parent_run_id"])


@pytest.fixture(scope="session")
def main_report(store: Store, tmp_path_factory: pytest.TempPathFactory):
    """Default invocation: no experiment, no sweep -> the latest sweep (sw-main), logged to its parent."""
    from analysis import ReportOptions, generate_report

    out = tmp_path_factory.mktemp("report")
    return generate_report(store.uri, None, None, False, out, ReportOptions())
