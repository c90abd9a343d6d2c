"""Which tests must share an xdist worker: those of a module that defines a module-, class- or
package-scoped fixture, so that its expensive setup (a CLI trial and its store, a model, a report)
is built once, as in a serial run, while every other test is scheduled on its own.

Why a scheduler and not `xdist_group` marks: with pytest 9 the marks have no effect (xdist 3.8
writes the group into `item._nodeid`, which pytest 9 no longer reads), and `--dist loadfile` would
keep all 37 bad-input cases or all CLI trials of one file on one worker. The scheduler sees only
node ids, so the modules are found by reading the test files (AST, nothing imported).

Work units are handed out longest first (costs from tests/support/unit_costs.py), so that the
run does not end with one worker idle while the other finishes a two-minute sweep.
"""
from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from xdist.scheduler import LoadGroupScheduling

from tests.support.unit_costs import known_costs, unit_cost

SHARED_SCOPES = {"module", "class", "package"}


def _fixture_scope(decorator: ast.expr) -> str | None:
    """The scope of a `@pytest.fixture(scope=...)` decorator, None for anything else."""
    if not isinstance(decorator, ast.Call):
        return None
    func = decorator.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != "fixture":
        return None
    scope = next((k.value for k in decorator.keywords if k.arg == "scope"), None)
    return scope.value if isinstance(scope, ast.Constant) and isinstance(scope.value, str) else None


def defines_shared_fixture(path: Path) -> bool:
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(_fixture_scope(d) in SHARED_SCOPES for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for d in node.decorator_list)


def shared_setup_modules(rootdir: Path) -> set[str]:
    """Node-id paths (relative to `rootdir`) of the test modules that define a shared fixture."""
    return {path.relative_to(rootdir).as_posix() for path in rootdir.rglob("test_*.py")
            if ".venv" not in path.parts and defines_shared_fixture(path)}


def longest_first(units: Iterable[tuple[str, Mapping[str, bool]]],
                  costs: Mapping[str, float]) -> list[tuple[str, Mapping[str, bool]]]:
    """Work units (scope, {node id: done}) by estimated cost, longest first; ties keep their order."""
    return sorted(units, key=lambda unit: -unit_cost(unit[1], costs))


class ModuleGroupScheduling(LoadGroupScheduling):
    """`--dist loadgroup`, plus: the tests of a module with a shared fixture are one work unit."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self.shared_modules = shared_setup_modules(Path(config.rootpath))
        self.costs = known_costs(config)
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        if scope != nodeid:  # an xdist_group that reached the node id
            return scope
        module = nodeid.split("::", 1)[0]
        return module if module in self.shared_modules else nodeid

    def _assign_work_unit(self, node) -> None:
        """Before the first unit leaves, order the queue by cost, longest first (stable: equal
        costs keep collection order). The queue is complete by then: xdist builds it whole from
        the collection before it assigns anything."""
        if not self._ordered:
            units = longest_first(self.workqueue.items(), self.costs)
            self.workqueue.clear()
            self.workqueue.update(units)
            self._ordered = True
        super()._assign_work_unit(node)
