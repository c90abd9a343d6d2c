"""Run the workload's preflight checks (files, policy names, devices, lm-eval tasks) in a child
process, so the orchestrator itself never imports torch, and turn them into one UserInputError."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from orchestrator.errors import UserInputError


def preflight(configs: list[dict[str, Any]]) -> None:
    """Raise UserInputError listing every problem of every config; return quietly when all is well."""
    proc = subprocess.run([sys.executable, "-m", "workloads.preflight"], input=json.dumps(configs, default=str),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"preflight checks crashed: {tail}")
    problems = json.loads(proc.stdout)
    if problems:
        raise UserInputError(problems)
