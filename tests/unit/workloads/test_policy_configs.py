"""conf/precision/ and the policy registry agree: every registered policy is selectable by name."""
from __future__ import annotations

import yaml

from orchestrator.config_loader import shipped_config_dir
from workloads.precision.policy import available_policies, get_policy


def test_every_registered_policy_has_a_config_and_back() -> None:
    files = {p.stem: yaml.safe_load(p.read_text()) for p in (shipped_config_dir() / "precision").glob("*.yaml")}
    assert set(files) == set(available_policies())
    for name, cfg in files.items():
        assert cfg["policy"] == name
        get_policy(cfg["policy"]).with_switches(**cfg["switches"])


def test_ablation_experiment_lists_every_policy() -> None:
    experiment = yaml.safe_load((shipped_config_dir() / "experiment" / "ablations.yaml").read_text())
    assert experiment["sweep"]["axes"]["precision"] == available_policies()
