"""Find every frozen linear of a (PEFT-wrapped) causal LM: the one module walker.

The emulated policy application and the torchao / Transformer Engine backends all decide
"which GEMMs does the policy cast" from this list, so they agree on what a base linear is:

- the ``base_layer`` of every PEFT ``LoraLayer`` (a LoRA-targeted linear);
- every other ``nn.Linear`` or transformers ``Conv1D`` (GPT-2's transposed linear) that is not
  a LoRA adapter and has no trainable weight -- the linears ``lora.target_modules`` left
  untargeted follow the policy's base rule too, so a narrow target list cannot flatter FP8;
- the output embedding (``get_output_embeddings()``), with ``role='lm_head'`` and ``tied=True``
  when its weight *is* the input embedding's (GPT-2, Gemma, Llama-3.2-1B, Qwen2.5-0.5B ...).

Adapters (``lora_A``/``lora_B``) are recognised by identity, never by name. ``module_filter``
(``(site) -> bool``) narrows the list, like torchao's ``module_filter_fn``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peft.tuners.lora import LoraLayer
from torch import nn
from transformers.pytorch_utils import Conv1D

__all__ = [
    "FrozenLinear",
    "backend_sites",
    "frozen_linears",
    "set_module",
    "unsupported_weights",
]

LINEAR_TYPES = (nn.Linear, Conv1D)


@dataclass(frozen=True, eq=False)
class FrozenLinear:
    """One frozen GEMM weight: where it sits and what it is."""

    name: str  # qualified name in the model, e.g. "...layers.0.self_attn.q_proj.base_layer"
    module: nn.Module  # nn.Linear or Conv1D
    role: str  # "base" | "lm_head"
    lora_layer: LoraLayer | None  # the PEFT layer around it; None for an untargeted linear
    tied: bool = False  # its weight is also the input embedding

    @property
    def transposed(self) -> bool:
        """Conv1D stores its weight as [in, out] (y = x @ W + b)."""
        return isinstance(self.module, Conv1D)

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features), whatever the storage layout."""
        out_in = tuple(self.module.weight.shape)
        return (out_in[1], out_in[0]) if self.transposed else (out_in[0], out_in[1])

    @property
    def targeted(self) -> bool:
        return self.lora_layer is not None

    @property
    def layer_name(self) -> str:
        """The name plans and telemetry use: the PEFT layer's for a targeted linear."""
        return self.name.removesuffix(".base_layer") if self.targeted else self.name

    def replace(self, model: nn.Module, new: nn.Module) -> None:
        """Put ``new`` where this linear sits (PEFT keeps calling ``self.base_layer(x)``)."""
        if self.lora_layer is not None:
            self.lora_layer.base_layer = new
        else:
            set_module(model, self.name, new)


def frozen_linears(
    model: nn.Module, module_filter: Callable[[FrozenLinear], bool] | None = None
) -> list[FrozenLinear]:
    """Every frozen linear of ``model`` in module order (see the module docstring)."""
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    adapters, bases = _lora_parts(model)
    sites = []
    for name, module in model.named_modules():
        if not isinstance(module, LINEAR_TYPES) or id(module) in adapters:
            continue
        if getattr(module, "weight", None) is None or module.weight.requires_grad:
            continue  # trainable (e.g. modules_to_save): not a frozen GEMM
        layer = bases.get(id(module))
        is_head = module is lm_head or (layer is not None and layer is lm_head)
        tied = is_head and embed is not None and module.weight is getattr(embed, "weight", None)
        site = FrozenLinear(name, module, "lm_head" if is_head else "base", layer, tied)
        if module_filter is None or module_filter(site):
            sites.append(site)
    return sites


def backend_sites(
    model: nn.Module, lm_head_fp8: bool, backend: str
) -> tuple[list[FrozenLinear], list[str]]:
    """The linears a real-FP8 backend (torchao, Transformer Engine) converts under a policy --
    plain ``nn.Linear`` base linears, and the lm_head when ``lm_head_fp8`` -- and one deviation
    line per kind of linear the policy puts in FP8 that the backend must leave in BF16."""
    kept: dict[str, list[str]] = {}
    sites = []
    for site in frozen_linears(model, lambda s: s.role == "base" or lm_head_fp8):
        if site.tied:
            kept.setdefault("lm_head tied to the input embeddings", []).append(site.layer_name)
        elif type(site.module) is not nn.Linear:
            kind = f"{type(site.module).__name__} linears ({backend} converts nn.Linear only)"
            kept.setdefault(kind, []).append(site.layer_name)
        else:
            sites.append(site)
    deviations = [f"{len(names)} {kind} kept BF16: {', '.join(names[:3])}"
                  + (" ..." if len(names) > 3 else "") for kind, names in kept.items()]  # fmt: skip
    return sites, deviations


def unsupported_weights(model: nn.Module) -> list[str]:
    """Frozen GEMM weights that are not linears (e.g. fused MoE expert tensors, 3-D), which no
    policy can cast: names for a preflight refusal. Embeddings and norms are not GEMMs."""
    linear_ids = {id(s.module.weight) for s in frozen_linears(model)}
    out = []
    for name, p in model.named_parameters():
        if p.requires_grad or id(p) in linear_ids or p.dim() < 3:
            continue
        out.append(name)
    return out


def set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule at ``name`` (PEFT's ``base_layer`` included)."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _lora_parts(model: nn.Module) -> tuple[set[int], dict[int, LoraLayer]]:
    """(ids of every LoRA adapter module, {id(base_layer): its LoraLayer})."""
    adapters: set[int] = set()
    bases: dict[int, LoraLayer] = {}
    for module in model.modules():
        if isinstance(module, LoraLayer):
            for part in (module.lora_A, module.lora_B):
                adapters.update(id(m) for m in part.values())
            bases[id(module.base_layer)] = module
    return adapters, bases
