"""Params logged to MLflow: flattened, secrets never included."""
from __future__ import annotations

from orchestrator.params import flatten_params


def test_flattens_nested_keys() -> None:
    assert flatten_params({"lora": {"r": 8}, "seed": 0, "sweep": {"axes": {}}}) == {"lora.r": 8, "seed": 0, "sweep.axes": {}}


def test_secret_like_keys_are_dropped() -> None:
    flat = flatten_params({"tracking": {"uri": "x", "api_token": "s3cr3t", "password": "p"}, "AWS_SECRET_ACCESS_KEY": "k"})
    assert flat == {"tracking.uri": "x"}
