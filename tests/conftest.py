"""Shared test setup: offline HF, quiet MLflow, a temp working dir per test where needed."""
from __future__ import annotations

import os

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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup`: tests of a module with a module-scoped fixture share a worker (built
    once), all others spread one by one (tests/support/xdist_groups.py says why not the marks)."""
    if config.getvalue("dist") != "loadgroup":
        return None  # any other --dist is honoured as asked
    from tests.support.xdist_groups import ModuleGroupScheduling

    return ModuleGroupScheduling(config, log)
