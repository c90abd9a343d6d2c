"""Report files are written all at once: a full disk or a read-only folder is one line and exit 2
with the previous report untouched; the end-of-sweep report never fails the sweep; files 0644."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis.files import write_folder_atomic
from orchestrator import cli

MANIFEST = ".fp8lab-report.json"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def _tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}): needs root with CAP_SYS_ADMIN")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_folder_is_swapped_whole_keeps_user_files_and_drops_stale_ones(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    write_folder_atomic(out, {"report.md": "one", "figures/a.png": b"A", "figures/old.png": b"O"}, MANIFEST)
    (out / "notes.txt").write_text("mine")
    old_umask = os.umask(0o022)
    try:
        written = write_folder_atomic(out, {"report.md": "two", "figures/a.png": b"B"}, MANIFEST)
    finally:
        os.umask(old_umask)
    assert _snapshot(out) == {"report.md": b"two", "figures/a.png": b"B", "notes.txt": b"mine",
                              MANIFEST: b'{\n "files": [\n  "figures/a.png",\n  "report.md"\n ]\n}\n'}
    assert written == [out / "report.md", out / "figures/a.png"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in written} == {0o644}
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]  # no staging folder left beside it


def test_working_folder_as_out_is_filled_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_folder_atomic(Path("."), {"report.md": "one", "b.csv": "x"}, MANIFEST)
    write_folder_atomic(Path("."), {"report.md": "two"}, MANIFEST)
    assert {p.name for p in tmp_path.iterdir()} == {"report.md", MANIFEST}
    assert (tmp_path / "report.md").read_text() == "two"


def test_full_disk_and_read_only_folder_are_one_line_and_leave_the_old_report(store, tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    def report(out: Path, *which: str) -> int:
        return cli.main(["report", *which, "--out", str(out), f"tracking.uri={store.uri}"])

    with _tmpfs(tmp_path / "disk", "size=4m") as disk:
        out = disk / "rep"
        assert report(out, "--sweep", "sw-axes") == 0
        before = _snapshot(out)
        filler = disk / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as fh:  # fill the disk to the last byte
            while True:
                fh.write(b"\0" * 65536)
        capsys.readouterr()
        assert report(out, "--all", "--experiment", "exp-b") == 2  # another report
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fp8lab: error: report.out: cannot write the report to {out}: "
                                                  "No space left on device"), err
        assert _snapshot(out) == before  # the first sweep's report, whole: never a mix of two
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "rep"]

    with _tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        capsys.readouterr()
        assert report(ro / "rep", "--sweep", "sw-axes") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "report.out: cannot write the report to" in err[0] and "Read-only file system" in err[0], err


def test_end_of_sweep_report_problem_never_fails_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(**_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("analysis.report.generate_report", disk_full)
    printed: list[str] = []
    plan = SimpleNamespace(config={"sweep": {"name": "x"}, "report": {"out": None}}, tracking_uri="sqlite:///x.db",
                           sweep_id="abc")
    cli._report_after_sweep(plan, SimpleNamespace(print=printed.append))
    assert len(printed) == 1 and printed[0].startswith("Report not written: OSError: [Errno 28] No space left"), printed
