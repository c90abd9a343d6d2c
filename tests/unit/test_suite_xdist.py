"""The suite's xdist settings (README's test command, tests/conftest.py): with the flags of
README's command and two workers, a module-scoped fixture is built once and every test that uses
it runs on that worker; `-n auto` never starts more workers than there are cores."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTEST = re.compile(r"python -m pytest (.*) tests$", re.M)


def _command_flags() -> list[str]:
    """The pytest flags of README's test command, which .ci/run must run as is."""
    readme = PYTEST.findall((ROOT / "README.md").read_text())
    ci = PYTEST.findall((ROOT / ".ci" / "run").read_text())
    assert len(readme) == 1 and ci == readme, (readme, ci)
    return readme[0].split()


CONFTEST = "from tests.conftest import pytest_xdist_auto_num_workers, pytest_xdist_make_scheduler  # noqa: F401\n"
MODULE = '''
import os
import pytest

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    with open(os.environ["SETUPS_FILE"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return 42

@pytest.mark.parametrize("i", range(6))
def test_uses_it(built, i):
    with open(os.environ["USERS_FILE"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    assert built == 42

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    assert i >= 0
'''


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_mod.py").write_text(MODULE)
    setups, users = tmp_path / "setups.txt", tmp_path / "users.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SETUPS_FILE": str(setups), "USERS_FILE": str(users)}
    env.pop("PYTEST_XDIST_AUTO_NUM_WORKERS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           *args, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    read = lambda p: p.read_text().split() if p.exists() else []  # noqa: E731
    return proc, read(setups), read(users)


def test_module_fixture_is_built_once_and_its_tests_share_a_worker(tmp_path: Path) -> None:
    flags = _command_flags()
    assert "-n" in flags and "--dist" in flags, flags
    flags[flags.index("-n") + 1] = "2"  # two workers even on a one-core machine
    proc, setups, users = _run(tmp_path, *flags)
    assert proc.returncode == 0 and "12 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(setups) == 1 and setups[0].startswith("gw"), setups  # once, on a worker
    assert users == setups * 6  # every user of the fixture ran where it was built


def test_auto_workers_are_capped_by_cores(monkeypatch) -> None:
    from tests.conftest import pytest_xdist_auto_num_workers

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert 1 <= pytest_xdist_auto_num_workers(None) <= cores
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "7")
    assert pytest_xdist_auto_num_workers(None) == 7  # the user's number wins


def test_modules_with_a_shared_fixture_are_found_by_reading_them(tmp_path: Path) -> None:
    from tests.support.xdist_groups import shared_setup_modules

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_a.py").write_text(MODULE)  # scope="module"
    (tmp_path / "test_b.py").write_text("import pytest\n\n@pytest.fixture(autouse=True, scope='class')\ndef c():\n    pass\n")
    (tmp_path / "test_c.py").write_text("import pytest\n\n@pytest.fixture\ndef f():\n    pass\n\n"
                                        "@pytest.fixture(scope='session')\ndef s():\n    pass\n")
    (tmp_path / "conftest.py").write_text("import pytest\n\n@pytest.fixture(scope='module')\ndef m():\n    pass\n")
    assert shared_setup_modules(tmp_path) == {"sub/test_a.py", "test_b.py"}  # function/session scope and conftest: no
