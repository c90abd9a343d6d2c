"""Flatten a resolved config into MLflow params (`lora.r`, `train.lr`, ...), secrets removed."""
from __future__ import annotations

import re
from typing import Any

SECRET_NAME = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD)", re.IGNORECASE)


def flatten_params(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_params(value, name + "."))
        elif not SECRET_NAME.search(str(key)):
            flat[name] = value
    return flat
