"""workloads.registry: the one registry policies, scaling kinds and backends share."""
from __future__ import annotations

import pytest

from workloads.precision.backends.entries import UnknownBackendError, get_entry
from workloads.precision.policy import UnknownPolicyError, get_policy
from workloads.precision.scaling import get_kind
from workloads.registry import Registry, UnknownNameError


def test_order_lookup_and_the_one_unknown_name_message() -> None:
    reg: Registry[int] = Registry("colour")
    reg.register("red", 1)
    reg.register("green", 2)
    assert reg.names() == ("red", "green") and reg.get("green") == 2 and "red" in reg and len(reg) == 2
    with pytest.raises(UnknownNameError, match=r"^unknown colour 'gren' — did you mean 'green'\? available: red, green$"):
        reg.get("gren")
    with pytest.raises(UnknownNameError, match=r"^unknown colour 'zzz'; available: red, green$"):
        reg.get("zzz")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("red", 3)
    reg.register("red", 3, replace=True)
    assert reg["red"] == 3


def test_a_lazy_entry_is_imported_on_first_get_only() -> None:
    reg: Registry[object] = Registry("thing")
    reg.register("dumps", "json:dumps")
    reg.register("broken", "no_such_module_xyz:thing")  # never imported unless asked for
    import json

    assert reg.get("dumps") is json.dumps
    with pytest.raises(ModuleNotFoundError):
        reg.get("broken")


def test_policies_kinds_and_backends_speak_the_same_message() -> None:
    for lookup, error, wrong in ((get_policy, UnknownPolicyError, "fp8_nave"), (get_kind, UnknownNameError, "curent"),
                                 (get_entry, UnknownBackendError, "torchaoo")):
        with pytest.raises(error) as info:
            lookup(wrong)
        message = str(info.value)
        assert message.startswith("unknown ") and " — did you mean '" in message and "? available: " in message, message
