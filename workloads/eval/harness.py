"""Evaluate an in-memory (already fine-tuned) model with lm-eval, on one or several tasks of any
output type (multiple_choice, generate_until, loglikelihood_rolling, ...).

    out = evaluate_tasks(model, tokenizer, ["fp8lab_embedded", "my_gsm"], metrics={"my_gsm": "exact_match,flexible-extract"})
    out["tasks"]["my_gsm"]["value"], out["tasks"]["my_gsm"]["metrics"], out["tasks"]["my_gsm"]["samples"]
    evaluate_model(model, tokenizer, task="fp8lab_embedded")["accuracy"]     # one task

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
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from workloads.embedded.paths import embedded_paths
from workloads.eval.metrics import EMBEDDED_TASK, TaskInfo, item_values, metric_label, resolve_primary, task_metrics


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


def load_tasks(
    names: Sequence[str],
    include_path: str | Path | list[str | Path] | None = None,
    data_dirs: Mapping[str, str | Path] | None = None,
) -> dict[str, Any]:
    """Build lm-eval Task objects for `names` (a group or tag expands to its tasks), each with
    its data loaded: {task name: Task}. `data_dirs` points named fp8lab JSONL tasks at another
    folder. Raises ValueError for an unknown task (did-you-mean) or a task that cannot take a
    data_dir; whatever lm-eval raises while loading a task's data propagates."""
    built: dict[str, Any] = {}
    for name in names:
        data_dir = (data_dirs or {}).get(name)
        manager = task_manager(name, include_path, data_dir)
        with _quiet_lm_eval():
            loaded = list(manager.load([name])["tasks"].values())
        if data_dir is not None:
            _check_honours_data_dir(loaded)
        for task in loaded:
            built.setdefault(task.config.task, task)
    return built


def evaluate_tasks(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[str],
    *,
    metrics: Mapping[str, str] | None = None,
    data_dirs: Mapping[str, str | Path] | None = None,
    include_path: str | Path | list[str | Path] | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    num_fewshot: int | None = None,
    apply_chat_template: bool | str = False,
    fewshot_as_multiturn: bool = False,
    system_instruction: str | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Evaluate an in-memory causal LM on several lm-eval tasks of any output type in one
    `simple_evaluate` call (lm-eval's own requests, filters and metrics).

    `metrics` names a task's primary metric (see eval_metrics.resolve_primary; default: the
    first of its metric_list under its first filter). `num_fewshot=None` keeps each task's own
    default. Returns {"tasks": {name: {"primary", "value", "stderr", "n", "higher_is_better",
    "metrics", "samples", "raw"}}, "results"}: `metrics` are `eval/<task>/<label>` for every
    number lm-eval returned, `samples` the per-item values of the primary metric, `results`
    lm-eval's output minus samples, as plain JSON.

    The model is put in eval mode for the call and its previous mode restored; lm-eval seeds
    the global RNGs (python, numpy, torch) for a reproducible evaluation, and their previous
    states are restored afterwards. `device` is where the model already lives (an in-memory
    model is never moved; HFLM takes the device from the model).
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from workloads.eval.env_info import env_info_once
    from workloads.eval.git_hash import quiet_git_hash

    with _preserved_rng_state():  # building a task may draw from the global RNGs too
        built = load_tasks(tasks, include_path, data_dirs)
    infos = {name: TaskInfo.of(task) for name, task in built.items()}
    primaries = {name: resolve_primary(info, (metrics or {}).get(name)) for name, info in infos.items()}
    was_training = model.training
    model.eval()
    try:
        with _quiet_lm_eval(), _preserved_rng_state(), quiet_git_hash(), env_info_once():
            lm = HFLM(
                pretrained=model,
                tokenizer=tokenizer,
                batch_size=batch_size,
                device=device,
                softmax_dtype="float32",  # BF16 log-probs are too coarse to rank close choices
            )
            out = simple_evaluate(
                model=lm,
                tasks=list(built.values()),
                num_fewshot=num_fewshot,
                limit=limit,
                log_samples=True,  # per-item values: the report pairs policies on items
                apply_chat_template=apply_chat_template,
                fewshot_as_multiturn=fewshot_as_multiturn,
                system_instruction=system_instruction,
                # the tasks are built already: a manager over fp8lab's folders only, so lm-eval
                # does not index its ~15k YAMLs again
                task_manager=_task_manager(_include_paths(include_path), False, None),
                # >0 or lm-eval reports no stderr at all; means get the closed form, only
                # bootstrappable metrics (perplexities, ...) resample
                bootstrap_iters=1000,
            )
    finally:
        model.train(was_training)

    if out is None:  # only on non-zero ranks of a distributed run
        raise RuntimeError("lm-eval returned no results")
    per_task = {name: _task_outcome(name, out, primaries[name], built[name], infos[name]) for name in built}
    return {"tasks": per_task, "results": results_payload(out)}


def _task_outcome(name: str, out: dict[str, Any], key: str, task: Any, info: TaskInfo) -> dict[str, Any]:
    raw = out["results"][name]
    if key not in raw:  # declared but not produced (a process_results that skips it)
        raise ValueError(f"task {name!r} returned no {metric_label(key)!r} (it returned: "
                         f"{', '.join(sorted(metric_label(k) for k in raw if ',' in k and '_stderr' not in k))})")
    metric = key.partition(",")[0]
    stderr = raw.get(key.replace(",", "_stderr,", 1))
    return {
        "primary": metric_label(key),
        "value": float(raw[key]),
        "stderr": float(stderr) if isinstance(stderr, (int, float)) else float("nan"),
        "n": int(out.get("n-samples", {}).get(name, {}).get("effective", 0)),
        "higher_is_better": bool(info.higher_is_better.get(metric, True)),
        "metrics": task_metrics(name, raw),
        "samples": item_values(out.get("samples", {}).get(name, []), key, task.aggregation().get(metric),
                               getattr(task, "OUTPUT_TYPE", None)),
        "raw": raw,
    }


def evaluate_model(
    model: Any,
    tokenizer: Any,
    *,
    task: str = EMBEDDED_TASK,
    data_dir: str | Path | None = None,
    include_path: str | Path | list[str | Path] | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    num_fewshot: int | None = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """One task through `evaluate_tasks`, its primary metric as "accuracy" (kept for callers
    that score a single multiple-choice task, e.g. an exported model).

    Returns {"accuracy", "accuracy_stderr", "task", "n", "raw", "samples", "results"}."""
    data_dirs = {task: data_dir} if data_dir is not None else None
    out = evaluate_tasks(model, tokenizer, [task], data_dirs=data_dirs, include_path=include_path,
                         limit=limit, batch_size=batch_size, num_fewshot=num_fewshot, device=device)
    name, one = next(iter(out["tasks"].items()))
    return {"accuracy": one["value"], "accuracy_stderr": one["stderr"], "task": name, "n": one["n"],
            "raw": one["raw"], "samples": one["samples"], "results": out["results"]}


def results_payload(out: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's results dict without the logged samples, reduced to what JSON can hold (task
    configs carry functions; lm-eval's own converter turns those into strings)."""
    from lm_eval.utils import handle_non_serializable

    kept = {k: v for k, v in out.items() if k != "samples"}
    return json.loads(json.dumps(kept, default=handle_non_serializable))


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
