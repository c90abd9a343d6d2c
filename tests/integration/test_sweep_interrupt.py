"""Ctrl-C (SIGINT) or SIGTERM (`kill`, systemd, a batch scheduler) stops a sweep cleanly: exit 130
within seconds, unfinished runs KILLED, nothing left running; a rerun finishes only what is
missing and the report counts each trial once (a KILLED attempt is superseded).

One flow, shared by the two tests (one sweep store, as a user would live it): a three-trial sweep
on one slot is interrupted by SIGINT while its second trial trains; the rerun is interrupted by
SIGTERM while its (new) third trial trains; a last rerun finishes the third trial and the report
reads the store. Each test checks its signal's stop and the rerun after it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import TINY, read_csv, run_cli, seed_store, session_processes, trial_runs, trial_statuses, wait_for

pytestmark = pytest.mark.integration

NAME = "t-interrupt"
# 20 steps: the trial to interrupt is RUNNING for seconds (model build, training, eval), many polls of wait_for
ARGS = ["sweep", *TINY, "train.steps=20", "sweep.report=false", "cluster.num_cpus=1", f"sweep.name={NAME}",
        "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0,1,2]"]


@dataclass
class Stop:
    """What one interrupted driver left: its exit, output, the runs by (name, status) and strays."""
    returncode: int
    exit_s: float
    output: str
    runs: list[tuple[str, str, str]]  # (run name, MLflow status, fp8lab.status), sorted
    strays: list[str]


@dataclass
class Flow:
    workdir: Path
    stops: dict[str, Stop]
    rerun_stdout: dict[str, str]  # signal name -> the stdout of the driver started after that stop
    final_runs: list[tuple[str, str]]
    report_stdout: str


def _interrupt(workdir: Path, sig: int, finished_before: int) -> Stop:
    """Start the sweep (one slot), wait until `finished_before` trials are FINISHED and the next
    one is RUNNING, send `sig`, and collect what the driver left."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    # preexec_fn: a shell starts background jobs with SIGINT ignored, and the child would inherit
    # that (so would a CI runner launched with `&`); the CLI must see Ctrl-C as a terminal sends it
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *ARGS], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def next_trial_running() -> bool:
        statuses = trial_statuses(workdir, NAME)
        return statuses.count("FINISHED") == finished_before and statuses.count("RUNNING") == 1

    try:
        wait_for(next_trial_running, 300, f"{finished_before} trials done, the next running")
        started = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        exit_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = proc.stdout.read() if proc.stdout else ""
    runs = sorted((r.info.run_name, r.info.status, r.data.tags["fp8lab.status"]) for r in trial_runs(workdir, NAME))
    return Stop(proc.returncode, exit_s, output, runs, session_processes(proc.pid))


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory, store_template: Path) -> Flow:
    workdir = seed_store(tmp_path_factory.mktemp("interrupt"), store_template)
    stops = {"SIGINT": _interrupt(workdir, signal.SIGINT, finished_before=1)}
    # the first rerun is the driver the second stop interrupts: its output holds the rerun's title line
    stops["SIGTERM"] = _interrupt(workdir, signal.SIGTERM, finished_before=2)
    last = run_cli(ARGS, workdir)
    final_runs = sorted((r.info.run_name, r.info.status) for r in trial_runs(workdir, NAME))
    report = run_cli(["report", "--experiment", NAME, "--out", "rep"], workdir)
    return Flow(workdir, stops, {"SIGINT": stops["SIGTERM"].output, "SIGTERM": last.stdout}, final_runs, report.stdout)


def _check_stop(stop: Stop) -> None:
    assert stop.returncode == 130, stop.output[-3000:]
    assert stop.exit_s < 30, f"driver took {stop.exit_s:.0f}s to exit"
    assert "Interrupted: unfinished trials marked KILLED" in stop.output
    assert not stop.strays


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupted_driver_marks_runs_killed_and_rerun_completes_only_missing(flow: Flow, sig: str) -> None:
    stop = flow.stops[sig]
    _check_stop(stop)
    if sig == "SIGINT":  # the first sweep: seed 0 finished, seed 1 stopped while training, seed 2 never started
        assert stop.runs == [("bf16-s0", "FINISHED", "FINISHED"), ("bf16-s1", "KILLED", "KILLED")], stop.runs
        assert "2 trials (1 already finished)" in flow.rerun_stdout[sig]
        return
    # the rerun: seed 1 ran again (a new run; the KILLED attempt stays), seed 2 stopped while training
    assert stop.runs == [("bf16-s0", "FINISHED", "FINISHED"), ("bf16-s1", "FINISHED", "FINISHED"),
                         ("bf16-s1", "KILLED", "KILLED"), ("bf16-s2", "KILLED", "KILLED")], stop.runs
    assert "1 trials (2 already finished)" in flow.rerun_stdout[sig]
    assert flow.final_runs == [("bf16-s0", "FINISHED"), ("bf16-s1", "FINISHED"), ("bf16-s1", "KILLED"),
                               ("bf16-s2", "FINISHED"), ("bf16-s2", "KILLED")], flow.final_runs
    assert "(3 trials, 3 in the statistics" in flow.report_stdout, flow.report_stdout
    counted = [r for r in read_csv(flow.workdir / "rep" / "runs.csv") if r["counted"] == "True"]
    assert sorted(r["run_name"] for r in counted) == ["bf16-s0", "bf16-s1", "bf16-s2"], counted
    assert len({r["trial_id"] for r in counted}) == 3
    summary = read_csv(flow.workdir / "rep" / "summary.csv")
    assert [(s["policy"], s["n_trials"], s["n_finished"]) for s in summary] == [("bf16", "3", "3")], summary
