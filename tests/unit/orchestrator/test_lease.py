"""One driver per sweep, lost drivers closed, a new store migrated once (orchestrator.lease)."""
from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from fp8lab_conf.contracts import TAG_DRIVER, TAG_DRIVER_HEARTBEAT, TAG_DRIVER_LOST
from orchestrator import lease, runs
from tests.support.synthetic import artifacts_beside

ROOT = Path(__file__).resolve().parents[3]


def _hold_lease(uri: str, sweep_id: str) -> subprocess.Popen:
    """Another driver: a process that holds the sweep's lease until it is killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from orchestrator.lease import SweepLease
        lease = SweepLease({uri!r}, {sweep_id!r}); lease.acquire()
        print("held", flush=True); time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_second_driver_is_refused_naming_the_holder_and_a_killed_one_frees_the_lease(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    other = _hold_lease(uri, "abc123")
    try:
        with pytest.raises(lease.SweepBusy) as refused:
            lease.SweepLease(uri, "abc123").acquire()
        line = str(refused.value)
        assert f"pid {other.pid} on {socket.gethostname()} since " in line and "fix:" in line, line
        assert lease.driver_alive(uri, "abc123", {})
        with lease.SweepLease(uri, "other-sweep"):  # another sweep of the same store is not blocked
            pass
    finally:
        _kill(other)  # SIGKILL: no cleanup code runs, the kernel frees the lock
    assert not lease.driver_alive(uri, "abc123", {})
    with lease.SweepLease(uri, "abc123") as mine:
        assert mine.holder.pid == os.getpid()


def test_a_refusal_names_the_new_holder_not_the_dead_one_its_file_still_names(tmp_path: Path) -> None:
    """The winner writes itself into the lock file just after taking the lock; a loser that reads
    in between finds the previous holder there, dead since, and must wait for the live one."""
    import fcntl
    import json
    import threading
    from dataclasses import asdict

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    handle = open(lease._lock_file(lease.local_store_path(uri), "sweep-abc123"), "a+")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the winner has the lock ...
    handle.write(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "since": "earlier"}))
    handle.flush()  # ... and the file still names the driver before it

    def winner_writes_itself() -> None:
        time.sleep(0.3)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(asdict(lease.Holder.me())))
        handle.flush()

    writer = threading.Thread(target=winner_writes_itself)
    writer.start()
    try:
        with pytest.raises(lease.SweepBusy) as refused:
            lease.SweepLease(uri, "abc123").acquire()
    finally:
        writer.join()
        handle.close()
    line = str(refused.value)
    assert f"pid {os.getpid()} on " in line and f"pid {dead.pid} " not in line, line


def test_server_store_lease_is_the_parent_heartbeat() -> None:
    mine = lease.SweepLease("http://127.0.0.1:1", "s1")
    mine.acquire()  # no local file to lock
    fresh = {TAG_DRIVER: "pid 1 on elsewhere since x", TAG_DRIVER_HEARTBEAT: f"{time.time() - 5:.0f}"}
    with pytest.raises(lease.SweepBusy, match="pid 1 on elsewhere"):
        mine.check_parent(fresh)
    stale = {**fresh, TAG_DRIVER_HEARTBEAT: f"{time.time() - lease.LEASE_TIMEOUT_S - 1:.0f}"}
    mine.check_parent(stale)  # expired: taken over
    assert not lease.driver_alive("http://127.0.0.1:1", "s1", stale)
    mine.check_parent({**fresh, TAG_DRIVER: mine.holder.describe()})  # our own heartbeat


def _open_store(uri: str, barrier: Any) -> None:
    barrier.wait()  # both processes open the new store at the same instant
    lease.ready_store(uri)
    MlflowClient(uri).search_experiments()


def test_concurrent_first_use_of_a_new_store_migrates_it_once(tmp_path: Path) -> None:
    """Two processes open the same new SQLite store at once; without the init lock two Alembic
    migrations race (`table _alembic_tmp_tags already exists`). Forked: MLflow is already imported."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_open_store, args=(uri, barrier)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0]
    client = MlflowClient(uri)
    assert client.create_experiment("after") and client.get_experiment_by_name("after")


def test_runs_of_a_lost_driver_are_closed_and_a_live_drivers_left_alone(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    lease.ready_store(uri)
    client = MlflowClient(uri)
    exp = runs.ensure_experiment(client, "lost", artifacts_beside(uri))
    parent = runs.open_parent_run(client, exp, "s-lost", "lost", "a: 1\n")
    client.set_tag(parent, TAG_DRIVER, "pid 4242 on node-7 since 2026-01-01 00:00:00 UTC")
    child = client.create_run(exp, tags={"fp8lab.role": "trial", "fp8lab.sweep_id": "s-lost",
                                         "fp8lab.trial_id": "t1", "fp8lab.status": "RUNNING"}).info.run_id
    done = client.create_run(exp, tags={"fp8lab.role": "trial", "fp8lab.sweep_id": "s-lost",
                                        "fp8lab.trial_id": "t0", "fp8lab.status": "FINISHED"}).info.run_id
    client.set_terminated(done, "FINISHED")
    driver = _hold_lease(uri, "s-lost")
    try:
        assert runs.close_lost_in_store(uri, "lost") == []  # its driver is alive
        assert client.get_run(child).info.status == "RUNNING"
    finally:
        _kill(driver)
    lines = runs.close_lost_in_store(uri, "lost")
    assert lines == ["sweep s-lost: its driver (pid 4242 on node-7 since 2026-01-01 00:00:00 UTC) was lost; "
                     "1 unfinished trial run(s) marked KILLED (reason: driver lost)"], lines
    closed = client.get_run(child)
    assert closed.info.status == "KILLED" and closed.data.tags["fp8lab.status"] == "KILLED"
    assert closed.data.tags["fp8lab.reason"] == lease.DRIVER_LOST
    assert closed.data.tags[TAG_DRIVER_LOST].startswith("pid 4242 on node-7")
    assert client.get_run(parent).info.status == "KILLED"
    assert client.get_run(done).info.status == "FINISHED"
    assert runs.close_lost_in_store(uri, "lost") == []  # nothing left to close
