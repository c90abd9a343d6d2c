"""Config validation: every problem reported together, each naming the key and the fix."""
from __future__ import annotations

import pytest

from orchestrator.config_loader import compose_config, to_container
from orchestrator.errors import UserInputError
from orchestrator.schema import validate_config


def _config(*overrides: str) -> dict:
    return to_container(compose_config(list(overrides)))


def test_default_config_is_valid() -> None:
    assert validate_config(_config()) == []


def test_all_errors_reported_together() -> None:
    problems = validate_config(_config("lora.r=-4", "train.lr=abc", "train.steps=0", "+lora.rank=8"))
    joined = "\n".join(problems)
    assert len(problems) == 4
    assert "lora.r: must be an integer >= 1, got -4 (fix: lora.r=8)" in joined
    assert "train.lr: must be a number > 0" in joined
    assert "train.steps: must be an integer >= 1, got 0" in joined
    assert "lora.rank: unknown config key" in joined


@pytest.mark.parametrize("override,key", [
    ("seed=1.5", "seed"),
    ("lora.dropout=1.0", "lora.dropout"),
    ("train.batch_size=true", "train.batch_size"),
    ("precision.telemetry.every=0", "precision.telemetry.every"),
    ("report.utilization=1.5", "report.utilization"),
    ("report.equivalence_margin_pts=0", "report.equivalence_margin_pts"),
    ("cluster.gpus_per_trial=1.5", "cluster.gpus_per_trial"),
    ("precision.backend=cuda", "precision.backend"),
    ("model.trust_remote_code=yes", "model.trust_remote_code"),
])
def test_wrong_values_name_the_key(override: str, key: str) -> None:
    problems = validate_config(_config(override))
    assert len(problems) == 1 and problems[0].startswith(f"{key}:"), problems


def test_unknown_key_suggests_close_match() -> None:
    problems = validate_config(_config("+train.stpes=3"))
    assert problems == [p for p in problems if "did you mean train.steps?" in p] and problems


def test_seed_axis_must_hold_integers() -> None:
    problems = validate_config(_config("sweep.axes.seed=[0,a]"))
    assert any(p.startswith("sweep.axes.seed: seeds must be integers") for p in problems)


def test_axis_on_unknown_key_is_refused() -> None:
    problems = validate_config(_config("+sweep.axes={lora.rank:[8,16]}"))
    assert any("sweep.axes.lora.rank" in p for p in problems)


def test_unknown_group_option_gets_did_you_mean() -> None:
    with pytest.raises(UserInputError) as info:
        compose_config(["precision=fp8_protcted"])
    assert "did you mean fp8_protected?" in info.value.problems[0]


def test_override_of_missing_key_is_one_line() -> None:
    with pytest.raises(UserInputError) as info:
        compose_config(["lora.rnk=3"])
    assert len(info.value.problems) == 1 and "lora.rnk" in info.value.problems[0]


def test_eval_task_and_tasks_together_is_one_line() -> None:
    problems = validate_config(_config("eval.task=arc_easy", "eval.tasks=[fp8lab_embedded,arc_easy]"))
    assert len(problems) == 1 and problems[0].startswith("eval.task: set together with eval.tasks"), problems
    assert validate_config(_config("eval.tasks=[fp8lab_embedded,arc_easy]", "eval.metrics={arc_easy: acc_norm}",
                                   "eval.primary=arc_easy", "eval.num_fewshot=null")) == []


@pytest.mark.parametrize("overrides,start", [
    (["eval.tasks=[]"], "eval.tasks: must be a non-empty list"),
    (["eval.tasks=[a,a]"], "eval.tasks: must be a non-empty list of distinct"),
    (["eval.metrics={a: 3}"], "eval.metrics: must be a mapping"),
    (["eval.fewshot_as_multiturn=true"], "eval.fewshot_as_multiturn: needs a chat template"),
])
def test_eval_section_rules(overrides: list[str], start: str) -> None:
    problems = validate_config(_config(*overrides))
    assert len(problems) == 1 and problems[0].startswith(start), problems


def test_health_and_early_stop_problems_are_reported_together() -> None:
    problems = validate_config(_config("health.at=500", "sweep.early_stop=maybe",
                                       "health.rules=[{verdict:fatal,why:x,when:[{metric:train/loss,op:nonfinite}]}]"))
    assert [p.split(":")[0] for p in problems] == ["sweep.early_stop", "health.rules[0].verdict", "health.at"]
    assert "health.at: step 500 is after the last step, train.steps=400" in problems[2]
    assert validate_config(_config("health.at=40", "sweep.early_stop=true")) == []
    assert "health.at: must be a number > 0" in validate_config(_config("health.at=0"))[0]
