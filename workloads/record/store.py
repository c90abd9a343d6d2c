"""Reading a finished trial's run back from the store (``fp8lab export``): the MLflow client
is made here so that ``record/`` stays the one workloads package that imports MLflow."""
from __future__ import annotations

from typing import Any


def store_client(tracking_uri: str) -> Any:
    """An ``mlflow.MlflowClient`` on ``tracking_uri`` (get_run, list/download artifacts)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri)
