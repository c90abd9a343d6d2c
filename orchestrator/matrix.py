"""Sweep matrix: the product of `sweep.axes` expanded into validated, identified trials.

An axis key is either a config group (`precision`: values are option names such as fp8_naive)
or a config key (`seed`, `lora.r`, `train.lr`). Each cell becomes Hydra overrides appended to
the user's own, so every trial's config is composed exactly as `fp8lab trial` would compose it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from orchestrator.axes import flatten_axes
from orchestrator.config_loader import compose_many, shipped_config_dir, to_container
from orchestrator.errors import UserInputError
from orchestrator.schema import validate_config
from orchestrator.trial_id import compute_trial_id

# Axes that name the trial already (run name `<policy>-s<seed>`); others are appended.
NAMING_AXES = ("precision", "seed")
# The policy every other one is compared with: `precision.switches` never apply to it in a sweep.
BASELINE_POLICY = "bf16"
# Hydra overrides that give the baseline cell an empty switch mapping again.
_BASELINE_OVERRIDES = ("~precision.switches", "++precision.switches={}")


@dataclass(frozen=True)
class TrialSpec:
    """One cell of the sweep: how to compose it, its resolved config and its identity."""

    overrides: tuple[str, ...]
    axis_values: dict[str, Any]
    config: dict = field(repr=False)
    trial_id: str

    @property
    def policy(self) -> str:
        return policy_label(self.config)

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    @property
    def run_name(self) -> str:
        name = self.config.get("trial", {}).get("name")
        return name or trial_run_name(self.config, self.axis_values)

    @property
    def extra_axes(self) -> dict[str, Any]:
        """Axis values other than policy and seed (tagged as fp8lab.axis.<key>)."""
        return {k: v for k, v in self.axis_values.items() if k not in NAMING_AXES}


def policy_label(config: dict) -> str:
    """The policy name as shown to users; switch overrides make it a distinct label."""
    precision = config["precision"]
    switches = precision.get("switches") or {}
    suffix = "".join(f"+{k}={_short(v)}" for k, v in sorted(switches.items()))
    return f"{precision['policy']}{suffix}"


def trial_run_name(config: dict, axis_values: dict[str, Any]) -> str:
    """Readable MLflow run name: `fp8_protected-s1`, plus `-lora.r=16` for extra axes."""
    extras = "".join(f"-{k}={_short(v)}" for k, v in axis_values.items() if k not in NAMING_AXES)
    return f"{policy_label(config)}-s{config['seed']}{extras}"


def _short(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def group_names() -> set[str]:
    """Config groups (folders of conf/): their axis values are option names, not values."""
    return {p.name for p in shipped_config_dir().iterdir() if p.is_dir() and not p.name.startswith("_")}


def format_override(key: str, value: Any, groups: set[str]) -> str:
    """One Hydra override for a cell value (group options bare, values in Hydra syntax)."""
    if key in groups:
        return f"{key}={value}"
    return f"{key}={_hydra_literal(value)}"


def _hydra_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_literal(v) for v in value) + "]"
    escaped = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def expand_sweep(base_overrides: list[str], base_config: dict, config_dir: str | None = None) -> list[TrialSpec]:
    """Compose and validate every cell; raise one UserInputError listing all problems."""
    axes = flatten_axes(base_config["sweep"]["axes"])
    groups = group_names()
    cells = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    cell_overrides = [[format_override(k, v, groups) for k, v in cell.items()] for cell in cells]
    fixes = [_baseline_fix(base_config, axes, cell) for cell in cells]
    composed = compose_many([list(base_overrides) + f + o for f, o in zip(fixes, cell_overrides)], config_dir)
    specs, problems = [], []
    for cell, fix, overrides, cfg in zip(cells, fixes, cell_overrides, composed):
        config = to_container(cfg)
        for problem in validate_config(config):
            problems.append(f"[{', '.join(overrides)}] {problem}")
        specs.append(TrialSpec(tuple(base_overrides) + tuple(fix) + tuple(overrides), cell, config,
                               compute_trial_id(config)))
    problems += _duplicate_ids(specs)
    if problems:
        raise UserInputError(sorted(set(problems), key=problems.index))
    return specs


def _baseline_fix(base_config: dict, axes: dict[str, Any], cell: dict[str, Any]) -> list[str]:
    """`precision.switches` in a sweep change the FP8 policies it compares, never the baseline
    they are compared with: the bf16 cell of a precision axis stays plain bf16 (its run name,
    tag and trial id are those of every other bf16 trial), while switched policies get their
    own label (`fp8_protected+lm_head_fp8=True`). A sweep of bf16 alone keeps the switches."""
    switches = base_config.get("precision", {}).get("switches") or {}
    values = axes.get("precision") or []
    if switches and cell.get("precision") == BASELINE_POLICY and len(set(map(str, values))) > 1:
        return list(_BASELINE_OVERRIDES)
    return []


def _duplicate_ids(specs: list[TrialSpec]) -> list[str]:
    """Two cells with one trial id would be the same experiment twice (e.g. an axis that
    only changes a non-semantic key)."""
    seen: dict[str, TrialSpec] = {}
    problems = []
    for spec in specs:
        if spec.trial_id in seen:
            problems.append(f"sweep.axes: cells {seen[spec.trial_id].axis_values} and {spec.axis_values} "
                            "are the same trial (fix: sweep only keys that change what a trial computes)")
        seen.setdefault(spec.trial_id, spec)
    return problems


def describe(spec: TrialSpec) -> dict[str, Any]:
    """A row for --dry-run and progress tables."""
    return {"trial_id": spec.trial_id, "run_name": spec.run_name, "policy": spec.policy,
            "seed": spec.seed, **{f"axis:{k}": v for k, v in spec.extra_axes.items()}}


def resolved_yaml(config: dict) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(config))
