"""BF16 GEMMs on CPUs without native BF16 matrix support, run as FP32 GEMMs on the same operands.

Why: on a CPU where oneDNN has no BF16 GEMM (no AVX-512: e.g. an AVX2-only AMD EPYC), PyTorch
runs a BF16 ``mm`` in its scalar reference kernel, 25-57x slower than the FP32 GEMM of the same
shape (measured on a 2-core AVX2 EPYC, torch 2.13: 512x192x576 43 ms vs 1.75 ms; 512x576x1536 791
vs 14 ms), so ~90% of a BF16 training step of the embedded model was that kernel (pytorch/pytorch
issue 146508). A policy's BF16 GEMM means BF16 operands, FP32 accumulation and a BF16 result --
what a GPU's tensor cores and the reference kernel both do -- so the same math runs here as an FP32
GEMM on the upcast operands, its result rounded to BF16 once. Only the summation order differs
(results may differ in the last bit of a BF16 value, as they do between CPUs with different
kernels). Backward does the same for dgrad and wgrad; the operands saved for it stay BF16, so
memory is what the native path keeps.

Where the CPU has native BF16 GEMMs (AVX-512 BF16, AMX, any GPU) nothing changes: ``linear`` and
``matmul`` call the PyTorch op, and ``route_cpu_gemms`` leaves the model alone.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PLAN_ROW", "UpcastLinear", "applies_to", "linear", "matmul", "native_bf16_gemm", "route_cpu_gemms",
           "upcast_needed"]

# The precision plan's row (``PrecisionHandle.plan``) saying a trial's BF16 GEMMs ran this way.
PLAN_ROW = {"module": "*", "role": "other", "tensor": "bf16 GEMMs on this CPU", "format": "bf16",
            "note": "run as FP32 GEMMs of the BF16 operands, rounded to BF16: the CPU has no native BF16 GEMM"}


@functools.cache
def native_bf16_gemm() -> bool:
    """Whether this CPU runs BF16 GEMMs in oneDNN (the check ATen makes before using it)."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without the check: assume the fast path
        return True


def upcast_needed(x: torch.Tensor) -> bool:
    """A BF16 CPU tensor on a CPU whose BF16 GEMM is the slow reference kernel."""
    return x.dtype == torch.bfloat16 and x.device.type == "cpu" and not native_bf16_gemm()


def _fp32_mm(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.matmul(a.float(), b.float()).to(dtype)


class _UpcastLinearFn(torch.autograd.Function):
    """``F.linear`` of BF16 operands as an FP32 GEMM rounded to BF16, forward and backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.bias_dtype = None if bias is None else bias.dtype
        out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        return out.to(torch.promote_types(x.dtype, weight.dtype))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        g32 = grad.float()  # once, for every gradient asked for (a frozen base linear asks for dx only)
        dx = _fp32_mm(g32, weight, x.dtype) if ctx.needs_input_grad[0] else None
        g2d = g32.reshape(-1, g32.shape[-1])
        dw = _fp32_mm(g2d.t(), x.reshape(-1, x.shape[-1]), weight.dtype) if ctx.needs_input_grad[1] else None
        db = g2d.sum(0).to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, as an FP32 GEMM where the CPU has no native BF16 one (module doc)."""
    if upcast_needed(x) and weight.dtype == torch.bfloat16:
        return _UpcastLinearFn.apply(x, weight, bias)
    return F.linear(x, weight, bias)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for the bodies of custom autograd functions (no graph is recorded there)."""
    if upcast_needed(a) and b.dtype == torch.bfloat16:
        return _fp32_mm(a, b, torch.bfloat16)
    return a @ b


class UpcastLinear(nn.Linear):
    """An ``nn.Linear`` whose GEMM goes through ``linear`` (``route_cpu_gemms`` swaps the class of
    a model's plain linears in place: same parameters, same state dict, still an ``nn.Linear``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Linear's name
        return linear(input, self.weight, self.bias)


def applies_to(model: nn.Module) -> bool:
    """Whether ``model`` holds BF16 CPU parameters on a CPU without native BF16 GEMMs."""
    return any(upcast_needed(p) for p in model.parameters())


def route_cpu_gemms(model: nn.Module) -> int:
    """Send the plain ``nn.Linear`` GEMMs of a BF16 model on such a CPU through ``linear``; returns
    how many were routed (0 where the CPU has native BF16 GEMMs or the model is not on the CPU).
    fp8lab's own linears (``workloads.precision.linear``) call ``linear``/``matmul`` themselves."""
    routed = 0
    for module in model.modules():
        if type(module) is nn.Linear and upcast_needed(module.weight):
            module.__class__ = UpcastLinear
            routed += 1
    return routed
