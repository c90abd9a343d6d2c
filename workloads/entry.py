"""Entry point for one trial from any launcher (the `fp8lab trial` command or a Ray worker).

Takes only plain data and a progress callback, so launchers need not import torch.
"""
from __future__ import annotations

from typing import Any, Callable

from workloads.trial import TrialContext, run_trial


def run(config: dict[str, Any], trial_id: str, run_id: str, tracking_uri: str, policy_label: str,
        progress: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, Any]:
    return run_trial(config, TrialContext(trial_id, run_id, tracking_uri, policy_label), progress)
