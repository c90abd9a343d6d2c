"""Digests of what a trial reads (its data files and model folder), so that a trial id changes
when a file is edited in place and a rerun never skips a trial against results of old content.

What is hashed, and why:
- data: the bytes of every split file (`*.jsonl` of a folder, or the one file). Datasets for a
  LoRA fine-tune are small, and any edit changes results.
- model: config, tokenizer and other small files whole; the weights whole while the folder's
  weights total at most `FULL_HASH_BYTES`; above that, each weight file's size, its safetensors
  header (names, dtypes, shapes, offsets) and `SAMPLES` evenly spaced 64 KiB blocks of its data.
  Hashing 15 GB on every sweep start would cost ~10 s of disk reads; a retrained or re-quantized
  checkpoint changes practically every block, so samples catch it, and a different architecture
  changes the header. A single edited value in a large checkpoint is not caught (documented).
- a hub id (not a local folder) is hashed as its name: its files are the hub's concern.
When a digest is recomputed (the cache rule): a file up to `CONTENT_KEYED_BYTES` is hashed on
every call, so its digest is keyed on its content itself and no stat trick can fool it; a larger
file's digest is cached on disk (`~/.cache/fp8lab/digests.json`) keyed by path, inode, size,
mtime_ns and ctime_ns. mtime alone is not enough: `touch -r`, `cp -p`, rsync and tar restore it
after a same-size edit; ctime cannot be set by a user and changes on every write, and a file
replaced by another (a new inode) is a new key. The cache only saves time: a missing or
unwritable one is ignored.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from fp8lab_conf.filesystem import cache_dir

FULL_HASH_BYTES = 1 << 30
CONTENT_KEYED_BYTES = 32 << 20  # up to this size a file is re-hashed every time (~0.1 s at most)
SAMPLES, SAMPLE_BYTES = 64, 1 << 16
_CHUNK = 1 << 20


def _cache_file() -> Path:
    return cache_dir() / "digests.json"


class _Cache:
    """path|inode|size|mtime_ns|ctime_ns|mode -> hex digest, loaded once per process (large files only)."""

    def __init__(self) -> None:
        self._data: dict[str, str] | None = None
        self._seen: dict[str, str] = {}  # small files, this process only
        self._dirty = False

    def _load(self) -> dict[str, str]:
        if self._data is None:
            try:
                self._data = dict(json.loads(_cache_file().read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError):
                self._data = {}
        return self._data

    def get_or(self, path: Path, mode: str, compute: Any) -> str:
        stat = path.stat()
        key = f"{path.resolve()}|{stat.st_ino}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{mode}"
        if stat.st_size <= CONTENT_KEYED_BYTES:  # re-hashed once per process (a sweep's cells share it)
            if key not in self._seen:
                self._seen[key] = compute(path)
            return self._seen[key]
        data = self._load()
        if key not in data:
            data[key], self._dirty = compute(path), True
        return data[key]

    def save(self) -> None:
        if not self._dirty or self._data is None:
            return
        target = _cache_file()
        with contextlib.suppress(OSError):
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._data), encoding="utf-8")
            os.replace(tmp, target)
            self._dirty = False


_CACHE = _Cache()


def _hash_whole(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _hash_sampled(path: Path) -> str:
    """Size, the safetensors header (when there is one) and evenly spaced blocks."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        head = handle.read(8)
        if path.suffix == ".safetensors" and len(head) == 8:
            (length,) = struct.unpack("<Q", head)
            digest.update(handle.read(min(length, size)))
        for i in range(SAMPLES):
            handle.seek(size * i // SAMPLES)
            digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _folder_digest(files: list[Path], root: Path | list[Path], sampled: set[Path]) -> str:
    """Each file named relative to the first of ``root`` (one folder or several) that holds it:
    the digest does not depend on where a checkout or a virtual environment lives."""
    roots = root if isinstance(root, list) else [root]
    digest = hashlib.sha256()
    for path in files:
        mode = "sampled" if path in sampled else "whole"
        value = _CACHE.get_or(path, mode, _hash_sampled if mode == "sampled" else _hash_whole)
        digest.update(f"{_relative_name(path, roots)}={value};".encode())
    return digest.hexdigest()[:16]


def _relative_name(path: Path, roots: list[Path]) -> str:
    for index, root in enumerate(roots):
        if path.is_relative_to(root):
            name = path.relative_to(root).as_posix()
            return name if index == 0 else f"@{index}/{name}"  # the first root keeps the plain names
    raise ValueError(f"{path} is under none of {roots}")


def files_digest(files: list[Path], roots: list[Path]) -> str:
    """Digest of files anywhere, each hashed whole under the cache rule and named relative to the
    first of ``roots`` that holds it (end ``roots`` with ``Path("/")`` for files elsewhere)."""
    digest = _folder_digest(files, [r.resolve() for r in roots], set())
    _CACHE.save()
    return digest


def data_digest(path: Path) -> str:
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    return _folder_digest(files, path if path.is_dir() else path.parent, set())


def model_digest(folder: Path) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    weights = [p for p in files if p.suffix in (".safetensors", ".bin", ".pt", ".gguf")]
    large = sum(p.stat().st_size for p in weights) > FULL_HASH_BYTES
    return _folder_digest(files, folder, set(weights) if large else set())


def _embedded(*parts: str) -> Path:
    import importlib.resources  # noqa: PLC0415

    return Path(str(importlib.resources.files("workloads.embedded"))).joinpath("assets", *parts)


def content_digests(config: dict[str, Any]) -> dict[str, str]:
    """{'data': ..., 'model': ...} for local files; a hub name stands for itself."""
    out = {}
    data, model = config["data"]["path"], config["model"]["name_or_path"]
    data_path = _embedded("task") if data == "embedded" else Path(data).expanduser()
    model_path = _embedded("base_model") if model == "embedded" else Path(model).expanduser()
    if data_path.exists():
        out["data"] = data_digest(data_path)
    if model_path.is_dir():
        out["model"] = model_digest(model_path)
    _CACHE.save()
    return out
