"""`fp8lab trial` skips an identical trial that already FINISHED in the experiment (same trial id,
as a sweep does) and hands back its result; `--force` runs it again as a new run (issue 28, item 5)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from orchestrator import cli, runs
from orchestrator.config_loader import compose_config, to_container
from orchestrator.trial_id import compute_trial_id

OVERRIDES = ["train.steps=2", "eval.limit=4"]


def _trial_runs(client: MlflowClient, experiment_id: str) -> list[Any]:
    return client.search_runs([experiment_id], "tags.`fp8lab.role` = 'trial'")


@pytest.fixture()
def finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[MlflowClient, str, dict[str, Any], list[str]]:
    """A store holding a FINISHED run of exactly the trial the overrides describe."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*OVERRIDES, f"tracking.uri={uri}", f"trial.output={tmp_path / 'r.json'}"]
    from workloads.preflight import resolve_config

    config = resolve_config(to_container(compose_config(args, None)))  # as `fp8lab trial` ids it: train keys from the data
    client = MlflowClient(uri)
    experiment_id = runs.ensure_experiment(client, config["sweep"]["name"], config["tracking"]["artifact_location"])
    run = client.create_run(experiment_id, tags={"fp8lab.role": "trial", "fp8lab.status": "FINISHED",
                                                 "fp8lab.trial_id": compute_trial_id(config)})
    result = {"status": "FINISHED", "policy": "bf16", "seed": 0, "metrics": {"eval/accuracy": 0.5},
              "mlflow_run_id": run.info.run_id, "reason": ""}
    client.log_text(run.info.run_id, json.dumps(result), "result.json")
    client.set_terminated(run.info.run_id, "FINISHED")
    return client, experiment_id, result, args


def test_finished_identical_trial_is_skipped_with_its_result(finished, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    client, experiment_id, result, args = finished

    def must_not_train(*_: object, **__: object) -> None:
        raise AssertionError("the finished trial was run again")

    monkeypatch.setattr("workloads.entry.run", must_not_train)
    assert cli.main(["trial", *args]) == 0
    assert "already FINISHED as MLflow run" in capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text()) == result
    assert len(_trial_runs(client, experiment_id)) == 1


def test_force_reruns_it_as_a_new_run(finished, monkeypatch: pytest.MonkeyPatch) -> None:
    client, experiment_id, result, args = finished
    calls: list[Any] = []

    def fake_run(launch: Any, progress: Any) -> dict[str, Any]:
        calls.append(launch)
        return {**result, "mlflow_run_id": launch.run_id}

    monkeypatch.setattr("workloads.entry.run", fake_run)
    assert cli.main(["trial", "--force", *args]) == 0
    assert len(calls) == 1 and calls[0].run_id != result["mlflow_run_id"]
    assert len(_trial_runs(client, experiment_id)) == 2
