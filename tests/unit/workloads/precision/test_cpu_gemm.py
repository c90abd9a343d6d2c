"""BF16 GEMMs as FP32 GEMMs on CPUs without native BF16 ones (workloads/precision/cpu_gemm.py):
the same numbers as PyTorch's BF16 kernel up to the last bit of a few values, forward and
backward; used only where the CPU lacks native BF16 GEMMs; the model's parameters untouched."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workloads.precision import cpu_gemm

BF16_ULP = 2.0 ** -7  # relative spacing of BF16 values


def _operands(bias: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 17, 96, generator=gen).bfloat16().requires_grad_()
    w = (torch.randn(80, 96, generator=gen) / 10).bfloat16().requires_grad_()
    b = torch.randn(80, generator=gen).bfloat16().requires_grad_() if bias else None
    return x, w, b


def _assert_close_in_bf16(native: torch.Tensor, upcast: torch.Tensor) -> None:
    assert upcast.dtype == native.dtype == torch.bfloat16
    same = (native == upcast).float().mean().item()
    rel = ((native.float() - upcast.float()).abs() / native.float().abs().clamp(min=1e-2)).max().item()
    assert same > 0.99, same  # summation order only: the rare value one BF16 step apart
    assert rel <= 1.01 * BF16_ULP, rel


@pytest.mark.parametrize("bias", [False, True])
def test_fp32_gemm_matches_the_bf16_kernel_forward_and_backward(bias: bool) -> None:
    x, w, b = _operands(bias)
    inputs = (x, w) if b is None else (x, w, b)
    native = F.linear(x, w, b)
    grad = torch.randn(native.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    native_grads = torch.autograd.grad(native, inputs, grad)
    upcast = cpu_gemm._UpcastLinearFn.apply(x, w, b)
    upcast_grads = torch.autograd.grad(upcast, inputs, grad)
    _assert_close_in_bf16(native, upcast)
    for n, u in zip(native_grads, upcast_grads):
        _assert_close_in_bf16(n, u)


def test_backward_keeps_the_bf16_operands_not_fp32_copies() -> None:
    x, w, _ = _operands(False)
    out = cpu_gemm._UpcastLinearFn.apply(x, w, None)
    assert [t.dtype for t in out.grad_fn.saved_tensors] == [torch.bfloat16, torch.bfloat16]


def test_a_frozen_weight_gets_no_wgrad() -> None:
    x, w, _ = _operands(False)
    w.requires_grad_(False)
    cpu_gemm._UpcastLinearFn.apply(x, w, None).sum().backward()
    assert x.grad is not None and w.grad is None


@pytest.mark.parametrize("native", [True, False])
def test_linear_and_matmul_upcast_only_bf16_cpu_operands_without_native_gemms(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(cpu_gemm, "native_bf16_gemm", lambda: native)
    x, w, _ = _operands(False)
    upcast = "_UpcastLinearFnBackward"
    assert (type(cpu_gemm.linear(x, w).grad_fn).__name__ == upcast) == (not native)
    assert type(cpu_gemm.linear(x.float(), w.float()).grad_fn).__name__ != upcast  # FP32 stays PyTorch's
    with torch.no_grad():
        _assert_close_in_bf16(x.detach()[0] @ w.detach().t(), cpu_gemm.matmul(x.detach()[0], w.detach().t()))


def _model() -> nn.Module:
    model = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16, bias=False)).to(torch.bfloat16)
    model.add_module("custom", _Custom(16, 16).to(torch.bfloat16))
    return model


class _Custom(nn.Linear):  # a subclass with its own forward is not a plain nn.Linear: left alone
    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return super().forward(input)


@pytest.mark.parametrize("native", [True, False])
def test_route_swaps_plain_linears_only_where_needed(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(cpu_gemm, "native_bf16_gemm", lambda: native)
    torch.manual_seed(0)
    model = _model()
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 32).bfloat16()
    before = model(x)
    routed = cpu_gemm.route_cpu_gemms(model)
    assert routed == (0 if native else 2)
    kinds = [type(m) for m in model]
    assert kinds[0] is kinds[2] is (nn.Linear if native else cpu_gemm.UpcastLinear)
    assert kinds[3] is _Custom and all(isinstance(m, nn.Linear) for m in (model[0], model[2]))
    assert all(torch.equal(keys[k], v) for k, v in model.state_dict().items()) and keys.keys() == model.state_dict().keys()
    _assert_close_in_bf16(before, model(x))
    assert cpu_gemm.route_cpu_gemms(_model().float()) == 0  # an FP32 model has no BF16 GEMM to reroute


@pytest.mark.parametrize("native", [True, False])
def test_applying_a_policy_routes_the_model_and_says_so_in_the_plan(monkeypatch, native: bool) -> None:
    """Through ``apply_backend`` (what a trial calls): without native BF16 GEMMs the frozen BF16
    linears are routed and the plan has the row; with them, nothing changes. Training still
    moves the adapters."""
    from tests.support.tiny_lora import tiny_lora_model, train_steps
    from workloads.precision.backends import apply_backend
    from workloads.precision.backends.base import BackendChoice
    from workloads.precision.telemetry import Fp8Telemetry

    monkeypatch.setattr(cpu_gemm, "native_bf16_gemm", lambda: native)
    model = tiny_lora_model()
    telemetry = Fp8Telemetry()
    handle = apply_backend(model, "bf16", telemetry, BackendChoice("emulated", True, "test"))
    routed = [m for m in model.modules() if type(m) is cpu_gemm.UpcastLinear]
    assert (cpu_gemm.PLAN_ROW in handle.plan) == (not native) == bool(routed)
    before = {k: v.clone() for k, v in handle.lora_params.items()}
    losses, _ = train_steps(model, handle, telemetry, steps=2)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(before[k], v) for k, v in handle.lora_params.items())
