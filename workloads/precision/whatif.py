"""What-if telemetry: what every registered recipe would do to the very tensors a policy casts.

At a recorded telemetry step, each tensor a cast site of the policy quantizes (base activations,
dgrad gradients, FP8 LoRA casts; frozen weights once) is also quantized, on the side, under each
recipe of ``WHATIF_RECIPES`` -- the result is thrown away, training is unchanged -- and three
numbers are kept per (layer, kind, recipe), by the same definitions as the policy's own
telemetry (``telemetry.cast_stats``): underflow share ``(nonzero(x) - nonzero(q(x))) / numel``,
saturation share ``|x * scale| > fmax``, and the MSE of the round trip. This is Transformer
Engine's debug ``LogFp8TensorStats`` "what-if" idea, on any machine and into MLflow (the
recorder writes ``telemetry/whatif.parquet``).

The recipes, as the libraries apply them to a tensor of each role:

- ``tensorwise``: one exact per-tensor scale, E4M3 (E5M2 for gradients): TE Float8CurrentScaling
  (HYBRID), torchao ``tensorwise``;
- ``rowwise``: one power-of-two scale per row, E4M3: torchao ``rowwise``;
- ``block``: power-of-two scales per 1x128 tile (128x128 for weights), E4M3: TE Float8BlockScaling;
- ``mxfp8``: E8M0 scales per 1x32 block, E4M3: TE MXFP8BlockScaling;
- ``nvfp4``: E2M1 with E4M3 scales per 1x16 block (16x16 weights) and an FP32 tensor scale:
  TE NVFP4BlockScaling, rounded to nearest (stochastic rounding would draw from the trial's
  rounding stream and change an NVFP4 trial's own numbers).

Cost: five extra quantize-dequantize round trips of every cast tensor on each recorded step (a
tensor fed to several sites, such as q/k/v's shared input, is quantized once), and one
device->host transfer of its own at the end of the step. Off by default
(``precision.telemetry.whatif``); ``benchmarks/whatif_overhead.py`` measures what it costs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fp8lab_conf.contracts import WHATIF_RECIPES
from workloads.precision.scaling import CastSpec, Role, ScalingRecipe, TensorScaler
from workloads.precision.telemetry import cast_stats

__all__ = ["WHATIF_RECIPES", "WhatIf", "recipe_spec"]

_ROLES: dict[str, Role] = {"activation": "activation", "weight": "weight", "lora_weight": "weight",
                           "dgrad": "grad", "wgrad": "grad"}  # fmt: skip
_UNDER, _OVER, _MSE = 0, 1, 5  # positions in telemetry's stats vector


def _tensorwise(role: Role, cols: int) -> CastSpec:
    return CastSpec("e5m2" if role == "grad" else "e4m3", ScalingRecipe("current", power_2_scale=False))


def _rowwise(role: Role, cols: int) -> CastSpec:
    return CastSpec("e4m3", ScalingRecipe("block", block_size=cols))  # tile (1, cols) as activation


_SPECS: dict[str, Callable[[Role, int], CastSpec]] = {
    "tensorwise": _tensorwise,
    "rowwise": _rowwise,
    "block": lambda role, cols: CastSpec.parse("e4m3:block"),
    "mxfp8": lambda role, cols: CastSpec.parse("e4m3:mx"),
    "nvfp4": lambda role, cols: CastSpec.parse("e2m1:nvfp4"),
}
if tuple(_SPECS) != WHATIF_RECIPES:  # one list: the contract's names are these recipes
    raise RuntimeError(f"whatif: recipes {tuple(_SPECS)} != contracts.WHATIF_RECIPES")


def recipe_spec(recipe: str, kind: str, cols: int) -> tuple[CastSpec, Role]:
    """The cast ``recipe`` applies to a tensor of telemetry kind ``kind`` with ``cols`` columns,
    and the role its tiles follow (rowwise tiles are one row whatever the tensor)."""
    role = _ROLES.get(kind, "activation")
    return _SPECS[recipe](role, cols), ("activation" if recipe == "rowwise" else role)


@torch.no_grad()
def recipe_stats(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``[len(WHATIF_RECIPES), 3]`` on x's device: underflow %, saturation %, MSE per recipe."""
    out = []
    for recipe in WHATIF_RECIPES:
        spec, role = recipe_spec(recipe, kind, x.shape[-1])
        q, saturated = TensorScaler(spec.recipe, spec.format, role).quantize(x, count_saturated=True)
        stats = cast_stats(x, q.dequantize(x.dtype), q.scale_inv, saturated)
        out.append(stats[[_UNDER, _OVER, _MSE]])
    return torch.stack(out)


class WhatIf:
    """Collects ``recipe_stats`` of every cast on recorded steps; ``rows`` holds the results."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._pending: list[tuple[str, str, int, torch.Tensor]] = []
        self._static: list[tuple[str, str, int, torch.Tensor]] = []
        self._last: tuple[Any, torch.Tensor] | None = None  # (key of x, its stats): shared inputs

    def observe(self, layer: str, kind: str, x: torch.Tensor) -> None:
        """A cast of ``x`` at ``layer``/``kind`` on a recorded step (first micro-batch counts)."""
        if any(p[0] == layer and p[1] == kind for p in self._pending):
            return
        key = (id(x), x._version if not x.is_inference() else None, kind)
        if self._last is None or self._last[0] != key:
            self._last = (key, recipe_stats(x.detach(), kind))
        self._pending.append((layer, kind, x.numel(), self._last[1]))

    def observe_static(self, layer: str, kind: str, w: torch.Tensor) -> None:
        """A frozen weight: its what-if never changes, so it is computed once and reported at
        the first recorded step."""
        self._static.append((layer, kind, w.numel(), recipe_stats(w.detach(), kind)))

    def end_step(self, step: int) -> None:
        """Move this step's stats to the host (one transfer) and append them as rows."""
        items = self._static + self._pending
        self._static, self._pending, self._last = [], [], None
        if not items:
            return
        values = torch.stack([s for *_, s in items]).tolist()  # SYNC: the what-if step's one transfer
        for (layer, kind, numel, _), per_recipe in zip(items, values, strict=True):
            pct = 100.0 / max(numel, 1)  # counts -> % of all elements, as the telemetry rows
            for recipe, (under, over, mse) in zip(WHATIF_RECIPES, per_recipe, strict=True):
                self.rows.append({"step": step, "layer": layer, "kind": kind, "recipe": recipe,
                                  "underflow_pct": under * pct, "overflow_pct": over * pct,
                                  "mse": mse, "numel": numel})  # fmt: skip
