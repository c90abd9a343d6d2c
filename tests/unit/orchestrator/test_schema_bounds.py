"""Reliability round 3, case 9: counts have upper bounds (`train.steps=1e20` written as an int
used to train "step 115/100000000000000000000"); a long run is confirmed with a flag."""
from __future__ import annotations

import pytest

from orchestrator.config_loader import compose_config, to_container
from orchestrator.schema import LONG_RUN_STEPS, validate_config


def _problems(*overrides: str) -> list[str]:
    return validate_config(to_container(compose_config(list(overrides))))


def test_absurd_step_count_is_refused_with_one_line() -> None:
    problems = _problems("train.steps=100000000000000000000")
    assert len(problems) == 1 and problems[0].startswith("train.steps: 100000000000000000000 is more than"), problems
    assert "(fix: " in problems[0]


def test_long_run_needs_the_confirmation_flag() -> None:
    long = f"train.steps={LONG_RUN_STEPS + 1}"
    problems = _problems(long)
    assert len(problems) == 1 and "train.allow_long_run=true" in problems[0], problems
    assert _problems(long, "train.allow_long_run=true") == []
    assert _problems(f"train.steps={LONG_RUN_STEPS}") == []


@pytest.mark.parametrize("override", ["lora.r=100000000", "train.batch_size=10000000000",
                                      "train.max_seq_len=100000000000", "sweep.max_retries=1000000",
                                      "eval.limit=10000000000000"])
def test_other_counts_have_upper_bounds(override: str) -> None:
    key = override.split("=")[0]
    problems = _problems(override)
    assert len(problems) == 1 and problems[0].startswith(f"{key}: ") and "upper bound" in problems[0], problems
