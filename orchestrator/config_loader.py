"""Compose fp8lab's Hydra config from the shipped tree plus user overrides.

We use Hydra's compose API (not @hydra.main) because fp8lab has several subcommands, must not
change the working directory or write `outputs/` folders, and must find `conf/` both in a
checkout and in an installed wheel (it ships as the `fp8lab_conf` package).
"""
from __future__ import annotations

import difflib
import importlib.resources
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from orchestrator.errors import UserInputError


def shipped_config_dir() -> Path:
    """The conf/ folder shipped with fp8lab (package data of `fp8lab_conf`)."""
    return Path(str(importlib.resources.files("fp8lab_conf")))


def compose_config(overrides: list[str], config_dir: str | None = None) -> DictConfig:
    """Compose the primary config with Hydra overrides; a user config dir is searched first.

    Hydra's own errors (unknown group option, key not in struct, grammar) become one-line
    UserInputErrors that say how to fix the override.
    """
    return compose_many([overrides], config_dir)[0]


def compose_many(override_sets: list[list[str]], config_dir: str | None = None) -> list[DictConfig]:
    """Compose one config per override list inside a single Hydra context (a sweep's cells)."""
    search = _searchpath_override(config_dir)
    override_sets = [[_open_axes(o) for o in overrides] for overrides in override_sets]
    configs = []
    try:
        with initialize_config_dir(config_dir=str(shipped_config_dir()), version_base="1.3", job_name="fp8lab"):
            for overrides in override_sets:
                cfg = compose(config_name="config", overrides=list(overrides) + search)
                OmegaConf.set_struct(cfg, False)
                configs.append(cfg)
    except OverrideParseException as exc:
        raise UserInputError(_unparsable_override(override_sets, exc)) from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise UserInputError(_one_line_hydra_error(exc)) from None
    return configs


def group_options(group: str, config_dir: str | None = None) -> list[str]:
    """Options of a config group in fp8lab's tree and the user's --config-dir (what `glob()` sweeps)."""
    from hydra.core.global_hydra import GlobalHydra

    search = _searchpath_override(config_dir)
    with initialize_config_dir(config_dir=str(shipped_config_dir()), version_base="1.3", job_name="fp8lab"):
        return GlobalHydra.instance().config_loader().get_group_options(group, config_name="config", overrides=search)


def _unparsable_override(override_sets: list[list[str]], exc: Exception) -> str:
    """Hydra's grammar error does not say which override it choked on: find it and name its key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    message = str(exc).strip().splitlines()[0]
    for override in (o for overrides in override_sets for o in overrides):
        try:
            parser.parse_overrides([override])
        except HydraException:
            key = override.split("=", 1)[0].lstrip("+~")
            return (f"{key}: cannot parse the override {override!r} ({message}) "
                    f"(fix: quote values with special characters, e.g. '{key}=\"...\"'; lists are [a,b])")
    return f"config: {message} (fix: check the override syntax, e.g. key=value or key=[a,b])"


# Open mappings: any key may be added without Hydra's `+`/`++` prefixes.
OPEN_MAPPINGS = ("sweep.axes", "precision.switches")


def _open_axes(override: str) -> str:
    """`sweep.axes` and `precision.switches` are open mappings: `sweep.axes={lora.r:[8,16]}`
    adds an axis, `sweep.axes.train.lr=[...]` adds or replaces one, and
    `precision.switches={lm_head_fp8:true}` sets switches, all without Hydra's `+`/`++`
    prefixes (Hydra's struct mode would otherwise refuse keys the shipped config does not
    have). Existing entries are kept; remove one with `~sweep.axes.seed`."""
    if any(override.startswith(f"{key}=") or override.startswith(f"{key}.") for key in OPEN_MAPPINGS):
        return "++" + override
    return override


def _searchpath_override(config_dir: str | None) -> list[str]:
    if config_dir is None:
        return []
    user_dir = Path(config_dir).expanduser().resolve()
    if not user_dir.is_dir():
        raise UserInputError(f"--config-dir: {config_dir} is not a folder (fix: pass an existing folder of YAML configs)")
    return [f"hydra.searchpath=[file://{user_dir}]"]


_MISSING_OPTION = re.compile(r"Could not find '(?P<group>[\w/]+)/(?P<option>[^']+)'.*?Available options in '[^']+':(?P<options>.*?)(Config search path|$)", re.S)


def _one_line_hydra_error(exc: Exception) -> str:
    """Hydra errors are multi-line; keep the meaningful part and add the usual fix."""
    raw = str(exc)
    missing = _MISSING_OPTION.search(raw)
    if missing:
        group, option = missing["group"], missing["option"]
        options = missing["options"].split()
        close = difflib.get_close_matches(option, options, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return (f"{group}={option}: unknown {group} option ({hint}available: {', '.join(options)}; "
                f"fix: {group}={close[0] if close else options[0]} or add {group}/{option}.yaml with --config-dir)")
    text = " ".join(line.strip() for line in raw.splitlines() if line.strip())
    unknown = _UNKNOWN_KEY.search(raw)
    if unknown:
        return _unknown_key_line(unknown["key"])
    if "Could not override" in text:
        return f"{text} (fix: check the key's spelling; `fp8lab trial --cfg job` prints every key)"
    return f"config: {text}"


_UNKNOWN_KEY = re.compile(r"Could not override '(?P<key>[^']+)'\.\s*To append to your config use")


def _unknown_key_line(key: str) -> str:
    """`lora.rr=3`: name the key, suggest the closest known one (the schema knows every key)."""
    from orchestrator.schema import SCHEMA

    close = difflib.get_close_matches(key, _dotted_keys(SCHEMA), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    node: Any = SCHEMA
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            prefix = ".".join(parts[:depth])
            listing = (f"known keys{' in ' + prefix if prefix else ''}: {', '.join(node)}" if isinstance(node, dict)
                       else f"{prefix} is a value, not a group")
            return f"{key}: unknown config key ({hint}{listing}) (fix: check the spelling; `fp8lab trial --cfg job` prints every key)"
        node = node[part]
    return f"{key}: this key cannot be overridden here (fix: check the spelling; `fp8lab trial --cfg job` prints every key)"


def _dotted_keys(schema: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, rule in schema.items():
        keys.append(prefix + name)
        if isinstance(rule, dict):
            keys += _dotted_keys(rule, f"{prefix}{name}.")
    return keys


def to_container(cfg: DictConfig) -> dict:
    """A plain, fully resolved dict (what trials receive and what is logged)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
