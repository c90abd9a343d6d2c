"""Transformer Engine backend (optional extra ``fp8lab[te]``; needs CUDA and an SM 8.9+ GPU).

``apply_te(model, policy, telemetry)``:

1. the emulated backend's ``apply_policy`` with the base casts switched off (dtypes, LoRA
   adapters, LoRA grad scaler, plan) -- LoRA adapters stay PEFT modules with FP32 masters and
   BF16 GEMMs (or the emulated FP8 LoRA GEMM when ``lora_gemm='fp8'``);
2. each frozen ``nn.Linear`` ``walker.backend_sites`` lists (LoRA-targeted or not, and the
   output embedding when ``lm_head_fp8`` unless it is tied) with dims that are multiples of 16
   becomes a ``te.Linear`` holding the same BF16 weight, frozen (TE then runs no wgrad GEMM);
3. the model's ``forward`` is wrapped in ``te.autocast(recipe=...)`` (``te.fp8_autocast`` on TE
   releases before ``autocast`` existed), so the trainer and lm-eval need no change.

Policy -> TE recipe (``map_policy_te``): any ``block`` cast -> ``Float8BlockScaling`` (E4M3,
1x128 activation/grad tiles, 128x128 weight blocks: fp8lab's ``block`` recipe); else any
``delayed`` cast -> ``DelayedScaling`` (HYBRID when dgrad is E5M2, the policy's amax history
length / algo / margin; calibration forwards run under ``autocast(calibrating=True)``); else
``Float8CurrentScaling``. Blackwell's block formats map onto their own recipes
(``_map_block_formats``): ``mx`` casts -> ``MXFP8BlockScaling`` (E4M3, or HYBRID with an E5M2
dgrad), ``nvfp4`` casts -> ``NVFP4BlockScaling`` with ``disable_stochastic_rounding`` /
``disable_rht`` from the dgrad cast's switches and TE's 2-D weight quantization. Differences (a TE recipe applies one scaling kind to every tensor) are
listed in ``handle.deviations`` and the plan. Plain (unscaled) casts (``fp8_naive-scaling``) have no
TE recipe and raise; so do partial base FP8 and non-E4M3 weights/activations.

Telemetry: TE does its casts in fused kernels, so only the LoRA-side rows (LoRA grad norms,
weight std, emulated LoRA FP8 casts) are recorded; activation/weight/dgrad underflow needs TE's
own debug API (``nvdlfw_inspect`` LogFp8TensorStats, whose definitions ours follow) -- not wired.

Nothing here is importable-tested on CPU: TE cannot be imported without CUDA libraries. The GPU
test is ``tests/gpu/test_te_backend.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workloads.precision.apply import PrecisionHandle, apply_policy
from workloads.precision.backends import select as probes
from workloads.precision.backends.base import Availability, Backend, BackendChoice
from workloads.precision.policy import PrecisionPolicy, get_policy
from workloads.precision.telemetry import Fp8Telemetry
from workloads.precision.walker import backend_sites

__all__ = ["BACKEND", "TeHandle", "TeMapping", "TePolicyError", "apply_te", "import_te", "map_policy_te"]

_FIELDS = ("base_weight", "base_activation", "base_dgrad")


class TePolicyError(ValueError):
    """The policy asks for something Transformer Engine cannot run."""


def import_te() -> Any:
    """``transformer_engine.pytorch``, or an ImportError that says what to do."""
    try:
        import transformer_engine.pytorch as te
    except Exception as exc:  # noqa: BLE001 - OSError/RuntimeError without CUDA libraries
        raise ImportError(
            "precision.backend=transformer_engine needs Transformer Engine with CUDA: pip install"
            f" 'fp8lab[te]' on a CUDA machine ({type(exc).__name__}: {exc})"
        ) from exc
    return te


@dataclass(frozen=True)
class TeMapping:
    """Which TE recipe runs a policy (pure data, no TE import)."""

    recipe: str | None  # DelayedScaling | Float8CurrentScaling | Float8BlockScaling | None
    fp8_format: str = "HYBRID"  # HYBRID (E4M3 fwd, E5M2 bwd) | E4M3
    kwargs: dict[str, Any] = field(default_factory=dict)
    deviations: tuple[str, ...] = ()

    def build(self) -> Any:
        """The ``transformer_engine.common.recipe`` object."""
        from transformer_engine.common import recipe as te_recipe

        cls = getattr(te_recipe, self.recipe)
        return cls(fp8_format=getattr(te_recipe.Format, self.fp8_format), **self.kwargs)


def map_policy_te(policy: PrecisionPolicy | str) -> TeMapping:
    """Map the policy's base casts to one TE recipe (module docstring); raises TePolicyError."""
    policy = get_policy(policy) if isinstance(policy, str) else policy
    specs = {f: getattr(policy, f) for f in _FIELDS}
    on = [f for f, s in specs.items() if s.enabled]
    if not on:
        return TeMapping(recipe=None)
    fix = "; fix: precision.backend=torchao or emulated"
    if len(on) != len(specs):
        raise TePolicyError(
            f"policy {policy.name!r} casts only some base GEMM operands to FP8 ({', '.join(on)});"
            f" a TE recipe casts all of them{fix}"
        )
    blackwell = _map_block_formats(policy, specs, fix)
    if blackwell is not None:
        return blackwell
    plain = [f for f, s in specs.items() if s.recipe.scaling.plain]
    if plain:
        raise TePolicyError(
            f"policy {policy.name!r} uses plain (unscaled) FP8 casts ({', '.join(plain)}), which"
            f" no Transformer Engine recipe does{fix}"
        )
    for f in ("base_weight", "base_activation"):
        if specs[f].fmt != "e4m3":
            raise TePolicyError(f"policy {policy.name!r}: {f}={specs[f].tag}; TE needs E4M3{fix}")
    kinds = {f: s.recipe.scaling for f, s in specs.items()}
    unknown = [f"{f}={specs[f].tag}" for f, k in kinds.items()
               if not (k.tiled or k.from_history or k.own_amax)]  # fmt: skip
    if unknown:
        raise TePolicyError(f"policy {policy.name!r}: no TE recipe for {', '.join(unknown)}{fix}")
    dgrad_fmt = specs["base_dgrad"].fmt
    deviations: list[str] = []
    if any(k.tiled for k in kinds.values()):
        recipe, fmt, kwargs = "Float8BlockScaling", "E4M3", {}
        for f, k in kinds.items():
            if not k.tiled:
                deviations.append(f"{f}: {specs[f].recipe.tag} -> block (TE Float8BlockScaling)")
        if dgrad_fmt == "e5m2":
            deviations.append("base_dgrad: e5m2 -> e4m3 (Float8BlockScaling is E4M3 throughout)")
    elif any(k.from_history for k in kinds.values()):
        delayed = [specs[f].recipe for f, k in kinds.items() if k.from_history]
        r = delayed[0]
        recipe = "DelayedScaling"
        fmt = "HYBRID" if dgrad_fmt == "e5m2" else "E4M3"
        kwargs = {
            "amax_history_len": max(d.amax_history_len for d in delayed),
            "amax_compute_algo": r.amax_compute_algo,
            "margin": r.margin,
        }
        for f, k in kinds.items():
            if not k.from_history:
                deviations.append(f"{f}: {specs[f].recipe.tag} -> delayed (TE DelayedScaling)")
    else:
        recipe, kwargs = "Float8CurrentScaling", {}
        fmt = "HYBRID" if dgrad_fmt == "e5m2" else "E4M3"
    if policy.calibration_steps and recipe != "DelayedScaling":
        deviations.append(f"calibration: {policy.calibration_steps} steps skipped (no history)")
    return TeMapping(recipe, fmt, kwargs, tuple(deviations))


