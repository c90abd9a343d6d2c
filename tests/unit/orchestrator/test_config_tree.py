"""Every option of every config group composes and validates (walks conf/ recursively)."""
from __future__ import annotations

import pytest

from orchestrator.config_loader import compose_config, shipped_config_dir, to_container
from orchestrator.schema import validate_config


def _options() -> list[str]:
    root = shipped_config_dir()
    return sorted(f"{p.parent.relative_to(root)}={p.stem}" for p in root.rglob("*.yaml") if p.parent != root)


@pytest.mark.parametrize("override", _options())
def test_each_option_composes_and_validates(override: str) -> None:
    assert validate_config(to_container(compose_config([override]))) == []


def test_every_yaml_starts_with_a_comment_saying_how_to_use_it() -> None:
    for path in shipped_config_dir().rglob("*.yaml"):
        first = path.read_text().lstrip().splitlines()[0]
        assert first.startswith("#"), path
