"""`collection_paused` holds collections for a block and gives them back as they were;
`skip_final_collection`: the exit skips the collector's walk, and nothing a user can observe."""
from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab_conf.garbage_collection import collection_paused
from orchestrator import cli

# A process that ends the way fp8lab's processes do: work, skip_final_collection(), exit.
CHILD = """
import atexit, sys, threading, time
from fp8lab_conf.garbage_collection import skip_final_collection
out = open(sys.argv[1], "w")
out.write("buffered, never flushed by hand")  # freed by reference counting at exit: closed, flushed
cycle = {}
cycle["self"] = cycle  # garbage the skipped walk would have found: it must not matter
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined", flush=True))).start()
skip_final_collection()
print("exiting", flush=True)
sys.exit(3)
"""


def test_exit_after_skipping_the_collection_keeps_code_atexit_threads_and_buffered_files(tmp_path: Path) -> None:
    written = tmp_path / "out.txt"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(written)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.splitlines() == ["exiting", "thread joined", "atexit ran"]  # the interpreter's order
    assert written.read_text() == "buffered, never flushed by hand"
    assert proc.stderr == ""


def test_the_fp8lab_command_skips_the_collection_after_main_and_exits_with_its_code(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cli, "main", lambda: calls.append("main") or 2)
    monkeypatch.setattr(cli, "skip_final_collection", lambda: calls.append("skip"))
    with pytest.raises(SystemExit) as exited:
        cli.run()
    assert exited.value.code == 2 and calls == ["main", "skip"]


def test_the_installed_fp8lab_command_is_the_entry_point_that_skips_it() -> None:
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "fp8lab"]
    assert script.value == "orchestrator.cli:run"


def test_collection_paused_holds_collections_and_restores_the_setting_even_on_error() -> None:
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ImportError), collection_paused():
        raise ImportError("a failed import")
    assert gc.isenabled()
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()  # switched off before: stays off
    finally:
        gc.enable()
