"""`precision.switches` from the command line: honoured as typed, and never applied to the bf16
baseline of a sweep (which would relabel it and leave the report without a baseline)."""
from __future__ import annotations

from orchestrator.config_loader import compose_config, to_container
from orchestrator.matrix import expand_sweep


def _expand(*overrides: str):
    return expand_sweep(list(overrides), to_container(compose_config(list(overrides))))


def test_switches_mapping_is_accepted_without_a_plus_prefix() -> None:
    config = compose_config(["precision=fp8_protected", "precision.switches={lm_head_fp8:true,calibration_steps:2}"])
    assert dict(config.precision.switches) == {"lm_head_fp8": True, "calibration_steps": 2}
    single = compose_config(["precision=fp8_protected", "precision.switches.lm_head_fp8=true"])
    assert dict(single.precision.switches) == {"lm_head_fp8": True}


def test_a_switch_override_keeps_the_bf16_baseline_plain_and_labels_the_switched_policies() -> None:
    plain = {s.policy: s for s in _expand("sweep.axes.seed=[0]")}
    specs = _expand("sweep.axes.seed=[0]", "precision.switches={lm_head_fp8:true}")
    labels = [s.policy for s in specs]
    assert labels == ["bf16", "fp8_naive+lm_head_fp8=True", "fp8_protected+lm_head_fp8=True"]
    bf16 = specs[0]
    assert bf16.config["precision"]["switches"] == {} and bf16.run_name == "bf16-s0"
    assert bf16.trial_id == plain["bf16"].trial_id  # the very same baseline trial as the default sweep
    assert specs[2].config["precision"]["switches"] == {"lm_head_fp8": True}
    assert specs[2].trial_id != plain["fp8_protected"].trial_id
    # The recorded overrides reproduce the cell: `fp8lab trial <overrides>` composes the same config.
    assert to_container(compose_config(list(bf16.overrides))) == bf16.config


def test_a_sweep_of_bf16_alone_honours_the_switches() -> None:
    specs = _expand("sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]", "precision.switches={lm_head_fp8:true}")
    assert {s.policy for s in specs} == {"bf16+lm_head_fp8=True"}
