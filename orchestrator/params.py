"""MLflow params of a run: what a trial *is*, flattened (`lora.r`, `train.lr`, ...), secrets removed.

Where and how a trial ran (tracking, cluster, sweep, report, trial output, thread counts...: the
keys `orchestrator.trial_id` leaves out of a trial's identity) and fault injection are not params;
they stay in the
run's `config/resolved.yaml` artifact and its tags. So the params table compares trials on what
changes results, and two runs of the same trial have the same params.
"""
from __future__ import annotations

import re
from typing import Any

from orchestrator.trial_id import semantic_config

# Not params either, though part of a trial's identity: fault injection tests fp8lab itself.
NOT_PARAMS = ("fault",)

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


def trial_params(config: dict[str, Any]) -> dict[str, Any]:
    """The params of a trial's run: its semantic config, flattened."""
    semantic = semantic_config(config)
    return flatten_params({k: v for k, v in semantic.items() if k not in NOT_PARAMS})


def sweep_params(config: dict[str, Any], n_trials: int) -> dict[str, Any]:
    """The params of a sweep's parent run: the matrix (`sweep.axes.<key>` = its values, the
    number of trials) and what every trial shares (the semantic config of the sweep)."""
    axes = config["sweep"].get("axes") or {}
    shared = {k: v for k, v in trial_params(config).items() if k.split(".")[0] not in axes and k not in axes}
    return {**shared, **{f"sweep.axes.{k}": v for k, v in axes.items()},
            "sweep.name": config["sweep"]["name"], "sweep.n_trials": n_trials}
