"""Precision policies and the emulated FP8 backend (pure torch + peft).

Never imports orchestrator or mlflow: a trial hands in a model and a policy name and gets back
a PrecisionHandle; telemetry comes back as plain rows and floats for the caller to log.
"""

from workloads.precision.apply import PrecisionHandle, apply_policy
from workloads.precision.formats import E4M3, E5M2, Fp8Format, quantize_dequantize, saturating_cast
from workloads.precision.grad_scaler import GradScalerConfig, LoraGradScaler
from workloads.precision.policy import (
    PrecisionPolicy,
    UnknownPolicyError,
    available_policies,
    get_policy,
    register_policy,
)
from workloads.precision.scaling import CastSpec, ScalingRecipe, TensorScaler
from workloads.precision.telemetry import Fp8Telemetry, StepTelemetry

__all__ = [
    "E4M3",
    "E5M2",
    "CastSpec",
    "Fp8Format",
    "Fp8Telemetry",
    "GradScalerConfig",
    "LoraGradScaler",
    "PrecisionHandle",
    "PrecisionPolicy",
    "ScalingRecipe",
    "StepTelemetry",
    "TensorScaler",
    "UnknownPolicyError",
    "apply_policy",
    "available_policies",
    "get_policy",
    "quantize_dequantize",
    "register_policy",
    "saturating_cast",
]
