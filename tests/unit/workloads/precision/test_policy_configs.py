"""conf/precision/ and the policy registry agree: every registered policy is selectable by name."""
from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.config_loader import compose_config, shipped_config_dir
from workloads.precision.ladder import MECHANISMS, RUNGS
from workloads.precision.policy import available_policies


def test_every_registered_policy_has_a_config_and_back() -> None:
    folder = shipped_config_dir() / "precision"
    files = {p.stem: yaml.safe_load(p.read_text()) for p in folder.glob("*.yaml")}
    assert set(files) == set(available_policies())
    for name, cfg in files.items():
        assert cfg["policy"] == name and cfg["defaults"] == ["/_precision_base@_here_", "_self_"]
        composed = compose_config([f"precision={name}"])
        assert composed.precision.policy == name and dict(composed.precision.switches) == {}


def _experiment_policies(name: str) -> list[str]:
    experiment = yaml.safe_load((shipped_config_dir() / "experiment" / f"{name}.yaml").read_text())
    return experiment["sweep"]["axes"]["precision"]


def test_ablation_experiment_lists_protected_and_each_of_its_rungs() -> None:
    rungs = [r.name for r in RUNGS if r.base == "fp8_protected"]
    assert _experiment_policies("ablations") == ["bf16", "fp8_naive", "fp8_protected", *rungs]


def test_mechanisms_experiment_runs_both_ladders_between_the_three_policies() -> None:
    fp8 = [r.name for r in RUNGS if r.base in ("fp8_naive", "fp8_protected")]
    assert _experiment_policies("mechanisms") == ["bf16", "fp8_naive", "fp8_protected", *fp8]
    sweep = compose_config(["experiment=mechanisms"]).sweep
    assert list(sweep.axes.seed) == [0, 1] and sweep.name == "fp8lab-mechanisms"
    # Same hyperparameters as the default sweep: the experiment sets nothing but the sweep.
    assert compose_config(["experiment=mechanisms"]).train == compose_config([]).train


def test_blackwell_experiment_runs_both_block_formats_and_each_of_their_rungs() -> None:
    rungs = [r.name for r in RUNGS if r.base in ("mxfp8", "nvfp4")]
    assert _experiment_policies("blackwell") == ["bf16", "mxfp8", "nvfp4", *rungs]
    assert list(compose_config(["experiment=blackwell"]).sweep.axes.seed) == [0, 1, 2]


def test_the_mechanisms_doc_names_every_mechanism_and_rung() -> None:
    doc = (Path(__file__).parents[4] / "docs" / "mechanisms.md").read_text()
    for name in [*MECHANISMS, *(r.name for r in RUNGS), *available_policies()]:
        assert f"`{name}`" in doc, name
