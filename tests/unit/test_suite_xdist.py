"""The suite's xdist settings (README's test command, tests/conftest.py): with the flags of
README's command and two workers, a module-scoped fixture is built once and every test that uses
it runs on that worker, the longest test starts first, and a folder is shared by the workers;
`-n auto` never starts more workers than there are cores."""
from __future__ import annotations

import json
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


CONFTEST = ("from tests.conftest import (pytest_configure, pytest_xdist_auto_num_workers,  # noqa: F401\n"
            "                            pytest_xdist_make_scheduler, run_shared_dir)\n")
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


def _run(tmp_path: Path, *args: str, module: str = MODULE,
         cache: bool = False) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_mod.py").write_text(module)
    setups, users = tmp_path / "setups.txt", tmp_path / "users.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SETUPS_FILE": str(setups), "USERS_FILE": str(users)}
    env.pop("PYTEST_XDIST_AUTO_NUM_WORKERS", None)
    no_cache = [] if cache else ["-p", "no:cacheprovider"]
    proc = subprocess.run([sys.executable, "-m", "pytest", *no_cache, "--rootdir", str(tmp_path),
                           *args, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    read = lambda p: p.read_text().split() if p.exists() else []  # noqa: E731
    return proc, read(setups), read(users)


def _two_worker_flags() -> list[str]:
    flags = _command_flags()
    assert "-n" in flags and "--dist" in flags, flags
    flags[flags.index("-n") + 1] = "2"  # two workers even on a one-core machine
    return flags


def test_module_fixture_is_built_once_and_its_tests_share_a_worker(tmp_path: Path) -> None:
    proc, setups, users = _run(tmp_path, *_two_worker_flags())
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


# Tests that log (worker, name) as they start; test_z_slow is collected last, and its previous
# duration (seeded in pytest's cache) makes it the longest; every test also writes its worker id
# into the run's shared folder.
ORDERED = '''
import os

def _started(name, run_shared_dir):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.environ["USERS_FILE"], "a") as f:
        f.write(f"{worker}:{name}\\n")
    (run_shared_dir / worker).write_text(name)

def test_a(run_shared_dir):
    _started("a", run_shared_dir)

def test_b(run_shared_dir):
    _started("b", run_shared_dir)

def test_c(run_shared_dir):
    _started("c", run_shared_dir)

def test_d(run_shared_dir):
    _started("d", run_shared_dir)

def test_z_slow(run_shared_dir):
    _started("z_slow", run_shared_dir)
'''


def test_longest_test_starts_first_and_durations_are_recorded(tmp_path: Path) -> None:
    """The previous run's durations (pytest's cache) order the work: the test collected last but
    known to be the longest is the first its worker runs; this run's durations are written back;
    both workers see one shared folder."""
    durations = tmp_path / ".pytest_cache" / "v" / "fp8lab" / "durations"
    durations.parent.mkdir(parents=True)
    durations.write_text(json.dumps({"test_mod.py::test_z_slow": 100.0}))
    basetemp = tmp_path / "base"
    proc, _, started = _run(tmp_path, *_two_worker_flags(), f"--basetemp={basetemp}", module=ORDERED, cache=True)
    assert proc.returncode == 0 and "5 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    first_per_worker = {}
    for line in started:
        worker, name = line.split(":")
        first_per_worker.setdefault(worker, name)
    assert sorted(first_per_worker) == ["gw0", "gw1"], started
    assert "z_slow" in first_per_worker.values(), started  # collected last, run first
    recorded = json.loads(durations.read_text())
    assert set(recorded) == {f"test_mod.py::test_{n}" for n in ("a", "b", "c", "d", "z_slow")}, recorded
    assert recorded["test_mod.py::test_z_slow"] < 100.0  # replaced by this run's measurement
    assert sorted(p.name for p in (basetemp / "shared").iterdir()) == ["gw0", "gw1"]  # one folder, both workers


def test_units_are_ordered_by_cost_with_defaults_by_folder() -> None:
    from tests.support.unit_costs import DEFAULT_OTHER_S, DEFAULT_S, cost_of
    from tests.support.xdist_groups import longest_first

    costs = {"tests/unit/x.py::test_known": 50.0}
    assert cost_of("tests/unit/x.py::test_known", costs) == 50.0
    assert cost_of("tests/integration/test_new.py::test_t", costs) == DEFAULT_S["tests/integration/"]
    assert cost_of("tests/unit/y.py::test_t", costs) == DEFAULT_OTHER_S
    units = [("tests/unit/a.py::test_1", {"tests/unit/a.py::test_1": False}),
             ("tests/unit/b.py", {f"tests/unit/b.py::test_{i}": False for i in range(3)}),
             ("tests/integration/test_c.py::test_1", {"tests/integration/test_c.py::test_1": False}),
             ("tests/unit/x.py::test_known", {"tests/unit/x.py::test_known": False}),
             ("tests/unit/d.py::test_1", {"tests/unit/d.py::test_1": False})]
    order = [scope for scope, _ in longest_first(units, costs)]
    assert order == ["tests/unit/x.py::test_known", "tests/integration/test_c.py::test_1", "tests/unit/b.py",
                     "tests/unit/a.py::test_1", "tests/unit/d.py::test_1"]  # a module unit: the sum of its tests


LEAKY = '''
import os

def test_writes_a_store_into_the_checkout():
    os.makedirs("mlruns/0", exist_ok=True)
'''


def test_run_outputs_left_in_the_checkout_fail_the_run(tmp_path: Path) -> None:
    """A test that writes MLflow's `./mlruns` into the checkout (its working folder) passes, but
    the run fails, naming the folder; with README's flags the check runs in the xdist controller."""
    proc, _, _ = _run(tmp_path, *_two_worker_flags(), module=LEAKY)
    assert "1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert f"the tests wrote mlruns into the checkout {tmp_path}" in proc.stdout, proc.stdout[-2000:]


def test_run_outputs_already_in_the_checkout_are_left_alone(tmp_path: Path) -> None:
    """A user's own sweep store in the checkout is not the tests' doing: the run passes."""
    (tmp_path / "mlruns").mkdir()
    proc, _, _ = _run(tmp_path, "-p", "no:xdist", module=LEAKY)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
