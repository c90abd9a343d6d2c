"""sweep.speed_probe: the probe's result lands on the parent run where the report reads it (no Ray, no training)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from analysis.load import fetch_parent
from analysis.speed_probe import probe_ratios
from orchestrator import speed_probe_run
from tests.support.synthetic import artifacts_beside

RESULT = {"rounds": 6, "chunk": 5, "confidence": 0.95, "loadavg_start": 1.0, "loadavg_end": 1.5, "cpu_count": 2,
          "probe_s": 1.0,
          "policies": {p: {c: {"step_s": {"median": 0.1 * r}, "ratio": {"median": r, "low": r - 0.1, "high": r + 0.1}}
                           for c in ("wall", "cpu")} for p, r in (("bf16", 1.0), ("fp8_protected", 1.25))}}


def test_the_probe_is_logged_on_the_parent_run_and_read_back_by_the_report(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    parent = client.create_run(client.create_experiment("e", artifact_location=artifacts_beside(uri))).info.run_id
    seen = {}

    class Task:
        def options(self, **kw):
            seen["options"] = kw
            return SimpleNamespace(remote=lambda configs: seen.update(configs=configs))

    monkeypatch.setattr(speed_probe_run, "probe_task", Task())
    monkeypatch.setattr(speed_probe_run.ray, "get", lambda _ref: RESULT)
    config = {"cluster": {"cpus_per_trial": 1, "gpus_per_trial": 0}, "precision": {"policy": "bf16"},
              "sweep": {"axes": {"precision": ["fp8_protected", "bf16"]}}}
    text = speed_probe_run.run_and_log(client, parent, config, ["lora.r=16", "sweep.speed_probe=true"])
    assert list(seen["configs"]) == ["bf16", "fp8_protected"]  # the reference first, each policy's own config
    assert all(c["lora"]["r"] == 16 and c["precision"]["policy"] == p for p, c in seen["configs"].items())
    assert "fp8_protected" in text and "1.25x" in text
    ratio, low, high = probe_ratios(fetch_parent(uri, parent)["metrics"])["fp8_protected"]
    assert ratio == pytest.approx(0.8) and low == pytest.approx(1 / 1.35) and high == pytest.approx(1 / 1.15)
