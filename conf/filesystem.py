"""Filesystem and process facts both the driver and the trial's checks need (standard library only, like
everything in this package, so the torch-free orchestrator and the workloads may both use it)."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def cache_dir() -> Path:
    """fp8lab's cache folder: `$XDG_CACHE_HOME/fp8lab`, else `~/.cache/fp8lab` (what it holds only
    saves time: digests, converted models, the environment report)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fp8lab"


def process_exists(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (someone else's counts: signal 0
    is refused to it, not unknown). The lease and the trial's temp-folder clean-up ask."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def folder_is_writable(folder: Path) -> bool:
    """Really create (and remove) a file: os.access says yes to root even where writes fail."""
    probe = folder / f".fp8lab-write-probe-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False


def special_path_problem(path: Path) -> str | None:
    """What is wrong with a path that is neither missing nor a regular file or folder, in words.

    `Path.exists()` is False for a symlink loop (ELOOP), which a caller would report as "does not
    exist"; a FIFO or device is neither a file nor a folder, so a data check would look for splits
    in it (and reading one blocks). None: missing, a regular file or a folder (callers say more).
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return (f"{path} is a symbolic link loop (a link that points back to itself through "
                    f"{os.readlink(path) if os.path.islink(path) else 'a parent link'})")
        return None
    for test, what in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return f"{path} is {what}, not a regular file or folder"
    return None
