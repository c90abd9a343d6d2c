"""The torchao frozen-base module: ``FrozenBaseFloat8Linear`` and its autograd Function.

torchao's ``Float8Linear`` always computes the weight gradient (and keeps the input alive for
it), even for a weight with ``requires_grad=False``. For LoRA's frozen base that is a third of the
base GEMMs and an activation per linear thrown away. ``FrozenBaseFloat8Linear`` runs the same
casts (torchao's own ``hp_tensor_to_float8_dynamic``) and the same FP8 ``mm`` (``_scaled_mm``, or
FP32 with ``emulate=True``) for the forward and dgrad GEMMs only, adds the plain (unit-scale) cast
torchao cannot express, and records FP8 telemetry from the very casts the GEMMs use.

This module imports torchao at the top: ``torchao_backend`` imports it only when a model is
converted (``frozen_base_float8_linear_cls``), so the backend module itself loads without
torchao. Everything here is module level, so pickle / ``torch.save`` find the class by name.
"""

from __future__ import annotations

from typing import Any

import torch
from torchao.float8.config import ScalingType
from torchao.float8.float8_linear import Float8Linear
from torchao.float8.float8_scaling_utils import (
    get_maybe_axiswise_dim,
    hp_tensor_to_float8_dynamic,
)
from torchao.float8.float8_training_tensor import GemmInputRole, hp_tensor_and_scale_to_float8

from workloads.precision.formats import E4M3, E5M2
from workloads.precision.telemetry import Fp8Telemetry, cast_stats, count_saturated

__all__ = ["FrozenBaseFloat8Linear"]

_TELEMETRY_KIND = {"input": "activation", "grad_output": "dgrad"}  # operand -> telemetry kind


def cast(mod: Any, hp: torch.Tensor, operand: str, cc: Any, axis: int, role: Any) -> Any:
    """torchao's cast of one GEMM operand, or a unit-scale (plain) cast; records telemetry."""
    if cc.scaling_type is ScalingType.DISABLED:
        return hp
    if operand.split(":")[0] in mod.fp8lab_plain:
        one = torch.ones((), dtype=torch.float32, device=hp.device)
        q = hp_tensor_and_scale_to_float8(hp, one, cc.target_dtype, mod.linear_mm_config, role)
    else:
        q = hp_tensor_to_float8_dynamic(
            hp,
            cc.target_dtype,
            mod.linear_mm_config,
            gemm_input_role=role,
            scaling_granularity=cc.scaling_granularity,
            axiswise_dim=get_maybe_axiswise_dim(axis, cc.scaling_granularity),
            round_scales_to_power_of_2=mod.config.round_scales_to_power_of_2,
        )
    kind = _TELEMETRY_KIND.get(operand)
    tel = mod.fp8lab_telemetry
    if kind is not None and tel is not None and tel.recording:
        tel.record_cast(mod.fp8lab_name, kind, hp, *_dequant_stats(hp, q))
    return q


@torch._dynamo.allow_in_graph
class _FrozenWeightMatmul(torch.autograd.Function):
    """out = cast(x) @ cast(W)^T; backward: dx = cast(dy) @ cast(W). No grad_weight GEMM."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight_t: torch.Tensor, mod: Any) -> torch.Tensor:
        c = mod.config
        ctx.mod = mod
        ctx.save_for_backward(weight_t)  # a view of the frozen parameter: no new memory
        x8 = cast(mod, x, "input", c.cast_config_input, -1, GemmInputRole.INPUT)
        w8 = cast(mod, weight_t, "weight", c.cast_config_weight, 0, GemmInputRole.WEIGHT)
        shape = x8.shape
        out = torch.mm(x8.reshape(-1, shape[-1]), w8)
        return out.reshape(*shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        (weight_t,) = ctx.saved_tensors
        mod = ctx.mod
        c = mod.config
        shape = grad_out.shape
        g = grad_out.reshape(-1, shape[-1])
        g8 = cast(mod, g, "grad_output", c.cast_config_grad_output, -1, GemmInputRole.GRAD_OUTPUT)
        w_cc = c.cast_config_weight_for_grad_input
        w8 = cast(mod, weight_t, "weight:dgrad", w_cc, -1, GemmInputRole.WEIGHT)
        dx = torch.mm(g8, w8.t())
        return dx.reshape(*shape[:-1], dx.shape[-1]), None, None


class FrozenBaseFloat8Linear(Float8Linear):
    """torchao ``Float8Linear`` for a frozen weight: forward and dgrad GEMMs only.

    Set up by ``apply_torchao`` (``from_float8_linear``); a weight that requires grad falls
    back to torchao's own forward unchanged (plain casts are then not available).
    """

    fp8lab_name: str = ""
    fp8lab_plain: frozenset[str] = frozenset()
    fp8lab_telemetry: Fp8Telemetry | None = None

    @classmethod
    def from_float8_linear(
        cls,
        mod: Float8Linear,
        *,
        name: str,
        plain: frozenset[str],
        telemetry: Fp8Telemetry | None,
    ) -> Float8Linear:
        mod.__class__ = cls  # same state, different forward: no copy of the weight
        mod.fp8lab_name = name
        mod.fp8lab_plain = frozenset(plain)
        mod.fp8lab_telemetry = telemetry
        if telemetry is not None:
            mod.register_weight_stats()
        return mod

    @torch.no_grad()
    def register_weight_stats(self) -> None:
        """Frozen weight: stats of its forward-GEMM cast once (telemetry.register_static)."""
        w_t = self.weight.t()
        cc = self.config.cast_config_weight
        tel, self.fp8lab_telemetry = self.fp8lab_telemetry, None  # don't record this cast
        try:
            q = cast(self, w_t, "weight", cc, 0, GemmInputRole.WEIGHT)
        finally:
            self.fp8lab_telemetry = tel
        x_dq, scale_inv, saturated = _dequant_stats(w_t, q)
        stats = cast_stats(w_t, x_dq, scale_inv, saturated)
        tel.register_static(self.fp8lab_name, "weight", stats, w_t.numel())

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torchao's name
        if self.weight.requires_grad:
            if self.fp8lab_plain:
                raise ValueError(f"{self.fp8lab_name}: plain FP8 casts need a frozen base weight")
            return super().forward(input)
        if torch.is_autocast_enabled():  # as torchao's Float8Linear.forward
            input = input.to(torch.get_autocast_gpu_dtype())
        out = _FrozenWeightMatmul.apply(input, self.weight.t(), self)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def extra_repr(self) -> str:
        plain = f", plain={sorted(self.fp8lab_plain)}" if self.fp8lab_plain else ""
        return super().extra_repr() + f", frozen (no wgrad){plain}"


def _dequant_stats(hp: torch.Tensor, q: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dequantized, scale_inv, saturated count) of a torchao Float8TrainingTensor ``q``."""
    fmt = E4M3 if q._data.dtype == E4M3.dtype else E5M2
    scale = q._scale
    x_dq = q._data.to(torch.float32) / scale  # the values the GEMM multiplies
    saturated = count_saturated(hp.to(torch.float32) * scale, fmt)
    return x_dq, 1.0 / scale, saturated


