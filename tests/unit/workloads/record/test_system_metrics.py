"""MLflow system metrics on a trial's run: a trial shorter than the sampling interval still gets a
sample, and a retried trial continues the steps instead of writing step 0 again."""
from __future__ import annotations

import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from workloads.record.logger import SystemMetrics
from tests.support.synthetic import artifacts_beside


def test_short_and_retried_trials_get_one_value_per_step(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("x", artifact_location=artifacts_beside(uri))).info.run_id
    for _ in range(2):  # the first attempt and a retry, each shorter than the 30 s interval
        monitor = SystemMetrics(uri, run_id, interval_s=30)
        time.sleep(0.2)
        monitor.stop()
    steps = [m.step for m in client.get_metric_history(run_id, "system/cpu_utilization_percentage")]
    assert sorted(steps) == [0, 1]
    SystemMetrics(uri, run_id, interval_s=0).stop()  # off: nothing started, nothing written
    assert len(client.get_metric_history(run_id, "system/cpu_utilization_percentage")) == 2
