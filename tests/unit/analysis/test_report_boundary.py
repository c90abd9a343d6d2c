"""analysis reads MLflow only: it must never import workloads, orchestrator or torch (docs/architecture.md)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FORBIDDEN = ("workloads", "orchestrator", "torch")


def test_no_forbidden_imports_in_source() -> None:
    offenders = []
    for path in sorted((ROOT / "analysis").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert not offenders, offenders


def test_generating_a_report_loads_no_torch(store, tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from analysis import generate_report, ReportOptions;"
        f"generate_report({store.uri!r}, None, 'sw-axes', False, Path({str(tmp_path)!r}),"
        " ReportOptions(log_to_mlflow=False));"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r});"
        "print('BAD', bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
