"""Pieces of `fp8lab export --best`, the parent run's summary, params and `fp8lab ui`, without a sweep."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.best import choose_best
from orchestrator.cli import main
from orchestrator.errors import UserInputError
from orchestrator.params import sweep_params, trial_params
from orchestrator.sweep_summary import log_policy_summary, log_sweep_params, policy_means
from orchestrator.ui import ML_KIND, runs_view_url, server_env
from tests.support.synthetic import artifacts_beside


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module (creating one runs MLflow's migrations: seconds)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store')}/m.db"
    MlflowClient(uri).search_experiments()
    return uri


def _run(policy: str, seed: int, acc: float, tps: float, status: str = "FINISHED", emulated: bool = False) -> SimpleNamespace:
    return SimpleNamespace(info=SimpleNamespace(run_id=f"{policy}-{seed}"),
                           data=SimpleNamespace(tags={"fp8lab.policy": policy, "fp8lab.seed": str(seed),
                                                      "fp8lab.status": status, "mlflow.runName": f"{policy}-s{seed}",
                                                      "fp8lab.emulated": str(emulated).lower()},
                                                metrics={"eval/accuracy": acc, "train/tokens_per_s": tps}))


def test_best_is_the_fastest_policy_within_the_margin_of_bf16() -> None:
    runs = [_run("bf16", 0, 0.90, 100), _run("bf16", 1, 0.92, 100),
            _run("fp8_protected", 0, 0.905, 150), _run("fp8_protected", 1, 0.91, 150),  # mean 0.9075 >= 0.91 - 0.01
            _run("fp8_naive", 0, 0.70, 200), _run("fp8_naive", 1, 0.72, 200)]  # fastest, but worse
    best = choose_best(runs)
    assert (best.policy, best.run_id) == ("fp8_protected", "fp8_protected-1")  # its most accurate seed
    assert "1.50x bf16" in best.reason
    assert choose_best(runs, margin_pts=0.1).policy == "bf16"  # nothing else is that close
    assert choose_best(runs, margin_pts=30).policy == "fp8_naive"


def test_best_on_emulated_fp8_does_not_rank_by_speed_and_states_its_rule() -> None:
    """On CPU emulated FP8 is slower than bf16: ranking by speed would always export bf16."""
    runs = [_run("bf16", 0, 0.90, 3000, emulated=True), _run("bf16", 1, 0.92, 3100, emulated=True),
            _run("fp8_protected", 0, 0.905, 2000, emulated=True), _run("fp8_protected", 1, 0.91, 2100, emulated=True),
            _run("fp8_naive", 0, 0.70, 1500, emulated=True)]
    best = choose_best(runs)
    assert best.policy == "fp8_protected"
    assert "emulated" in best.reason and "not ranked" in best.reason and "bf16 if none" in best.reason
    assert choose_best(runs, margin_pts=0.1).policy == "bf16"  # no FP8 policy is that close
    assert "no FP8 policy" in choose_best(runs, margin_pts=0.1).reason


def test_best_without_bf16_is_the_most_accurate_and_failed_runs_do_not_count() -> None:
    runs = [_run("fp8_naive", 0, 0.7, 200), _run("fp8_protected", 0, 0.8, 100), _run("fp8_x", 0, 0.99, 1, "DIVERGED")]
    assert choose_best(runs).policy == "fp8_protected"
    with pytest.raises(UserInputError, match="no FINISHED trial"):
        choose_best([_run("bf16", 0, 0.9, 1, "FAILED")])


def test_params_are_the_semantic_config_only() -> None:
    config = {"seed": 0, "lora": {"r": 8}, "train": {"lr": 1e-4, "num_threads": 2, "log_every": 5},
              "tracking": {"uri": "sqlite:///x.db"}, "cluster": {"num_cpus": 2}, "fault": {"kind": None},
              "report": {"out": None}, "trial": {"output": "r.json"},
              "sweep": {"name": "s", "axes": {"precision": ["bf16", "fp8_naive"], "seed": [0, 1]}},
              "precision": {"policy": "bf16"}}
    assert trial_params(config) == {"seed": 0, "lora.r": 8, "train.lr": 1e-4, "precision.policy": "bf16"}
    parent = sweep_params(config, n_trials=4)
    assert parent == {"lora.r": 8, "train.lr": 1e-4, "sweep.axes.precision": ["bf16", "fp8_naive"],
                      "sweep.axes.seed": [0, 1], "sweep.name": "s", "sweep.n_trials": 4}


def test_parent_run_gets_the_matrix_and_per_policy_means(store: str) -> None:
    client = MlflowClient(store)
    exp = client.create_experiment("parent", artifact_location=artifacts_beside(store))
    parent = client.create_run(exp).info.run_id
    earlier = client.create_run(exp, tags={"fp8lab.policy": "fp8_naive+bf16_lora_gemm", "fp8lab.status": "FINISHED"})
    client.log_metric(earlier.info.run_id, "eval/accuracy", 0.5)
    results = {"a": {"policy": "bf16", "status": "FINISHED", "metrics": {"eval/accuracy": 0.8, "train/tokens_per_s": 10.0}},
               "b": {"policy": "bf16", "status": "FINISHED", "metrics": {"eval/accuracy": 0.9, "train/tokens_per_s": 30.0}},
               "c": {"policy": "bf16", "status": "FAILED", "metrics": {}}}
    log_sweep_params(client, parent, {"seed": 0, "sweep": {"name": "e", "axes": {"seed": [0, 1]}}}, 3)
    log_policy_summary(client, parent, results, {"t": earlier.info.run_id})
    data = client.get_run(parent).data
    assert data.params == {"sweep.axes.seed": "[0, 1]", "sweep.name": "e", "sweep.n_trials": "3"}
    assert data.metrics["summary/bf16/accuracy"] == pytest.approx(0.85)
    assert data.metrics["summary/bf16/tokens_per_s"] == pytest.approx(20.0)
    assert data.metrics["summary/bf16/n"] == 2
    assert data.metrics["summary/fp8_naive_bf16_lora_gemm/accuracy"] == pytest.approx(0.5)  # '+' is not allowed
    assert policy_means([]) == {}


def test_ui_opens_the_ml_runs_view_of_the_experiment_without_the_job_runner(store: str, tmp_path) -> None:
    missing = f"sqlite:///{tmp_path}/m.db"
    assert runs_view_url(missing, "e", "127.0.0.1", 5001) == \
        "http://127.0.0.1:5001/#/experiments?workflowType=machine_learning"
    assert not (tmp_path / "m.db").exists()  # no store is created just to build a URL
    assert runs_view_url(store, "ui", "127.0.0.1", 5001).endswith("/#/experiments?workflowType=machine_learning")
    client = MlflowClient(store)
    exp = client.create_experiment("ui", artifact_location=artifacts_beside(store))
    assert runs_view_url(store, "ui", "0.0.0.0", 5001) == \
        f"http://127.0.0.1:5001/#/experiments/{exp}/runs?workflowType=machine_learning"
    assert client.get_experiment(exp).tags["mlflow.experimentKind"] == ML_KIND
    assert server_env(False)["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert server_env(True)["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "true"


@pytest.mark.parametrize("argv, message", [
    (["export", "--format", "merged", "--out", "x"], "exactly one of RUN_ID or --sweep"),
    (["export", "r1", "r2", "--format", "merged", "--out", "x"], "exactly one of RUN_ID or --sweep"),
    (["export", "--sweep", "abc", "--format", "merged", "--out", "x"], "add --best"),
    (["export", "abc", "--format", "merged", "--out", "x", "--partial-blocks"], "--partial-blocks: only for --format fp8-block128"),
    (["export", "abc", "--format", "merged", "--out", "x"], "no MLflow store at"),
    (["export", "abc", "--format", "merged", "--out", "x", "tracking.uri=sqlite:///other.db"], "other.db"),
])
def test_export_argument_mistakes_are_one_line(argv, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "x").exists()
