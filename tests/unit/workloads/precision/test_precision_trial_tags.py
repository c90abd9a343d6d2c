"""The trial tags every run with its ladder position and the backend's deviations (the report
pairs rungs and flags changed policies from these tags alone)."""
from types import SimpleNamespace

import pytest

from workloads import trial
from workloads.record.recorder import TrialRecorder
from fp8lab_conf.contracts import TAG_LADDER, TAG_LADDER_BASE, TAG_MECHANISM, TAG_MECHANISM_DESC
from workloads.precision.ladder import MECHANISMS
from workloads.precision.policy import get_policy


class FakeLogger:
    def __init__(self) -> None:
        self.tags: dict = {}

    def set_tags(self, tags: dict) -> None:
        self.tags.update(tags)

    def log_text(self, text: str, path: str) -> None: ...

    def log_dict(self, data: dict, path: str) -> None: ...


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fp8_naive+calibration", ("up", "fp8_naive", "calibration")),
        ("fp8_naive-fp32_adapters_vs_e4m3", ("down", "fp8_naive", "fp32_adapters_vs_e4m3")),
        ("fp8_protected-grad_scaler", ("down", "fp8_protected", "grad_scaler")),
        ("fp8_protected", ("", "", "")),
    ],
)
def test_ladder_tags(name, expected):
    logger, policy = FakeLogger(), get_policy(name)
    handle = SimpleNamespace(backend="emulated", emulated=True, plan=[], deviations=[])
    built = SimpleNamespace(handle=handle, policy=policy, choice=SimpleNamespace(reason="asked for"))
    result = {"device": "cpu"}
    trial._Hooks({"seed": 0}, TrialRecorder("unused", "run", logger=logger), result).on_precision(built)
    assert result["backend"] == "emulated" and result["deviations"] == []
    tags = logger.tags
    assert (tags[TAG_LADDER], tags[TAG_LADDER_BASE], tags[TAG_MECHANISM]) == expected
    assert tags[TAG_MECHANISM_DESC] == (MECHANISMS[expected[2]].description if expected[2] else "")
    assert tags["fp8lab.ablation"] == (expected[2] if expected[1] == "fp8_protected" else "")
