"""Shared names stay in one place: `fp8lab_conf.contracts` (docs/contracts.md).

orchestrator, workloads and analysis must spell a tag, the sweep/trial role or a telemetry column
through that module, never as their own `"fp8lab.<name>"` literal, or a renamed tag silently
splits writers from readers.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab_conf import contracts

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("orchestrator", "workloads", "analysis")
NAME = re.compile(r"fp8lab\.(?=[A-Za-z_]|$)")  # `$`: an f-string part before `{key}`
# Documented exceptions: a string may mention `fp8lab.` when it is not a tag name.
LOGGER_CALLS = {"getLogger"}  # logger names such as "fp8lab.trial" (a logging hierarchy, not MLflow)


def _docstrings(tree: ast.AST) -> set[int]:
    """Bare string statements: module, class, function and attribute docstrings."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _logger_names(tree: ast.AST) -> set[int]:
    return {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in LOGGER_CALLS for arg in node.args}


def literal_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant that spells `fp8lab.<name>` (f-string parts included)."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _logger_names(tree)
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in skip and NAME.search(node.value))


def test_no_tag_literals_outside_contracts() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {text!r}"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for line, text in literal_names(path.read_text())]
    assert found == [], "spell these through fp8lab_conf.contracts:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    'tags = {"fp8lab.status": "RUNNING"}',
    'q = f"tags.`fp8lab.role` = \'{x}\'"',
    'k = f"fp8lab.{key}"',
    'col = "tags.fp8lab.seed"',
])
def test_the_check_finds_a_literal(source: str) -> None:
    assert literal_names(source)


def test_the_check_allows_docstrings_and_logger_names() -> None:
    source = '"""Reads `fp8lab.status`."""\nimport logging\nlog = logging.getLogger("fp8lab.trial")\n'
    assert literal_names(source) == []


def test_contracts_import_nothing_third_party() -> None:
    """The driver, a Ray head without torch and a report-only laptop all import it."""
    code = ("import sys; import fp8lab_conf.contracts; "
            "print(sorted(m for m in ('torch', 'mlflow', 'ray', 'pandas', 'hydra', 'omegaconf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_tag_names_are_unique_and_prefixed() -> None:
    tags = {k: v for k, v in vars(contracts).items() if k.startswith("TAG_")}
    assert all(v.startswith("fp8lab.") for v in tags.values())
    assert len(set(tags.values())) == len(tags)


def test_trial_launch_is_frozen_plain_data() -> None:
    launch = contracts.TrialLaunch({"seed": 0}, "t", "r", "sqlite:///x.db", "bf16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.trial_id = "other"  # type: ignore[misc]
