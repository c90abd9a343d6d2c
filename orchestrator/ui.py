"""`fp8lab ui`: MLflow's UI on the sweep's store, opened on the experiment's machine-learning runs view.

MLflow 3 opens experiments in its GenAI view unless the experiment says it is classic ML work:
the experiment tag `mlflow.experimentKind=custom_model_development` (set here if missing) and the
URL's `workflowType=machine_learning` select the runs table instead. MLflow 3's server also starts
a job runner (Huey consumers for GenAI jobs: ~10 extra processes, GBs of memory) unless
`MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`; fp8lab has no such jobs, so it is off unless asked.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

EXPERIMENT_KIND_TAG, ML_KIND = "mlflow.experimentKind", "custom_model_development"
JOBS_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def runs_view_url(uri: str, experiment: str, host: str, port: int) -> str:
    """URL of the experiment's runs table (the experiments list when it does not exist yet)."""
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    base = f"http://{shown_host}:{port}/#/experiments"
    experiment_id = _ml_experiment_id(uri, experiment)
    if experiment_id is None:
        return f"{base}?workflowType=machine_learning"
    return f"{base}/{experiment_id}/runs?workflowType=machine_learning"


def _ml_experiment_id(uri: str, name: str) -> str | None:
    """The experiment's id, tagged as machine-learning work; None when there is no such experiment
    (or no store yet: a missing SQLite file is not created here)."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return None
    if experiment.tags.get(EXPERIMENT_KIND_TAG) != ML_KIND:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, ML_KIND)
    return experiment.experiment_id


def server_command(uri: str, host: str, port: int) -> list[str]:
    # One worker: a UI for one person needs no more, and 4 (MLflow's default) take long to start on small machines.
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host,
            "--port", str(port), "--workers", "1"]


def server_env(with_jobs: bool) -> dict[str, str]:
    return {**os.environ, JOBS_ENV: "true" if with_jobs else "false"}
