"""Digests of what decides an evaluation's score, for the trial id (`orchestrator.trial_id`):
a task's answers edited in place must give a new id, or a rerun reports accuracies scored
against the old answers as if they were new.

What is covered, without importing lm-eval (the driver stays light; lm-eval's task index takes
5-20 s to build):
- lm-eval's version (its built-in task YAMLs and scoring code ship with it);
- every file of fp8lab's own task folder and of `eval.include_path` (task YAMLs, their
  `include:`d templates, loaders such as `dataset.py`, data kept beside them);
- for every YAML among those (and a task given as a YAML path), the local files it points at:
  `include:`, `dataset_path`, `dataset_kwargs.data_files` / `data_dir`, `metadata.data_dir`,
  resolved against the YAML's folder and against the working folder (lm-eval passes
  `data_files` to `datasets`, which resolves them there), and whole folders where a folder is
  named.
Files are hashed by `content_digest` (same cache rule as the training data). A task on the hub
(`dataset_path: allenai/ai2_arc`) stands for itself, like a hub model.
"""
from __future__ import annotations

import importlib.metadata
import importlib.resources
from pathlib import Path
from typing import Any, Iterator

import yaml

from orchestrator.content_digest import files_digest

_LOCAL_KEYS = (("include",), ("dataset_path",), ("dataset_kwargs", "data_files"), ("dataset_kwargs", "data_dir"),
               ("metadata", "data_dir"))


class _TaskYamlLoader(yaml.SafeLoader):
    """Reads lm-eval task YAMLs, whose `!function module.name` tags name Python code."""


_TaskYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def eval_digests(config: dict[str, Any]) -> dict[str, str]:
    """{'lm_eval': version, 'eval_files': digest} for the trial id."""
    ev = config["eval"]
    tasks = [t for t in (ev.get("tasks") or [ev.get("task")]) if t]
    roots = _task_roots(ev.get("include_path"))
    files = sorted(_eval_files(roots, tasks))
    # named relative to fp8lab's task folder or the include path: a checkout elsewhere is the same trial
    return {"lm_eval": _lm_eval_version(), "eval_files": files_digest(files, [*roots, Path("/")])}


def _lm_eval_version() -> str:
    try:
        return importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _task_roots(include_path: str | None) -> list[Path]:
    """fp8lab's own task folder, then `eval.include_path` (when set)."""
    roots = [Path(str(importlib.resources.files("workloads.embedded"))) / "tasks"]
    return roots + ([Path(include_path).expanduser()] if include_path else [])


def _eval_files(roots: list[Path], tasks: list[str]) -> set[Path]:
    files = {f for root in roots for f in _files_under(root)}
    files |= {Path(t).expanduser().resolve() for t in tasks if t.endswith((".yaml", ".yml")) and Path(t).expanduser().is_file()}
    pending = [f for f in files if f.suffix in (".yaml", ".yml")]
    while pending:  # follow YAMLs to the files they name (and YAMLs those name)
        for found in _referenced(pending.pop()):
            if found not in files:
                files.add(found)
                pending += [found] if found.suffix in (".yaml", ".yml") else []
    return files


def _files_under(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path.resolve()
    elif path.is_dir():
        yield from (p.resolve() for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                    and not p.name.startswith("."))


def _referenced(task_yaml: Path) -> Iterator[Path]:
    """Local files and folders a task YAML names."""
    try:
        doc = yaml.load(task_yaml.read_text(encoding="utf-8"), Loader=_TaskYamlLoader)  # noqa: S506 - a SafeLoader
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # preflight reports an unreadable task; its bytes are in the digest already
    if not isinstance(doc, dict):
        return
    for keys in _LOCAL_KEYS:
        for value in _values(doc, keys):
            for base in (task_yaml.parent, Path.cwd()):
                candidate = (base / Path(value).expanduser())
                if candidate.exists():
                    yield from _files_under(candidate)
                    break


def _values(doc: dict[str, Any], keys: tuple[str, ...]) -> Iterator[str]:
    node: Any = doc
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        yield from (v for v in node if isinstance(v, str))
    elif isinstance(node, dict):  # data_files: {split: path or [paths]}
        for v in node.values():
            yield from ([v] if isinstance(v, str) else [x for x in v if isinstance(x, str)] if isinstance(v, list) else [])
