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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns xdist_group marks into node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a module- or class-scoped fixture of its own module runs on the same xdist
    worker as the module's other such tests, so that the expensive setup (a CLI trial, a model, a
    store) is built once, as without xdist, and not once per worker. Ignored without
    `--dist loadgroup`; an explicit xdist_group mark wins."""
    for item in items:
        if item.get_closest_marker("xdist_group") or not hasattr(item, "_fixtureinfo"):
            continue
        module = item.nodeid.split("::", 1)[0]
        shared = [defs[-1] for defs in item._fixtureinfo.name2fixturedefs.values()
                  if defs and defs[-1].scope in ("module", "class") and defs[-1].baseid == module]
        if shared:
            item.add_marker(pytest.mark.xdist_group(module))
