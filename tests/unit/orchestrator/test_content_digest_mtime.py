"""Reliability round 3, case 2: a same-size edit of a data file with its old mtime restored
(`touch -r`, `cp -p`, rsync) gives a new trial id: small files are keyed on their content, large
ones on inode + size + mtime_ns + ctime_ns (ctime cannot be restored)."""
from __future__ import annotations

import os
import shutil
import time
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


def _edit_keeping_size_and_mtime(path: Path) -> None:
    before = path.stat()
    text = path.read_text()
    edited = text.replace("largest", "biggest", 1)  # both 7 letters: same size
    assert edited != text and len(edited) == len(text)
    time.sleep(0.01)  # a later ctime even on coarse clocks
    path.write_text(edited)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # what `touch -r` does
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("content_keyed_bytes", [content_digest.CONTENT_KEYED_BYTES, 0], ids=["small-file", "large-file"])
def test_same_size_edit_with_restored_mtime_changes_the_trial_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 content_keyed_bytes: int) -> None:
    monkeypatch.setattr(content_digest, "CONTENT_KEYED_BYTES", content_keyed_bytes)
    data = Path(shutil.copytree(EMBEDDED / "task", tmp_path / "task"))
    config = to_container(compose_config([f"data.path={data}"]))
    before = compute_trial_id(config)
    _edit_keeping_size_and_mtime(data / "train.jsonl")
    assert compute_trial_id(config) != before
