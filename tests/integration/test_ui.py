"""`fp8lab ui` serves the MLflow UI for the configured store on 127.0.0.1, without MLflow's job
runner, and prints the URL of the experiment's machine-learning runs view; in headless Chromium
that URL shows the runs table with the trial and its dataset.

The Chromium test skips when no Chromium is installed (`apt-get install chromium`); its screenshot
is left in the test's tmp folder for a human to look at.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import free_port, store_uri
from tests.support.synthetic import artifacts_beside

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "report_screenshot.sh"
BROWSER = next(
    (b for b in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable") if shutil.which(b)), None
)


class _Ui:
    """`fp8lab ui` in its own session, stopped (with everything it started) on exit."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", "--port", str(self.port), *args],
                                     cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, env={**os.environ})

    def __enter__(self) -> _Ui:
        self.first_line = self.proc.stdout.readline()
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    assert response.status == 200
                    return self
            except OSError:
                time.sleep(1)
        pytest.fail("MLflow UI did not answer within 150 s")

    def __exit__(self, *exc: object) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)

    def processes(self) -> list[str]:
        out = subprocess.run(["pgrep", "-a", "-s", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if line.strip()]


def test_ui_serves_on_localhost_without_the_job_runner(tmp_path: Path) -> None:
    with _Ui(tmp_path) as ui:
        assert f"http://127.0.0.1:{ui.port}/#/experiments?workflowType=machine_learning" in ui.first_line
        listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
        assert f"127.0.0.1:{ui.port}" in listening and f"0.0.0.0:{ui.port}" not in listening
        processes = ui.processes()
        # the server and its one uvicorn worker; MLflow's job runner would add Huey consumers
        assert len(processes) <= 2 and not [p for p in processes if "huey" in p.lower()], processes


def _store_with_a_trial(workdir: Path) -> str:
    """An experiment as a sweep leaves it (one trial run with a metric and its training data as
    input), written with the MLflow client: no training needed to look at it."""
    import mlflow.data
    import pandas as pd
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store_uri(workdir))
    experiment_id = client.create_experiment("fp8lab-default", artifact_location=artifacts_beside(store_uri(workdir)))
    run = client.create_run(experiment_id, run_name="bf16-s0", tags={"fp8lab.role": "trial", "fp8lab.policy": "bf16"})
    client.log_metric(run.info.run_id, "eval/accuracy", 0.9)
    data = mlflow.data.from_pandas(pd.DataFrame({"prompt": ["a"], "answer": ["b"]}), source="train.jsonl",
                                   name="embedded:train")
    client.log_inputs(run.info.run_id, [DatasetInput(data._to_mlflow_entity(), [InputTag("mlflow.data.context", "training")])])
    client.set_terminated(run.info.run_id)
    return experiment_id


@pytest.mark.skipif(BROWSER is None and not os.environ.get("FP8LAB_REQUIRE_BROWSER"),
                    reason="no Chromium installed (apt-get install chromium)")
def test_ui_opens_the_runs_view_in_chromium(tmp_path: Path) -> None:
    assert BROWSER, "FP8LAB_REQUIRE_BROWSER is set but no Chromium is installed"
    experiment_id = _store_with_a_trial(tmp_path)
    with _Ui(tmp_path) as ui:
        url = re.search(r"http://\S+", ui.first_line).group(0)
        assert url.endswith(f"/#/experiments/{experiment_id}/runs?workflowType=machine_learning")
        shot = tmp_path / "ui.png"
        env = {**os.environ, "VIRTUAL_TIME_MS": "20000"}
        proc = subprocess.run(["bash", str(SCRIPT), url, str(shot), "1400", "900"], capture_output=True, text=True,
                              timeout=180, env=env)
        assert proc.returncode == 0, proc.stderr
        with tempfile.TemporaryDirectory() as profile:  # the rendered page, to check what it shows
            dom = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                  f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--window-size=1400,900",
                                  "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
    assert "bf16-s0" in dom and "embedded:train" in dom  # the trial and its dataset, in the runs table
    assert "Model training" in dom and "matching run" in dom  # the ML runs view, not the GenAI one
    from matplotlib.image import imread

    img = imread(shot)[..., :3]
    assert img.shape[:2] == (900, 1400) and (img < 0.9).any(axis=2).mean() > 0.01  # drawn, not blank
