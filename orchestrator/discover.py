"""What a user can choose, without reading the source: `fp8lab policies`, the config groups in
`--help`, and `--info`; Hydra's app flags fp8lab cannot honour are refused with the alternative.

fp8lab composes configs with Hydra's Compose API (no `@hydra.main` application), so Hydra's
runtime flags (`--cfg hydra`, `--shell-completion`, `--hydra-help`) have nothing to act on; each
is refused with one line naming what to use instead. The policies come from the policy registry
in a child process (`python -m workloads.precision.catalog`): the driver never imports torch.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator.config_loader import shipped_config_dir
from orchestrator.errors import UserInputError

HELP_OPTIONS_SHOWN = 4  # options per group in --help; `--info` lists them all

REFUSED_FLAGS = {
    "--cfg hydra": "--cfg hydra: fp8lab composes configs with Hydra's Compose API, so there is no Hydra runtime "
                   "config to print (fix: --cfg job for the composed config, --info for groups and search path)",
    "--shell-completion": "--shell-completion: fp8lab is not a Hydra application, so Hydra's completion script "
                          "does not apply (fix: fp8lab --help lists the commands, fp8lab trial --info the config "
                          "groups and their options, fp8lab policies the policies)",
    "--hydra-help": "--hydra-help: fp8lab is not a Hydra application (fix: fp8lab trial --info lists the config "
                    "groups, their options and the search path)",
}


def refuse(flag: str) -> None:
    """One line naming the supported alternative, exit 2 (cli.main prints it)."""
    raise UserInputError(REFUSED_FLAGS[flag])


def config_groups(config_dir: str | None = None) -> dict[str, list[str]]:
    """group -> its options: fp8lab's config tree, then the user's --config-dir (searched first by
    Hydra, so an option of the same name there replaces fp8lab's)."""
    groups: dict[str, list[str]] = {}
    for root in [shipped_config_dir(), *([Path(config_dir).expanduser()] if config_dir else [])]:
        for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
            options = groups.setdefault(folder.name, [])
            options += [stem for stem in sorted(f.stem for f in folder.glob("*.yaml")) if stem not in options]
    return {group: options for group, options in groups.items() if options}


def groups_epilog() -> str:
    """The config groups for `--help`: each with its first options (choose with group=option)."""
    lines = ["config groups (choose with GROUP=OPTION; all options: fp8lab trial --info):"]
    for group, options in config_groups().items():
        more = len(options) - HELP_OPTIONS_SHOWN
        shown = ", ".join(options[:HELP_OPTIONS_SHOWN]) + (f", ... (+{more}; policies: fp8lab policies)"
                                                             if more > 0 and group == "precision" else
                                                             f", ... (+{more})" if more > 0 else "")
        lines.append(f"  {group:<11} {shown}")
    return "\n".join(lines)


def print_info(config_dir: str | None) -> int:
    """Like Hydra's --info: the config search path, the primary config's defaults and every group's options."""
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.load(shipped_config_dir() / "config.yaml"))["defaults"]
    chosen = {k: v for item in defaults if isinstance(item, dict) for k, v in item.items()}
    print("Config search path:")
    if config_dir:
        print(f"  {Path(config_dir).expanduser().resolve()}  (--config-dir, searched first)")
    print(f"  {shipped_config_dir()}  (fp8lab)")
    print("\nConfig groups (* = the default; choose with GROUP=OPTION):")
    for group, options in config_groups(config_dir).items():
        print(f"  {group}: " + ", ".join(o + ("*" if chosen.get(group) == o else "") for o in options))
    print("\nPrimary config: config.yaml; print the composed config with --cfg job")
    return 0


def policy_rows() -> list[dict[str, object]]:
    """The registered policies (name, version, description, ladder base, mechanism) from the registry."""
    proc = subprocess.run([sys.executable, "-m", "workloads.precision.catalog"], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"listing the policies failed: {tail}")
    return json.loads(proc.stdout)


def print_policies() -> int:
    """`fp8lab policies`: one line per registered policy (select one with precision=NAME)."""
    rows = [(str(r["name"]), str(r["version"]), str(r["ladder_base"] or "-"), str(r["description"])) for r in policy_rows()]
    header = ("NAME", "VERSION", "LADDER BASE", "DESCRIPTION")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    print("\nSelect one with precision=NAME; the switches of each: docs/policies.md, the ladder: docs/mechanisms.md")
    return 0
