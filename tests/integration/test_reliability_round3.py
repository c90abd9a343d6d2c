"""Reliability round 3 (issue #29), the cases that need a real sweep: every (metric, step) once
across retries (case 4), lost single trials closed and stale parent reasons cleared (case 10),
one trial id trained at most once at a time (case 5), bounded memory on a large data file (case 3).
Trials are tiny (6 steps, 16 eval items); one store per module."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.integration.conftest import EAGER_CASTS, TINY, client_for, run_cli, seed_store, trial_runs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, store_template: Path) -> Path:
    return seed_store(tmp_path_factory.mktemp("round3"), store_template)


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
             "sweep.axes.precision=[fp8_protected]", "sweep.axes.seed=[0]", "sweep.max_retries=1", *extra], store,
            env=EAGER_CASTS)


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
    assert "(1 trials, 1 in the statistics" in report.stdout, report.stdout


def test_report_closes_a_sigkilled_single_trial(store: Path) -> None:
    """Case 10: `fp8lab trial` SIGKILLed (here by its own fault, before evaluation) left its run
    RUNNING for good; `fp8lab report` now sees its claim free and closes it KILLED."""
    killed = run_cli(["trial", *TINY, "sweep.name=r3-single", "fault.kind=kill_in_eval"], store, check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [r.info.status for r in trial_runs(store, "r3-single")] == ["RUNNING"]
    report = run_cli(["report", "--experiment", "r3-single", "--out", "rep-single"], store, check=False)
    assert "its process is gone; marked KILLED (reason: process lost)" in report.stderr, report.stderr[-2000:]
    [run] = trial_runs(store, "r3-single")
    assert (run.info.status, run.data.tags["fp8lab.status"], run.data.tags["fp8lab.reason"]) == ("KILLED", "KILLED", "process lost")


def test_overlapping_sweeps_never_train_one_trial_twice(store: Path) -> None:
    """Case 5: two sweeps of one name and store that share a cell (bf16 seed 0), started together:
    the cell trains once; the other sweep waits for it and reuses the result."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    common = ["sweep", *TINY, "sweep.report=false", "cluster.num_cpus=1", "sweep.name=r3-overlap", "sweep.axes.precision=[bf16]"]
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *common, f"sweep.axes.seed={seeds}"], cwd=store,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for seeds in ("[0]", "[0,1]")]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(o[-3000:] for o in outputs)
    runs = trial_runs(store, "r3-overlap")
    per_trial = Counter(r.data.tags["fp8lab.trial_id"] for r in runs)
    assert sorted(per_trial.values()) == [1, 1], ([(r.info.run_name, r.info.status) for r in runs], outputs)
    assert all(r.info.status == "FINISHED" for r in runs)
    joined = "\n".join(outputs)
    assert "waiting for it" in joined or "already finished" in joined, joined[-3000:]


def test_sigterm_during_data_loading_of_a_large_file_is_honoured_in_bounded_memory(store: Path) -> None:
    """Case 3: a 40 MB training file (400k rows): SIGTERM while the trial loads and tokenizes it
    ends `fp8lab trial` within seconds (exit 130, run KILLED), and its memory stays bounded."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    data = store / "large.jsonl"
    row = '{"prompt": "Which number is the largest: %05d, 17, 42, 99?", "completion": "99 is the largest one here"}\n'
    with data.open("w") as handle:
        for i in range(400_000):
            handle.write(row % i)
    size_mb = data.stat().st_size / 2**20
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "HF_DATASETS_CACHE": str(store / "hf-cache")}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "trial", *TINY, "sweep.name=r3-large",
                             f"data.path={data}", "eval.task=fp8lab_embedded"], cwd=store, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    ps = psutil.Process(proc.pid)
    baseline, peak, deadline = 0, 0, time.monotonic() + 600
    assert proc.stderr is not None
    for line in proc.stderr:  # the run exists once this line is printed: data loading follows the model
        if "-> MLflow run" in line:
            baseline = ps.memory_info().rss
            break
    assert baseline, "the trial never started"
    sent = time.monotonic() + 4.0
    while time.monotonic() < sent:
        peak = max(peak, ps.memory_info().rss)
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.1)
    exit_s = time.monotonic() - signalled
    _, err = proc.communicate(timeout=60)
    grown = (peak - baseline) / 2**20
    print(f"file {size_mb:.0f} MiB, RSS at start {baseline / 2**20:.0f} MiB, grown {grown:.0f} MiB "
          f"({grown / size_mb:.1f}x the file), exit {exit_s:.1f}s after SIGTERM")
    assert proc.returncode == 130 and exit_s < 15, (proc.returncode, exit_s, err[-3000:])  # 8.1 s measured at load 18 (busy)
    assert grown < 12 * size_mb, f"RSS grew {grown:.0f} MiB for a {size_mb:.0f} MiB file"
    [run] = trial_runs(store, "r3-large")
    assert run.info.status == "KILLED"
