"""The mechanism ladder: one named policy per FP8 mechanism, in both directions.

A *mechanism* is one precision choice the FP8 fine-tuning literature blames for lost accuracy
(unscaled casts, FP8 LoRA GEMMs, E5M2 LoRA gradients, FP8 adapter storage, FP8 lm_head, tensor
vs block scales, calibration, the LoRA gradient scaler). Each one is named after the
*protection* against it and has two positions: ``protect`` (the protection on) and ``expose``
(off). A rung is a base policy with exactly one mechanism moved to the other position:

- ``fp8_naive+<id>`` (ladder ``up``): the stock FP8 conversion plus one protection;
- ``fp8_naive-<id>`` / ``fp8_protected-<id>`` (ladder ``down``): one protection removed;
- ``mxfp8<+|-><id>`` / ``nvfp4<+|-><id>``: the mechanisms that set Blackwell's block formats
  apart (block size, scale format, stochastic rounding, the Hadamard transform), moved one at a
  time from the two Blackwell policies.

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


LADDER_BASES = ("fp8_naive", "fp8_protected", "mxfp8", "nvfp4")


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


def _block(fmt: str, kind: str, block: int, **switches: Any) -> dict[str, Any]:
    """A block-format cast position (``mx`` / ``nvfp4``) with its block size spelled out."""
    return {"fmt": fmt, "kind": kind, "block_size": block, **switches}


# The Blackwell policies' casts (policy.py builds mxfp8 / nvfp4 from these, so a rung's
# position and its base's setting cannot drift apart).
MECHANISM_CASTS: dict[str, dict[str, Any]] = {
    "mxfp8": _block("e4m3", "mx", 32),
    "mxfp8_128": _block("e4m3", "mx", 128),
    "mxfp8_fp32": _block("e4m3", "mx", 32, block_scale_fmt="fp32"),
    "nvfp4": _block("e2m1", "nvfp4", 16),
    "nvfp4_32": _block("e2m1", "nvfp4", 32),
    "nvfp4_sr": _block("e2m1", "nvfp4", 16, stochastic_rounding=True),
    "nvfp4_sr_32": _block("e2m1", "nvfp4", 32, stochastic_rounding=True),
    "nvfp4_fp32": _block("e2m1", "nvfp4", 16, block_scale_fmt="fp32"),
    "nvfp4_sr_fp32": _block("e2m1", "nvfp4", 16, block_scale_fmt="fp32", stochastic_rounding=True),
    "nvfp4_sr_rht": _block("e2m1", "nvfp4", 16, stochastic_rounding=True, hadamard=True),
}


def _all_three(weight: str, activation: str, dgrad: str) -> dict[str, Any]:
    """The three base casts at once (a block-format mechanism moves all of them)."""
    return {
        "base_weight": MECHANISM_CASTS[weight],
        "base_activation": MECHANISM_CASTS[activation],
        "base_dgrad": MECHANISM_CASTS[dgrad],
    }


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
_BLACKWELL_MECHANISMS = (
    Mechanism(
        "mx_block32",
        "MXFP8 with one E8M0 scale per 32 values along the reduction dim (the MX block) instead "
        "of per 128 (Float8BlockScaling's 1x128 tile, still E8M0): a large value costs "
        "resolution to 31 neighbours, not 127.",
        protect=_all_three("mxfp8", "mxfp8", "mxfp8"),
        expose=_all_three("mxfp8_128", "mxfp8_128", "mxfp8_128"),
    ),
    Mechanism(
        "mx_fp32_scales",
        "MXFP8 blocks scaled by their exact FP32 fmax / amax instead of an E8M0 power of two "
        "by the OCP rule (floor(log2 amax) - 8), under which a block's largest values can "
        "exceed 448 and saturate, and the rest lose up to one binade of resolution.",
        protect=_all_three("mxfp8_fp32", "mxfp8_fp32", "mxfp8_fp32"),
        expose=_all_three("mxfp8", "mxfp8", "mxfp8"),
    ),
    Mechanism(
        "nvfp4_block16",
        "NVFP4 with one E4M3 scale per 16 values (16x16 for weights) instead of per 32 "
        "(32x32): the small block is what lets a 4-bit format follow the data.",
        protect=_all_three("nvfp4", "nvfp4", "nvfp4_sr"),
        expose=_all_three("nvfp4_32", "nvfp4_32", "nvfp4_sr_32"),
    ),
    Mechanism(
        "nvfp4_fp32_scales",
        "NVFP4 blocks scaled by their exact FP32 6 / amax instead of an E4M3 block scale "
        "(rounded to 3 mantissa bits) under the FP32 per-tensor scale.",
        protect=_all_three("nvfp4_fp32", "nvfp4_fp32", "nvfp4_sr_fp32"),
        expose=_all_three("nvfp4", "nvfp4", "nvfp4_sr"),
    ),
    Mechanism(
        "stochastic_rounding",
        "The NVFP4 gradient entering the base dgrad GEMMs is rounded stochastically (unbiased: "
        "the expected value is the gradient) instead of to nearest, TE's NVFP4 choice for "
        "gradients.",
        protect={"base_dgrad": MECHANISM_CASTS["nvfp4_sr"]},
        expose={"base_dgrad": MECHANISM_CASTS["nvfp4"]},
    ),
    Mechanism(
        "hadamard",
        "The NVFP4 dgrad gradient goes through a 16-point random Hadamard transform before "
        "quantization (undone after decoding), spreading an outlier over its block. TE applies "
        "it to the weight-gradient GEMM only, which a frozen base never runs; this rung applies "
        "it to the one gradient a frozen base's GEMMs do cast, dgrad's.",
        protect={"base_dgrad": MECHANISM_CASTS["nvfp4_sr_rht"]},
        expose={"base_dgrad": MECHANISM_CASTS["nvfp4_sr"]},
    ),
)
MECHANISMS: dict[str, Mechanism] = {m.id: m for m in (*_MECHANISMS, *_BLACKWELL_MECHANISMS)}


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
    Rung("mxfp8", "down", "mx_block32"),
    Rung("mxfp8", "up", "mx_fp32_scales"),
    Rung("nvfp4", "down", "nvfp4_block16"),
    Rung("nvfp4", "up", "nvfp4_fp32_scales"),
    Rung("nvfp4", "down", "stochastic_rounding"),
    Rung("nvfp4", "up", "hadamard"),
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
