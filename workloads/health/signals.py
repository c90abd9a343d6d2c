"""Health signals computed on the device at logged steps (docs/health.md, "Signals").

They travel in the logged step's single device->host transfer: `device_signals` returns 0-d
tensors that `run_training` adds to the `extras` of `telemetry.end_step`; nothing here syncs.

Adapter movement. PEFT initialises `lora_B` to zero, so the relative change of the adapter
matrices themselves is undefined (B) or dominated by rounding (A). What matters is how far the
adapter has moved the layer it adapts: `||dW||_F / ||W_base||_F` with
`dW = s * (B A - B0 A0)`, `s` the LoRA scaling, `B0 A0` the product at init (zero for a fresh
adapter). It is exact and cheap: with `X = [B, -B0]` and `Y = [A; A0]`,
`||X Y||_F^2 = sum((X^T X) * (Y Y^T))`, two 2r x 2r Gram matrices per adapter, never a
d_out x d_in product. Adapters of the same shapes are stacked and reduced together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fp8lab_conf.contracts import (METRIC_HEALTH_MOVEMENT_MEDIAN, METRIC_HEALTH_MOVEMENT_MIN,
                                   METRIC_HEALTH_SKIPS, METRIC_HEALTH_STD_MIN)


@dataclass
class _Adapter:
    a: torch.Tensor  # lora_A weight [r, d_in] (the live parameter)
    b: torch.Tensor  # lora_B weight [d_out, r]
    a0: torch.Tensor  # detached copies at init
    b0: torch.Tensor
    scaling: float
    base_norm: float  # ||W_base||_F at init (BF16 master, before any FP8 conversion)


@dataclass
class _Group:
    """Adapters of one shape, with what does not change between steps stacked once."""

    adapters: list[_Adapter]
    a0: torch.Tensor  # [n, r, d_in]
    b0: torch.Tensor  # [n, d_out, r]
    scale: torch.Tensor  # [n]: s / ||W_base||

    @classmethod
    def of(cls, adapters: list[_Adapter]) -> "_Group":
        scale = torch.tensor([x.scaling / max(x.base_norm, 1e-30) for x in adapters], device=adapters[0].a.device)
        return cls(adapters, torch.stack([x.a0 for x in adapters]), torch.stack([x.b0 for x in adapters]), scale)


class AdapterProbe:
    """Keeps a detached copy of every adapter's initial weights and measures it against them.

    Build it after the precision backend is applied (the backend may replace the LoRA
    parameters, e.g. by FP32 masters: the probe must watch the ones the optimizer updates), with
    the base norms the model stage took before it (`workloads.model.loading.base_weight_norms`)."""

    def __init__(self, model: nn.Module, base_norms: dict[str, float]) -> None:
        by_shape: dict[tuple[Any, ...], list[_Adapter]] = {}
        for name, module in model.named_modules():
            if name not in base_norms:  # the LoRA layers are the ones the model stage measured
                continue
            for adapter in _adapters_of(module, base_norms[name]):
                key = (tuple(adapter.a.shape), tuple(adapter.b.shape), adapter.a.device)
                by_shape.setdefault(key, []).append(adapter)
        if not by_shape:
            raise ValueError("health signals: the model has no LoRA adapters to watch")
        self._groups = [_Group.of(adapters) for adapters in by_shape.values()]

    @torch.no_grad()
    def device_signals(self) -> dict[str, torch.Tensor]:
        """Min and median adapter movement and the smallest LoRA matrix std, as 0-d device tensors."""
        moves, stds = [], []
        for group in self._groups:
            a = torch.stack([x.a.detach() for x in group.adapters]).float()
            b = torch.stack([x.b.detach() for x in group.adapters]).float()
            xs = torch.cat([b, -group.b0], dim=2)  # [n, d_out, 2r]
            ys = torch.cat([a, group.a0], dim=1)  # [n, 2r, d_in]
            sq = (xs.transpose(1, 2) @ xs * (ys @ ys.transpose(1, 2))).sum(dim=(1, 2)).clamp_min(0)
            moves.append(sq.sqrt() * group.scale)
            stds.append(torch.minimum(a.flatten(1).std(dim=1), b.flatten(1).std(dim=1)))
        move = torch.cat(moves)
        return {METRIC_HEALTH_MOVEMENT_MIN: move.min(), METRIC_HEALTH_MOVEMENT_MEDIAN: move.median(),
                METRIC_HEALTH_STD_MIN: torch.cat(stds).min()}


def host_signals(handle: Any) -> dict[str, float]:
    """Signals already on the host: optimizer steps the LoRA grad scaler skipped (if it has one)."""
    scaler = getattr(handle, "scaler", None)
    return {} if scaler is None else {METRIC_HEALTH_SKIPS: float(scaler.skipped_steps)}


def _adapters_of(module: nn.Module, base_norm: float) -> list[_Adapter]:
    """The (A, B) pairs of one PEFT LoRA layer (one per adapter name)."""
    lora_a, lora_b = module.lora_A, module.lora_B
    out = []
    for name, a_mod in lora_a.items():
        if name not in lora_b:
            continue
        a, b = a_mod.weight, lora_b[name].weight
        scaling = float(getattr(module, "scaling", {}).get(name, 1.0))
        out.append(_Adapter(a, b, a.detach().float().clone(), b.detach().float().clone(), scaling, base_norm))
    return out
