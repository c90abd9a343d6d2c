"""Evaluate an in-memory (already fine-tuned) model with lm-eval.

    result = evaluate_model(model, tokenizer, task="fp8lab_embedded", limit=None, batch_size=32)
    result["accuracy"], result["accuracy_stderr"], result["n"]

The model is whatever the trial trained — a PeftModel, possibly with base linears swapped for
FP8 emulation modules — wrapped as-is in lm-eval's HFLM; nothing is reloaded, nothing touches
the hub. Tasks are found by name among lm-eval's registered tasks, fp8lab's own task folder
(`workloads/embedded/tasks`) and an optional `include_path` of the user's YAMLs. `data_dir`
points fp8lab tasks (those built on `_fp8lab_mc.yaml`) at another folder of
`{train,test}.jsonl` rows with the same fields: {"prompt", "choices", "answer"}.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.resources
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

EMBEDDED_TASK = "fp8lab_embedded"
METRIC = "acc"


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


def _include_paths(include_path: str | Path | list[str | Path] | None) -> tuple[str, ...]:
    extra = [] if include_path is None else list(include_path) if isinstance(include_path, (list, tuple)) else [include_path]
    paths = [str(embedded_paths().tasks_dir)]
    for p in extra:
        path = Path(p).expanduser()
        if not path.exists():
            raise ValueError(f"include_path {str(p)!r} does not exist")
        paths.append(str(path.resolve()))
    return tuple(paths)


@functools.lru_cache(maxsize=16)
def _task_manager(include_paths: tuple[str, ...], with_defaults: bool, data_dir: str | None) -> Any:
    from lm_eval.tasks import TaskManager

    metadata = {"data_dir": data_dir} if data_dir else None
    return TaskManager(include_path=list(include_paths), include_defaults=with_defaults, metadata=metadata)


def task_manager(
    task: str,
    include_path: str | Path | list[str | Path] | None = None,
    data_dir: str | Path | None = None,
) -> Any:
    """A cached lm-eval TaskManager that knows `task`.

    Indexing lm-eval's ~15k built-in YAMLs takes 5-20 s, so fp8lab's own tasks and the user's
    `include_path` are tried first with a manager over just those folders; the full index is
    built (once per process) only for a task found nowhere else. Raises ValueError with a
    did-you-mean for an unknown task."""
    paths = _include_paths(include_path)
    data = str(Path(data_dir).expanduser().resolve()) if data_dir is not None else None
    if data is not None and not Path(data).is_dir():
        raise ValueError(f"data_dir {str(data_dir)!r} is not a folder")
    if task.endswith((".yaml", ".yml")) and Path(task).expanduser().is_file():
        return _task_manager(paths, True, data)
    if task in _task_manager(paths, False, None).all_tasks:
        return _task_manager(paths, False, data)
    full = _task_manager(paths, True, None)
    if task in full.all_tasks:
        return _task_manager(paths, True, data) if data else full
    close = difflib.get_close_matches(task, full.all_tasks, n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"unknown lm-eval task {task!r}.{hint} ({len(full.all_tasks)} tasks are registered, e.g. "
        f"{EMBEDDED_TASK!r}; add a folder of task YAMLs with include_path=...)"
    )


def check_task_exists(task: str, include_path: str | Path | list[str | Path] | None = None) -> None:
    """Raise ValueError (with a did-you-mean) unless `task` is a registered lm-eval task, group
    or tag, one of fp8lab's, one in `include_path`, or a path to a task YAML. Call it before
    training starts: it is instant for fp8lab's tasks and takes seconds for lm-eval's (once)."""
    task_manager(task, include_path)


def evaluate_model(
    model: Any,
    tokenizer: Any,
    *,
    task: str = EMBEDDED_TASK,
    data_dir: str | Path | None = None,
    include_path: str | Path | list[str | Path] | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    num_fewshot: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Accuracy of an in-memory causal LM on one lm-eval task (multiple choice, metric `acc`).

    Returns {"accuracy", "accuracy_stderr", "task", "n", "raw", "samples", "results"}; `raw` is
    lm-eval's results dict for the task, `samples` its per-item values of the metric (see
    `item_values`), `results` lm-eval's whole output minus samples, as plain JSON. The model is put in eval mode for the call and its previous mode restored;
    lm-eval seeds the global RNGs (python, numpy, torch) for a reproducible evaluation, and
    their previous states are restored afterwards. `device` is where the model already lives
    (an in-memory model is never moved; HFLM takes the device from the model).
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    manager = task_manager(task, include_path, data_dir)
    was_training = model.training
    model.eval()
    try:
        with _quiet_lm_eval(), _preserved_rng_state():
            tasks = list(manager.load([task])["tasks"].values())  # built once, handed to lm-eval
            if data_dir is not None:
                _check_honours_data_dir(tasks)
            lm = HFLM(
                pretrained=model,
                tokenizer=tokenizer,
                batch_size=batch_size,
                device=device,
                softmax_dtype="float32",  # BF16 log-probs are too coarse to rank close choices
            )
            out = simple_evaluate(
                model=lm,
                tasks=tasks,
                num_fewshot=num_fewshot,
                limit=limit,
                task_manager=manager,
                log_samples=True,  # per-item values: the report pairs policies on items
                # >0 or lm-eval reports no stderr at all; `acc` (a mean) gets the closed form,
                # only bootstrappable metrics of other tasks resample
                bootstrap_iters=1000,
            )
    finally:
        model.train(was_training)

    if out is None:  # only on non-zero ranks of a distributed run
        raise RuntimeError("lm-eval returned no results")
    results = out["results"]
    name = task if task in results else next(iter(results))
    raw = results[name]
    metric_key = _metric_key(raw, name)
    n_samples = out.get("n-samples", {})
    n = n_samples[name]["effective"] if name in n_samples else sum(v["effective"] for v in n_samples.values())
    stderr = raw.get(metric_key.replace(",", "_stderr,", 1))
    return {
        "accuracy": float(raw[metric_key]),
        "accuracy_stderr": float(stderr) if isinstance(stderr, (int, float)) else float("nan"),
        "task": name,
        "n": int(n),
        "raw": raw,
        "samples": item_values(out.get("samples", {}).get(name, []), metric_key),
        "results": results_payload(out),
    }


def item_values(logged: list[dict[str, Any]], metric_key: str) -> list[dict[str, Any]]:
    """lm-eval's logged samples -> one `{"doc_id", "metric", "value"}` row per document, for
    the metric `metric_key` ("acc,none", "exact_match,strict-match"): lm-eval logs every
    document once per filter, so only the rows of that metric's filter are kept. The metric
    is named without lm-eval's "none" filter suffix ("acc", "exact_match,strict-match")."""
    metric, _, filter_key = metric_key.partition(",")
    name = metric if filter_key in ("", "none") else metric_key
    rows = [{"doc_id": int(s["doc_id"]), "metric": name, "value": float(s[metric])}
            for s in logged if s.get("filter", "none") == (filter_key or "none") and metric in s]
    return sorted(rows, key=lambda r: r["doc_id"])


