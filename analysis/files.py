"""Atomic writes: readers (a browser, `mlflow ui`, a CI step) never see half a report, and a
report folder never mixes files of two reports.

A whole report is built in a temporary folder beside its destination, then swapped in with
one rename (Linux `renameat2(RENAME_EXCHANGE)` when the folder already exists). A full disk or a
read-only destination therefore fails before anything in the destination changed. Files get the
usual permissions of a new file (0666 minus the umask: 0644 with the common umask 022), not the
0600 of `mkstemp`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write to a temp file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        _write_new(tmp, payload)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def _write_new(path: Path, payload: bytes) -> None:
    """Create `path` with 0666 & ~umask (what any new file gets), write and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    with os.fdopen(fd, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())


def write_folder_atomic(out_dir: Path, files: Mapping[str, bytes | str], manifest: str) -> list[Path]:
    """Make `out_dir` hold exactly `files` (relative path -> content) plus whatever was there that
    an earlier report did not write (listed in `manifest`), in one step. Raises OSError with
    nothing in `out_dir` changed when any file cannot be written. Returns the paths written."""
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    in_place = out_dir.is_dir() and (os.path.ismount(out_dir) or Path.cwd().is_relative_to(out_dir.resolve()))
    # a mount point or the working folder cannot be renamed: stage inside it, then move file by file
    stage = (out_dir if in_place else out_dir.parent) / f".{out_dir.name}.new-{os.getpid()}-{secrets.token_hex(4)}"
    os.mkdir(stage)  # 0777 & ~umask, like any new folder (mkdtemp would make it 0700)
    try:
        for rel, data in files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            _write_new(stage / rel, data.encode("utf-8") if isinstance(data, str) else data)
        _write_new(stage / manifest, (json.dumps({"files": sorted(files)}, indent=1) + "\n").encode())
        if in_place:
            _move_files_in(stage, out_dir, files, manifest)
        else:
            _carry_over(out_dir, stage, files, manifest)
            _swap(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [out_dir / rel for rel in files]


def _previous_files(out_dir: Path, manifest: str) -> set[str]:
    try:
        return {str(p) for p in json.loads((out_dir / manifest).read_text(encoding="utf-8")).get("files", [])}
    except (OSError, ValueError, AttributeError):
        return set()


def _carry_over(out_dir: Path, stage: Path, files: Mapping[str, bytes | str], manifest: str) -> None:
    """Files in `out_dir` no report wrote (the user's own) go into the new folder too (hard links:
    no copy, no space); those an earlier report wrote and this one does not are left behind."""
    if not out_dir.is_dir():
        return
    ours = _previous_files(out_dir, manifest) | set(files) | {manifest}
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir).as_posix()
        if path.is_dir() or rel in ours or path.name.startswith(f".{out_dir.name}.new-"):
            continue
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, stage / rel)
        except OSError:
            shutil.copy2(path, stage / rel)


def _swap(stage: Path, out_dir: Path) -> None:
    """Put `stage` at `out_dir` in one rename; the old folder ends up at `stage` (then removed)."""
    if not out_dir.exists():
        os.rename(stage, out_dir)
        return
    if _exchange(stage, out_dir):
        return
    old = stage.with_name(stage.name + ".old")
    os.rename(out_dir, old)
    os.rename(stage, out_dir)
    os.rename(old, stage)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2); False where the system cannot."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name, use_errno=True) if libc_name else None
    if libc is None or not hasattr(libc, "renameat2"):
        return False
    if libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):  # old kernel or a filesystem without exchange
        return False
    raise OSError(err, os.strerror(err), str(b))


def _move_files_in(stage: Path, out_dir: Path, files: Mapping[str, bytes | str], manifest: str) -> None:
    """Every file is already written (so the disk had room); renames need none."""
    stale = _previous_files(out_dir, manifest) - set(files)
    for rel in [*files, manifest]:
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / rel, out_dir / rel)
    for rel in stale:
        old = (out_dir / rel).resolve()
        if old.is_relative_to(out_dir.resolve()) and old.is_file():
            old.unlink()
