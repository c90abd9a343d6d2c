"""MLflow logging for one trial, kept out of the training step.

The trial never creates runs: the orchestrator creates the run (parent/child layout, names,
tags) and hands over its id, so a retried or resumed trial writes into the run it was given.
Metrics are buffered and written with `log_batch` (few writes, so parallel trials sharing a
SQLite store rarely contend; MLflow also sets a 20 s SQLite busy timeout): a write when the
buffer holds a full batch (`flush_every`, MLflow's 1000-metric cap) or when its oldest metric
has waited `flush_s` seconds, whichever comes first. The clock starts with the first metric
buffered after a write (or after a failed write), not at the last write: a first logged step that
comes long after the run started (model build, data loading under load) still waits its turn, so
whether a worker killed a step later left a metric history in the run (and its retry can stay in
that run: `record.attempts`) does not depend on how slow the setup was. Time, not a small count, sets the pace
because a write's cost is mostly fixed (a transaction, ~5 ms of CPU on SQLite) while a trial logs
a few to a few dozen metrics per logged step; the UI still sees metrics within `flush_s`. A write that fails
(locked database, server briefly down) is retried with back-off and the buffer is kept, so a
short outage loses nothing; a long one fails the trial with a clear reason.
"""
from __future__ import annotations

import errno
import json
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_PARAM_LENGTH = 6000  # MLflow 3 limit is 6000 characters per param value


class TrialLogger(Protocol):
    """What the training code may call; an implementation decides where the numbers go."""

    def log_step(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_final(self, metrics: dict[str, float], step: int = 0) -> None: ...
    def set_tags(self, tags: dict[str, Any]) -> None: ...
    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_text(self, text: str, artifact_path: str) -> None: ...
    def log_file(self, local_path: Path, artifact_dir: str) -> None: ...
    def flush(self) -> None: ...


class TrackingUnavailable(RuntimeError):
    """The tracking store stayed unreachable past the retry budget."""


class MlflowTrialLogger:
    """Buffered, retrying writer for one existing MLflow run."""

    def __init__(self, tracking_uri: str, run_id: str, flush_every: int = 1000, retry_s: float = 60.0,
                 flush_s: float = 5.0):
        self.client = MlflowClient(tracking_uri)
        self.run_id = run_id
        self.flush_every = flush_every
        self.flush_s = flush_s
        self.retry_s = retry_s
        self._metrics: list[Metric] = []
        self._clock_start = time.monotonic()  # when the buffer's oldest metric (or a failed write) came

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        if not self._metrics:
            self._clock_start = time.monotonic()
        self._metrics += [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if len(self._metrics) >= self.flush_every or time.monotonic() - self._clock_start >= self.flush_s:
            self._try_flush()

    def hold_until_flush(self) -> None:
        """Write only on an explicit `flush` (checkpointed trials: a resume re-logs exactly the
        steps after the last checkpoint)."""
        self.flush_every, self.flush_s = 10**9, math.inf

    def log_final(self, metrics: dict[str, float], step: int = 0) -> None:
        self.log_step(step, metrics)
        self.flush()

    def set_tags(self, tags: dict[str, Any]) -> None:
        batch = [RunTag(k, str(v)) for k, v in tags.items()]
        self._retry(lambda: self.client.log_batch(self.run_id, tags=batch))

    def log_params(self, params: dict[str, Any]) -> None:
        items = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            chunk = items[start : start + 100]
            self._retry(lambda chunk=chunk: self.client.log_batch(self.run_id, params=chunk))

    def log_text(self, text: str, artifact_path: str) -> None:
        self._retry(lambda: self.client.log_text(self.run_id, text, artifact_path))

    def log_dict(self, data: Any, artifact_path: str) -> None:
        self.log_text(json.dumps(data, indent=2, default=str), artifact_path)

    def log_file(self, local_path: Path, artifact_dir: str) -> None:
        self._retry(lambda: self.client.log_artifact(self.run_id, str(local_path), artifact_dir))

    def log_dir(self, local_dir: Path, artifact_dir: str) -> None:
        """Every file of `local_dir` under `artifact_dir` (e.g. the LoRA adapter folder)."""
        self._retry(lambda: self.client.log_artifacts(self.run_id, str(local_dir), artifact_dir))

    def log_inputs(self, datasets: list[Any]) -> None:
        """MLflow `DatasetInput`s: what the run trained and was evaluated on (the run's inputs)."""
        self._retry(lambda: self.client.log_inputs(self.run_id, datasets=datasets))

    def flush(self) -> None:
        """Write everything buffered; raises TrackingUnavailable after the retry budget."""
        while self._metrics:
            chunk = self._metrics[:1000]  # MLflow caps a batch at 1000 metrics
            self._retry(lambda chunk=chunk: self.client.log_batch(self.run_id, metrics=chunk))
            self._metrics = self._metrics[len(chunk):]

    def _try_flush(self) -> None:
        """Mid-training flush: on failure keep the buffer and carry on training (the next try
        comes `flush_s` later, or at a full batch)."""
        self._clock_start = time.monotonic()
        try:
            chunk = self._metrics[:1000]
            self.client.log_batch(self.run_id, metrics=chunk)
            self._metrics = self._metrics[len(chunk):]
        except Exception as exc:  # noqa: BLE001 - any store error: keep buffering
            log.warning("MLflow write failed (%s); %d metrics kept in memory, will retry", exc, len(self._metrics))

    def _retry(self, call: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.retry_s
        delay = 0.5
        while True:
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - store errors come in many types
                if time.monotonic() > deadline:
                    budget = f"{self.retry_s:.0f}s"
                    what = f"out of disk space (writes failed for {budget})" if disk_full(exc) else f"unreachable for {budget}"
                    raise TrackingUnavailable(f"MLflow store {what}: {exc}") from exc
                log.warning("MLflow write failed (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 8.0)


def disk_full(exc: BaseException) -> bool:
    """A store that answers but cannot write (SQLite: "database or disk is full", ENOSPC, or a
    server relaying either) is not "unreachable": the fix is free space, not a restart."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "errno", None) == errno.ENOSPC or any(
                text in str(seen) for text in ("database or disk is full", "No space left on device")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def write_parquet(rows: list[dict[str, Any]], columns: list[str], name: str = "telemetry.parquet") -> Path:
    """Telemetry rows -> a Parquet file ``name`` in a temp folder (caller logs it as an artifact)."""
    import pandas as pd

    path = Path(tempfile.mkdtemp(prefix="fp8lab-telemetry-")) / name
    pd.DataFrame(rows, columns=columns).to_parquet(path, index=False)
    return path


class SystemMetrics:
    """MLflow's own system-metrics monitor (CPU, memory, disk, network, GPU), attached to one run.

    The monitor writes one aggregate per sampling interval; a trial shorter than that would get
    none, so `stop` writes what was sampled since the last write before the run is closed."""

    def __init__(self, tracking_uri: str, run_id: str, interval_s: float):
        self._monitor = None
        if interval_s <= 0:
            return
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            # resume_logging: a retried trial continues the run's system/* steps instead of writing step 0 again
            self._monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True,
                                                 tracking_uri=tracking_uri)
            self._monitor.start()
        except Exception as exc:  # noqa: BLE001 - monitoring is informative, never fails a trial
            log.warning("system metrics not recorded: %s", exc)
            self._monitor = None

    def stop(self) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return
        try:
            monitor.finish()
            monitor.collect_metrics()  # one last sample at the end of the trial
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()
        except Exception as exc:  # noqa: BLE001
            log.warning("last system metrics sample not recorded: %s", exc)
