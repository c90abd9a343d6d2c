"""Model folder and resource checks (headers and JSON only: nothing loaded, milliseconds)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.config_loader import compose_config, to_container
from workloads.model import sizing as resource_guard
from workloads.model.checks import inspect_folder
from workloads.preflight import check_model_fit

EMBEDDED = Path(__file__).resolve().parents[4] / "workloads" / "embedded" / "assets" / "base_model"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return Path(shutil.copytree(EMBEDDED, tmp_path / "model"))


def _config(*overrides: str) -> dict:
    return to_container(compose_config(list(overrides), None))


def _edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))


def test_the_shipped_model_passes_and_its_size_is_read_from_headers(model: Path) -> None:
    facts, problems = inspect_folder(model)
    assert problems == []
    assert facts is not None and 1_000_000 < facts.n_params * 4 <= (model / "model.safetensors").stat().st_size
    assert check_model_fit(_config(f"model.name_or_path={model}")) == []


def test_truncated_weights_are_named(model: Path) -> None:
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    problems = check_model_fit(_config(f"model.name_or_path={model}"))
    assert len(problems) == 1 and "model.safetensors is truncated: tensor" in problems[0], problems
    weights.write_bytes(b"<html>not a model</html>")  # e.g. an error page saved by a download
    problems = check_model_fit(_config(f"model.name_or_path={model}"))
    assert len(problems) == 1 and "is not a readable safetensors file" in problems[0], problems


def test_weights_that_do_not_match_the_config_are_named(model: Path) -> None:
    _edit_json(model / "config.json", hidden_size=64, num_hidden_layers=6)
    problems = check_model_fit(_config(f"model.name_or_path={model}"))
    assert len(problems) == 2, problems
    assert "no [vocab_size=896, hidden_size=64] embedding" in problems[0]
    assert "weights have 4 layers, config.json says num_hidden_layers=6" in problems[1]


def test_tokenizer_without_pad_or_eos_is_refused(model: Path) -> None:
    _edit_json(model / "tokenizer_config.json", pad_token=None, eos_token=None)
    problems = check_model_fit(_config(f"model.name_or_path={model}"))
    assert len(problems) == 1 and "neither a pad nor an eos token" in problems[0] and "fix:" in problems[0], problems
    _edit_json(model / "tokenizer_config.json", eos_token="</s>")  # eos alone is enough (it pads with eos)
    assert check_model_fit(_config(f"model.name_or_path={model}")) == []


@pytest.mark.parametrize(("overrides", "field", "text"), [
    (["train.max_seq_len=100000"], "train.max_seq_len", "more than the model's 256 positions"),
    (["lora.r=100000"], "lora.r", "smallest adapted layer's dimension 128"),
    (["lora.r=200", "lora.target_modules=[q_proj]"], "lora.r", "model.layers.0.self_attn.q_proj: [128, 128]"),
    (["train.batch_size=100000"], "train.batch_size", "for batch 100000 x seq 32, but one trial gets"),
], ids=["seq-beyond-positions", "rank-beyond-dims", "rank-beyond-named-module", "batch-beyond-memory"])
def test_resource_guards_refuse_with_the_fix(overrides: list[str], field: str, text: str) -> None:
    problems = check_model_fit(_config(*overrides))
    assert len(problems) == 1 and problems[0].startswith(f"{field}: ") and text in problems[0], problems
    assert "(fix: " in problems[0]


def test_memory_estimate_scales_with_batch_and_sequence() -> None:
    facts, _ = inspect_folder(EMBEDDED)
    small = resource_guard.estimate(_config("train.batch_size=8", "train.max_seq_len=32"), facts)
    double = resource_guard.estimate(_config("train.batch_size=16", "train.max_seq_len=32"), facts)
    assert double.activations == pytest.approx(2 * small.activations, rel=1e-6)
    assert small.weights == facts.n_params * 2  # bfloat16
    assert small.adapters > 0 and double.adapters == small.adapters
    wider = resource_guard.estimate(_config("lora.r=16"), facts)
    assert wider.adapters == 2 * resource_guard.estimate(_config("lora.r=8"), facts).adapters
