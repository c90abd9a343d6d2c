"""Reliability round 3 (issue #29), the cases that need a real sweep: every (metric, step) once
across retries (case 4), lost single trials closed and stale parent reasons cleared (case 10),
one trial id trained at most once at a time (case 5), bounded memory on a large data file (case 3).
Trials are tiny (6 steps, 16 eval items); one store per module."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.integration.conftest import TINY, client_for, run_cli, trial_runs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("round3")


def _duplicates(client: object, run_id: str) -> dict[str, list[int]]:
    """(metric -> steps logged more than once) over every metric of the run."""
    run = client.get_run(run_id)  # type: ignore[attr-defined]
    out = {}
    for key in run.data.metrics:
        counts = Counter(m.step for m in client.get_metric_history(run_id, key))  # type: ignore[attr-defined]
        repeated = sorted(step for step, n in counts.items() if n > 1)
        if repeated:
            out[key] = repeated
    return out


def _sweep(store: Path, name: str, *extra: str) -> None:
    run_cli(["sweep", *TINY, "sweep.report=false", "cluster.num_cpus=1", f"sweep.name={name}",
             "sweep.axes.precision=[fp8_protected]", "sweep.axes.seed=[0]", "sweep.max_retries=1", *extra], store)


def test_worker_killed_during_eval_resumes_from_the_last_checkpoint_without_duplicates(store: Path) -> None:
    """Case 4: the checkpoint is kept until the run is closed (the last step is checkpointed), so a
    worker killed during evaluation resumes after training, in the same run; nothing is logged twice
    (underflow/events at the last step included); the checkpoint is gone once the run is FINISHED."""
    marker = store / "killed-in-eval-ckpt"
    _sweep(store, "r3-eval-ckpt", "train.checkpoint_every=4", "fault.kind=kill_in_eval", f"fault.once_file={marker}")
    assert marker.exists()
    runs = trial_runs(store, "r3-eval-ckpt")
    assert [(r.info.status, r.data.tags["fp8lab.status"]) for r in runs] == [("FINISHED", "FINISHED")]
    assert runs[0].data.tags.get("fp8lab.resumed_from_step") == "6" and runs[0].data.tags["fp8lab.attempt"] == "2"
    client = client_for(store)
    assert _duplicates(client, runs[0].info.run_id) == {}
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")] == [2, 4, 6]
    assert "eval/accuracy" in runs[0].data.metrics
    assert not any((store / "fp8lab-checkpoints").glob("*/checkpoint.pt"))


def test_retry_that_cannot_resume_continues_in_a_fresh_attempt_run(store: Path) -> None:
    """Case 4: without checkpoints, the retry of a worker killed during evaluation (its training
    metrics already in MLflow) trains again in a fresh attempt run; the old run is KILLED and
    names it; no run has a (metric, step) twice; the report counts the trial once."""
    marker = store / "killed-in-eval-plain"
    _sweep(store, "r3-eval-plain", "fault.kind=kill_in_eval", f"fault.once_file={marker}")
    assert marker.exists()
    runs = {r.info.run_id: r for r in trial_runs(store, "r3-eval-plain")}
    assert sorted((r.info.status, r.data.tags["fp8lab.status"]) for r in runs.values()) == [
        ("FINISHED", "FINISHED"), ("KILLED", "KILLED")]
    old = next(r for r in runs.values() if r.info.status == "KILLED")
    new = runs[old.data.tags["fp8lab.superseded_by"]]
    assert new.data.tags["fp8lab.retry_of"] == old.info.run_id and new.data.tags["fp8lab.attempt"] == "2"
    assert new.data.tags["fp8lab.trial_id"] == old.data.tags["fp8lab.trial_id"] and new.info.run_name == old.info.run_name
    assert new.data.params == old.data.params
    client = client_for(store)
    for run_id in runs:
        assert _duplicates(client, run_id) == {}, run_id
    assert [m.step for m in client.get_metric_history(new.info.run_id, "train/loss")] == [2, 4, 6]
    report = run_cli(["report", "--experiment", "r3-eval-plain", "--out", "rep-plain"], store)
    assert "(1 trials, 1 in the statistics)" in report.stdout, report.stdout