def _map_block_formats(policy: PrecisionPolicy, specs: dict[str, Any], fix: str) -> TeMapping | None:
    """``MXFP8BlockScaling`` / ``NVFP4BlockScaling`` for a policy in a Blackwell block format
    (None when no cast uses one); TePolicyError for what those recipes cannot express."""
    kinds = {f: s.recipe.scaling.name for f, s in specs.items() if s.recipe.scaling.native_scale_fmt != "fp32"}
    if not kinds:
        return None
    tags = ", ".join(f"{f}={s.tag}" for f, s in specs.items())
    if len(kinds) != len(specs) or len(set(kinds.values())) != 1:
        raise TePolicyError(f"policy {policy.name!r}: TE's MX/NVFP4 recipes cast every base operand in one block format, not {tags}{fix}")
    recipes = {f: s.recipe for f, s in specs.items()}
    if any(r.block_scale_fmt == "fp32" for r in recipes.values()):
        raise TePolicyError(f"policy {policy.name!r}: FP32 block scales ({tags}) have no TE recipe (E8M0 / E4M3 only){fix}")
    kind = kinds["base_weight"]
    native = 32 if kind == "mx" else 16
    if any(r.block_size != native for r in recipes.values()):
        raise TePolicyError(f"policy {policy.name!r}: TE's {kind} blocks are {native} values, not {tags}{fix}")
    if kind == "mx":
        return _map_mxfp8(policy, specs, fix)
    return _map_nvfp4(specs)


