"""Where the shipped model, task data and task YAMLs are (real files both in a checkout and in
an installed wheel): the one lookup every stage and test uses."""
from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EmbeddedPaths:
    model_dir: Path  # base model + tokenizer (save_pretrained folder)
    data_dir: Path  # {train,validation,test}.jsonl
    tasks_dir: Path  # lm-eval task YAMLs (pass as include_path)


def embedded_paths() -> EmbeddedPaths:
    """Folders of the model, task data and task YAMLs shipped in the `workloads.embedded` package
    (real files both in a checkout and in an installed wheel)."""
    root = importlib.resources.files("workloads.embedded")
    base = Path(str(root))
    return EmbeddedPaths(base / "assets" / "base_model", base / "assets" / "task", base / "tasks")
