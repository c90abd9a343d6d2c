"""Hydra's multirun grammar on the `fp8lab sweep` command line, as a shorthand for `sweep.axes`.

`fp8lab sweep -m precision=bf16,fp8_protected seed=range(0,3) train.lr=1e-4,3e-4` is what a
Hydra user types; here every sweep override (comma list, `choice()`, `range()`, `glob()` on a
config group) becomes the axis `sweep.axes.<key>=[...]`, and a plain override of a key that
is already an axis (`precision=fp8_protected`, `seed=5`) narrows that axis to the one value
given. Without that, the cell overrides appended for each trial would silently win over it.

Parsing is Hydra's own (`hydra.core.override_parser`), so quoting, escaping and the sweep
functions behave exactly as in `python app.py --multirun ...`.
"""
from __future__ import annotations

from dataclasses import dataclass

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException

from orchestrator.errors import UserInputError

AXES_PREFIX = "sweep.axes."
_ENUMERABLE = {ValueType.SIMPLE_CHOICE_SWEEP, ValueType.CHOICE_SWEEP, ValueType.RANGE_SWEEP, ValueType.GLOB_CHOICE_SWEEP}


@dataclass(frozen=True)
class SweepCommandLine:
    """The sweep's overrides rewritten for composition, and what the rewriting did (for --dry-run)."""

    overrides: list[str]
    axes_set: dict[str, str]  # axis key -> the command-line override that set or narrowed it


def rewrite_sweep_overrides(overrides: list[str], config_dir: str | None = None) -> SweepCommandLine:
    """Sweep overrides become axes; plain overrides of axis keys narrow their axis.

    Raises UserInputError (every problem at once) for sweeps that cannot be enumerated."""
    parsed = [(text, _parse(text)) for text in overrides]
    problems: list[str] = []
    plain: list[str] = []
    axes: dict[str, tuple[str, str]] = {}  # key -> (axis override, original text)
    for text, override in parsed:
        if override is None or not override.is_sweep_override():
            plain.append(text)
            continue
        values, problem = _sweep_values(override, text, config_dir)
        if problem:
            problems.append(problem)
        else:
            axes[override.key_or_group] = (_axis_override(override.key_or_group, values), text)
    if problems:
        raise UserInputError(problems)
    axis_keys = _axis_keys(plain + [a for a, _ in axes.values()], config_dir) | set(axes)
    kept = []
    for text, override in ((t, o) for t, o in parsed if t in plain):
        if _narrows(override, axis_keys):
            axes[override.key_or_group] = (_axis_override(override.key_or_group, [override.get_value_element_as_str()]), text)
        else:
            kept.append(text)
    return SweepCommandLine(kept + [a for a, _ in axes.values()], {k: t for k, (_, t) in axes.items()})


def refuse_sweep_overrides(overrides: list[str], command: str) -> None:
    """`fp8lab trial seed=0,1` would otherwise fail with Hydra's hint to add --multirun, which
    this command does not have: point at `fp8lab sweep -m` instead."""
    problems = []
    for text in overrides:
        override = _parse(text)
        if override is not None and override.is_sweep_override():
            key = override.key_or_group
            problems.append(f"{key}: {text!r} asks for several values, but `fp8lab {command}` takes one "
                            f"(fix: fp8lab sweep -m {text}, or quote a literal comma: {key}='...')")
    if problems:
        raise UserInputError(problems)


def _parse(text: str) -> Override | None:
    """Hydra's parse of one override; None when it does not parse (composition reports it)."""
    try:
        return OverridesParser.create().parse_overrides([text])[0]
    except HydraException:
        return None


def _sweep_values(override: Override, text: str, config_dir: str | None) -> tuple[list[str], str | None]:
    """The sweep's values as Hydra literals (`range(0,3)` -> 0, 1, 2), or a problem line."""
    key = override.key_or_group
    if key.startswith("sweep."):
        return [], f"{key}: {text!r} sweeps a sweep setting (fix: give an axis as a list, {key}=[a,b], or sweep the key itself)"
    if override.is_delete() or override.value_type not in _ENUMERABLE:
        return [], (f"{key}: {text!r} cannot be swept as a grid (fix: a comma list a,b, choice(a,b), range(start,stop[,step]) "
                    "or glob(pattern) for a config group)")
    try:
        if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
            values = _glob_options(override, config_dir)
        else:
            values = list(override.sweep_string_iterator())
    except HydraException as exc:
        return [], f"{key}: cannot expand {text!r} ({exc}) (fix: a comma list a,b or range(start,stop))"
    if not values:
        return [], f"{key}: {text!r} gives no values (fix: a sweep with at least one value, e.g. {key}=a,b)"
    return values, None


def _glob_options(override: Override, config_dir: str | None) -> list[str]:
    """`precision=glob(fp8_protected-*)`: the group's options (fp8lab's and --config-dir's) that match."""
    from orchestrator.config_loader import group_options

    options = group_options(override.key_or_group, config_dir)
    if not options:
        raise HydraException(f"{override.key_or_group} is not a config group")
    return override.value().filter(options)


def _axis_override(key: str, values: list[str]) -> str:
    return f"{AXES_PREFIX}{key}=[{','.join(values)}]"


def _axis_keys(overrides: list[str], config_dir: str | None) -> set[str]:
    """The axes of the config these overrides compose (experiment files can bring their own)."""
    from orchestrator.config_loader import compose_config, to_container
    from orchestrator.axes import flatten_axes

    axes = to_container(compose_config(overrides, config_dir))["sweep"]["axes"]
    return set(flatten_axes(axes)) if isinstance(axes, dict) else set()


def _narrows(override: Override | None, axis_keys: set[str]) -> bool:
    """A plain `key=value` (also with + or ++) of an axis key; `~key` and sweep.* keys are not."""
    return (override is not None and not override.is_delete() and override.value_type == ValueType.ELEMENT
            and not override.key_or_group.startswith("sweep.") and override.key_or_group in axis_keys)
