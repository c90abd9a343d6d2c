"""What ran where: device, backend, emulated or real FP8, package versions, git commit.

Read from tags/params of the trial runs and the parent run, plus an optional `env.json`
artifact. Every source is optional; absent information is reported as "not recorded".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from fp8lab_conf.contracts import TAG_BACKEND, TAG_DEVICE, TAG_EMULATED, TAG_GIT_COMMIT

_VERSION_COL = re.compile(r"^(?:tags|params)\.(?:fp8lab\.)?versions?\.(.+)$")
_COMMIT_COLS = ("tags.mlflow.source.git.commit", f"tags.{TAG_GIT_COMMIT}", f"params.{TAG_GIT_COMMIT}")


def _distinct(raw: pd.DataFrame, col: str) -> list[str]:
    if col not in raw.columns:
        return []
    return sorted({str(v) for v in raw[col].dropna() if str(v) != ""})


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value if isinstance(value, str) else json.dumps(value)


def environment_items(
    raw: pd.DataFrame, parent: Mapping[str, Any] | None, env_json: Mapping[str, Any] | None
) -> list[tuple[str, str]]:
    """(label, value) pairs; a field with several values across runs lists them all."""
    items: list[tuple[str, str]] = []

    def add(label: str, values: list[str]) -> None:
        items.append((label, ", ".join(values) if values else "not recorded"))

    add("device", _distinct(raw, f"tags.{TAG_DEVICE}"))
    add("backend", _distinct(raw, f"tags.{TAG_BACKEND}"))
    emu = _distinct(raw, f"tags.{TAG_EMULATED}")
    emulated = [v for v in emu if v.lower() in ("true", "1", "yes")]
    items.append(
        (
            "FP8",
            "emulated (quantize-dequantize; speed not representative of FP8 hardware)"
            if emulated
            else ("real FP8 kernels" if emu else "not recorded"),
        )
    )
    versions: dict[str, set[str]] = {}
    frames = [raw]
    if parent:
        prow = {"tags." + k: v for k, v in (parent.get("tags") or {}).items()}
        prow.update({"params." + k: v for k, v in (parent.get("params") or {}).items()})
        frames.append(pd.DataFrame([prow]))
    commits: set[str] = set()
    for frame in frames:
        for col in frame.columns:
            m = _VERSION_COL.match(col)
            if m:
                versions.setdefault(m.group(1), set()).update(str(v) for v in frame[col].dropna() if str(v))
        for col in _COMMIT_COLS:
            commits.update(_distinct(frame, col))
    for name in sorted(versions):
        items.append((name, ", ".join(sorted(versions[name])) or "not recorded"))
    if not versions:
        items.append(("package versions", "not recorded"))
    add("git commit", sorted(commits))
    if env_json:
        flat: dict[str, str] = {}
        _flatten("", env_json, flat)
        for k in sorted(flat):
            items.append((f"env.json: {k}", flat[k]))
    return items
