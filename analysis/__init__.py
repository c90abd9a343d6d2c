"""fp8lab analysis: MLflow runs -> tidy table -> statistics -> figures -> report.

Reads MLflow only; never imports `workloads`, `orchestrator` or torch, so a report can be
generated on a laptop that has only the tracking store.

Public API: `generate_report`, `ReportOptions`, `ReportResult`, `ReportError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from analysis.errors import ReportError
from analysis.options import ReportOptions

if TYPE_CHECKING:
    from analysis.report import ReportResult, generate_report

__all__ = ["ReportError", "ReportOptions", "ReportResult", "generate_report"]


def __getattr__(name: str) -> Any:
    # Lazy: `import analysis` for ReportOptions/ReportError should not pay for matplotlib/scipy.
    if name in ("generate_report", "ReportResult"):
        from analysis import report

        return getattr(report, name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
