"""`fp8lab ui` serves the MLflow UI for the configured store on 127.0.0.1 and prints the URL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration


def test_ui_serves_on_localhost(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ})
    try:
        first_line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in first_line
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("MLflow UI did not answer within 150 s")
        listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
        assert f"127.0.0.1:{port}" in listening and f"0.0.0.0:{port}" not in listening
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
