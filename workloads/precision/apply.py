"""Apply a PrecisionPolicy to a PEFT LoRA model and hand back what the training step needs.

``apply_policy`` is the one place where dtypes are decided:

- frozen parameters (base weights, norms, embeddings) go to the compute dtype (BF16); buffers
  are left alone (e.g. rotary ``inv_freq`` stays FP32);
- LoRA parameters stay FP32 masters. Their GEMMs run in BF16 through ``LoraComputeLinear``
  (or FP8 through ``Fp8LoraLinear`` when ``lora_gemm='fp8'``), and PEFT's own input upcast is
  turned off (``cast_input_dtype_enabled=False``) so activations are not copied to FP32 first.
  This is explicit per module rather than a global autocast, so the trainer needs no autocast
  and every GEMM's format is visible in ``plan``;
- every frozen linear of the model (``walker.frozen_linears``: each PEFT ``base_layer``, the
  linears ``lora.target_modules`` left without an adapter, transformers ``Conv1D``) becomes an
  ``Fp8BaseLinear`` when the policy casts any base tensor to FP8 -- a narrow target list must
  not leave half the GEMMs in BF16. PEFT's forward keeps calling ``self.base_layer(x)``. The
  output embedding is only converted when ``lm_head_fp8`` is set; when it is tied to the input
  embedding it becomes an ``Fp8TiedLinear`` (shared weight, cast per GEMM), so the tie holds.
  The plan has a row for every linear, with its format or why it stays in the compute dtype.

The training step then reads (``handle.calibrate(...)`` once before the first step):

    telemetry.begin_step(step, record=step % log_every == 0)
    loss = model(**batch).loss
    handle.scale_loss(loss).backward()
    if handle.prepare_step(optimizer):   # FP8 grad casts / unscale + overflow check / LoRA stats
        optimizer.step()
        handle.after_step()              # FP8 adapter storage: round LoRA weights into E4M3
    optimizer.zero_grad(set_to_none=True)
    stats = telemetry.end_step({"train/loss": loss.detach()})  # None when not recorded

``prepare_step`` already calls ``telemetry.record_lora``; the trainer should not call it again.
Applying a policy twice to one model is refused (the swaps are not idempotent).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from torch import nn

from workloads.precision.formats import E4M3, E5M2, saturating_cast
from workloads.precision.grad_scaler import LoraGradScaler
from workloads.precision.linear import (
    CastSite,
    Fp8BaseLinear,
    Fp8LoraLinear,
    Fp8TiedLinear,
    LoraComputeLinear,
)
from workloads.precision.policy import PrecisionPolicy, get_policy
from workloads.precision.scaling import ScalingRecipe, TensorScaler, get_kind
from workloads.precision.telemetry import Fp8Telemetry, count_saturated
from workloads.precision.walker import LINEAR_TYPES, FrozenLinear, frozen_linears

__all__ = ["PrecisionHandle", "apply_policy"]

_APPLIED_ATTR = "_fp8lab_precision_policy"


@dataclass
class PrecisionHandle:
    """What the trainer holds after ``apply_policy``: the plan, calibration and step hooks."""

    model: nn.Module
    policy: PrecisionPolicy
    telemetry: Fp8Telemetry | None
    plan: list[dict[str, Any]]
    lora_params: dict[str, nn.Parameter]
    cast_sites: list[CastSite] = field(default_factory=list)
    scaler: LoraGradScaler | None = None
    backend: str = "emulated"
    emulated: bool = True
    # What the backend changed relative to the policy, one sentence each (none when emulated).
    deviations: tuple[str, ...] = ()

    # -- calibration ---------------------------------------------------------------------
    def calibrate(self, run_forward: Callable[[Any], Any], batches: Iterable[Any]) -> int:
        """Run up to ``policy.calibration_steps`` no-grad forwards that only fill amax histories.

        Casts are skipped meanwhile (TE's calibrating mode), so calibration sees BF16 numerics.
        No-op when the policy has no calibration steps or no delayed scaling. Returns the
        number of forwards run.
        """
        steps = self.policy.calibration_steps
        sites = [s for s in self.cast_sites if s.scaler is not None and s.scaler.uses_history]
        if steps <= 0 or not sites:
            return 0
        done = 0
        with self._calibrating(), torch.no_grad():
            for batch in batches:
                if done >= steps:
                    break
                run_forward(batch)
                done += 1
        return done

    @contextmanager
    def _calibrating(self) -> Iterator[None]:
        """Every cast site observes instead of casting; telemetry is paused meanwhile."""
        recording = self.telemetry.recording if self.telemetry else False
        if self.telemetry:
            self.telemetry.recording = False
        for site in self.cast_sites:
            if site.scaler is not None:
                site.scaler.calibrating = True
        try:
            yield
        finally:
            for site in self.cast_sites:
                if site.scaler is not None:
                    site.scaler.calibrating = False
            if self.telemetry:
                self.telemetry.recording = recording

    @contextmanager
    def preserved_scaling_state(self) -> Iterator[None]:
        """Forwards inside leave every cast site's scaling state (amax histories) as it was, so
        a measurement during training (the held-out loss curve) does not change the training."""
        sites = [s.scaler for s in self.cast_sites if s.scaler is not None]
        saved = [scaler.snapshot() for scaler in sites]
        try:
            yield
        finally:
            for scaler, state in zip(sites, saved):
                scaler.restore(state)

    # -- the step ------------------------------------------------------------------------
    @property
    def loss_scale(self) -> float | None:
        return None if self.scaler is None else self.scaler.scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``.backward()`` on (scaled when the LoRA grad scaler is on)."""
        return loss if self.scaler is None else self.scaler.scale_loss(loss)

    def prepare_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """After backward, before ``optimizer.step()``. Returns False when the step must be skipped.

        Order matters: the FP8 grad cast (``lora_grad='fp8_e5m2'``) sees the still-scaled grads,
        so the scaler protects that hop; then the scaler checks for Inf/NaN and unscales.
        Without the scaler this needs no device->host sync.
        """
        params = [
            p for group in optimizer.param_groups for p in group["params"] if p.grad is not None
        ]
        if self.policy.lora_grad == "fp8_e5m2":
            self._cast_grads_e5m2(params)
        ok = True if self.scaler is None else self.scaler.unscale_([p.grad for p in params])
        if self.telemetry is not None:
            self.telemetry.record_lora(self.model)
        return ok

    @torch.no_grad()
    def _cast_grads_e5m2(self, params: list[nn.Parameter]) -> None:
        names = {id(p): n for n, p in self.lora_params.items()}
        tel = self.telemetry
        for p in params:
            g = p.grad
            q = saturating_cast(g, E5M2).to(g.dtype)
            if tel is not None and tel.recording:
                layer = names.get(id(p), "?").removesuffix(".weight")
                tel.record_cast(layer, "wgrad", g, q, None, count_saturated(g, E5M2))
            g.copy_(q)

    @torch.no_grad()
    def after_step(self) -> None:
        """FP8 adapter storage: round every LoRA weight back into E4M3 (``store_adapters``)."""
        if self.policy.lora_storage == "fp32_master":
            return
        store_adapters(self.lora_params, self.policy.lora_storage, self.telemetry)

    def base_weight_bytes(self) -> int:
        """Bytes of the frozen Linear weights (incl. lm_head and FP8 scales; not embeddings)."""
        total = 0
        lora_ids = {id(p) for p in self.lora_params.values()}
        for module in self.model.modules():
            if isinstance(module, Fp8BaseLinear):
                total += module.storage_bytes()
            elif isinstance(module, LINEAR_TYPES) and id(module.weight) not in lora_ids:
                total += module.weight.nbytes
        return total


def apply_policy(
    model: nn.Module,
    policy: PrecisionPolicy | str,
    telemetry: Fp8Telemetry | None = None,
) -> PrecisionHandle:
    """Convert ``model`` (a PEFT LoRA model) in place to ``policy``; see the module docstring."""
    policy = get_policy(policy) if isinstance(policy, str) else policy
    applied = getattr(model, _APPLIED_ATTR, None)
    if applied is not None:
        raise ValueError(f"precision policy {applied!r} is already applied to this model")
    cd = policy.torch_compute_dtype
    plan: list[dict[str, Any]] = []
    sites: list[CastSite] = []

    for site in frozen_linears(model):
        new = _convert_base(site, policy, telemetry, plan, sites)
        if new is not site.module:
            site.replace(model, new)
    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            _convert_lora_layer(name, module, policy, telemetry, plan)

    lora_params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    _set_dtypes(model, cd, lora_params)
    if policy.lora_storage != "fp32_master":
        with torch.no_grad():
            store_adapters(lora_params, policy.lora_storage, None)
    plan.extend(_global_plan(policy))
    scaler = LoraGradScaler(policy.grad_scaler) if policy.lora_grad_scaler else None
    setattr(model, _APPLIED_ATTR, policy.name)
    return PrecisionHandle(model, policy, telemetry, plan, lora_params, sites, scaler)


_STORAGE_RECIPE = {"fp8_e4m3": ScalingRecipe("none"), "fp8_e4m3_scaled": ScalingRecipe("current", power_2_scale=False)}
"""E4M3 adapter storage: plain (scale 1) or an exact per-tensor current scale fmax / amax."""


@torch.no_grad()
def store_adapters(
    params: dict[str, nn.Parameter], storage: str, telemetry: Fp8Telemetry | None
) -> None:
    """Round each trainable LoRA weight to what E4M3 ``storage`` keeps of it, in place.

    Unscaled storage keeps only values E4M3 can hold at scale 1, so an entry below 2^-10 (half
    the smallest subnormal) becomes 0; scaled storage maps each tensor's amax to 448 first, so only
    the 3-bit mantissa's relative rounding remains. The rounding is telemetry kind 'lora_weight'.
    """
    recipe = _STORAGE_RECIPE[storage]
    tel = telemetry if telemetry is not None and telemetry.recording else None
    for name, p in params.items():
        scaler = TensorScaler(recipe, E4M3, "weight")
        q, saturated = scaler.quantize(p, count_saturated=tel is not None)
        stored = q.dequantize(p.dtype)
        if tel is not None:
            tel.record_cast(name.removesuffix(".weight"), "lora_weight", p, stored, q.scale_inv, saturated)
        p.copy_(stored)


def _convert_lora_layer(
    name: str,
    layer: LoraLayer,
    policy: PrecisionPolicy,
    telemetry: Fp8Telemetry | None,
    plan: list[dict[str, Any]],
) -> None:
    layer.cast_input_dtype_enabled = False  # keep activations in the compute dtype (docstring)
    if not isinstance(layer.base_layer, LINEAR_TYPES + (Fp8BaseLinear, Fp8TiedLinear)):
        plan.append(_row(name, "base", "all", "compute_dtype", "unsupported layer type, unchanged"))
    for adapter in list(layer.lora_A.keys()):
        for part in ("lora_A", "lora_B"):
            container = getattr(layer, part)
            full = f"{name}.{part}.{adapter}"
            container[adapter] = _convert_lora(full, container[adapter], policy, telemetry, plan)


def _convert_base(
    site: FrozenLinear,
    policy: PrecisionPolicy,
    telemetry: Fp8Telemetry | None,
    plan: list[dict[str, Any]],
    sites: list[CastSite],
) -> nn.Module:
    """The policy's base rule for one frozen linear, LoRA-targeted or not (lm_head: its own)."""
    name, role = site.layer_name, site.role
    fp8 = policy.lm_head_fp8 if role == "lm_head" else policy.base_fp8
    where = _where(site)
    if not fp8:
        cd = _dtype_name(policy.torch_compute_dtype)
        why = "excluded by the policy" if role == "lm_head" and policy.base_fp8 else "compute dtype"
        for tensor in ("weight", "activation", "dgrad"):
            plan.append(_row(name, role, tensor, cd, f"{why}; {where}"))
        return site.module
    # lm_head in FP8 uses the same three cast specs as the other base GEMMs of the policy.
    casts = {"weight": policy.base_weight, "activation": policy.base_activation,
             "dgrad": policy.base_dgrad, "name": name, "telemetry": telemetry,
             "compute_dtype": policy.torch_compute_dtype}  # fmt: skip
    stored = policy.base_weight_storage == "fp8"
    if site.tied:
        new: nn.Module = Fp8TiedLinear(_as_linear(site), **casts)
        storage = "cast per GEMM from the tied BF16 weight"
    else:
        new = Fp8BaseLinear(_as_linear(site), store_fp8=stored, **casts)
        storage = "storage" if stored else "cast per GEMM from the BF16 weight"
    sites.extend(new.cast_sites())
    plan.append(
        _row(name, role, "weight", policy.base_weight.tag, f"{storage} + fwd/dgrad GEMM operand; {where}")
    )
    plan.append(_row(name, role, "activation", policy.base_activation.tag, "fwd GEMM input"))
    plan.append(_row(name, role, "dgrad", policy.base_dgrad.tag, "grad_output in dgrad GEMM"))
    plan.append(_row(name, role, "wgrad", "none", "frozen: no weight gradient"))
    return new


def _where(site: FrozenLinear) -> str:
    """Plan note: why this linear is there (targeted or not, layout, tie)."""
    parts = ["LoRA-targeted" if site.targeted else "no LoRA adapter"]
    if site.transposed:
        parts.append("transformers Conv1D")
    if site.tied:
        parts.append("weight tied to the input embedding")
    return ", ".join(parts)


def _as_linear(site: FrozenLinear) -> Any:
    """What Fp8BaseLinear reads (in/out features, [out, in] weight, bias) from any linear; a
    Conv1D's [in, out] weight is handed over transposed (Fp8BaseLinear copies it anyway)."""
    module = site.module
    if not site.transposed:
        return module
    out_f, in_f = site.shape
    return SimpleNamespace(
        in_features=in_f, out_features=out_f, weight=module.weight.t(), bias=module.bias
    )


def _convert_lora(
    name: str,
    linear: nn.Module,
    policy: PrecisionPolicy,
    telemetry: Fp8Telemetry | None,
    plan: list[dict[str, Any]],
) -> nn.Module:
    cd = policy.torch_compute_dtype
    storage = (
        f"e4m3/{_STORAGE_RECIPE[policy.lora_storage].tag} (rounded after each update)"
        if policy.lora_storage in _STORAGE_RECIPE
        else "fp32"
    )
    grad = "e5m2/none" if policy.lora_grad == "fp8_e5m2" else "fp32"
    if policy.lora_grad_scaler:
        grad += " + selective LoRA grad scaler"
    plan.append(_row(name, "lora", "weight_storage", storage, "trainable master weight"))
    plan.append(_row(name, "lora", "wgrad", grad, "what the optimizer receives"))
    if not isinstance(linear, nn.Linear):
        plan.append(_row(name, "lora", "gemm", "unchanged", f"unsupported {type(linear).__name__}"))
        return linear
    if policy.lora_gemm == "fp8":
        scaling = policy.lora_gemm_scaling
        # A plain cast of FP8-stored weights is exact; their rounding is logged in after_step.
        record_weight = policy.lora_storage != "fp8_e4m3" or not get_kind(scaling).plain
        plan.append(_row(name, "lora", "activation", f"e4m3/{scaling}", "fwd GEMM input"))
        plan.append(_row(name, "lora", "weight", f"e4m3/{scaling}", "fwd/dgrad GEMM operand"))
        plan.append(
            _row(name, "lora", "dgrad", f"e5m2/{scaling}", "grad_output in dgrad+wgrad GEMMs")
        )
        return Fp8LoraLinear.from_linear(
            linear,
            name=name,
            telemetry=telemetry,
            record_weight=record_weight,
            scaling=scaling,
            power_2_scale=policy.lora_gemm_power_2_scale,
            compute_dtype=cd,
        )
    plan.append(_row(name, "lora", "gemm", _dtype_name(cd), "fwd/dgrad/wgrad GEMMs"))
    return LoraComputeLinear.from_linear(linear, compute_dtype=cd)


def _global_plan(policy: PrecisionPolicy) -> list[dict[str, Any]]:
    cd = _dtype_name(policy.torch_compute_dtype)
    cal = (
        f"{policy.calibration_steps} calibration forwards" if policy.uses_delayed_scaling else "n/a"
    )
    return [
        _row("*", "other", "norms/softmax/attention/embeddings", f"{cd}/fp32", "never FP8"),
        _row("*", "other", "loss", "fp32", "logits upcast by the model's loss"),
        _row("*", "other", "optimizer_states", "fp32", "FP32 LoRA masters"),
        _row("*", "other", "amax_calibration", cal if policy.calibration_steps else "none", ""),
    ]


def _row(module: str, role: str, tensor: str, fmt: str, note: str) -> dict[str, Any]:
    """One plan entry; ``format`` is 'bf16' or '<fp8 format>/<scaling>' (e.g. 'e4m3/block128')."""
    return {"module": module, "role": role, "tensor": tensor, "format": fmt, "note": note}


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


def _set_dtypes(
    model: nn.Module, compute_dtype: torch.dtype, lora: dict[str, nn.Parameter]
) -> None:
    """Frozen params -> compute dtype, LoRA params -> FP32 masters; buffers untouched."""
    lora_ids = {id(p) for p in lora.values()}
    for p in model.parameters():
        target = torch.float32 if id(p) in lora_ids else compute_dtype
        if p.dtype != target and p.is_floating_point():
            p.data = p.data.to(target)
