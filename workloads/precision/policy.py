"""Precision policies: named, versioned recipes of independent switches (docs/mechanisms.md).

Each protection is its own switch, so a rung of the mechanism ladder is a registered copy of a
base policy with exactly one mechanism moved (``ladder.py``) -- no new code. A policy only
decides formats and scaling; it never touches lr, rank, steps or any other hyperparameter
(there is no field for them).

Registered policies:

- ``bf16``: everything in BF16, LoRA FP32 master weights with BF16 compute.
- ``fp8_naive`` (v3): what a stock FP8 conversion (Transformer Engine, torchao
  ``convert_to_float8_training``, accelerate) gives a user who knows nothing about LoRA: every
  linear -- LoRA adapters and lm_head included -- runs FP8 GEMMs with per-tensor *current*
  scaling (E4M3 weights and activations, E5M2 gradients) and *exact* scales fmax / amax, the
  default of torchao's tensorwise recipe and TE's Float8CurrentScaling (v2 rounded them down to
  a power of two; that is now the rung ``fp8_naive-exact_scales``); frozen base weights stay in BF16 and
  are cast per GEMM (``base_weight_storage='compute'``), adapter masters stay FP32; no LoRA
  gradient scaler, no calibration.
- ``fp8_unscaled_fp8_adapters``: ``fp8_naive`` version 1, kept under a name that says what it
  is: every cast plain (scale 1), trainable LoRA weights *stored* in E4M3 with no master copy
  (rounded back after every update), LoRA weight gradients cast to E5M2.
- ``fp8_protected`` (v2; v1 had power-of-two per-tensor scales): base weights E4M3 with
  128x128 block scales (power-of-two, TE Float8BlockScaling's default); base activations E4M3 with
  *delayed* scaling (amax history of 16, max) filled by ``calibration_steps`` calibration
  forwards -- delayed because that is the recipe for which calibration exists, and the
  ``-calibration`` rung then measures what it buys over current scaling; dgrad E5M2 with
  *current* per-tensor scaling -- gradient magnitudes drift over training (LoRA grads shrink
  late) and no-grad calibration forwards cannot fill a gradient history, so a history would
  start from scale 1 exactly when gradients are at risk; both per-tensor scales exact; LoRA FP32 master + BF16 GEMMs; LoRA
  grads FP32 with the selective LoRA gradient scaler; lm_head excluded (BF16).
- ``mxfp8`` (v1): Blackwell's MXFP8 (TE MXFP8BlockScaling) on the base GEMMs -- weights,
  activations and dgrad all E4M3 with one E8M0 scale per 1x32 block (OCP MX rule), base weights
  stored as MXFP8; adapters and protections as in ``fp8_protected`` (FP32 masters, BF16 LoRA
  GEMMs, LoRA grad scaler, lm_head BF16); no calibration (block scales come from each tensor).
- ``nvfp4`` (v1): Blackwell's NVFP4 (TE NVFP4BlockScaling) on the base GEMMs -- E2M1 values,
  E4M3 scales per 1x16 block (16x16 for weights) and an FP32 scale per tensor, the dgrad
  gradient rounded stochastically; no Hadamard transform, because TE applies it only to the
  weight-gradient GEMM, which a frozen base never runs; adapters and protections as ``mxfp8``.
- ``fp8_naive+<id>`` / ``fp8_naive-<id>`` / ``fp8_protected-<id>`` / ``mxfp8<+|-><id>`` /
  ``nvfp4<+|-><id>``: the mechanism ladder
  (``ladder.RUNGS``); ``ladder``, ``ladder_base`` and ``mechanism`` say which rung.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from workloads.precision.grad_scaler import GradScalerConfig
from workloads.precision.ladder import MECHANISM_CASTS, MECHANISMS, RUNGS
from workloads.precision.scaling import KINDS, CastSpec, ScalingRecipe, get_kind
from workloads.registry import Registry, UnknownNameError, did_you_mean

__all__ = [
    "PrecisionPolicy",
    "UnknownPolicyError",
    "SWITCHES",
    "register_policy",
    "get_policy",
    "available_policies",
]

LORA_STORAGE = ("fp32_master", "fp8_e4m3", "fp8_e4m3_scaled")  # unscaled | per-tensor scaled
BASE_WEIGHT_STORAGE = ("fp8", "compute")
LORA_GEMM = ("bf16", "fp8")
LORA_GRAD = ("fp32", "fp8_e5m2")
LORA_GEMM_SCALING = ("none", "current")  # recipe of the casts of an FP8 LoRA GEMM
COMPUTE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_CAST_FIELDS = ("base_weight", "base_activation", "base_dgrad")


class UnknownPolicyError(UnknownNameError):
    """A policy name that is not registered (the message suggests the closest names)."""


@dataclass(frozen=True)
class PrecisionPolicy:
    """A named, versioned set of precision switches. Validated on construction."""

    name: str
    version: int = 1
    description: str = ""
    ladder: str = ""
    ladder_base: str = ""
    mechanism: str = ""
    base_weight: CastSpec = CastSpec()
    base_activation: CastSpec = CastSpec()
    base_dgrad: CastSpec = CastSpec()
    base_weight_storage: str = "fp8"  # "fp8": stored quantized | "compute": BF16, cast per GEMM
    lora_storage: str = "fp32_master"
    lora_gemm: str = "bf16"
    lora_gemm_scaling: str = "current"
    lora_gemm_power_2_scale: bool = True  # scales of an FP8 LoRA GEMM rounded to powers of two
    lora_grad: str = "fp32"
    lora_grad_scaler: bool = False
    grad_scaler: GradScalerConfig = field(default_factory=GradScalerConfig)
    lm_head_fp8: bool = False
    calibration_steps: int = 0
    compute_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        errors = _validate(self)
        if errors:
            raise ValueError(
                f"invalid precision policy {self.name!r}:\n  - " + "\n  - ".join(errors)
            )

    # -- derived views --------------------------------------------------------------------
    @property
    def torch_compute_dtype(self) -> torch.dtype:
        return COMPUTE_DTYPES[self.compute_dtype]

    @property
    def base_fp8(self) -> bool:
        """True when any tensor of the frozen base GEMMs is cast to FP8."""
        return any(getattr(self, f).enabled for f in _CAST_FIELDS)

    @property
    def uses_delayed_scaling(self) -> bool:
        return any(
            getattr(self, f).enabled and getattr(self, f).recipe.scaling.from_history
            for f in _CAST_FIELDS
        )

    @property
    def ablation(self) -> str:
        """The protection this policy removes from ``fp8_protected`` ('' if it is no such rung)."""
        return self.mechanism if (self.ladder, self.ladder_base) == ("down", "fp8_protected") else ""

    @property
    def mechanism_desc(self) -> str:
        return MECHANISMS[self.mechanism].description if self.mechanism in MECHANISMS else ""

    @property
    def tag(self) -> str:
        """Short switch signature for run names, e.g. ``W8blk.A8dly.G8cur.Lbf16s.Hbf16.C8``.

        Two policies with the same switches have the same tag, whatever their names.
        """
        if not self.base_fp8 and self.lora_gemm == "bf16" and self.lora_storage == "fp32_master":
            if self.lora_grad == "fp32" and not self.lm_head_fp8 and not self.lora_grad_scaler:
                return "bf16"
        lora_kind = get_kind(self.lora_gemm_scaling)
        lora = (
            ("L8" + lora_kind.short + _exact_tag(lora_kind.plain, self.lora_gemm_power_2_scale)
             if self.lora_gemm == "fp8" else "Lbf16")
            + {"fp8_e4m3": "w8", "fp8_e4m3_scaled": "w8s"}.get(self.lora_storage, "")
            + ("g8" if self.lora_grad == "fp8_e5m2" else "")
            + ("s" if self.lora_grad_scaler else "")
        )
        parts = [
            "W" + _spec_tag(self.base_weight) + ("m" if self.base_weight_storage == "compute" else ""),
            "A" + _spec_tag(self.base_activation),
            "G" + _spec_tag(self.base_dgrad),
            lora,
            "H8" if self.lm_head_fp8 else "Hbf16",
        ]
        if self.calibration_steps:
            parts.append(f"C{self.calibration_steps}")
        return ".".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (YAML/JSON/MLflow params) of every switch."""
        out: dict[str, Any] = {"name": self.name, "version": self.version, "tag": self.tag}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, CastSpec):
                value = value.to_dict()
            elif isinstance(value, GradScalerConfig):
                value = dataclasses.asdict(value)
            out[f.name] = value
        return out

    def with_switches(self, **switches: Any) -> PrecisionPolicy:
        """A validated copy with some switches changed (names in ``SWITCHES``).

        Cast switches accept a CastSpec, 'e4m3:block'-style strings, None/'bf16', or a mapping;
        ``grad_scaler`` accepts a GradScalerConfig or a mapping of its fields. A ladder rung
        whose switches change is no longer that rung, so its ladder identity is cleared.
        """
        unknown = sorted(set(switches) - set(SWITCHES))
        if unknown:
            hints = [did_you_mean(u, SWITCHES) for u in unknown]
            raise ValueError(
                f"unknown precision switch(es) {', '.join(map(repr, unknown))}"
                + "".join(h for h in hints if h)
                + f"; valid switches: {', '.join(SWITCHES)}"
            )
        new = dataclasses.replace(self, **{k: _coerce(k, v) for k, v in switches.items()})
        if new != self and self.ladder:  # two switches away from its base: no longer that rung
            new = dataclasses.replace(new, ladder="", ladder_base="", mechanism="")
        return new


