"""Driver-side MLflow layout on a temporary SQLite store."""
from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator import runs
from orchestrator.config_loader import compose_config, to_container
from orchestrator.errors import UserInputError
from orchestrator.matrix import expand_sweep
from tests.support.synthetic import artifacts_beside


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/mlflow.db"


def test_parent_and_child_runs_have_the_layout(store: str) -> None:
    client = MlflowClient(store)
    specs = expand_sweep([], to_container(compose_config([])))
    exp = runs.ensure_experiment(client, "t", artifacts_beside(store))
    parent = runs.open_parent_run(client, exp, "abc123", "t", "x: 1\n")
    child = runs.create_trial_run(client, exp, specs[5], "abc123", parent, {"lora.r": 8})
    run = client.get_run(child)
    assert run.info.run_name == "fp8_protected-s1"
    assert run.info.status == "SCHEDULED"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["fp8lab.policy"] == "fp8_protected" and run.data.tags["fp8lab.seed"] == "1"
    assert run.data.tags["fp8lab.trial_id"] == specs[5].trial_id
    assert run.data.params["lora.r"] == "8"
    # reopening the same sweep reuses the parent
    assert runs.open_parent_run(client, exp, "abc123", "t", "x: 1\n") == parent


def test_finished_trials_and_closing_unfinished(store: str) -> None:
    client = MlflowClient(store)
    specs = expand_sweep([], to_container(compose_config([])))
    exp = runs.ensure_experiment(client, "t", artifacts_beside(store))
    done = runs.create_trial_run(client, exp, specs[0], "s", None, {})
    client.set_tag(done, "fp8lab.status", "FINISHED")
    client.set_terminated(done, "FINISHED")
    pending = runs.create_trial_run(client, exp, specs[1], "s", None, {})
    diverged = runs.create_trial_run(client, exp, specs[2], "s", None, {})
    client.set_tag(diverged, "fp8lab.status", "DIVERGED")
    failed = runs.create_trial_run(client, exp, specs[3], "s", None, {})
    client.set_tag(failed, "fp8lab.status", "FAILED")
    assert runs.finished_trials(client, exp) == {specs[0].trial_id: done, specs[2].trial_id: diverged}
    runs.close_unfinished(client, [pending, done], "KILLED", "sweep interrupted")
    assert client.get_run(pending).info.status == "KILLED"
    assert client.get_run(pending).data.tags["fp8lab.reason"] == "sweep interrupted"
    assert client.get_run(done).info.status == "FINISHED"


def test_store_checks(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="tracking.uri: folder .* does not exist"):
        runs.check_store(f"sqlite:///{tmp_path}/missing/mlflow.db")
    with pytest.raises(UserInputError, match="not reachable"):
        runs.check_store("http://127.0.0.1:9", timeout_s=1)
    runs.check_store(f"sqlite:///{tmp_path}/mlflow.db")


def test_relative_sqlite_uri_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert runs.absolute_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert runs.absolute_uri("http://x:5000") == "http://x:5000"
