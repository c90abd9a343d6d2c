"""A toy FP8 backend that lives in the tests folder: proof that adding a backend needs one
module plus its registry entry, and no edit of product code (test_precision_registry.py).

It runs the emulated backend's numerics, claims to run real FP8 (so ``auto`` would take it
first), refuses policies with an FP8 lm_head (to exercise the policy check), and records that
it ran in the handle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workloads.precision.apply import apply_policy
from workloads.precision.backends.base import Availability, Backend, BackendChoice

NAME = "toy"


@dataclass(frozen=True)
class ToyMapping:
    deviations: tuple[str, ...] = ("toy: nothing is really different",)


class ToyBackend(Backend):
    name = NAME

    def __init__(self) -> None:
        self.applied: list[tuple[str, BackendChoice]] = []

    def availability(self, device: Any, *, auto: bool) -> Availability:
        return Availability(ok=True, emulated=False, reason=f"the toy runs on {device.type}")

    def map_policy(self, policy: Any) -> ToyMapping:
        if policy.lm_head_fp8:
            raise ValueError(f"policy {policy.name!r}: the toy keeps lm_head in BF16")
        return ToyMapping()

    def apply(self, model: Any, policy: Any, telemetry: Any, choice: BackendChoice, **options: Any) -> Any:
        mapping = self.map_policy(policy)
        handle = apply_policy(model, policy, telemetry)
        handle.backend, handle.emulated, handle.deviations = NAME, choice.emulated, mapping.deviations
        self.applied.append((policy.name, choice))
        return handle


BACKEND = ToyBackend()
