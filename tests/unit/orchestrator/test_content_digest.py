"""Trial ids follow the content of the data and model files, not only the config."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator import content_digest
from orchestrator.config_loader import compose_config, to_container
from orchestrator.trial_id import compute_trial_id

EMBEDDED = Path(__file__).resolve().parents[3] / "workloads" / "embedded" / "assets"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(content_digest, "_CACHE", content_digest._Cache())


def _id(*overrides: str) -> str:
    return compute_trial_id(to_container(compose_config(list(overrides))))


def test_editing_a_data_file_in_place_changes_the_trial_id(tmp_path: Path) -> None:
    data = Path(shutil.copytree(EMBEDDED / "task", tmp_path / "task"))
    before = _id(f"data.path={data}")
    text = (data / "train.jsonl").read_text()
    (data / "train.jsonl").write_text(text.replace("largest", "biggest", 1))
    assert _id(f"data.path={data}") != before
    (data / "train.jsonl").write_text(text)  # same content again (new mtime): the same trial
    assert _id(f"data.path={data}") == before


def test_model_digest_whole_and_sampled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Path(shutil.copytree(EMBEDDED / "base_model", tmp_path / "model"))
    weights = model / "model.safetensors"
    whole = content_digest.model_digest(model)
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1  # one value of the last tensor
    weights.write_bytes(bytes(blob))
    assert content_digest.model_digest(model) != whole

    monkeypatch.setattr(content_digest, "FULL_HASH_BYTES", 0)  # treat it as a large model
    sampled = content_digest.model_digest(model)
    blob = bytes(b ^ 1 for b in blob[:8]) + bytes(blob[8:])  # a header change (another layout)
    weights.write_bytes(blob[:8] + bytes(weights.read_bytes()[8:]))
    retrained = bytearray(weights.read_bytes())
    for i in range(len(retrained) // 2, len(retrained), 4096):  # every block of half the weights changes
        retrained[i] ^= 1
    weights.write_bytes(bytes(retrained))
    assert content_digest.model_digest(model) != sampled


def test_unchanged_files_are_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = Path(shutil.copytree(EMBEDDED / "task", tmp_path / "task"))
    monkeypatch.setattr(content_digest, "CONTENT_KEYED_BYTES", 0)  # cache every file (small ones are re-hashed)
    reads: list[Path] = []
    real = content_digest._hash_whole
    monkeypatch.setattr(content_digest, "_hash_whole", lambda p: reads.append(p) or real(p))
    content_digest.data_digest(data)
    content_digest._CACHE.save()
    monkeypatch.setattr(content_digest, "_CACHE", content_digest._Cache())  # a new process: from the disk cache
    content_digest.data_digest(data)
    assert len(reads) == 3  # train, validation, test: once each
