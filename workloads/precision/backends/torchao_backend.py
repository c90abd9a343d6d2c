"""torchao backend: the frozen base linears run torchao float8 training GEMMs.

``apply_torchao(model, policy, telemetry, emulate)`` does, in order:

1. the emulated backend's ``apply_policy`` with the policy's *base* casts switched off: it sets
   the dtypes, wraps the LoRA adapters (``LoraComputeLinear``, or ``Fp8LoraLinear`` for
   ``lora_gemm='fp8'``), rounds FP8 LoRA storage, builds the LoRA grad scaler and the plan. The
   LoRA-side switches therefore behave exactly as on the emulated backend (their FP8 casts stay
   emulated: rank-r adapter GEMMs gain nothing from FP8 tensor cores);
2. ``torchao.float8.convert_to_float8_training`` with a ``module_filter_fn`` that admits only the
   frozen linears ``walker.backend_sites`` lists (every ``nn.Linear`` base linear, LoRA-targeted or
   not, plus the output embedding when
   ``lm_head_fp8``) whose dims are multiples of 16 (``torch._scaled_mm``'s requirement). PEFT's
   ``lora_A``/``lora_B`` are ``nn.Linear`` too and are rejected by identity, not by name;
3. each converted ``Float8Linear`` becomes a ``FrozenBaseFloat8Linear`` (``torchao_frozen.py``,
   imported only here, when a model is converted): the same casts
   (torchao's own ``hp_tensor_to_float8_dynamic``) and the same FP8 ``mm`` (``_scaled_mm``, or
   FP32 with ``emulate=True``), but the frozen weight gets no weight-gradient GEMM and the input
   is not saved for backward. torchao's ``Float8Linear`` always computes ``grad_weight`` (and
   keeps the input alive for it), even for a weight with ``requires_grad=False``; for LoRA that
   is a third of the base GEMMs and an activation per linear thrown away. It also adds the one
   thing torchao cannot express: a *plain* cast (unit scale) for unscaled (``fp8_naive-scaling``-style) operands.

Policy -> torchao (``map_policy``; policy switch names on the left, docs/mechanisms.md):

======================================  =====================================================
base casts (weight, activation, dgrad)  torchao
======================================  =====================================================
all off (``bf16``)                      nothing converted; identical to the emulated backend
dgrad a plain E5M2 cast (unscaled)    ``tensorwise`` (the rowwise recipes cast grads to E4M3)
else any ``block`` operand              ``rowwise`` (finest torchao granularity: per-row
                                        scales for activations/grads, per output channel (fwd)
                                        / input channel (dgrad) for weights); grads in E4M3
otherwise (current / delayed)           ``tensorwise`` (dynamic per-tensor); delayed -> current
======================================  =====================================================

Under any recipe a ``none`` (plain) operand is cast with a unit scale, i.e. exactly the policy's
plain cast, as a real FP8 GEMM operand. torchao saturates finite values like
``formats.saturating_cast`` but clamps Inf to the format's max (ours turns Inf into NaN).

Every difference from the policy's numerics is a sentence in ``handle.deviations`` and in the
plan; the ones that matter: torchao has no delayed scaling (so calibration is skipped and
``fp8_protected`` runs with current-scaled activations here, like ``fp8_protected-calibration``), no 128x128 / 1x128 block scales, and
base weights stay BF16 in memory (cast per GEMM), so ``memory/base_weight_bytes`` is the BF16
figure. ``rowwise_with_gw_hp`` is selectable with ``recipe=`` but never derived: its one feature,
a high-precision weight gradient, does not exist for a frozen base. Policies torchao cannot run
raise ``TorchaoPolicyError``: some base casts on and others off (torchao casts both operands of a
GEMM or neither), or a base weight/activation format other than E4M3.

Telemetry (same definitions as ``telemetry.py``): on recorded steps the converted modules record
``activation`` (forward input) and ``dgrad`` (incoming gradient) from the very casts the GEMMs
use; ``weight`` (forward-GEMM weight cast) is computed once at conversion (``register_static``).
Not recorded: the second weight cast used by dgrad (a different axis under ``rowwise``; the same
tensor under ``tensorwise``), and anything on linears torchao did not convert (kept BF16).
LoRA-side rows (FP8 LoRA casts, ``lora_weight``, ``wgrad``, grad norms) come from the emulated
code as before.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workloads.precision.apply import PrecisionHandle, apply_policy
from workloads.precision.backends import select as probes
from workloads.precision.backends.base import Availability, Backend, BackendChoice
from workloads.precision.formats import E4M3, E5M2
from workloads.precision.policy import PrecisionPolicy, get_policy
from workloads.precision.scaling import CastSpec
from workloads.precision.telemetry import Fp8Telemetry
from workloads.precision.walker import backend_sites

__all__ = [
    "BACKEND",
    "RECIPES",
    "TorchaoHandle",
    "TorchaoMapping",
    "TorchaoPolicyError",
    "apply_torchao",
    "frozen_base_float8_linear_cls",
    "make_module_filter",
    "map_policy",
]

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
# policy field -> torchao operand name
_OPERANDS = {"base_activation": "input", "base_weight": "weight", "base_dgrad": "grad_output"}


class TorchaoPolicyError(ValueError):
    """The policy asks for something torchao float8 training cannot run."""


@dataclass(frozen=True)
class TorchaoMapping:
    """How one policy runs on torchao (pure data; building it does not import torchao)."""

    recipe: str | None  # None: no base GEMM in FP8
    plain: frozenset[str] = frozenset()  # operands cast with a unit scale (plain cast)
    grad_fmt: str = "e5m2"  # target format of grad_output
    round_scales_to_power_of_2: bool = True
    deviations: tuple[str, ...] = ()
    formats: dict[str, str] = field(default_factory=dict)  # operand -> plan format string

    def float8_config(self, emulate: bool) -> Any:
        """The ``torchao.float8.Float8LinearConfig`` for this mapping."""
        from torchao.float8 import CastConfig, Float8LinearConfig

        if self.recipe is None:
            raise TorchaoPolicyError("this policy has no FP8 base GEMM to configure")
        if self.recipe == "tensorwise":
            grad_dtype = E5M2.dtype if self.grad_fmt == "e5m2" else E4M3.dtype
            return Float8LinearConfig(
                cast_config_grad_output=CastConfig(target_dtype=grad_dtype),
                emulate=emulate,
                round_scales_to_power_of_2=self.round_scales_to_power_of_2,
            )
        config = Float8LinearConfig.from_recipe_name(self.recipe)
        return dataclasses.replace(
            config, emulate=emulate, round_scales_to_power_of_2=self.round_scales_to_power_of_2
        )


def map_policy(policy: PrecisionPolicy | str, recipe: str | None = None) -> TorchaoMapping:
    """Map ``policy``'s base casts to a torchao recipe (module docstring); ``recipe`` forces one.

    Raises TorchaoPolicyError (a ValueError naming the switch and the fix) when torchao cannot
    run the policy at all.
    """
    policy = get_policy(policy) if isinstance(policy, str) else policy
    if recipe is not None and recipe not in RECIPES:
        raise TorchaoPolicyError(f"torchao recipe {recipe!r} not in {RECIPES}")
    specs: dict[str, CastSpec] = {op: getattr(policy, f) for f, op in _OPERANDS.items()}
    on = {op for op, s in specs.items() if s.enabled}
    if not on:
        return TorchaoMapping(recipe=None)
    fix = "; fix: precision.backend=emulated (or change the switch)"
    if on != set(specs):
        off = [f for f, op in _OPERANDS.items() if op not in on]
        raise TorchaoPolicyError(
            f"policy {policy.name!r} casts only some base GEMM operands to FP8 ({', '.join(off)}"
            f" stay BF16); torchao casts both operands of a GEMM or neither{fix}"
        )
    _refuse_block_formats(policy, specs)
    for f in ("base_weight", "base_activation"):
        if getattr(policy, f).fmt != "e4m3":
            raise TorchaoPolicyError(
                f"policy {policy.name!r}: {f}={getattr(policy, f).tag}, but torchao casts GEMM"
                f" weights and inputs to E4M3{fix}"
            )
    kinds = {op: s.recipe.scaling for op, s in specs.items()}
    plain = frozenset(op for op, k in kinds.items() if k.plain)
    dgrad = specs["grad_output"]
    if recipe is None:
        if "grad_output" in plain and dgrad.fmt == "e5m2":
            recipe = "tensorwise"  # rowwise recipes cast grads to E4M3: a plain E4M3 grad differs
        elif any(k.tiled for k in kinds.values()):
            recipe = "rowwise"
        else:
            recipe = "tensorwise"
    grad_fmt = dgrad.fmt if recipe == "tensorwise" else "e4m3"
    scaled = [s for op, s in specs.items() if op not in plain]
    if recipe == "tensorwise":
        power_2 = all(s.recipe.power_2_scale for s in scaled) if scaled else False
    else:
        power_2 = True  # torchao's rowwise recipes round scales to powers of two

    grain = "tensorwise" if recipe == "tensorwise" else "rowwise"
    deviations: list[str] = []
    formats: dict[str, str] = {}
    for field_name, op in _OPERANDS.items():
        spec = specs[op]
        fmt = grad_fmt if op == "grad_output" else "e4m3"
        formats[op] = f"{fmt}/{'none' if op in plain else grain}"
        if fmt != spec.fmt:
            deviations.append(
                f"{field_name}: {spec.fmt} -> {fmt} (torchao's {recipe} recipe casts gradients"
                " to E4M3)"
            )
        if op not in plain:
            text = _scaling_deviation(op, spec, recipe)
            if text:
                deviations.append(f"{field_name}: {text}")
    if policy.uses_delayed_scaling and policy.calibration_steps:
        deviations.append(
            f"calibration: {policy.calibration_steps} steps skipped (no amax history to fill)"
        )
    if any(s.recipe.power_2_scale != power_2 for s in scaled):
        deviations.append(
            f"scales: power-of-two rounding is one torchao switch, here {power_2} for all operands"
        )
    if policy.base_weight_storage == "fp8":
        deviations.append(
            "base weights stay BF16 in memory and are cast to FP8 per GEMM (the policy stores FP8)"
        )
    return TorchaoMapping(
        recipe=recipe,
        plain=plain,
        grad_fmt=grad_fmt,
        round_scales_to_power_of_2=power_2,
        deviations=deviations,
        formats=formats,
    )


def _refuse_block_formats(policy: PrecisionPolicy, specs: dict[str, CastSpec]) -> None:
    """torchao's float8 training has no MX or NVFP4 blocks, and mapping them onto per-row FP8
    would run a different format under the policy's name. torchao's MX training
    (``torchao.prototype.mx_formats.MXLinearConfig``, a prototype) needs SM100 for real MX GEMMs
    and computes a weight gradient for every linear; fp8lab's frozen-base conversion does not
    wrap it yet, so these policies are refused with the backends that do run them."""
    tags = [f"{op}={s.tag}" for op, s in specs.items() if s.recipe.scaling.native_scale_fmt != "fp32"]
    if tags:
        raise TorchaoPolicyError(
            f"policy {policy.name!r}: {', '.join(tags)} is a Blackwell block format that torchao's"
            " float8 training has no recipe for (its MX training is not wired into fp8lab);"
            " fix: precision.backend=emulated or transformer_engine"
        )


def _scaling_deviation(op: str, spec: CastSpec, recipe: str) -> str:
    """How torchao's scaling of operand ``op`` differs from the policy's ('' when it doesn't);
    TorchaoPolicyError for a scaling kind torchao has no mapping for."""
    want, kind = spec.recipe.tag, spec.recipe.scaling
    if recipe == "tensorwise":
        got = "one per-tensor scale"
    elif op == "weight":
        dgrad = "per-tensor" if recipe == "rowwise_with_gw_hp" else "per-input-channel"
        got = f"per-output-channel (fwd) / {dgrad} (dgrad) scales"
    else:
        got = "one scale per row (1 x K)"
    if kind.own_amax:  # current
        return "" if recipe == "tensorwise" else f"per-tensor {want} -> {got}"
    if kind.from_history:  # delayed
        return f"{want} -> dynamic {got} (torchao has no delayed scaling)"
    if kind.tiled:  # block
        tiles = "128x128 blocks" if op == "weight" else f"1x{spec.recipe.block_size} tiles"
        return f"{want} ({tiles}) -> {got}"
    raise TorchaoPolicyError(f"{want} scaling has no torchao mapping; fix: precision.backend=emulated")


# -- the frozen-base module --------------------------------------------------------------------
def frozen_base_float8_linear_cls() -> type:
    """``FrozenBaseFloat8Linear`` from ``torchao_frozen`` (imported here, on first use, so this
    module imports without torchao)."""
    from workloads.precision.backends.torchao_frozen import FrozenBaseFloat8Linear

    return FrozenBaseFloat8Linear


# -- apply ---------------------------------------------------------------------------------------
@dataclass
class TorchaoHandle(PrecisionHandle):
    """A PrecisionHandle plus what the torchao backend decided."""

    recipe: str | None = None
    converted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def make_module_filter(
    targets: dict[int, str], skipped: list[str] | None = None
) -> Callable[[nn.Module, str], bool]:
    """torchao ``module_filter_fn``: convert exactly the modules in ``targets`` (id -> name)
    whose dims are multiples of 16; rejected targets are appended to ``skipped``."""

    def module_filter_fn(mod: nn.Module, fqn: str) -> bool:
        name = targets.get(id(mod))
        if name is None or ".lora_" in f".{fqn}":  # LoRA adapters, lm_head, anything else
            return False
        if not isinstance(mod, nn.Linear):
            return False
        out_f, in_f = mod.weight.shape
        if out_f % 16 or in_f % 16:
            if skipped is not None:
                skipped.append(name)
            return False
        return True

    return module_filter_fn


def apply_torchao(
    model: nn.Module,
    policy: PrecisionPolicy | str,
    telemetry: Fp8Telemetry | None = None,
    emulate: bool = False,
    *,
    recipe: str | None = None,
    skip_frozen_wgrad: bool = True,
) -> TorchaoHandle:
    """Convert ``model`` (a PEFT LoRA model) in place; see the module docstring.

    ``recipe`` forces a torchao recipe instead of deriving it from the policy.
    ``skip_frozen_wgrad=False`` keeps torchao's stock ``Float8Linear`` (computes and discards
    the frozen weight's gradient; no plain casts, no FP8 telemetry) -- for benchmarks only.
    """
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    policy = get_policy(policy) if isinstance(policy, str) else policy
    mapping = map_policy(policy, recipe)
    if mapping.plain and not skip_frozen_wgrad:
        raise TorchaoPolicyError(
            f"policy {policy.name!r} needs plain (unit-scale) casts for {sorted(mapping.plain)},"
            " which only the frozen-base module provides (skip_frozen_wgrad=True)"
        )
    hp_policy = policy.with_switches(
        base_weight=None, base_activation=None, base_dgrad=None, lm_head_fp8=False
    )
    base = apply_policy(model, hp_policy, telemetry)
    sites, kept = backend_sites(model, policy.lm_head_fp8, "torchao") if mapping.recipe else ([], [])
    targets = {id(site.module): site.layer_name for site in sites}
    skipped: list[str] = []
    converted: dict[str, nn.Module] = {}
    if targets:
        # Float8Linear.from_float shares the Parameter, so the weight identifies the new module.
        weight_names = {id(m.weight): targets[id(m)] for m in model.modules() if id(m) in targets}
        convert_to_float8_training(
            model,
            module_filter_fn=make_module_filter(targets, skipped),
            config=mapping.float8_config(emulate),
        )
        frozen_cls = frozen_base_float8_linear_cls()
        for module in model.modules():
            name = weight_names.get(id(getattr(module, "weight", None)))
            if isinstance(module, Float8Linear) and name is not None:
                if skip_frozen_wgrad:
                    frozen_cls.from_float8_linear(
                        module, name=name, plain=mapping.plain, telemetry=telemetry
                    )
                converted[name] = module
    plan = _torchao_plan(
        base.plan, policy, mapping, converted, skipped, emulate, skip_frozen_wgrad, model
    )
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(PrecisionHandle)}
    kept += [f"{len(set(skipped))} linears kept BF16 (dims not multiples of 16)"] if skipped else []
    plan.extend(_row("*", "backend", "deviation", "", d) for d in kept)  # recipe ones: in plan
    deviations = (*(mapping.deviations if converted else ()), *kept)
    fields.update(policy=policy, plan=plan, backend="torchao", emulated=bool(emulate),
                  deviations=deviations)  # fmt: skip
    return TorchaoHandle(
        **fields,
        recipe=mapping.recipe,
        converted=sorted(converted),
        skipped=sorted(set(skipped)),
    )


def _torchao_plan(
    plan: list[dict[str, Any]],
    policy: PrecisionPolicy,
    mapping: TorchaoMapping,
    converted: dict[str, nn.Module],
    skipped: list[str],
    emulate: bool,
    frozen: bool,
    model: nn.Module,
) -> list[dict[str, Any]]:
    """The emulated plan with the converted modules' base rows replaced by torchao's."""
    gemm = "torchao emulate=True (FP32 GEMM)" if emulate else "torchao real FP8 GEMM"
    out = [r for r in plan if not (r["module"] in converted and r["role"] in ("base", "lm_head"))]
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    f = mapping.formats
    wgrad = (
        "frozen: no weight-gradient GEMM (torchao's is skipped)"
        if frozen
        else "frozen, but torchao's stock Float8Linear computes and discards it"
    )
    for name, module in converted.items():
        role = "lm_head" if module is lm_head or name.endswith("lm_head") else "base"
        rows = [
            ("weight", f["weight"], f"storage bf16; cast per GEMM ({gemm}, {mapping.recipe})"),
            ("activation", f["input"], f"fwd GEMM input ({gemm})"),
            ("dgrad", f["grad_output"], f"grad_output in dgrad GEMM ({gemm})"),
            ("wgrad", "none", wgrad),
        ]  # fmt: skip
        out.extend(_row(name, role, t, fmt, note) for t, fmt, note in rows)
    for name in sorted(set(skipped)):
        out.append(_row(name, "base", "all", "bf16", "torchao: dims not multiples of 16"))
    if policy.lora_gemm == "fp8" or policy.lora_storage == "fp8_e4m3" or policy.lora_grad != "fp32":
        out.append(_row("*", "lora", "fp8_casts", "emulated", "LoRA FP8 casts run on the "
                        "emulated path (torchao converts only frozen base linears)"))  # fmt: skip
    summary = (
        f"recipe {mapping.recipe}, emulate={emulate}" if mapping.recipe else "no FP8 base GEMMs"
    )
    out.append(_row("*", "backend", "torchao", mapping.recipe or "bf16", summary))
    for text in mapping.deviations if converted else ():
        out.append(_row("*", "backend", "deviation", "", text))
    return out


def _row(module: str, role: str, tensor: str, fmt: str, note: str) -> dict[str, Any]:
    return {"module": module, "role": role, "tensor": tensor, "format": fmt, "note": note}


class TorchaoBackend(Backend):
    """torchao float8 training (module docstring); ``emulate=True`` without an FP8 GPU."""

    name = "torchao"

    def availability(self, device: torch.device, *, auto: bool) -> Availability:
        gpu_ok, gpu_why = probes._fp8_gpu(device)
        if auto and not gpu_ok:  # auto never emulates torchao: don't even import it
            return Availability(False, True, gpu_why)
        ao_ok, ao_why = probes._torchao_importable()
        if not ao_ok:
            fix = "pip install 'fp8lab[torchao]', or set precision.backend=emulated."
            return Availability(False, not gpu_ok, ao_why, fix)
        if gpu_ok:
            return Availability(True, False, gpu_why if not auto else f"{gpu_why} and {ao_why}")
        return Availability(True, True, f"{gpu_why}: torchao float8 runs with emulate=True (real"
                            " FP8 casts, GEMMs in FP32)")  # fmt: skip

    def map_policy(self, policy: PrecisionPolicy) -> TorchaoMapping:
        return map_policy(policy)

    def apply(
        self,
        model: nn.Module,
        policy: PrecisionPolicy,
        telemetry: Fp8Telemetry | None,
        choice: BackendChoice,
        **options: Any,
    ) -> TorchaoHandle:
        return apply_torchao(model, policy, telemetry, emulate=choice.emulated, **options)


BACKEND = TorchaoBackend()


def sqnr(ref: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB (torchao's accuracy measure)."""
    ref, test = ref.detach().double(), test.detach().double()
    noise = torch.linalg.vector_norm(ref - test)
    if noise == 0:
        return math.inf
    return float(20 * torch.log10(torch.linalg.vector_norm(ref) / noise))
