"""Store problems are named for what they are: a full disk is not an outage, and the fix names
an override the CLI accepts."""
from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from orchestrator import cli, runs
from orchestrator.errors import UserInputError
from workloads.record.logger import MlflowTrialLogger, TrackingUnavailable, disk_full


class _FullStore:
    def log_batch(self, *args: object, **kwargs: object) -> None:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as exc:  # as SQLAlchemy wraps it
            raise RuntimeError("(sqlite3.OperationalError) database or disk is full") from exc


def test_a_full_store_is_not_called_unreachable() -> None:
    logger = MlflowTrialLogger.__new__(MlflowTrialLogger)
    logger.client, logger.run_id, logger.retry_s, logger._metrics = _FullStore(), "r", 0.0, []
    with pytest.raises(TrackingUnavailable, match=r"^MLflow store out of disk space \(writes failed for 0s\)"):
        logger.set_tags({"a": 1})
    assert disk_full(OSError(28, "No space left on device")) and not disk_full(ConnectionError("refused"))


def test_sweep_refuses_a_store_on_a_full_disk(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        with pytest.raises(UserInputError, match=r"tracking.uri: the disk holding .* is full .*fix: free space"):
            runs.check_store(f"sqlite:///{disk}/mlflow.db")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_report_errors_name_the_override_fp8lab_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", f"tracking.uri=sqlite:///{tmp_path}/none.db"]) == 2
    err = capsys.readouterr().err
    assert "pass tracking.uri=sqlite:///" in err and "python -m analysis" in err, err


def test_the_cli_really_rejects_the_flag() -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["report", "--tracking-uri", "x"])
    assert exited.value.code == 2
