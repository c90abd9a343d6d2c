"""Dataset loader for fp8lab's lm-eval task YAMLs (`custom_dataset: !function dataset.load_splits`).

lm-eval imports this file by path (next to the YAML), so it must not rely on package imports.
It reads `<data_dir>/<split>.jsonl` into a `datasets.DatasetDict`; `data_dir` comes from the
task's metadata (YAML `metadata: {data_dir: ...}` or `TaskManager(metadata=...)`) and defaults
to the task shipped in `workloads/embedded/assets/task/`, so the YAML works from any cwd and
from an installed wheel.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHIPPED_DATA_DIR = Path(__file__).resolve().parent.parent / "assets" / "task"
SPLITS = ("train", "validation", "test")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """JSONL rows, each checked for {"prompt": str, "choices": [str, ...], "answer": int}."""
    rows = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            choices = row.get("choices")
            ok = (
                isinstance(row.get("prompt"), str)
                and isinstance(choices, list)
                and len(choices) >= 2
                and all(isinstance(c, str) for c in choices)
                and isinstance(row.get("answer"), int)
                and 0 <= row["answer"] < len(choices)
            )
            if not ok:
                raise ValueError(
                    f"{path}:{line_no}: expected {{\"prompt\": str, \"choices\": [str, ...], "
                    f"\"answer\": index into choices}}, got {line.strip()[:200]}"
                )
            rows.append({"prompt": row["prompt"], "choices": choices, "answer": row["answer"]})
    return rows


def load_splits(data_dir: str | None = None, **_: Any):
    """DatasetDict of the JSONL splits found in data_dir (test and train are required)."""
    import datasets

    folder = Path(data_dir).expanduser() if data_dir else SHIPPED_DATA_DIR
    found = {s: folder / f"{s}.jsonl" for s in SPLITS if (folder / f"{s}.jsonl").is_file()}
    missing = [s for s in ("train", "test") if s not in found]
    if missing:
        raise FileNotFoundError(f"task data folder {folder} lacks {', '.join(f'{s}.jsonl' for s in missing)}")
    return datasets.DatasetDict({s: datasets.Dataset.from_list(read_rows(p)) for s, p in found.items()})


load_splits.fp8lab_loader = True  # lets fp8lab check that a task honours `data_dir`
