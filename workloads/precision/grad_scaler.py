"""Selective LoRA gradient scaler (docs/background.md §1, technique 1).

Only LoRA parameters are trainable, so multiplying the loss by ``S`` scales exactly the LoRA
gradients (and the activation gradients flowing to them through the low-precision backward
hops: BF16, and E5M2 where dgrad is FP8). Tiny LoRA gradients (1e-6 .. 1e-8 late in training)
are thereby lifted above FP8/BF16's underflow edge on the way back; they are unscaled in FP32
right before the optimizer.

Rules (dynamic, as in torch's GradScaler, with the article's constants):

- start at ``S = 2**10``;
- after backward, if any LoRA gradient is non-finite: skip the optimizer step and halve ``S``;
- after ``growth_interval`` (100) consecutive good steps: ``S *= 1.5``.

The article's two magnitude rules are available but OFF by default:
``backoff_above_grad_norm`` (halve ``S`` when the largest *unscaled* per-parameter LoRA grad norm
exceeds it; the article uses 1.0) and ``grow_below_grad_norm`` (only count a step towards growth
while that norm stays below it; the article uses 0.01). Unscaled FP32 gradients carry no overflow
risk, so halving on a large-but-finite gradient only removes protection and acts like a second,
hidden clipping rule that would differ between policies; an overflow shows up as Inf/NaN, which
the default rule already catches. Turn them on to replicate the article exactly.

Keeping ``S`` on the host (a Python float) costs nothing extra: deciding whether to skip the step
already needs one device->host sync, which also carries the max grad norm.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

__all__ = ["GradScalerConfig", "LoraGradScaler"]


@dataclass(frozen=True)
class GradScalerConfig:
    """Constants of the selective LoRA gradient scaler (see module docstring)."""

    init_scale: float = 2.0**10
    growth_factor: float = 1.5
    backoff_factor: float = 0.5
    growth_interval: int = 100
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    backoff_above_grad_norm: float | None = None
    grow_below_grad_norm: float | None = None

    def __post_init__(self) -> None:
        errors = []
        if not self.min_scale <= self.init_scale <= self.max_scale:
            errors.append("need min_scale <= init_scale <= max_scale")
        if self.growth_factor <= 1.0:
            errors.append(f"growth_factor={self.growth_factor} must be > 1")
        if not 0.0 < self.backoff_factor < 1.0:
            errors.append(f"backoff_factor={self.backoff_factor} must be in (0, 1)")
        if self.growth_interval < 1:
            errors.append(f"growth_interval={self.growth_interval} must be >= 1")
        if errors:
            raise ValueError("invalid GradScalerConfig: " + "; ".join(errors))


class LoraGradScaler:
    """Dynamic loss scale for LoRA gradients: ``scale_loss`` before backward,
    ``unscale_`` after it (returns whether the optimizer may step)."""

    def __init__(self, config: GradScalerConfig | None = None) -> None:
        self.config = config or GradScalerConfig()
        self.scale = float(self.config.init_scale)
        self.good_steps = 0
        self.skipped_steps = 0
        self.last_max_grad_norm = float("nan")

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * S`` (a Python float multiply: no sync, no new device tensor state)."""
        return loss * self.scale

    @torch.no_grad()
    def unscale_(self, grads: Iterable[torch.Tensor]) -> bool:
        """Check the scaled grads for Inf/NaN, unscale them in place when finite, update ``S``.

        Returns False when the step must be skipped (non-finite gradients).
        """
        grads = [g for g in grads if g is not None]
        if not grads:
            return True
        norms = torch.stack([n.float() for n in torch._foreach_norm(grads)])
        # A per-parameter norm is non-finite iff some element is (or it overflowed FP32).
        summary = torch.stack([(~torch.isfinite(norms)).any().float(), norms.max()])
        found_inf, max_norm = summary.tolist()  # SYNC: skip decision + max norm, once per step
        self.last_max_grad_norm = max_norm / self.scale
        if found_inf:
            self._backoff()
            self.skipped_steps += 1
            return False
        torch._foreach_mul_(grads, 1.0 / self.scale)
        self._after_good_step(self.last_max_grad_norm)
        return True

    def _backoff(self) -> None:
        self.scale = max(self.scale * self.config.backoff_factor, self.config.min_scale)
        self.good_steps = 0

    def _after_good_step(self, max_norm: float) -> None:
        cfg = self.config
        if cfg.backoff_above_grad_norm is not None and max_norm > cfg.backoff_above_grad_norm:
            self._backoff()
            return
        if cfg.grow_below_grad_norm is not None and not max_norm < cfg.grow_below_grad_norm:
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= cfg.growth_interval:
            self.scale = min(self.scale * cfg.growth_factor, cfg.max_scale)
            self.good_steps = 0

    def state_dict(self) -> dict[str, float]:
        return {
            "scale": self.scale,
            "good_steps": self.good_steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
