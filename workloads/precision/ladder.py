"""The mechanism ladder: one named policy per FP8 mechanism, in both directions.

A *mechanism* is one precision choice the FP8 fine-tuning literature blames for lost accuracy
(unscaled casts, FP8 LoRA GEMMs, E5M2 LoRA gradients, FP8 adapter storage, FP8 lm_head, tensor
vs block scales, calibration, the LoRA gradient scaler). Each one is named after the
*protection* against it and has two positions: ``protect`` (the protection on) and ``expose``
(off). A rung is a base policy with exactly one mechanism moved to the other position:

- ``fp8_naive+<id>`` (ladder ``up``): the stock FP8 conversion plus one protection;
- ``fp8_naive-<id>`` / ``fp8_protected-<id>`` (ladder ``down``): one protection removed.

So the same id names the same switch on both ladders (``fp8_naive+calibration`` and
``fp8_protected-calibration`` move the same two fields in opposite directions), and a report can
pair the rungs. Most mechanisms are one policy field; three are one *user-level* choice that
spans several fields: ``scaling`` (the recipe of every FP8 cast), ``exact_scales`` (exact vs
power-of-two per-tensor scales of every cast) and ``calibration`` (a delayed amax history only
makes sense when calibration forwards fill it). The fields of each mechanism are declared here
once, and tests check that every rung changes exactly those *and* that its base starts at the
opposite position (``opposite``), so a rung never moves a second mechanism by accident.

Two choices keep that true. ``activation_scaling`` (current -> plain activations) is a rung of
``fp8_naive`` only: from ``fp8_protected`` (delayed activations) it would also switch
calibration off, which is the ``calibration`` rung's move. Adapter storage is two mechanisms,
``fp32_adapters_vs_e4m3`` (E4M3 with scale 1) and ``fp32_adapters_vs_scaled_e4m3`` (E4M3 with
an exact per-tensor scale), because the two fail for different reasons (docs/mechanisms.md).

This module is torch-free data (positions are switch strings ``CastSpec.parse`` reads), so the
registry in ``policy.py`` and the docs can both be built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fp8lab_conf.contracts import TAG_LADDER, TAG_LADDER_BASE, TAG_MECHANISM, TAG_MECHANISM_DESC

__all__ = [
    "LADDER_BASES",
    "MECHANISMS",
    "Mechanism",
    "RUNGS",
    "Rung",
    "ladder_tags",
    "opposite",
]


LADDER_BASES = ("fp8_naive", "fp8_protected")


@dataclass(frozen=True)
class Mechanism:
    """One switch with two positions. ``protect`` and ``expose`` set the same fields."""

    id: str
    description: str
    protect: dict[str, Any]
    expose: dict[str, Any]

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.protect)


def _cast(fmt: str, kind: str, exact: bool = True) -> dict[str, Any]:
    """A cast position: ``exact`` per-tensor scales (fmax / amax, TE's CurrentScaling and
    DelayedScaling arithmetic) unless asked for power-of-two ones (``CastSpec.parse`` reads it)."""
    return {"fmt": fmt, "kind": kind, **({"power_2_scale": False} if exact else {})}


_MECHANISMS = (
    Mechanism(
        "scaling",
        "Per-tensor current scaling of every FP8 cast (base and LoRA GEMMs); without it every "
        "cast is plain, scale 1, so small values underflow and large ones saturate.",
        protect={
            "base_weight": _cast("e4m3", "current"),
            "base_activation": _cast("e4m3", "current"),
            "base_dgrad": _cast("e5m2", "current"),
            "lora_gemm_scaling": "current",
        },
        expose={
            "base_weight": "e4m3:none",
            "base_activation": "e4m3:none",
            "base_dgrad": "e5m2:none",
            "lora_gemm_scaling": "none",
        },
    ),
    Mechanism(
        "activation_scaling",
        "Per-tensor current scaling of the base GEMM input activations; without it they are "
        "plain E4M3 casts (scale 1). A rung of fp8_naive only: fp8_protected's activations use "
        "delayed scaling, and leaving it would also switch calibration off (the calibration rung).",
        protect={"base_activation": _cast("e4m3", "current")},
        expose={"base_activation": "e4m3:none"},
    ),
    Mechanism(
        "dgrad_scaling",
        "Per-tensor current scaling of the gradient entering the base dgrad GEMMs; without it "
        "they are plain E5M2 casts (scale 1), where small gradients underflow.",
        protect={"base_dgrad": _cast("e5m2", "current")},
        expose={"base_dgrad": "e5m2:none"},
    ),
    Mechanism(
        "exact_scales",
        "Per-tensor scales exactly fmax / amax (torchao tensorwise, TE Float8CurrentScaling) "
        "instead of rounded down to a power of two (up to one binade less headroom).",
        protect={
            "base_weight": _cast("e4m3", "current"),
            "base_activation": _cast("e4m3", "current"),
            "base_dgrad": _cast("e5m2", "current"),
            "lora_gemm_power_2_scale": False,
        },
        expose={
            "base_weight": _cast("e4m3", "current", exact=False),
            "base_activation": _cast("e4m3", "current", exact=False),
            "base_dgrad": _cast("e5m2", "current", exact=False),
            "lora_gemm_power_2_scale": True,
        },
    ),
    Mechanism(
        "block_scales",
        "Frozen base weights stored in E4M3 with one scale per 128x128 block (power-of-two, "
        "TE Float8BlockScaling's default) instead of one exact scale per tensor.",
        protect={"base_weight": "e4m3:block"},
        expose={"base_weight": _cast("e4m3", "current")},
    ),
    Mechanism(
        "calibration",
        "Base activations scaled from a delayed amax history (16) filled by 8 calibration "
        "forwards before training, instead of per-tensor current scaling.",
        protect={"base_activation": _cast("e4m3", "delayed"), "calibration_steps": 8},
        expose={"base_activation": _cast("e4m3", "current"), "calibration_steps": 0},
    ),
    Mechanism(
        "bf16_lora_gemm",
        "LoRA adapter GEMMs run in BF16 instead of FP8 (a stock conversion turns the adapters' "
        "nn.Linear into FP8 GEMMs like any other linear).",
        protect={"lora_gemm": "bf16"},
        expose={"lora_gemm": "fp8"},
    ),
    Mechanism(
        "fp32_lora_grad",
        "LoRA weight gradients reach the optimizer in FP32 instead of being cast to E5M2 "
        "(plain) after backward.",
        protect={"lora_grad": "fp32"},
        expose={"lora_grad": "fp8_e5m2"},
    ),
    Mechanism(
        "fp32_adapters_vs_e4m3",
        "Trainable LoRA weights kept as FP32 masters instead of stored in E4M3 *without a "
        "scale* (scale 1) and rounded back after every optimizer update: an update below half "
        "of E4M3's smallest subnormal (2^-10) rounds away.",
        protect={"lora_storage": "fp32_master"},
        expose={"lora_storage": "fp8_e4m3"},
    ),
    Mechanism(
        "fp32_adapters_vs_scaled_e4m3",
        "Trainable LoRA weights kept as FP32 masters instead of stored in E4M3 with an exact "
        "per-tensor current scale (fmax / amax) and rounded back after every optimizer update: "
        "only the 3-bit mantissa's relative rounding remains.",
        protect={"lora_storage": "fp32_master"},
        expose={"lora_storage": "fp8_e4m3_scaled"},
    ),
    Mechanism(
        "bf16_lm_head",
        "The output projection (lm_head) stays a BF16 GEMM instead of being converted to FP8 "
        "with the other linears.",
        protect={"lm_head_fp8": False},
        expose={"lm_head_fp8": True},
    ),
    Mechanism(
        "grad_scaler",
        "A dynamic loss scale for the LoRA gradients (backs off on overflow) that lifts small "
        "gradients above FP8's underflow threshold on every low-precision hop.",
        protect={"lora_grad_scaler": True},
        expose={"lora_grad_scaler": False},
    ),
)
MECHANISMS: dict[str, Mechanism] = {m.id: m for m in _MECHANISMS}


@dataclass(frozen=True)
class Rung:
    """A registered policy ``<base><+|-><mechanism>``."""

    base: str
    direction: str  # "up" (protection added) | "down" (protection removed)
    mechanism: str

    @property
    def name(self) -> str:
        return f"{self.base}{'+' if self.direction == 'up' else '-'}{self.mechanism}"

    @property
    def switches(self) -> dict[str, Any]:
        m = MECHANISMS[self.mechanism]
        return dict(m.protect if self.direction == "up" else m.expose)


# Up from fp8_naive: the protections it lacks. Down from fp8_naive: what the stock recipe
# already gets right. Down from fp8_protected: each of its protections.
RUNGS: tuple[Rung, ...] = (
    *(
        Rung("fp8_naive", "up", m)
        for m in ("bf16_lora_gemm", "bf16_lm_head", "block_scales", "calibration", "grad_scaler")
    ),
    *(
        Rung("fp8_naive", "down", m)
        for m in (
            "scaling",
            "activation_scaling",
            "exact_scales",
            "fp32_adapters_vs_e4m3",
            "fp32_adapters_vs_scaled_e4m3",
            "fp32_lora_grad",
        )
    ),
    *(
        Rung("fp8_protected", "down", m)
        for m in (
            "block_scales",
            "calibration",
            "dgrad_scaling",
            "grad_scaler",
            "bf16_lora_gemm",
            "fp32_lora_grad",
            "bf16_lm_head",
            "fp32_adapters_vs_e4m3",
            "fp32_adapters_vs_scaled_e4m3",
        )
    ),
)


def opposite(rung: Rung) -> dict[str, Any]:
    """The mechanism's position the rung's base must start at (protect for a down rung)."""
    m = MECHANISMS[rung.mechanism]
    return dict(m.expose if rung.direction == "up" else m.protect)


def ladder_tags(ladder: str, base: str, mechanism: str) -> dict[str, str]:
    """The four ladder tags of a trial run ("" everywhere for a policy that is not a rung)."""
    desc = MECHANISMS[mechanism].description if mechanism in MECHANISMS else ""
    return {
        TAG_LADDER: ladder,
        TAG_LADDER_BASE: base,
        TAG_MECHANISM: mechanism,
        TAG_MECHANISM_DESC: desc,
    }
