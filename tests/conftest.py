"""Shared test setup: offline HF, quiet MLflow, a temp working dir per test where needed."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --- running on every core (pytest-xdist: `-n auto --dist loadgroup`, README's test command) ---------

_GIB = 1024 ** 3
WORKER_MEMORY_GIB = 3  # one worker plus the CLI / Ray / trial processes its integration tests start


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per usable core, but no more than memory holds. Integration tests
    start whole sweeps (a driver, Ray, trial workers) from their worker, so on a many-core box with
    little memory per core one worker per core would swap. PYTEST_XDIST_AUTO_NUM_WORKERS wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return cores
    return max(1, min(cores, memory // (WORKER_MEMORY_GIB * _GIB)))


def pytest_configure(config: pytest.Config) -> None:
    """In the xdist controller or a serial run, not in the workers: record each test's duration
    (the next run's scheduler starts the longest tests first, tests/support/unit_costs.py), and
    fail the run if it left run outputs in the checkout (tests/support/checkout_guard.py)."""
    if not hasattr(config, "workerinput"):
        from tests.support.checkout_guard import CheckoutGuard
        from tests.support.unit_costs import DurationRecorder

        config.pluginmanager.register(DurationRecorder(config), "fp8lab-durations")
        config.pluginmanager.register(CheckoutGuard(config.rootpath), "fp8lab-checkout-guard")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup`: tests of a module with a module-scoped fixture share a worker (built
    once), all others spread one by one (tests/support/xdist_groups.py says why not the marks)."""
    if config.getvalue("dist") != "loadgroup":
        return None  # any other --dist is honoured as asked
    from tests.support.xdist_groups import ModuleGroupScheduling

    return ModuleGroupScheduling(config, log)


@pytest.fixture(scope="session")
def run_shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this run sees: for setup built once per run, not once per
    worker (a session fixture runs in each worker that needs it). xdist gives each worker the base
    folder `<run's base>/<worker id>`, so the run's own folder is its parent; a serial run uses its
    base folder. Build into it under a lock (e.g. `filelock.FileLock`) and skip the build when it is
    done: the workers race for it."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    shared.mkdir(exist_ok=True)
    return shared
