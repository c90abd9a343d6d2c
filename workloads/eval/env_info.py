"""lm-eval's record of the environment (`pretty_env_info`), collected once per environment.

`simple_evaluate` adds torch's `collect_env` report to every result it returns: about a second of
CPU and a dozen subprocesses (`pip list`, `nvcc --version`, `lscpu`, `gcc --version`, ...) per
call, and the same text every time on one machine and Python environment. Every trial is a fresh
process, so a sweep paid it once per trial. Inside `env_info_once()` the report is collected once
and reused: in the process, and through a file in fp8lab's cache folder keyed by what it
describes — the interpreter, the machine's name and the site-packages folders' modification times
(installing, upgrading or removing a package changes them) — and no older than `MAX_AGE_S` (a
driver or toolkit update is seen within a day). What lm-eval records is the report's text as
torch writes it; a missing or unwritable cache only costs the time.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import site
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fp8lab_conf.filesystem import cache_dir

MAX_AGE_S = 24 * 3600
_REPORTS: dict[str, str] = {}  # this process's, by environment key


def environment_key() -> str:
    """What the report depends on, hashed: interpreter, machine, installed packages (by their
    folders' modification times)."""
    folders = sorted({*site.getsitepackages(), site.getusersitepackages(), *(p for p in sys.path if p.endswith("-packages"))})
    stamps = [f"{folder}:{os.stat(folder).st_mtime_ns}" for folder in folders if os.path.isdir(folder)]
    parts = [sys.executable, sys.version, sys.prefix, platform.node(), *stamps]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _cache_file(key: str) -> Path:
    return cache_dir() / "env_info" / f"{key}.txt"


def report_once(collect: Callable[[], str]) -> str:
    """`collect()`'s report for this environment: from this process, the cache file, or collected
    (and then written to both)."""
    key = environment_key()
    if key in _REPORTS:
        return _REPORTS[key]
    path = _cache_file(key)
    try:
        if time.time() - path.stat().st_mtime < MAX_AGE_S:
            _REPORTS[key] = path.read_text(encoding="utf-8")
            return _REPORTS[key]
    except OSError:
        pass
    _REPORTS[key] = report = collect()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(report, encoding="utf-8")
        os.replace(tmp, path)  # readers see the whole report or none
    return report


@contextmanager
def env_info_once() -> Iterator[None]:
    """For the block, `torch.utils.collect_env.get_pretty_env_info` (what lm-eval calls) returns
    the report of this environment collected once (`report_once`)."""
    from torch.utils import collect_env

    original = collect_env.get_pretty_env_info
    collect_env.get_pretty_env_info = lambda: report_once(original)
    try:
        yield
    finally:
        collect_env.get_pretty_env_info = original