# Fields a user may flip; identity fields (name, version, description, rung) are not switches.
IDENTITY_FIELDS = ("name", "version", "description", "ladder", "ladder_base", "mechanism")
SWITCHES: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(PrecisionPolicy) if f.name not in IDENTITY_FIELDS
)


def _spec_tag(spec: CastSpec) -> str:
    if not spec.enabled:
        return "bf16"
    kind = spec.recipe.scaling
    bits = "4" if spec.fmt == "e2m1" else "8"
    if kind.native_scale_fmt != "fp32":  # a block format: its block size and switches count
        return bits + spec.recipe.tag  # e.g. 8mx32, 4nvfp416sr
    return bits + kind.short + _exact_tag(kind.plain, spec.recipe.power_2_scale)


def _exact_tag(plain: bool, power_2: bool) -> str:
    """'x' for exact (not power-of-two) scales, so two policies differing only there differ in tag."""
    return "" if plain or power_2 else "x"


def _coerce(name: str, value: Any) -> Any:
    if name in _CAST_FIELDS:
        return CastSpec.parse(value)
    if name == "grad_scaler" and isinstance(value, Mapping):
        return GradScalerConfig(**value)
    return value


def _validate(p: PrecisionPolicy) -> list[str]:
    """Every problem at once, as sentences (not asserts: they vanish under ``python -O``)."""
    errors = []
    for name in _CAST_FIELDS:
        if not isinstance(getattr(p, name), CastSpec):
            errors.append(f"{name} must be a CastSpec (use with_switches to pass strings)")
    if errors:
        return errors
    weight_kind = p.base_weight.recipe.scaling
    if p.base_weight.enabled and not weight_kind.frozen_weight_ok:
        ok = "|".join(k.name for k in KINDS.values() if k.frozen_weight_ok)
        errors.append(f"base_weight: frozen weights are cast once; use {ok}, not {weight_kind.name}")
    for name, value, allowed in (
        ("lora_storage", p.lora_storage, LORA_STORAGE),
        ("base_weight_storage", p.base_weight_storage, BASE_WEIGHT_STORAGE),
        ("lora_gemm", p.lora_gemm, LORA_GEMM),
        ("lora_grad", p.lora_grad, LORA_GRAD),
        ("lora_gemm_scaling", p.lora_gemm_scaling, LORA_GEMM_SCALING),
        ("compute_dtype", p.compute_dtype, tuple(COMPUTE_DTYPES)),
    ):
        if value not in allowed:
            errors.append(f"{name}={value!r} not in {allowed}")
    if not isinstance(p.lora_gemm_power_2_scale, bool):
        errors.append(f"lora_gemm_power_2_scale={p.lora_gemm_power_2_scale!r} must be true or false")
    if not isinstance(p.calibration_steps, int) or p.calibration_steps < 0:
        errors.append(f"calibration_steps={p.calibration_steps!r} must be an int >= 0")
    if not isinstance(p.grad_scaler, GradScalerConfig):
        errors.append("grad_scaler must be a GradScalerConfig")
    return errors


