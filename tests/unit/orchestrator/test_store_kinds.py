"""Reliability round 3, case 6: a store that is the wrong kind of thing is one line + exit 2
before anything starts (no lock folder, no run): a folder as a SQLite file, a file that is not
SQLite, an unreachable database server, a database URI whose Python driver is missing."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator import cli, runs
from orchestrator.errors import UserInputError


def _refusal(uri: str) -> str:
    with pytest.raises(UserInputError) as caught:
        runs.check_store(uri)
    assert len(caught.value.problems) == 1, caught.value.problems
    return caught.value.problems[0]


def test_a_folder_as_sqlite_store_is_named(tmp_path: Path) -> None:
    line = _refusal(f"sqlite:///{tmp_path}")
    assert line == f"tracking.uri: {tmp_path} is a folder, not a SQLite file (fix: tracking.uri=sqlite:///{tmp_path / 'mlflow.db'})"


def test_a_file_that_is_not_sqlite_is_named(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.db"
    bogus.write_text("these are my notes, not a database\n")
    assert "is not a SQLite database" in _refusal(f"sqlite:///{bogus}")
    (tmp_path / "empty.db").write_bytes(b"")  # SQLite treats an empty file as a new database
    runs.check_store(f"sqlite:///{tmp_path / 'empty.db'}")


def test_a_file_as_a_file_store_is_named(tmp_path: Path) -> None:
    bogus = tmp_path / "mlruns"
    bogus.write_text("x")
    assert "an MLflow file store is a folder" in _refusal(str(bogus))


def test_missing_database_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    line = _refusal("postgresql://fp8lab:secret@127.0.0.1:1/mlflow")
    assert "needs the database driver psycopg" in line and 'pip install "fp8lab[postgres]"' in line, line
    assert "secret" not in line


def test_unreachable_database_server_is_one_line() -> None:
    line = _refusal("postgresql+psycopg://fp8lab@127.0.0.1:1/mlflow")
    assert line.startswith("tracking.uri: database postgresql+psycopg://fp8lab@127.0.0.1:1/mlflow is not reachable"), line


def test_report_refuses_a_non_sqlite_file_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("mlflow.db").write_text("not sqlite")
    assert cli.main(["report", "tracking.uri=sqlite:///mlflow.db", "--all"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a SQLite database" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]  # no lock folder, no report
