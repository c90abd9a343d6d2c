"""A sweep keeps its promises: a dead worker is retried into the same run (resuming from its
checkpoint), Ctrl-C or SIGTERM marks unfinished runs KILLED and a rerun finishes only what is
missing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import (
    TINY,
    client_for,
    read_csv,
    run_cli,
    session_processes,
    trial_runs,
    trial_statuses,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_killed_worker_is_retried_without_an_orphan_run(workdir: Path) -> None:
    marker = workdir / "killed-once"
    run_cli(["sweep", *TINY, "sweep.report=false", "cluster.num_cpus=2", "sweep.name=t-kill",
             "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]", "sweep.max_retries=1",
             "fault.kind=kill", "fault.step=3", f"fault.once_file={marker}"], workdir)
    assert marker.exists()  # the first attempt really was killed
    runs = trial_runs(workdir, "t-kill")
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED" and runs[0].data.tags["fp8lab.status"] == "FINISHED"
    assert "eval/accuracy" in runs[0].data.metrics


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_driver_marks_runs_killed_and_rerun_completes_only_missing(workdir: Path, sig: int) -> None:
    """Ctrl-C, or SIGTERM (`kill`, systemd, a batch scheduler): exit 130 within seconds, unfinished
    runs KILLED, nothing left running; the rerun runs only the missing trial and the report counts
    each trial once (the KILLED attempt is superseded)."""
    name = f"t-{signal.Signals(sig).name.lower()}"
    # 20 steps: seed 1 is RUNNING for seconds (model build, training, eval), many polls of wait_for
    args = ["sweep", *TINY, "train.steps=20", "sweep.report=false", "cluster.num_cpus=1", f"sweep.name={name}",
            "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0,1]"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    # preexec_fn: a shell starts background jobs with SIGINT ignored, and the child would inherit
    # that (so would a CI runner launched with `&`); the CLI must see Ctrl-C as a terminal sends it
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # one slot: seed 0 finishes, then seed 1 starts; interrupt while it runs
        wait_for(lambda: trial_statuses(workdir, name) == ["FINISHED", "RUNNING"], 300, "seed 0 done, seed 1 running")
        started = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        exit_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 130, output[-3000:]
    assert exit_s < 30, f"driver took {exit_s:.0f}s to exit"
    assert "Interrupted: unfinished trials marked KILLED" in output
    runs = {r.info.run_name: (r.info.status, r.data.tags["fp8lab.status"]) for r in trial_runs(workdir, name)}
    assert runs == {"bf16-s0": ("FINISHED", "FINISHED"), "bf16-s1": ("KILLED", "KILLED")}, runs
    assert not session_processes(proc.pid)

    rerun = run_cli(args, workdir)
    assert "1 trials (1 already finished)" in rerun.stdout
    statuses = sorted((r.info.run_name, r.info.status) for r in trial_runs(workdir, name))
    assert statuses == [("bf16-s0", "FINISHED"), ("bf16-s1", "FINISHED"), ("bf16-s1", "KILLED")], statuses

    report = run_cli(["report", "--experiment", name, "--out", "rep"], workdir)
    assert "(2 trials, 2 in the statistics" in report.stdout, report.stdout
    counted = [r for r in read_csv(workdir / "rep" / "runs.csv") if r["counted"] == "True"]
    assert sorted(r["run_name"] for r in counted) == ["bf16-s0", "bf16-s1"], counted
    assert len({r["trial_id"] for r in counted}) == 2
    summary = read_csv(workdir / "rep" / "summary.csv")
    assert [(s["policy"], s["n_trials"], s["n_finished"]) for s in summary] == [("bf16", "2", "2")], summary


def test_killed_worker_resumes_from_its_checkpoint_with_a_complete_history(workdir: Path) -> None:
    marker = workdir / "killed-once"
    run_cli(["sweep", *TINY, "train.steps=12", "train.checkpoint_every=4", "sweep.report=false", "cluster.num_cpus=2",
             "sweep.name=t-resume", "sweep.axes.precision=[fp8_protected]", "sweep.axes.seed=[0,1]",
             "fault.kind=kill", "fault.step=7", f"fault.once_file={marker}"], workdir)
    assert marker.exists()
    runs = trial_runs(workdir, "t-resume")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    resumed = [r for r in runs if r.data.tags.get("fp8lab.resumed_from_step")]
    assert len(resumed) == 1 and resumed[0].data.tags["fp8lab.resumed_from_step"] == "4"
    client = client_for(workdir)
    for run in runs:  # every logged step exactly once, killed or not
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert steps == [2, 4, 6, 8, 10, 12], (run.info.run_name, steps)
    assert not any((workdir / "fp8lab-checkpoints").glob("*/checkpoint.pt"))  # cleaned up after success
