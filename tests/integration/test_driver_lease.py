"""One driver per sweep, on the real CLI: two drivers started at once (new store, then existing
store) never both run it, and a driver killed with SIGKILL leaves nothing RUNNING after a rerun."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import TINY, read_csv, run_cli, trial_runs, trial_statuses, wait_for

pytestmark = pytest.mark.integration

# 20 steps: the winner's trial is RUNNING for seconds (model build, training, eval), many polls of
# wait_for; the loser of each race sees the lease and exits long before that trial ends
ARGS = ["sweep", *TINY, "train.steps=20", "sweep.report=false", "cluster.num_cpus=1", "sweep.name=t-lease",
        "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]"]


def _start(workdir: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *ARGS], cwd=workdir, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _race(workdir: Path) -> tuple[subprocess.Popen, subprocess.Popen, str]:
    """Start two drivers of the same sweep at once; return (winner, loser, loser's stderr)."""
    first, second = _start(workdir), _start(workdir)
    deadline = time.monotonic() + 240
    while first.poll() is None and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    loser = first if first.poll() is not None else second
    winner = second if loser is first else first
    _, err = loser.communicate(timeout=30)
    assert loser.returncode == 2, err[-3000:]
    return winner, loser, err


def test_two_drivers_never_run_one_sweep_and_a_killed_driver_is_closed_by_the_rerun(workdir: Path) -> None:
    winner, loser, err = _race(workdir)  # a new store: both create it at the same moment
    try:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and f"already being run by pid {winner.pid} on " in lines[0], err[-3000:]
        wait_for(lambda: trial_statuses(workdir, "t-lease") == ["RUNNING"], 300, "the winner's trial running")
        os.killpg(winner.pid, signal.SIGKILL)  # the OOM killer / a preempted node: no cleanup code runs
        winner.wait(timeout=30)
    finally:
        if winner.poll() is None:
            os.killpg(winner.pid, signal.SIGKILL)
    # left behind by the dead driver (polled: a read-only read right after a SIGKILL'd writer can fail once)
    wait_for(lambda: trial_statuses(workdir, "t-lease") == ["RUNNING"], 30, "the dead driver's run still RUNNING")

    rerun, other, err = _race(workdir)  # an existing store: again one driver only
    out, rerun_err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, (out + rerun_err)[-3000:]
    assert f"already being run by pid {rerun.pid} on " in err, err[-3000:]
    assert "was lost; 1 unfinished trial run(s) marked KILLED (reason: driver lost)" in out, out[-3000:]
    runs = sorted((r.info.status, r.data.tags.get("fp8lab.reason", "")) for r in trial_runs(workdir, "t-lease"))
    assert runs == [("FINISHED", ""), ("KILLED", "driver lost")], runs  # trained once after the loss, not twice

    run_cli(["report", "--experiment", "t-lease", "--out", "rep"], workdir)
    rows = read_csv(workdir / "rep" / "runs.csv")
    assert sorted(r["reason"] for r in rows) == ["", "driver lost"], rows
