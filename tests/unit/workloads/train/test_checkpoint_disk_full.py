"""Reliability round 3, case 8: a disk that fills up while a checkpoint is written is one clear
line ("out of disk space writing checkpoint ...; fix: ..."), no temp file is left, and the
previous checkpoint still loads. Before: `RuntimeError: [enforce fail at inline_container.cc:672]
unexpected pos ...` and a `checkpoint.tmp` left on the full disk."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.unit.workloads.train.test_checkpoint import load, save, state
from workloads.train.checkpoint import CheckpointDiskFull, Checkpointer


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        yield disk
    finally:
        import gc

        gc.collect()  # torch's failed zip writer may still hold the temp file open until collected
        subprocess.run(["umount", "-l", str(disk)], check=False)  # lazy: never leave the mount behind


def _fill(disk: Path, leave: int) -> None:
    """Fill the disk up to `leave` bytes of free space."""
    import shutil

    with (disk / "filler").open("wb") as handle:
        while shutil.disk_usage(disk).free > leave:
            handle.write(b"\0" * 4096)
            handle.flush()


def _assert_disk_full_handled(ckpt: Checkpointer, s: object, folder: Path) -> None:
    with pytest.raises(CheckpointDiskFull) as caught:
        save(ckpt, s, 4, {"steps_done": 4, "big": "x" * 400_000})  # cannot fit
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"out of disk space writing checkpoint {ckpt.path} at step 4"), line
    assert "the previous checkpoint is intact" in line and "(fix: " in line and "train.checkpoint_dir=" in line
    names = sorted(p.name for p in folder.iterdir())
    assert "checkpoint.pt" in names and not [n for n in names if n.endswith(".tmp")], names  # no checkpoint.tmp left
    assert load(ckpt, state(1))[0] == 2  # the previous checkpoint is intact


def test_full_disk_while_checkpointing_is_one_line_and_keeps_the_previous_checkpoint(tiny_disk: Path) -> None:
    ckpt = Checkpointer(tiny_disk / "ckpt", every=2, run_id="run-1")
    s = state(0)
    save(ckpt, s, 2)
    _fill(tiny_disk, leave=8 * 1024)
    _assert_disk_full_handled(ckpt, s, ckpt.folder)


def test_torch_writer_error_on_a_full_disk_is_recognised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without root: torch's zip writer fails with a RuntimeError (no errno) after writing part of the file."""
    import shutil

    import torch

    ckpt = Checkpointer(tmp_path / "ckpt", every=2, run_id="run-1")
    s = state(0)
    save(ckpt, s, 2)
    real_save = torch.save

    def failing_save(obj: object, path: Path) -> None:
        Path(path).write_bytes(b"PK\x03\x04 partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(torch, "save", failing_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=4096))
    _assert_disk_full_handled(ckpt, s, ckpt.folder)
    monkeypatch.setattr(torch, "save", real_save)
