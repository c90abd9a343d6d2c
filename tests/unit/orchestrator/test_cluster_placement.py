"""Multi-node rules without a cluster: trial resources and pins, and the file-store refusal."""
from __future__ import annotations

import pytest

from orchestrator import ray_runner, runs
from orchestrator.errors import UserInputError

CLUSTER = {"address": "auto", "trial_resources": {}, "pin_trials": [], "cpus_per_trial": 1, "gpus_per_trial": 0}


def test_trial_resources_add_round_robin_pins() -> None:
    cluster = {**CLUSTER, "trial_resources": {"pool": 1}, "pin_trials": ["node_a", "node_b"]}
    assert [ray_runner.trial_resources(cluster, i) for i in range(3)] == [
        {"pool": 1, "node_a": ray_runner.PIN_AMOUNT}, {"pool": 1, "node_b": ray_runner.PIN_AMOUNT},
        {"pool": 1, "node_a": ray_runner.PIN_AMOUNT}]
    assert ray_runner.trial_resources(CLUSTER, 0) == {}


@pytest.mark.parametrize("uri", ["sqlite:////tmp/x/mlflow.db", "file:///tmp/mlruns", "/tmp/mlruns"])
def test_file_store_refused_on_several_nodes(uri: str) -> None:
    with pytest.raises(UserInputError, match="2 nodes.*tracking.uri=http://"):
        runs.check_store_for_cluster(2, CLUSTER, uri, None)


def test_file_store_allowed_on_one_node_server_always() -> None:
    runs.check_store_for_cluster(1, CLUSTER, "sqlite:////tmp/x/mlflow.db", None)
    runs.check_store_for_cluster(3, CLUSTER, "http://mlflow:5000", None)
    runs.check_artifact_root(3, "mlflow-artifacts:/1", "exp")
    runs.check_artifact_root(1, "/mlruns/3", "exp")  # one node: its own disk is everyone's


def test_ray_client_counts_as_remote_and_local_artifacts_are_refused() -> None:
    with pytest.raises(UserInputError, match="Ray Client"):
        runs.check_store_for_cluster(1, {**CLUSTER, "address": "ray://head:10001"}, "sqlite:////tmp/m.db", None)
    with pytest.raises(UserInputError, match="tracking.artifact_location"):
        runs.check_store_for_cluster(2, CLUSTER, "http://mlflow:5000", "/shared/artifacts")
    with pytest.raises(UserInputError, match="local folder"):
        runs.check_artifact_root(2, "/mlruns/3", "exp")


def test_missing_custom_resource_is_refused_before_trials_wait_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_runner.ray, "cluster_resources", lambda: {"CPU": 4.0, "node_a": 1.0, "memory": 1e9})
    ray_runner.check_resources({**CLUSTER, "pin_trials": ["node_a"]})
    with pytest.raises(UserInputError, match=r"node_b.*custom resources: node_a=1.*--resources='\{\"node_b\": 1\}'"):
        ray_runner.check_resources({**CLUSTER, "pin_trials": ["node_a", "node_b"]})


LOCAL = {**CLUSTER, "address": None, "num_cpus": 2}


def test_local_cluster_resources_are_checked_before_ray_starts() -> None:
    ray_runner.check_local_resources(LOCAL)  # fits: nothing raised
    ray_runner.check_local_resources({**CLUSTER, "pin_trials": ["node_a"]})  # a real cluster: checked once connected
    with pytest.raises(UserInputError) as exc:
        ray_runner.check_local_resources({**LOCAL, "cpus_per_trial": 3, "trial_resources": {"pool": 1}})
    assert [p.split(":")[0] for p in exc.value.problems] == ["cluster.cpus_per_trial", "cluster.trial_resources/pin_trials"]


def test_one_cpu_rule_before_a_local_ray_and_on_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_runner.ray, "cluster_resources", lambda: {"CPU": 2.0})
    greedy = {**CLUSTER, "cpus_per_trial": 3}
    with pytest.raises(UserInputError, match=r"^cluster.cpus_per_trial: 3 CPUs per trial but the cluster has 2 \(fix"):
        ray_runner.check_resources(greedy)
    with pytest.raises(UserInputError, match=r"the local Ray gets 2 \(fix: .*raise cluster.num_cpus\)"):
        ray_runner.check_local_resources({**greedy, "address": None, "num_cpus": 2})
    ray_runner.check_resources({**CLUSTER, "cpus_per_trial": 2})  # exactly enough
