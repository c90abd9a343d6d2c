"""FP8 backends (docs/policies.md): choose one, then apply a policy through it.

    choice = select_backend(config.precision.backend, device)   # logs choice + reason
    handle = apply_backend(model, policy, telemetry, choice)     # same handle API everywhere

``handle.backend`` / ``handle.emulated`` say what actually ran (trial result, MLflow tags).
The backend modules are loaded only when used, so this package works without torchao and without
Transformer Engine installed (Transformer Engine is imported only by ``apply_te`` and by the
selection probe; note that peft itself imports torchao when it is installed).
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from workloads.precision.backends.select import BACKENDS, BackendChoice, select_backend
from workloads.precision.policy import PrecisionPolicy, get_policy
from workloads.precision.telemetry import Fp8Telemetry

__all__ = [
    "BACKENDS",
    "BackendChoice",
    "apply_backend",
    "backend_policy_errors",
    "select_backend",
]

log = logging.getLogger(__name__)


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
    fp8_unscaled_fp8_adapters' plain casts on Transformer Engine), the next backend in auto's order that can
    (transformer_engine -> torchao -> emulated) runs instead, with a warning; an explicit
    request raises instead of silently running something else.
    """
    policy = get_policy(policy) if isinstance(policy, str) else policy
    name = backend_choice.name
    if backend_choice.requested == "auto":
        order = ("transformer_engine", "torchao", "emulated")
        for candidate in order[order.index(name) :]:
            problems = backend_policy_errors(candidate, policy)
            if not problems:
                break
            log.warning("precision.backend=auto: %s; trying the next backend", problems[0])
        if candidate != name:
            emulated = True if candidate == "emulated" else backend_choice.emulated
            backend_choice = BackendChoice(
                candidate, emulated, f"auto fell back from {name}", requested="auto"
            )
            log.info("precision.backend=auto -> %s for policy %s", candidate, policy.name)
            name = candidate
    if name == "emulated":
        from workloads.precision.apply import apply_policy

        if options:
            raise TypeError(f"the emulated backend takes no options, got {sorted(options)}")
        return apply_policy(model, policy, telemetry)
    if name == "torchao":
        from workloads.precision.backends.torchao_backend import apply_torchao

        return apply_torchao(model, policy, telemetry, emulate=backend_choice.emulated, **options)
    if name == "transformer_engine":
        from workloads.precision.backends.te_backend import apply_te

        return apply_te(model, policy, telemetry, **options)
    raise ValueError(
        f"backend_choice.name={name!r} is not a backend that runs (use select_backend first)"
    )


def backend_policy_errors(backend: str, policy: PrecisionPolicy | str) -> list[str]:
    """Config-time check (no torchao/TE import, no device): can ``backend`` run ``policy``?

    For ``auto`` nothing is checked here (it may resolve to the emulated backend, which runs
    every policy). Returns sentences for preflight, empty when fine.
    """
    policy = get_policy(policy) if isinstance(policy, str) else policy
    if backend not in BACKENDS:
        return [f"precision.backend={backend!r} not in {BACKENDS}"]
    try:
        if backend == "torchao":
            from workloads.precision.backends.torchao_backend import map_policy

            map_policy(policy)
        elif backend == "transformer_engine":
            from workloads.precision.backends.te_backend import map_policy_te

            map_policy_te(policy)
    except ValueError as exc:
        return [f"precision.backend={backend}: {exc}"]
    return []
