"""Reliability round 3, case 11: every port a local sweep opens listens on the loopback address.

Before, Ray's DashboardAgent served Prometheus metrics (session name, task names, resources) on
0.0.0.0 without authentication, and the GCS, raylet, object manager and workers listened on every
interface, even though the sweep started Ray for this machine only. This test runs a real
one-trial sweep and samples the listening sockets of its whole process tree (driver, GCS, raylet,
agents, workers) until it ends.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import TINY

pytestmark = pytest.mark.integration

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _listening(root: psutil.Process) -> set[tuple[str, str, int]]:
    found = set()
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return found
    for proc in procs:
        try:
            name = proc.name()
            found |= {(name, c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
    return found


def test_every_listening_port_of_a_local_sweep_is_on_loopback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    args = ["sweep", *TINY, "cluster.num_cpus=1", "sweep.name=t-ports", "sweep.axes.precision=[bf16]",
            "sweep.axes.seed=[0]", "sweep.report=false"]
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root, seen, deadline = psutil.Process(proc.pid), set(), time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= _listening(root)
        time.sleep(0.3)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output[-4000:]
    names = {name for name, _, _ in seen}
    assert "gcs_server" in names and any("DashboardAgent" in n for n in names), (names, output[-2000:])
    exposed = sorted(s for s in seen if s[1] not in LOOPBACK)
    assert not exposed, f"listening beyond loopback: {exposed}"
