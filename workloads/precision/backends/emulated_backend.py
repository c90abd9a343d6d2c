"""The emulated backend: ``apply.apply_policy`` (quantize-dequantize with torch's float8 dtypes,
GEMMs in BF16). It runs every policy exactly as written, on any device, so it is the reference
the other backends are compared with and the one ``auto`` falls back to."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workloads.precision.backends.base import Availability, Backend, BackendChoice
from workloads.precision.policy import PrecisionPolicy
from workloads.precision.telemetry import Fp8Telemetry

__all__ = ["BACKEND", "EmulatedBackend"]


class EmulatedBackend(Backend):
    """Runs anywhere; every policy as written; no options."""

    name = "emulated"
    always_emulated = True

    def availability(self, device: torch.device, *, auto: bool) -> Availability:
        return Availability(ok=True, emulated=True, reason="")

    def apply(
        self,
        model: nn.Module,
        policy: PrecisionPolicy,
        telemetry: Fp8Telemetry | None,
        choice: BackendChoice,
        **options: Any,
    ) -> Any:
        from workloads.precision.apply import apply_policy

        if options:
            raise TypeError(f"the emulated backend takes no options, got {sorted(options)}")
        return apply_policy(model, policy, telemetry)


BACKEND = EmulatedBackend()