# -- registry --------------------------------------------------------------------------------
_REGISTRY: Registry[PrecisionPolicy] = Registry("precision policy", UnknownPolicyError)


def register_policy(policy: PrecisionPolicy, *, replace: bool = False) -> PrecisionPolicy:
    """Make ``policy`` available under ``policy.name``; re-registering needs ``replace=True``."""
    return _REGISTRY.register(policy.name, policy, replace=replace)


def get_policy(name: str) -> PrecisionPolicy:
    """The registered policy ``name``, or UnknownPolicyError with a did-you-mean hint."""
    return _REGISTRY.get(name)


def available_policies() -> list[str]:
    """Registered names in registration order (base policies first, then the ladder rungs)."""
    return list(_REGISTRY.names())


# -- the policy table (docs/mechanisms.md) ---------------------------------------------------
_PLAIN_E4M3 = CastSpec("e4m3", ScalingRecipe("none"))
_PLAIN_E5M2 = CastSpec("e5m2", ScalingRecipe("none"))

BF16 = register_policy(
    PrecisionPolicy(
        name="bf16",
        description="BF16 everywhere; LoRA FP32 master weights with BF16 compute.",
    )
)

_EXACT = {"power_2_scale": False}  # fmax / amax, not rounded to a power of two (TE/torchao default)