def results_payload(out: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's results dict without the logged samples, reduced to what JSON can hold (task
    configs carry functions; lm-eval's own converter turns those into strings)."""
    from lm_eval.utils import handle_non_serializable

    kept = {k: v for k, v in out.items() if k != "samples"}
    return json.loads(json.dumps(kept, default=handle_non_serializable))


def _metric_key(raw: dict[str, Any], task: str) -> str:
    keys = [k for k in raw if k.split(",")[0] == METRIC]
    if not keys:
        metrics = sorted({k.split(",")[0] for k in raw if "," in k and "_stderr" not in k})
        raise ValueError(f"task {task!r} reports no {METRIC!r} metric (it reports {metrics}); "
                         "fp8lab needs a multiple-choice task with metric `acc`")
    return keys[0]


def _check_honours_data_dir(tasks: list[Any]) -> None:
    for obj in tasks:
        loader = getattr(obj.config, "custom_dataset", None)
        if not getattr(loader, "fp8lab_loader", False):
            raise ValueError(
                f"data_dir is only understood by fp8lab JSONL tasks (built on _fp8lab_mc.yaml); "
                f"task {obj.config.task!r} loads its own dataset"
            )


@contextlib.contextmanager
def _preserved_rng_state() -> Iterator[None]:
    """simple_evaluate reseeds python/numpy/torch globally; put the caller's streams back."""
    import numpy as np
    import torch

    py, np_state, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class _NoiseFilter(logging.Filter):
    """Drops lm-eval warnings that are expected for fp8lab's way of calling it."""

    EXPECTED = (
        "`pretrained` model kwarg is not of type `str`",  # we pass the in-memory model on purpose
        "Passed an already-initialized model",
        "Custom kwargs can be passed to `--metadata`",  # our custom_dataset loader takes data_dir
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Overwriting default num_fewshot") and " from None to " in message:
            return False  # the task has no default; we state num_fewshot explicitly
        return not any(text in message for text in self.EXPECTED)


class _quiet_lm_eval:
    """lm-eval logs every request batch at INFO; keep warnings and errors, minus expected noise."""

    LOGGERS = ("lm_eval.api.task", "lm_eval.models.huggingface", "lm_eval.evaluator")

    def __enter__(self) -> None:
        self._root = logging.getLogger("lm_eval")
        self._level = self._root.level
        self._root.setLevel(max(self._level, logging.WARNING))
        self._filter = _NoiseFilter()
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self._filter)

    def __exit__(self, *exc: object) -> None:
        self._root.setLevel(self._level)
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self._filter)
