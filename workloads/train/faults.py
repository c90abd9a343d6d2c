"""Deliberate faults for resilience tests (config `fault`): NaN weights, an exception, or a
SIGKILL of the worker at a given step or before evaluation. Off unless `fault.kind` is set."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch


class FaultInjector:
    def __init__(self, fault_cfg: dict[str, Any] | None):
        cfg = fault_cfg or {}
        self.kind = cfg.get("kind")
        self.step = int(cfg.get("step") or 1)
        self.once_file = cfg.get("once_file")

    def before_step(self, step: int, params: list[torch.nn.Parameter]) -> None:
        if self.kind in (None, "kill_in_eval") or step != self.step or not self._armed():
            return
        if self.kind == "nan_weights":
            with torch.no_grad():
                params[0].fill_(float("nan"))
        elif self.kind == "raise":
            raise RuntimeError(f"injected fault at step {step}")
        elif self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)

    def before_eval(self) -> None:
        """`fault.kind=kill_in_eval`: SIGKILL after training, before evaluation (a retry must
        neither train again into the same run nor lose what training logged)."""
        if self.kind == "kill_in_eval" and self._armed():
            os.kill(os.getpid(), signal.SIGKILL)

    def _armed(self) -> bool:
        """With `once_file`, fire only the first time (so a retried trial then succeeds)."""
        if not self.once_file:
            return True
        marker = Path(self.once_file)
        if marker.exists():
            return False
        marker.write_text("fired\n")
        return True
