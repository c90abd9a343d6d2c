"""What the sweep's parent run shows without expanding it: the matrix as params and, per policy,
the mean of each headline metric over its finished trials as metrics.

Metric names are `summary/<policy>/<what>` (`summary/fp8_protected/accuracy`); characters MLflow
does not allow in a metric name (`+`, `=`, ...) become `_`. Means are plain averages over seeds
(and other axes); the report holds the statistics.
"""
from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from typing import Any, Iterable

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from fp8lab_conf.contracts import (
    METRIC_ACCURACY, METRIC_FINAL_LOSS, METRIC_PEAK_BYTES, METRIC_TOKENS_PER_S, TAG_POLICY, TAG_STATUS,
)
from orchestrator.params import sweep_params

log = logging.getLogger(__name__)

# result metric -> short name in the summary
SUMMARY_METRICS = {METRIC_ACCURACY: "accuracy", METRIC_TOKENS_PER_S: "tokens_per_s",
                   METRIC_PEAK_BYTES: "peak_bytes", METRIC_FINAL_LOSS: "final_loss"}
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_\-. /]")


def log_sweep_params(client: MlflowClient, parent_run_id: str, config: dict[str, Any], n_trials: int) -> None:
    """The matrix and the shared config as the parent's params (same sweep id = same values)."""
    items = [Param(k, str(v)[:6000]) for k, v in sweep_params(config, n_trials).items()]
    try:
        for start in range(0, len(items), 100):
            client.log_batch(parent_run_id, params=items[start : start + 100])
    except Exception as exc:  # noqa: BLE001 - informative only; the sweep goes on
        log.warning("sweep params not logged on the parent run: %s", exc)


def policy_means(results: Iterable[tuple[str, str, dict[str, float]]]) -> dict[str, float]:
    """(policy, status, metrics) of every trial -> `summary/<policy>/<what>` means over the
    FINISHED ones, plus `summary/<policy>/n` (how many)."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for policy, status, metrics in results:
        if status != "FINISHED":
            continue
        bucket = values[_NOT_ALLOWED.sub("_", policy)]
        bucket["n"].append(1.0)
        for key, short in SUMMARY_METRICS.items():
            if metrics.get(key) is not None:
                bucket[short].append(float(metrics[key]))
    return {f"summary/{policy}/{short}": (len(v) if short == "n" else sum(v) / len(v))
            for policy, bucket in values.items() for short, v in bucket.items()}


def log_policy_summary(client: MlflowClient, parent_run_id: str, results: dict[str, dict[str, Any]],
                       skipped: dict[str, str]) -> dict[str, float]:
    """Log the per-policy means of this sweep's trials: those that ran now (`results`) and those
    an earlier sweep had finished (`skipped`: trial id -> run id, read back from MLflow)."""
    rows = [(r.get("policy", ""), r.get("status", ""), r.get("metrics", {})) for r in results.values()]
    for run_id in skipped.values():
        try:
            run = client.get_run(run_id)
        except Exception:  # noqa: BLE001 - a deleted run simply does not count
            continue
        rows.append((run.data.tags.get(TAG_POLICY, ""), run.data.tags.get(TAG_STATUS, ""), run.data.metrics))
    means = policy_means(rows)
    if means:
        try:
            client.log_batch(parent_run_id, metrics=[Metric(k, v, _now_ms(), 0) for k, v in means.items()])
        except Exception as exc:  # noqa: BLE001
            log.warning("per-policy summary not logged on the parent run: %s", exc)
    return means


def _now_ms() -> int:
    return int(time.time() * 1000)