def _map_mxfp8(policy: PrecisionPolicy, specs: dict[str, Any], fix: str) -> TeMapping:
    if specs["base_weight"].fmt != "e4m3" or specs["base_activation"].fmt != "e4m3":
        raise TePolicyError(f"policy {policy.name!r}: MXFP8BlockScaling casts weights and inputs to E4M3{fix}")
    fmt = "HYBRID" if specs["base_dgrad"].fmt == "e5m2" else "E4M3"
    deviations = (
        "every cast: TE rounds amax / fmax *up* to the E8M0 power of two (no saturation), the "
        "policy uses the OCP rule floor(log2 amax) - emax (a block's top values may saturate)",
        "base_weight: dgrad reads TE's column-wise copy (1x32 blocks along the output dim); the "
        "policy reuses the row-wise blocks",
    )
    return TeMapping("MXFP8BlockScaling", fmt, {}, deviations)


def _map_nvfp4(specs: dict[str, Any]) -> TeMapping:
    recipes = {f: s.recipe for f, s in specs.items()}
    dgrad = recipes["base_dgrad"]
    deviations = []
    for f in ("base_weight", "base_activation"):
        if recipes[f].stochastic_rounding:
            deviations.append(f"{f}: stochastic rounding -> nearest (TE rounds only gradients stochastically)")
    if any(r.hadamard for r in recipes.values()):
        deviations.append(
            "hadamard: TE applies its random Hadamard transform to weight-gradient GEMM operands "
            "only; a frozen base runs none, so TE quantizes these casts without it"
        )
    kwargs = {
        "disable_stochastic_rounding": not dgrad.stochastic_rounding,
        "disable_rht": not any(r.hadamard for r in recipes.values()),
        "disable_2d_quantization": False,
    }
    return TeMapping("NVFP4BlockScaling", "E4M3", kwargs, tuple(deviations))


@dataclass
class TeHandle(PrecisionHandle):
    """A PrecisionHandle whose calibration runs under ``te.autocast(calibrating=True)``."""

    recipe: str | None = None
    converted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    te_recipe: Any = None
    calibrating: bool = False

    def autocast(self) -> Any:
        """The context every forward runs in (installed around ``model.forward``)."""
        te = import_te()
        if self.te_recipe is None:
            return _nullcontext()
        enabled = not self.calibrating
        if hasattr(te, "autocast"):
            return te.autocast(enabled=enabled, calibrating=self.calibrating, recipe=self.te_recipe)
        return te.fp8_autocast(
            enabled=enabled, calibrating=self.calibrating, fp8_recipe=self.te_recipe
        )

    def calibrate(self, run_forward: Callable[[Any], Any], batches: Iterable[Any]) -> int:
        """Up to ``calibration_steps`` no-grad forwards in TE's calibrating mode (BF16 numerics,
        amax histories filled). Only for DelayedScaling; returns the number of forwards."""
        steps = self.policy.calibration_steps
        if steps <= 0 or self.recipe != "DelayedScaling" or not self.converted:
            return 0
        done = 0
        recording = self.telemetry.recording if self.telemetry else False
        if self.telemetry:
            self.telemetry.recording = False
        self.calibrating = True
        try:
            with torch.no_grad():
                for batch in batches:
                    if done >= steps:
                        break
                    run_forward(batch)
                    done += 1
        finally:
            self.calibrating = False
            if self.telemetry:
                self.telemetry.recording = recording
        return done


@contextmanager
def _nullcontext() -> Iterator[None]:
    yield


def apply_te(
    model: nn.Module,
    policy: PrecisionPolicy | str,
    telemetry: Fp8Telemetry | None = None,
) -> TeHandle:
    """Convert ``model`` (a PEFT LoRA model on CUDA) in place; see the module docstring."""
    te = import_te()
    policy = get_policy(policy) if isinstance(policy, str) else policy
    mapping = map_policy_te(policy)
    hp_policy = policy.with_switches(
        base_weight=None, base_activation=None, base_dgrad=None, lm_head_fp8=False
    )
    base = apply_policy(model, hp_policy, telemetry)
    converted: list[str] = []
    skipped: list[str] = []
    plan = list(base.plan)
    kept: list[str] = []
    if mapping.recipe is not None:
        sites, kept = backend_sites(model, policy.lm_head_fp8, "transformer_engine")
        for site in sites:
            linear = site.module
            if linear.in_features % 16 or linear.out_features % 16:
                skipped.append(site.layer_name)
                plan.append(_row(site.layer_name, site.role, "all", "bf16", "TE: dims not multiples of 16"))
                continue
            site.replace(model, _to_te_linear(te, linear))
            converted.append(site.layer_name)
        plan = _te_plan(plan, mapping, converted)
    kept += [f"{len(skipped)} linears kept BF16 (dims not multiples of 16)"] if skipped else []
    plan.extend(_row("*", "backend", "deviation", "", d) for d in kept)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(PrecisionHandle)}
    fields.update(policy=policy, plan=plan, backend="transformer_engine", emulated=False,
                  deviations=(*(mapping.deviations if converted else ()), *kept))  # fmt: skip
    handle = TeHandle(
        **fields,
        recipe=mapping.recipe,
        converted=converted,
        skipped=skipped,
        te_recipe=mapping.build() if converted else None,
    )
    if converted:
        _wrap_forward(model, handle)
    return handle


