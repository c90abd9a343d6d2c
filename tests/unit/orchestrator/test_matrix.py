"""Sweep expansion and trial ids: stable, order-independent, distinct per axis value."""
from __future__ import annotations

import pytest

from orchestrator.config_loader import compose_config, shipped_config_dir, to_container
from orchestrator.errors import UserInputError
from orchestrator.matrix import expand_sweep, flatten_axes, format_override, group_names
from orchestrator.trial_id import compute_trial_id, semantic_config


def _expand(*overrides: str):
    return expand_sweep(list(overrides), to_container(compose_config(list(overrides))))


def test_default_sweep_is_three_policies_by_two_seeds() -> None:
    specs = _expand()
    assert [(s.policy, s.seed) for s in specs] == [
        ("bf16", 0), ("bf16", 1), ("fp8_naive", 0), ("fp8_naive", 1), ("fp8_protected", 0), ("fp8_protected", 1)]
    assert [s.run_name for s in specs][:2] == ["bf16-s0", "bf16-s1"]
    assert len({s.trial_id for s in specs}) == 6


def test_trial_ids_are_stable_across_expansions() -> None:
    assert [s.trial_id for s in _expand()] == [s.trial_id for s in _expand()]


def test_trial_id_ignores_key_order_and_non_semantic_fields() -> None:
    config = to_container(compose_config([]))
    reordered = dict(reversed(list(config.items())))
    assert compute_trial_id(config) == compute_trial_id(reordered)
    moved = to_container(compose_config(["tracking.uri=sqlite:////tmp/other.db", "cluster.cpus_per_trial=2", "eval.batch_size=8"]))
    assert compute_trial_id(moved) == compute_trial_id(config)
    assert "tracking" not in semantic_config(config)


def test_axis_order_does_not_change_trial_ids() -> None:
    a = _expand("+sweep.axes={lora.r:[8,16]}")
    b = _expand("~sweep.axes", "+sweep.axes={lora.r:[8,16],seed:[0,1],precision:[bf16,fp8_naive,fp8_protected]}")
    assert {s.trial_id for s in a} == {s.trial_id for s in b}
    assert len(a) == 12


def test_extra_axis_values_give_distinct_ids_and_names() -> None:
    specs = _expand("sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]", "sweep.axes={lora.r:[8,16],train.lr:[1e-4,2e-4]}")
    assert len({s.trial_id for s in specs}) == 4
    assert specs[0].run_name == "bf16-s0-lora.r=8-train.lr=0.0001"
    assert specs[3].config["lora"]["r"] == 16 and specs[3].config["train"]["lr"] == 2e-4
    assert specs[3].extra_axes == {"lora.r": 16, "train.lr": 2e-4}


def test_nested_axis_form_is_flattened() -> None:
    assert flatten_axes({"precision": ["bf16"], "lora": {"r": [8, 16]}}) == {"precision": ["bf16"], "lora.r": [8, 16]}
    assert len(_expand("+sweep.axes.lora.r=[8,16]")) == 12


def test_bad_cell_values_are_reported_with_their_cell() -> None:
    with pytest.raises(UserInputError) as info:
        _expand("sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]", "sweep.axes.lora.r=[8,-1]")
    assert any("lora.r=-1" in p and "lora.r: must be an integer >= 1" in p for p in info.value.problems)


def test_axis_that_only_changes_non_semantic_keys_is_refused() -> None:
    with pytest.raises(UserInputError) as info:
        _expand("sweep.axes.precision=[bf16]", "~sweep.axes.seed", "sweep.axes={eval.batch_size:[8,16]}")
    assert "are the same trial" in info.value.problems[0]


def test_override_formatting() -> None:
    groups = group_names()
    assert "precision" in groups and "seed" not in groups
    assert format_override("precision", "fp8_naive", groups) == "precision=fp8_naive"
    assert format_override("train.lr", 0.0002, groups) == "train.lr=0.0002"
    assert format_override("lora.target_modules", ["q_proj", "v_proj"], groups) == "lora.target_modules=['q_proj','v_proj']"


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (shipped_config_dir() / "experiment").glob("*.yaml")))
def test_every_shipped_experiment_names_registered_policies_and_validates(experiment: str) -> None:
    """An experiment naming a renamed policy failed only when a user launched it (smollm2 named
    `*-fp32_adapter_storage` a round after the rung was split in two)."""
    from orchestrator.schema import validate_config
    from workloads.precision.policy import available_policies

    config = compose_config([f"experiment={experiment}"])
    unknown = set(config.sweep.axes.precision) - set(available_policies())
    assert not unknown, f"experiment={experiment} names unknown policies {sorted(unknown)}"
    assert validate_config(to_container(config)) == []
