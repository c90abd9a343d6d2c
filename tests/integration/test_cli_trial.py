"""`fp8lab trial` end to end through the real CLI, one tiny trial per policy, on CPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import TINY, client_for, read_json, run_cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("policy", ["bf16", "fp8_naive", "fp8_protected"])
def test_trial_writes_result_and_mlflow_run(policy: str, workdir: Path) -> None:
    out = workdir / "result.json"
    proc = run_cli(["trial", f"precision={policy}", *TINY, f"trial.output={out}"], workdir)
    assert "not a git repository" not in proc.stderr  # the workdir is no git repository: no git noise
    result = read_json(out)
    assert result["status"] == "FINISHED", result
    assert result["policy"] == policy and result["seed"] == 0 and result["backend"] == "emulated"
    assert result["device"] == "cpu" and len(result["trial_id"]) == 16
    for key in ("eval/accuracy", "eval/accuracy_stderr", "train/tokens_per_s", "train/final_loss",
                "underflow/events", "memory/peak_bytes"):
        assert key in result["metrics"], key
    assert 0.0 <= result["metrics"]["eval/accuracy"] <= 1.0

    client = client_for(workdir)
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == f"{policy}-s0"
    tags = run.data.tags
    assert tags["fp8lab.policy"] == policy and tags["fp8lab.backend"] == "emulated" and tags["fp8lab.emulated"] == "true"
    assert tags["fp8lab.status"] == "FINISHED" and tags["fp8lab.trial_id"] == result["trial_id"]
    assert run.data.params["precision.policy"] == policy and run.data.params["lora.r"] == "8"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == [2, 4, 6]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config", "precision", "logs", "result.json", "eval", "adapter"} <= artifacts  # every policy keeps its adapter
    assert "fp8lab.adapter_error" not in tags
    _assert_eval_samples(client, run.info.run_id, result["metrics"]["eval/accuracy"])
    if policy != "bf16":
        assert "telemetry" in artifacts
        assert client.get_metric_history(run.info.run_id, "telemetry/activation/underflow_pct")


def _assert_eval_samples(client, run_id: str, accuracy: float) -> None:
    """Per-item samples (one 0/1 `acc` per document) average to the logged accuracy."""
    folder = Path(client.download_artifacts(run_id, "eval"))
    rows = [json.loads(line) for line in (folder / "samples" / "fp8lab_embedded.jsonl").read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == list(range(16))
    assert {r["metric"] for r in rows} == {"acc"} and {r["value"] for r in rows} <= {0.0, 1.0}
    assert sum(r["value"] for r in rows) / len(rows) == pytest.approx(accuracy)
    results = read_json(folder / "results.json")
    assert results["results"]["fp8lab_embedded"]["acc,none"] == pytest.approx(accuracy)


def test_diverging_trial_is_a_result_not_a_crash(workdir: Path) -> None:
    out = workdir / "result.json"
    proc = run_cli(["trial", "precision=bf16", *TINY, "fault.kind=nan_weights", "fault.step=3", f"trial.output={out}"], workdir)
    result = read_json(out)
    assert proc.returncode == 0
    assert result["status"] == "DIVERGED" and result["diverged_step"] == 3
    assert "train/final_loss" in result["metrics"]
    run = client_for(workdir).get_run(result["mlflow_run_id"])
    assert run.data.tags["fp8lab.diverged_step"] == "3" and run.info.status == "FINISHED"
    assert "adapter" not in {a.path for a in client_for(workdir).list_artifacts(run.info.run_id)}  # nothing to export


def test_bad_input_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    proc = run_cli(["trial", "precision=fp8_nave", "lora.r=-1"], tmp_path, check=False)
    assert proc.returncode == 2
    assert "did you mean fp8_naive?" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()
    proc = run_cli(["trial", "lora.r=-1", "train.lr=0"], tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.count("fp8lab: error:") == 2
    assert not (tmp_path / "mlflow.db").exists()