@torch.no_grad()
def _to_te_linear(te: Any, linear: nn.Linear) -> nn.Module:
    w = linear.weight
    new = te.Linear(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        params_dtype=w.dtype,
        device=w.device,
    )
    new.weight.copy_(w)
    new.weight.requires_grad_(False)  # frozen base: TE skips the wgrad GEMM
    if linear.bias is not None:
        new.bias.copy_(linear.bias)
        new.bias.requires_grad_(False)
    return new


def _wrap_forward(model: nn.Module, handle: TeHandle) -> None:
    """Every forward (training, calibration, lm-eval) runs inside the handle's TE autocast."""
    inner = model.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with handle.autocast():
            return inner(*args, **kwargs)

    model.forward = forward


def _te_plan(plan: list[dict[str, Any]], mapping: TeMapping, converted: list[str]) -> list[dict]:
    names = set(converted)
    out = [r for r in plan if not (r["module"] in names and r["role"] in ("base", "lm_head"))]
    fwd = "e4m3"
    bwd = "e5m2" if mapping.fp8_format == "HYBRID" else "e4m3"
    scaling = {"DelayedScaling": "delayed", "Float8CurrentScaling": "current"}.get(
        mapping.recipe, "block128"
    )
    act = "block1x128" if scaling == "block128" else scaling
    for name in converted:
        role = "lm_head" if name.endswith("lm_head") else "base"
        out.append(_row(name, role, "weight", f"{fwd}/{scaling}", f"te.Linear ({mapping.recipe})"))
        out.append(_row(name, role, "activation", f"{fwd}/{act}", "fwd GEMM input"))
        out.append(_row(name, role, "dgrad", f"{bwd}/{act}", "grad_output in dgrad GEMM"))
        out.append(_row(name, role, "wgrad", "none", "frozen: no weight gradient"))
    out.append(_row("*", "backend", "transformer_engine", mapping.recipe or "bf16",
                    f"{mapping.recipe}({mapping.fp8_format}, {mapping.kwargs})"))  # fmt: skip
    out.extend(_row("*", "backend", "deviation", "", d) for d in mapping.deviations)
    return out


def _row(module: str, role: str, tensor: str, fmt: str, note: str) -> dict[str, Any]:
    return {"module": module, "role": role, "tensor": tensor, "format": fmt, "note": note}


class TeBackend(Backend):
    """Transformer Engine (module docstring): needs TE importable and an SM 8.9+ CUDA device."""

    name = "transformer_engine"

    def availability(self, device: torch.device, *, auto: bool) -> Availability:
        gpu_ok, gpu_why = probes._fp8_gpu(device)
        if auto and not gpu_ok:  # no FP8 GPU: don't try to import TE (loads CUDA libraries)
            return Availability(False, False, gpu_why)
        te_ok, te_why = probes._te_importable()
        if te_ok and gpu_ok:
            return Availability(True, False, f"{gpu_why} and {te_why}" if auto else gpu_why)
        problems = [why for ok, why in ((te_ok, te_why), (gpu_ok, gpu_why)) if not ok]
        fix = (
            "install the extra (pip install 'fp8lab[te]') on a machine with CUDA and an SM 8.9+"
            " GPU (Ada/Hopper) and use train.device=cuda, or set precision.backend=auto (falls"
            " back to torchao/emulated) or precision.backend=emulated."
        )
        return Availability(False, False, "; ".join(problems), fix)

    def map_policy(self, policy: PrecisionPolicy) -> TeMapping:
        return map_policy_te(policy)

    def apply(
        self,
        model: nn.Module,
        policy: PrecisionPolicy,
        telemetry: Fp8Telemetry | None,
        choice: BackendChoice,
        **options: Any,
    ) -> TeHandle:
        return apply_te(model, policy, telemetry, **options)


BACKEND = TeBackend()
