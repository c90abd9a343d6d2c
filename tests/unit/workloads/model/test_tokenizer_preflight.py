"""Reliability round 3, case 7: a model folder whose tokenizer files do not load (here: no
tokenizer.json) is refused by preflight with one line, not a FAILED run after Ray started."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.config_loader import compose_config, to_container
from workloads.preflight import check_model_fit

EMBEDDED = Path(__file__).resolve().parents[4] / "workloads" / "embedded" / "assets" / "base_model"


def _problems(folder: Path) -> list[str]:
    return check_model_fit(to_container(compose_config([f"model.name_or_path={folder}"], None)))


def test_missing_tokenizer_json_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = Path(shutil.copytree(EMBEDDED, tmp_path / "model"))
    assert _problems(folder) == []
    (folder / "tokenizer.json").unlink()

    import transformers

    def no_weights(*_: object, **__: object) -> None:
        raise AssertionError("preflight must not load the weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    problems = _problems(folder)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"model.name_or_path: {folder}: the tokenizer does not load"), problems
    assert "(fix: save the tokenizer" in problems[0]
