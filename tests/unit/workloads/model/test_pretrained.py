"""Building a packaged model's folder: atomic (a killed build leaves no half folder), built once
under concurrent callers, and a missing package is one line naming the install command."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from workloads.model import pretrained


@pytest.fixture()
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in GGUF file and cache folder; the real dequantizing build is the integration test's."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF fake weights")
    monkeypatch.setenv("FP8LAB_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "missing_requirements", lambda name: [])
    monkeypatch.setattr(pretrained, "gguf_path", lambda name: gguf)
    return gguf


def _fake_write(source: Path, out: Path) -> None:
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"w")


def test_missing_package_is_one_line_naming_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = pretrained.PackagedGguf("fake", "fp8lab_no_such_package", "x.gguf", "smollm2", 'pip install -e ".[smollm2]"', "")
    monkeypatch.setitem(pretrained.PACKAGED, "fake", spec)
    lines = pretrained.missing_requirements("fake")
    assert len(lines) == 1 and "fp8lab_no_such_package" in lines[0] and 'pip install -e ".[smollm2]"' in lines[0]
    with pytest.raises(ModuleNotFoundError, match="smollm2"):
        pretrained.ensure_folder("fake")


def test_folder_is_keyed_by_the_gguf_digest_and_built_once(fake_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def slow_write(source: Path, out: Path) -> None:
        calls.append(out)
        time.sleep(0.3)  # long enough for the other thread to wait on the lock
        _fake_write(source, out)

    monkeypatch.setattr(pretrained, "write_folder", slow_write)
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(pretrained.ensure_folder("smollm2-135m"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and found[0] == found[1]
    assert found[0].name == f"smollm2-135m-{pretrained.file_digest(fake_gguf)[:16]}"
    assert sorted(p.name for p in found[0].iterdir()) == ["config.json", "model.safetensors"]


def test_a_killed_build_leaves_no_half_folder(fake_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from workloads.model import pretrained
        pretrained.missing_requirements = lambda name: []
        pretrained.gguf_path = lambda name: Path({str(fake_gguf)!r})
        def half(source, out):
            (out / "config.json").write_text("{{}}")
            print("writing", flush=True)
            time.sleep(60)
        pretrained.write_folder = half
        pretrained.ensure_folder("smollm2-135m")
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    target = pretrained.folder_for("smollm2-135m", pretrained.file_digest(fake_gguf))
    assert not target.exists()  # only a finished build is ever renamed into place
    monkeypatch.setattr(pretrained, "write_folder", _fake_write)
    assert pretrained.ensure_folder("smollm2-135m") == target  # the next caller builds it
    assert not list(target.parent.glob(".*building-*"))  # and clears the killed build's leftovers


def test_preflight_names_the_install_command_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from workloads import preflight

    monkeypatch.setattr(preflight, "missing_requirements", lambda name: [f"model.name_or_path={name}: needs x (fix: y)"])
    assert preflight.check_model({"name_or_path": "smollm2-135m"}) == ["model.name_or_path=smollm2-135m: needs x (fix: y)"]
    assert preflight.check_model({"name_or_path": "embedded"}) == []
