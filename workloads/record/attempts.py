"""Which attempt of a trial this worker is, and where it writes: every (metric, step) of a trial
run is logged exactly once, across Ray's retries of a dead worker.

The orchestrator created the run, and Ray retries a dead worker with the same launch record, so
a retry finds a run that an earlier attempt already wrote to. Two cases:
- the retry resumes from that run's checkpoint: it continues in the same run (the checkpoint
  was saved after the metrics up to its step were flushed, so it re-logs exactly the lost steps);
- the earlier attempt wrote no metric history yet (only its queue time and system metrics, which
  a retry continues): it continues in the same run too;
- otherwise (no checkpointing, killed during evaluation or before the first checkpoint, after
  metrics were flushed): MLflow cannot delete logged metrics, so re-training from step 1 into
  that run would log steps twice. The retry continues in a fresh run instead, a copy of the old one's tags and params tagged `fp8lab.retry_of`; the
  old run is closed KILLED with `fp8lab.superseded_by` naming the new one (the report counts a
  trial once and treats a KILLED attempt as superseded).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlflow.entities import Param, RunTag

from fp8lab_conf.contracts import METRIC_QUEUE_S, TAG_ATTEMPT, TAG_REASON, TAG_RETRY_OF, TAG_STATUS, TAG_SUPERSEDED_BY

_CONTINUED_PREFIXES = ("system/",)  # MLflow's system metrics monitor resumes its own steps
_KEPT_SYSTEM_TAGS = ("mlflow.parentRunId", "mlflow.runName", "mlflow.user", "mlflow.source.name", "mlflow.source.type")


@dataclass(frozen=True)
class Attempt:
    run_id: str
    number: int  # 1 for the first start of the worker
    fresh_history: bool  # no queue time logged in run_id yet (first attempt, or a fresh attempt run)


def begin_attempt(client: Any, run_id: str, resumable: bool) -> Attempt:
    """The run this attempt writes to (see the module docstring) and its number, tagged."""
    run = client.get_run(run_id)
    number = int(run.data.tags.get(TAG_ATTEMPT, "0")) + 1
    history = [k for k in run.data.metrics if not k.startswith(_CONTINUED_PREFIXES) and k != METRIC_QUEUE_S]
    if number == 1 or resumable or not history:
        client.set_tag(run_id, TAG_ATTEMPT, str(number))
        return Attempt(run_id, number, fresh_history=METRIC_QUEUE_S not in run.data.metrics)
    new_id = _copy_run(client, run, number)
    client.log_batch(run_id, tags=[RunTag(TAG_STATUS, "KILLED"), RunTag(TAG_SUPERSEDED_BY, new_id),
                                   RunTag(TAG_REASON, f"worker died; attempt {number} could not resume from a checkpoint "
                                                      f"and continues in run {new_id}")])
    client.set_terminated(run_id, "KILLED")
    return Attempt(new_id, number, fresh_history=True)


def _copy_run(client: Any, run: Any, number: int) -> str:
    """A new run with the old one's identity (name, parent, fp8lab tags, params), not its history."""
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.") or k in _KEPT_SYSTEM_TAGS}
    tags.update({TAG_RETRY_OF: run.info.run_id, TAG_ATTEMPT: str(number), TAG_STATUS: "RUNNING"})
    tags.pop(TAG_REASON, None)
    new_id = client.create_run(run.info.experiment_id, tags=tags, run_name=run.info.run_name).info.run_id
    params = [Param(k, v) for k, v in run.data.params.items()]
    for start in range(0, len(params), 100):  # MLflow's limit per batch
        client.log_batch(new_id, params=params[start:start + 100])
    return new_id
