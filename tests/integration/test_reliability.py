"""Faults of one trial: a diverging trial (DIVERGED with its step and its telemetry up to it,
listed as such by the report) and an interrupted `fp8lab trial` (KILLED, not FINISHED). The
sweep-level faults (killed worker, driver interrupted) are in test_sweep_resilience.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import TINY, client_for, read_csv, read_json, run_cli, session_processes

pytestmark = pytest.mark.integration


def test_diverged_trial_keeps_its_step_and_telemetry_and_is_in_the_report(workdir: Path) -> None:
    out = workdir / "result.json"
    run_cli(["trial", "precision=fp8_naive", *TINY, "fault.kind=nan_weights", "fault.step=3", f"trial.output={out}"], workdir)
    result = read_json(out)
    assert result["status"] == "DIVERGED" and result["diverged_step"] == 3, result
    assert result["reason"] == "non-finite loss at step 3"
    client = client_for(workdir)
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"  # a DIVERGED trial is a result, not a failure
    assert run.data.tags["fp8lab.status"] == "DIVERGED" and run.data.tags["fp8lab.diverged_step"] == "3"
    # the step and telemetry up to it: logged steps 2 and 4 (the step that saw the NaN), no further
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [2, 4]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "telemetry/activation/underflow_pct")] == [2, 4]
    assert "telemetry" in {a.path for a in client.list_artifacts(run.info.run_id)}

    report = run_cli(["report", "--all", "--out", "rep"], workdir)
    assert "(1 trials, 1 in the statistics" in report.stdout
    markdown = (workdir / "rep" / "report.md").read_text()
    section = markdown.split("## Runs that diverged, failed or did not finish", 1)[1].split("\n## ", 1)[0]
    assert "| fp8_naive-s0 | fp8_naive | 0 | DIVERGED | non-finite loss at step 3 | 3 |" in section, section
    rows = read_csv(workdir / "rep" / "runs.csv")
    assert [(r["status"], r["diverged_step"], r["counted"]) for r in rows] == [("DIVERGED", "3.0", "True")]
    summary = read_csv(workdir / "rep" / "summary.csv")
    assert summary[0]["n_diverged"] == "1"


def test_interrupted_single_trial_is_killed_not_finished(workdir: Path) -> None:
    """`fp8lab trial` interrupted mid-training: its run is KILLED (never FINISHED with half the
    steps, which a sweep would then skip as done), and the command exits 130 at once. SIGTERM is
    turned into the same KeyboardInterrupt as Ctrl-C, so this covers both signals' handling."""
    sig = signal.SIGTERM
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "trial", *TINY, "train.steps=200", "train.log_every=1"],
                            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if line.strip().startswith("step 3/"):
                break
        started = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert time.monotonic() - started < 20
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    client = client_for(workdir)
    [run] = client.search_runs([client.get_experiment_by_name("fp8lab-default").experiment_id])
    assert (run.info.status, run.data.tags["fp8lab.status"], run.data.tags["fp8lab.reason"]) == ("KILLED", "KILLED", "interrupted")
    assert not session_processes(proc.pid)
