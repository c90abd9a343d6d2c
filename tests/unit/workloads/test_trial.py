"""workloads/trial.py: the trial's log folder in the temp folder, and orphans of killed trials."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from workloads import trial


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_new_trial_removes_the_log_folders_of_killed_trials_and_keeps_live_ones(temp_root: Path) -> None:
    dead = temp_root / f"{trial.LOG_DIR_PREFIX}{_dead_pid()}-abc123"
    (dead / "trial.log").parent.mkdir()
    (dead / "trial.log").write_text("killed mid-trial\n")
    live = temp_root / f"{trial.LOG_DIR_PREFIX}{os.getppid()}-def456"  # our parent: alive
    live.mkdir()
    unrelated = temp_root / f"{trial.LOG_DIR_PREFIX}notapid-x"
    unrelated.mkdir()

    path, handler = trial._capture_log()
    logging.getLogger().removeHandler(handler)
    handler.close()

    assert not dead.exists()
    assert live.exists() and unrelated.exists()
    assert path.parent.parent == temp_root
    assert path.parent.name.startswith(f"{trial.LOG_DIR_PREFIX}{os.getpid()}-")
    assert trial.remove_orphaned_log_dirs() == []  # this process is alive: its own folder stays
    assert path.parent.exists()
