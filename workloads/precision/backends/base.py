"""The interface every FP8 backend implements, and the record of which one runs a trial.

A backend answers four questions, each a method of ``Backend``:

- ``availability(device, auto)``: can it run on this device, emulated or not, and why (plus the
  fix to print when a user asked for it explicitly and it cannot run);
- ``map_policy(policy)``: how it runs a precision policy -- an object with ``deviations`` (one
  sentence per difference from the policy's numerics), or a ValueError naming the switch and the
  fix when it cannot run the policy at all. Pure data: no torchao / TE import;
- ``apply(model, policy, telemetry, choice, **options)``: convert the model, return a
  ``PrecisionHandle`` (or a subclass with the same methods);
- ``always_emulated``: whether its FP8 is always emulated (the reference backend), which is what
  ``auto`` falls back to.

The backend object is the ``BACKEND`` attribute of its module; ``entries.py`` says which module.
This module imports no torch, so the selection record can travel anywhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from workloads.precision.backends.entries import backend_object, get_entry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from workloads.precision.policy import PrecisionPolicy
    from workloads.precision.telemetry import Fp8Telemetry

__all__ = ["Availability", "Backend", "BackendChoice", "NoMapping", "load_backend"]


@dataclass(frozen=True)
class BackendChoice:
    """The backend that will run (never ``auto``), whether FP8 is emulated, and why."""

    name: str
    emulated: bool
    reason: str
    requested: str = ""  # what precision.backend said; 'auto' lets apply_backend fall back


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on a device: ``ok``, ``emulated`` when it runs, the ``reason``
    (logged and tagged), and the ``fix`` sentence for an explicit request that cannot run."""

    ok: bool
    emulated: bool
    reason: str
    fix: str = ""


@dataclass(frozen=True)
class NoMapping:
    """The mapping of a backend that runs every policy as written."""

    deviations: tuple[str, ...] = ()


class Backend(ABC):
    """One FP8 backend (module docstring). Subclasses set ``name`` and implement the methods."""

    name: ClassVar[str]
    always_emulated: ClassVar[bool] = False

    @abstractmethod
    def availability(self, device: torch.device, *, auto: bool) -> Availability:
        """Can this backend run on ``device``? ``auto`` asks on behalf of ``auto``."""

    def map_policy(self, policy: PrecisionPolicy) -> Any:
        """How this backend runs ``policy`` (``.deviations``); ValueError when it cannot."""
        return NoMapping()

    def policy_errors(self, policy: PrecisionPolicy) -> list[str]:
        """Config-time check for preflight: sentences, empty when the policy runs here."""
        try:
            self.map_policy(policy)
        except ValueError as exc:
            return [f"precision.backend={self.name}: {exc}"]
        return []

    @abstractmethod
    def apply(
        self,
        model: nn.Module,
        policy: PrecisionPolicy,
        telemetry: Fp8Telemetry | None,
        choice: BackendChoice,
        **options: Any,
    ) -> Any:
        """Convert ``model`` in place; returns a PrecisionHandle (or subclass)."""


def load_backend(name: str) -> Backend:
    """The backend object registered as ``name``, importing its module on first use."""
    entry = get_entry(name)
    backend = backend_object(name)
    if not isinstance(backend, Backend):
        raise TypeError(f"{entry.module}.{entry.attr} is not a workloads.precision Backend")
    return backend
