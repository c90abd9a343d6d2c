"""A sweep keeps its promises: a dead worker is retried into the same run, Ctrl-C marks
unfinished runs KILLED and a rerun finishes only what is missing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import TINY, client_for, run_cli

pytestmark = pytest.mark.integration


def _trial_runs(workdir: Path, experiment: str) -> list:
    client = client_for(workdir)
    exp = client.get_experiment_by_name(experiment)
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("fp8lab.role") == "trial"]


def test_killed_worker_is_retried_without_an_orphan_run(workdir: Path) -> None:
    marker = workdir / "killed-once"
    run_cli(["sweep", *TINY, "sweep.report=false", "cluster.num_cpus=2", "sweep.name=t-kill",
             "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]", "sweep.max_retries=1",
             "fault.kind=kill", "fault.step=3", f"fault.once_file={marker}"], workdir)
    assert marker.exists()  # the first attempt really was killed
    runs = _trial_runs(workdir, "t-kill")
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED" and runs[0].data.tags["fp8lab.status"] == "FINISHED"
    assert "eval/accuracy" in runs[0].data.metrics


def test_ctrl_c_marks_unfinished_runs_killed_and_rerun_completes(workdir: Path) -> None:
    args = ["sweep", *TINY, "train.steps=80", "sweep.report=false", "cluster.num_cpus=1", "sweep.name=t-int",
            "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0,1]"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # one slot: seed 0 finishes, then seed 1 runs; interrupt while it trains
        _wait_for(lambda: sorted(r.info.status for r in _safe_runs(workdir, "t-int")) == ["FINISHED", "RUNNING"], timeout=240)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, proc.stdout.read() if proc.stdout else ""
    runs = {r.info.run_name: r.info.status for r in _trial_runs(workdir, "t-int")}
    assert runs == {"bf16-s0": "FINISHED", "bf16-s1": "KILLED"}, runs
    assert _nothing_left(proc.pid)

    rerun = run_cli(args, workdir)
    assert "1 trials (1 already finished)" in rerun.stdout
    statuses = sorted(r.info.status for r in _trial_runs(workdir, "t-int"))
    assert statuses == ["FINISHED", "FINISHED", "KILLED"]


def _safe_runs(workdir: Path, experiment: str) -> list:
    try:
        return _trial_runs(workdir, experiment)
    except Exception:  # noqa: BLE001 - store not created yet
        return []


def _wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError("condition not met in time")


def _nothing_left(session_id: int) -> bool:
    """No process of the sweep's session (driver, raylet, workers) outlives it."""
    for _ in range(20):
        if not subprocess.run(["pgrep", "-s", str(session_id)], capture_output=True, text=True).stdout.split():
            return True
        time.sleep(1)
    return False


def test_killed_worker_resumes_from_its_checkpoint_with_a_complete_history(workdir: Path) -> None:
    marker = workdir / "killed-once"
    run_cli(["sweep", *TINY, "train.steps=12", "train.checkpoint_every=4", "sweep.report=false", "cluster.num_cpus=2",
             "sweep.name=t-resume", "sweep.axes.precision=[fp8_protected]", "sweep.axes.seed=[0,1]",
             "fault.kind=kill", "fault.step=7", f"fault.once_file={marker}"], workdir)
    assert marker.exists()
    runs = _trial_runs(workdir, "t-resume")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    resumed = [r for r in runs if r.data.tags.get("fp8lab.resumed_from_step")]
    assert len(resumed) == 1 and resumed[0].data.tags["fp8lab.resumed_from_step"] == "4"
    client = client_for(workdir)
    for run in runs:  # every logged step exactly once, killed or not
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert steps == [2, 4, 6, 8, 10, 12], (run.info.run_name, steps)
    assert not any((workdir / "fp8lab-checkpoints").glob("*/checkpoint.pt"))  # cleaned up after success
