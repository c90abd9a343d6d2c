"""Entry point for one trial from any launcher (the `fp8lab trial` command or a Ray worker).

Takes only plain data and a progress callback, so launchers need not import torch.
"""
from __future__ import annotations

from typing import Any, Callable

from fp8lab_conf.contracts import TrialLaunch
from workloads.trial import run_trial


def run(launch: TrialLaunch, progress: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, Any]:
    return run_trial(launch, progress)
