"""Filesystem facts both the driver and the trial's checks need (standard library only, like
everything in this package, so the torch-free orchestrator and the workloads may both use it)."""
from __future__ import annotations

import os
from pathlib import Path


def folder_is_writable(folder: Path) -> bool:
    """Really create (and remove) a file: os.access says yes to root even where writes fail."""
    probe = folder / f".fp8lab-write-probe-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False
