"""Tracking store unavailable: a sweep against a dead MLflow server refuses to start with one
line (before Ray), and a trial whose server goes away mid-training buffers its metrics and
writes them all once the server is back: the run's history is complete, not silently short."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.ui import server_env
from tests.integration.conftest import free_port, TINY, read_json, run_cli

pytestmark = pytest.mark.integration


def test_sweep_refuses_to_start_when_the_tracking_server_is_down(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = run_cli(["sweep", f"tracking.uri={uri}", "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]"],
                   tmp_path, timeout=180, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fp8lab: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"fp8lab: error: tracking.uri: MLflow server {uri} is not reachable"), errors
    assert "fix:" in errors[0]
    assert "Token authentication is enabled" not in output  # Ray was never started
    assert not list(tmp_path.iterdir())  # and nothing was written


class _Server:
    """`mlflow server` on 127.0.0.1 with a SQLite store in tmp; stop() and start() keep the port."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> None:
        command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.folder}/server.db",
                   "--artifacts-destination", str(self.folder / "artifacts"), "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", "1"]
        # as `fp8lab ui` starts it: without MLflow's job runner, whose start-up a loaded machine makes slow
        env = {**server_env(with_jobs=False), "MLFLOW_DISABLE_TELEMETRY": "true"}
        self.proc = subprocess.Popen(command, cwd=self.folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"mlflow server did not answer within {timeout:.0f}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def test_metrics_survive_a_server_outage_during_training(tmp_path: Path) -> None:
    server = _Server(tmp_path)
    server.start()
    out = tmp_path / "result.json"
    steps = 100  # long enough to still be training through the outage (~0.3 s a step here)
    # MLflow's own HTTP retries are cut short so that fp8lab's buffer-and-retry is what carries the
    # metrics over the gap (MLflow's defaults would block each write for up to ~2 minutes instead).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    args = ["trial", "precision=bf16", *TINY, f"train.steps={steps}", "train.log_every=1",
            f"tracking.uri={server.uri}", f"trial.output={out}"]
    trial = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(trial.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any(line.strip().startswith("step 5/") for line in lines):
            assert trial.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "trial did not reach step 5"
            time.sleep(0.2)
        server.stop()  # the store goes away while the trial trains
        down_at = len(lines)
        time.sleep(10)
        server.start()  # back on the same port
        trial.wait(timeout=300)
        reader.join(timeout=10)
        log = "".join(lines)
        assert trial.returncode == 0, log[-4000:]
        trained_while_down = [line for line in lines[down_at:] if line.strip().startswith("step ")]
        assert trained_while_down, "the trial should keep training while the store is down:\n" + log[-3000:]

        result = read_json(out)
        assert result["status"] == "FINISHED", result
        client = MlflowClient(server.uri)
        run = client.get_run(result["mlflow_run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["fp8lab.status"] == "FINISHED"
        for metric in ("train/loss", "train/lr", "train/grad_norm"):  # per-step only (tokens_per_s has a final value too)
            steps_logged = [m.step for m in client.get_metric_history(run.info.run_id, metric)]
            assert sorted(steps_logged) == list(range(1, steps + 1)), (metric, steps_logged)
        assert "eval/accuracy" in run.data.metrics
        assert "result.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
        trial_log = Path(client.download_artifacts(run.info.run_id, "logs/trial.log", str(tmp_path))).read_text()
        assert "MLflow write failed" in trial_log  # the outage was seen and bridged, not missed
    finally:
        if trial.poll() is None:
            os.killpg(trial.pid, signal.SIGKILL)
        server.stop()


def test_an_outage_past_the_retry_budget_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The other outcome: a store that stays away. Training goes on while metrics wait in memory;
    the final flush gives up after the retry budget (60 s in a trial, 2 s here) with an error that
    names the store, which the trial turns into FAILED with that reason (workloads/trial.py)."""
    from workloads.record.logger import MlflowTrialLogger, TrackingUnavailable

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    logger = MlflowTrialLogger(f"http://127.0.0.1:{free_port()}", "0" * 32, flush_every=2, retry_s=2)
    for step in range(1, 6):
        logger.log_step(step, {"train/loss": 1.0 / step})  # mid-training writes fail quietly: nothing is dropped
    assert len(logger._metrics) == 5
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable, match="MLflow store unreachable for 2s"):
        logger.flush()
    assert time.monotonic() - started < 30
    assert len(logger._metrics) == 5  # still held: a later flush could write them all
