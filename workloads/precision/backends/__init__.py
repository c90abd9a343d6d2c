"""FP8 backends (docs/policies.md): choose one, then apply a policy through it.

    choice = select_backend(config.precision.backend, device)   # logs choice + reason
    handle = apply_backend(model, policy, telemetry, choice)     # same handle API everywhere

``handle.backend`` / ``handle.emulated`` say what actually ran (trial result, MLflow tags).
Every backend implements ``base.Backend``; ``entries.py`` registers each by name with the module
that implements it, and the module is imported only when that backend is chosen, probed or
checked -- so this package works without torchao and without Transformer Engine installed, and
importing it (or ``entries``, the names the orchestrator validates against) loads no torch.
Note that peft itself imports torchao when it is installed.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from workloads.precision.backends.entries import (
    AUTO,
    BackendEntry,
    auto_order,
    register_backend,
    requestable_names,
)

if TYPE_CHECKING:
    from torch import nn

    from workloads.precision.backends.base import BackendChoice
    from workloads.precision.policy import PrecisionPolicy
    from workloads.precision.telemetry import Fp8Telemetry

__all__ = [
    "BackendChoice",
    "BackendEntry",
    "apply_backend",
    "backend_policy_errors",
    "register_backend",
    "select_backend",
]

log = logging.getLogger(__name__)

_LAZY = {"BackendChoice": "base", "Backend": "base", "load_backend": "base",
         "select_backend": "select"}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def apply_backend(
    model: nn.Module,
    policy: PrecisionPolicy | str,
    telemetry: Fp8Telemetry | None,
    backend_choice: BackendChoice,
    **options: Any,
) -> Any:
    """Apply ``policy`` to ``model`` through the chosen backend; returns a PrecisionHandle
    (or a subclass with the same methods). ``options`` go to the backend (e.g. torchao's
    ``recipe=``).

    When the choice came from ``auto`` and that backend cannot express the policy (e.g.
    fp8_unscaled_fp8_adapters' plain casts on Transformer Engine), the next backend in auto's
    order that can (``entries.auto_order()``: transformer_engine -> torchao -> emulated) runs
    instead, with a warning; an explicit request raises instead of silently running something
    else.

    On a CPU without native BF16 GEMMs the model's remaining plain linears are then routed through
    FP32 GEMMs (``cpu_gemm``: same operands and rounding, 5-8x faster steps there).
    """
    from workloads.precision import cpu_gemm
    from workloads.precision.backends.base import BackendChoice, load_backend
    from workloads.precision.policy import get_policy

    policy = get_policy(policy) if isinstance(policy, str) else policy
    name = backend_choice.name
    if name == AUTO:
        raise ValueError("backend_choice.name='auto' is not a backend that runs (use select_backend first)")
    if backend_choice.requested == AUTO:
        order = auto_order()
        for candidate in order[order.index(name) :]:
            problems = backend_policy_errors(candidate, policy)
            if not problems:
                break
            log.warning("precision.backend=auto: %s; trying the next backend", problems[0])
        if candidate != name:
            emulated = load_backend(candidate).always_emulated or backend_choice.emulated
            backend_choice = BackendChoice(
                candidate, emulated, f"auto fell back from {name}", requested=AUTO
            )
            log.info("precision.backend=auto -> %s for policy %s", candidate, policy.name)
    backend = load_backend(backend_choice.name)
    handle = backend.apply(model, policy, telemetry, backend_choice, **options)
    if cpu_gemm.applies_to(model):  # last: a backend's own swaps (torchao converts plain nn.Linear) come first
        routed = cpu_gemm.route_cpu_gemms(model)
        handle.plan.append(dict(cpu_gemm.PLAN_ROW))
        log.info("no native BF16 GEMM on this CPU: BF16 GEMMs run as FP32 GEMMs (%d linears routed)", routed)
    return handle


def backend_policy_errors(backend: str, policy: PrecisionPolicy | str) -> list[str]:
    """Config-time check (no torchao/TE import, no device): can ``backend`` run ``policy``?

    For ``auto`` nothing is checked here (it may resolve to the emulated backend, which runs
    every policy). Returns sentences for preflight, empty when fine.
    """
    from workloads.precision.backends.base import load_backend
    from workloads.precision.policy import get_policy

    policy = get_policy(policy) if isinstance(policy, str) else policy
    if backend == AUTO:
        return []
    if backend not in requestable_names():
        return [f"precision.backend={backend!r} not in {requestable_names()}"]
    return load_backend(backend).policy_errors(policy)
