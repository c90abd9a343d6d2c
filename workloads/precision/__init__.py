"""Precision policies and the emulated FP8 backend (pure torch + peft).

Never imports orchestrator or mlflow: a trial hands in a model and a policy name and gets back
a PrecisionHandle; telemetry comes back as plain rows and floats for the caller to log.

Names below are imported on first use (PEP 562): `import workloads.precision.policy` must not
pull in peft and transformers (via ``apply``), so preflight checks stay quick.
"""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {
    "PrecisionHandle": "apply",
    "apply_policy": "apply",
    "E4M3": "formats",
    "E5M2": "formats",
    "Fp8Format": "formats",
    "quantize_dequantize": "formats",
    "saturating_cast": "formats",
    "GradScalerConfig": "grad_scaler",
    "LoraGradScaler": "grad_scaler",
    "PrecisionPolicy": "policy",
    "UnknownPolicyError": "policy",
    "available_policies": "policy",
    "get_policy": "policy",
    "register_policy": "policy",
    "CastSpec": "scaling",
    "ScalingRecipe": "scaling",
    "TensorScaler": "scaling",
    "Fp8Telemetry": "telemetry",
    "StepTelemetry": "telemetry",
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
