"""Every import boundary docs/architecture.md states, checked on the code (module-level and
deferred imports alike, read with ast; nothing is imported except in the torch-free test).

A rule here and a row in docs/architecture.md change together."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# workloads/: which workloads package may import which (a package is its first name below
# `workloads.`; a top module such as `trial` counts as a package of one file).
STAGES = ("data", "model", "train", "eval", "record", "precision", "health", "export", "embedded")
SPINE = ("recipe", "trial", "entry", "preflight", "bench")
MAY_IMPORT: dict[str, set[str]] = {
    "registry": set(),
    "embedded": {"eval", "model"},  # the calibration script trains and scores the shipped model
    "precision": {"registry"},
    "data": {"eval", "model"},  # data checks: which task the data folder serves, the model's tokenizer
    "model": set(),
    "train": set(),
    "eval": {"embedded"},
    "health": {"precision"},
    "record": {"data", "eval"},  # run inputs: where the training rows came from, which tasks scored
    "export": {"embedded", "model", "precision", "record"},
    "recipe": {"data", "model", "train", "eval", "precision", "health", "embedded", "export"},
    "trial": {"recipe", "record", "precision"},  # the lifecycle only (+ the ladder tags of what ran)
    "entry": {"trial"},
    "preflight": {"data", "model", "eval", "precision", "embedded", "health"},
    "bench": {"recipe", "train", "data"},  # the paired speed probe: trials set up by the spine, run in chunks
}
# What the orchestrator may import from workloads, and whether only inside a function (lazily).
ORCHESTRATOR_MAY = {
    "workloads.precision.backends.entries": "anywhere",  # the backend names, torch-free
    "workloads.health.rules": "anywhere",  # the rule engine is pure Python (schema checks the rules file)
    "workloads.preflight": "lazily",  # `fp8lab trial` checks its config in-process
    "workloads.entry": "lazily",  # inside the Ray task / `fp8lab trial`
    "workloads.bench": "lazily",  # `fp8lab bench` and sweep.speed_probe, inside the command / the Ray task
    "workloads.export.run": "anywhere",  # FORMATS (torch-free at module level); the export itself lazily
}
MLFLOW_ONLY_IN = ("workloads/record/",)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in ``path``; ``from a import b``
    yields ``a.b`` too, so a submodule imported by name counts."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, id(node) in top))
            found += [(f"{node.module}.{a.name}", id(node) in top) for a in node.names]
    return found


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "workloads" and len(parts) > 1 else None


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_every_workloads_package_imports_only_what_the_table_allows() -> None:
    problems = []
    for path in _files("workloads"):
        rel = path.relative_to(ROOT / "workloads")
        me = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if me == "__init__":
            continue
        allowed = MAY_IMPORT.get(me)
        assert allowed is not None, f"workloads/{rel}: a new package; give it a row in MAY_IMPORT and docs/architecture.md"
        for module, _ in _imports(path):
            other = _package(module)
            if other and other != me and other not in allowed and module != "workloads":
                problems.append(f"workloads/{rel} imports {module} ({me} -> {other})")
            if module.split(".")[0] in ("orchestrator", "analysis"):
                problems.append(f"workloads/{rel} imports {module}")
    assert problems == []


def test_only_record_imports_mlflow_in_workloads() -> None:
    offenders = [f"{p.relative_to(ROOT)}: {m}" for p in _files("workloads") for m, _ in _imports(p)
                 if m.split(".")[0] == "mlflow" and not str(p.relative_to(ROOT)).startswith(MLFLOW_ONLY_IN)]
    assert offenders == []


def test_the_orchestrator_imports_from_workloads_only_what_the_table_allows() -> None:
    problems = []
    for path in _files("orchestrator"):
        for module, at_top in _imports(path):
            if module.split(".")[0] != "workloads" or module == "workloads":
                continue
            rule = next((v for k, v in ORCHESTRATOR_MAY.items() if module == k or module.startswith(k + ".")), None)
            if rule is None or (rule == "lazily" and at_top):
                problems.append(f"{path.relative_to(ROOT)} imports {module}" + (" at module level" if rule else ""))
    assert problems == []


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import os\ndef f():\n    from workloads.trial import run_trial\n")
    assert _imports(sample) == [("os", True), ("workloads.trial", False), ("workloads.trial.run_trial", False)]


TORCH_FREE = ("orchestrator.cli", "orchestrator.schema", "orchestrator.plan", "orchestrator.sweep",
              "orchestrator.export_cmd", "workloads.precision.backends.entries", "workloads.health.rules",
              "workloads.registry")


def test_the_orchestrator_side_loads_no_torch() -> None:
    """One fresh interpreter imports every module the driver loads: torch must stay out."""
    code = (f"import sys\nfor m in {TORCH_FREE!r}: __import__(m)\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
