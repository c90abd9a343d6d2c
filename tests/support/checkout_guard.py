"""The test run leaves no run outputs in the checkout.

Why: MLflow puts an experiment created without an artifact location, and a model logged outside
an active run, under `./mlruns` of the process's working folder, which for the tests is the
checkout. Such files outlive the run, mix with a user's own sweeps there, and hide a product bug
where the product is the one writing them (an exported model once landed in the Default
experiment's `./mlruns/0` rather than beside its run). The run outputs are the ones `.gitignore`
lists; a name already there when the run starts is left alone (a user's own sweep).

Checked once, in the process that runs the session (the xdist controller, or a serial run), after
every test has ended: the run fails with a line naming what appeared.
"""
from __future__ import annotations

from pathlib import Path

import pytest

RUN_OUTPUTS = ("mlruns", "mlartifacts", "mlflow.db", "outputs", "multirun", "fp8lab-runs", "fp8lab-report")


class CheckoutGuard:
    """Plugin: notes which run outputs exist at the start, fails the run if others appear."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.before = self._present()

    def _present(self) -> set[str]:
        return {name for name in RUN_OUTPUTS if (self.root / name).exists()}

    def new_outputs(self) -> list[str]:
        """Run outputs in the checkout now that were not there at the start, sorted."""
        return sorted(self._present() - self.before)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        appeared = self.new_outputs()
        if not appeared:
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = (f"the tests wrote {', '.join(appeared)} into the checkout {self.root} (fix: give the store or "
                "experiment a folder under tmp_path, e.g. create_experiment(..., artifact_location=...))")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
