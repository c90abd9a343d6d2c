"""What a test costs, so that the xdist scheduler starts the longest work first.

Why: with two workers the suite's wall time is the busier worker's time. Scheduled in collection
order, a two-minute test that starts last leaves the other worker idle for two minutes; started
longest first (LPT), the short unit tests fill the gaps at the end. The cost of a test is, in
order: its duration in the previous run on this machine (pytest's cache, key `fp8lab/durations`,
written by `DurationRecorder`), its entry in `known_costs.json` (measured, committed: a fresh clone
or CI has no cache), else a default by folder (an integration test starts a CLI, Ray, trials).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

CACHE_KEY = "fp8lab/durations"
KNOWN_COSTS = Path(__file__).with_name("known_costs.json")
# Defaults by node-id prefix, first match: an integration test starts a CLI, Ray and trials; a
# benchmark smoke test runs a benchmark script, several of which launch `fp8lab` sweeps
DEFAULT_S = {"tests/integration/": 20.0, "tests/unit/benchmarks/": 10.0, "tests/gpu/": 5.0}
DEFAULT_OTHER_S = 0.5


def known_costs(config: pytest.Config | None = None) -> dict[str, float]:
    """Seconds per node id: the committed list, overlaid with the previous run's durations."""
    costs = dict(json.loads(KNOWN_COSTS.read_text())["seconds"])
    cache = getattr(config, "cache", None)
    if cache is not None:
        costs.update(cache.get(CACHE_KEY, {}))
    return costs


def cost_of(nodeid: str, costs: Mapping[str, float]) -> float:
    if nodeid in costs:
        return float(costs[nodeid])
    return next((s for prefix, s in DEFAULT_S.items() if nodeid.startswith(prefix)), DEFAULT_OTHER_S)


def unit_cost(nodeids: Iterable[str], costs: Mapping[str, float]) -> float:
    """A work unit (one test, or a module that shares a fixture) costs the sum of its tests."""
    return sum(cost_of(nodeid, costs) for nodeid in nodeids)



class DurationRecorder:
    """Sums setup + call + teardown per test as reports arrive (on the xdist controller, or in a
    serial run) and merges them into pytest's cache at the end, for the next run's order."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is not None and self.seconds:
            cache.set(CACHE_KEY, {**cache.get(CACHE_KEY, {}), **{k: round(v, 2) for k, v in self.seconds.items()}})