FP8_NAIVE = register_policy(
    PrecisionPolicy(
        name="fp8_naive",
        version=3,
        description=(
            "A stock FP8 conversion of every linear (LoRA adapters and lm_head included): "
            "per-tensor current scaling with exact scales, E4M3 weights/activations, E5M2 "
            "gradients, FP32 master weights; no LoRA grad scaler, no calibration."
        ),
        base_weight=CastSpec("e4m3", ScalingRecipe("current", **_EXACT)),
        base_activation=CastSpec("e4m3", ScalingRecipe("current", **_EXACT)),
        base_dgrad=CastSpec("e5m2", ScalingRecipe("current", **_EXACT)),
        base_weight_storage="compute",
        lora_storage="fp32_master",
        lora_gemm="fp8",
        lora_gemm_scaling="current",
        lora_gemm_power_2_scale=False,
        lora_grad="fp32",
        lora_grad_scaler=False,
        lm_head_fp8=True,
    )
)

FP8_PROTECTED = register_policy(
    PrecisionPolicy(
        name="fp8_protected",
        version=2,
        description=(
            "Base weights E4M3 128x128 block scales, activations E4M3 delayed scaling after "
            "calibration, dgrad E5M2 current scaling (per-tensor scales exact), LoRA FP32 "
            "master + BF16 GEMMs, selective LoRA grad scaler, lm_head BF16."
        ),
        base_weight=CastSpec("e4m3", ScalingRecipe("block", block_size=128)),
        base_activation=CastSpec("e4m3", ScalingRecipe("delayed", amax_history_len=16, **_EXACT)),
        base_dgrad=CastSpec("e5m2", ScalingRecipe("current", **_EXACT)),
        lora_storage="fp32_master",
        lora_gemm="bf16",
        lora_grad="fp32",
        lora_grad_scaler=True,
        lm_head_fp8=False,
        calibration_steps=8,
    )
)

FP8_UNSCALED_FP8_ADAPTERS = register_policy(
    PrecisionPolicy(
        name="fp8_unscaled_fp8_adapters",
        description=(
            "fp8_naive version 1: plain FP8 casts (scale 1) everywhere, trainable LoRA weights "
            "stored in E4M3 with no master copy, LoRA GEMMs in FP8, LoRA weight grads cast to "
            "E5M2, lm_head in FP8."
        ),
        base_weight=_PLAIN_E4M3,
        base_activation=_PLAIN_E4M3,
        base_dgrad=_PLAIN_E5M2,
        lora_storage="fp8_e4m3",
        lora_gemm="fp8",
        lora_gemm_scaling="none",
        lora_grad="fp8_e5m2",
        lora_grad_scaler=False,
        lm_head_fp8=True,
    )
)


_BLACKWELL_ADAPTERS = dict(  # fp8_protected's adapters and protections, no calibration
    lora_storage="fp32_master",
    lora_gemm="bf16",
    lora_grad="fp32",
    lora_grad_scaler=True,
    lm_head_fp8=False,
    calibration_steps=0,
)

MXFP8 = register_policy(
    PrecisionPolicy(
        name="mxfp8",
        description=(
            "MXFP8 base GEMMs (TE MXFP8BlockScaling): weights, activations and dgrad E4M3 with "
            "one E8M0 scale per 1x32 block, base weights stored MXFP8; LoRA FP32 master + BF16 "
            "GEMMs, selective LoRA grad scaler, lm_head BF16."
        ),
        base_weight=CastSpec.parse(MECHANISM_CASTS["mxfp8"]),
        base_activation=CastSpec.parse(MECHANISM_CASTS["mxfp8"]),
        base_dgrad=CastSpec.parse(MECHANISM_CASTS["mxfp8"]),
        **_BLACKWELL_ADAPTERS,
    )
)

NVFP4 = register_policy(
    PrecisionPolicy(
        name="nvfp4",
        description=(
            "NVFP4 base GEMMs (TE NVFP4BlockScaling): E2M1 values, E4M3 scales per 1x16 block "
            "(16x16 for weights) and an FP32 per-tensor scale, dgrad rounded stochastically, no "
            "Hadamard transform (TE's is for wgrad only); LoRA FP32 master + BF16 GEMMs, "
            "selective LoRA grad scaler, lm_head BF16."
        ),
        base_weight=CastSpec.parse(MECHANISM_CASTS["nvfp4"]),
        base_activation=CastSpec.parse(MECHANISM_CASTS["nvfp4"]),
        base_dgrad=CastSpec.parse(MECHANISM_CASTS["nvfp4_sr"]),
        **_BLACKWELL_ADAPTERS,
    )
)


def _register_rungs() -> None:
    """One policy per rung of ``ladder.RUNGS``: its base with one mechanism moved."""
    for rung in RUNGS:
        mechanism = MECHANISMS[rung.mechanism]
        verb = "plus" if rung.direction == "up" else "without"
        register_policy(
            dataclasses.replace(
                get_policy(rung.base).with_switches(**rung.switches),
                name=rung.name,
                ladder=rung.direction,
                ladder_base=rung.base,
                mechanism=rung.mechanism,
                description=f"{rung.base} {verb} {rung.mechanism}: {mechanism.description}",
            )
        )


_register_rungs()
