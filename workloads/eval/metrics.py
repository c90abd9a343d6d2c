"""Names and numbers of lm-eval metrics as fp8lab records them.

lm-eval keys a task's results by `<metric>,<filter>` ("acc,none", "exact_match,strict-match",
"exact_match_stderr,flexible-extract"). MLflow metric keys allow no comma, so fp8lab names a
metric by its *label*: the metric alone for lm-eval's "none" filter (`acc`), else
`<metric>.<filter>` (`exact_match.strict-match`), with characters MLflow refuses replaced by `_`.
MLflow gets `eval/<task>/<label>` and `eval/<task>/<label>_stderr`; the per-item samples name the
same label. Users may write a primary metric either way (`exact_match,strict-match` or
`exact_match.strict-match`) or by metric alone (its first filter is then taken).

Nothing here scores anything: values come from lm-eval's results and logged samples, and a
per-item value that lm-eval keeps as a tuple (perplexities: (loglikelihood, length)) is turned
into a number by the task's own aggregation function applied to that one item.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from workloads.eval.samples import readable_fields

EMBEDDED_TASK = "fp8lab_embedded"
PRIMARY_MEAN = "mean"
NO_FILTER = "none"
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. ]")


@dataclass(frozen=True)
class TaskInfo:
    """What can be known about a loaded lm-eval task before any model runs."""

    name: str
    output_type: str
    metrics: tuple[str, ...]  # in the task's metric_list order
    filters: tuple[str, ...]  # filter names in the task's filter_list order ("none" without one)
    higher_is_better: Mapping[str, bool]
    num_fewshot: int | None  # the task's own default

    @classmethod
    def of(cls, task: Any) -> "TaskInfo":
        """Read a built lm-eval Task (its metric_list / default metrics and filter ensembles)."""
        return cls(
            name=task.config.task,
            output_type=task.config.output_type,
            metrics=tuple(task.aggregation()),
            filters=tuple(f.name for f in task._filters),
            higher_is_better=dict(task.higher_is_better()),
            num_fewshot=task.get_config("num_fewshot"),
        )


def configured_tasks(eval_cfg: Mapping[str, Any]) -> list[str]:
    """The tasks an `eval` config asks for: `eval.tasks`, else the one-task shorthand
    `eval.task`, else fp8lab's embedded task (config validation refuses both at once)."""
    if eval_cfg.get("tasks"):
        return [str(t) for t in eval_cfg["tasks"]]
    return [str(eval_cfg.get("task") or EMBEDDED_TASK)]


def eval_aggregate(eval_cfg: Mapping[str, Any]) -> str:
    """What ``eval/accuracy`` aggregates over several tasks (``eval.primary``, default the mean)."""
    return eval_cfg.get("primary") or PRIMARY_MEAN


def eval_data_dirs(data_path: str, tasks: Sequence[str]) -> dict[str, str]:
    """{task: data_dir}: the embedded task's template scores a user's own JSONL folder (its
    test.jsonl) when `data.path` is one; every other task brings its own data."""
    local = Path(data_path).expanduser()
    if EMBEDDED_TASK in tasks and data_path != "embedded" and local.is_dir():
        return {EMBEDDED_TASK: str(local)}
    return {}


def safe_name(text: str) -> str:
    """A piece of an MLflow metric key or artifact file name (task and filter names are free text)."""
    return _UNSAFE.sub("_", text)


def metric_label(result_key: str) -> str:
    """lm-eval's "acc,none" -> "acc"; "exact_match,strict-match" -> "exact_match.strict-match"."""
    metric, _, filter_key = result_key.partition(",")
    if filter_key in ("", NO_FILTER):
        return safe_name(metric)
    return f"{safe_name(metric)}.{safe_name(filter_key)}"


def resolve_primary(info: TaskInfo, spec: str | None) -> str:
    """The lm-eval result key ("metric,filter") of a task's primary metric: `spec` when given
    (metric, "metric,filter" or "metric.filter"), else the first metric of the task's
    metric_list under its first filter. Raises ValueError naming what the task reports."""
    if spec is None:
        if not info.metrics:
            raise ValueError(f"task {info.name!r} reports no metric")
        return f"{info.metrics[0]},{info.filters[0]}"
    metric, filter_key = _split_spec(spec, info.filters)
    if metric not in info.metrics or filter_key not in info.filters:
        raise ValueError(f"task {info.name!r} has no metric {spec!r} (it reports: {', '.join(available(info))})")
    return f"{metric},{filter_key}"


def available(info: TaskInfo) -> list[str]:
    """Every primary-metric spelling a task accepts, as labels."""
    return [metric_label(f"{m},{f}") for f in info.filters for m in info.metrics]


def _split_spec(spec: str, filters: Sequence[str]) -> tuple[str, str]:
    """("metric", "filter") from "metric,filter", "metric.filter" (a filter the task has) or "metric"."""
    if "," in spec:
        metric, _, filter_key = spec.partition(",")
        return metric, filter_key
    for filter_key in filters:
        for spelled in {filter_key, safe_name(filter_key)}:
            if spec.endswith("." + spelled):
                return spec[: -len(spelled) - 1], filter_key
    return spec, filters[0]


def task_metrics(task: str, raw: Mapping[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """`<prefix><task>/<label>` (and `_stderr`) for every numeric metric lm-eval returned for a
    task; lm-eval's "N/A" stderrs (no bootstrap possible) are left out rather than faked."""
    out: dict[str, float] = {}
    for key, value in raw.items():
        if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        metric, _, filter_key = key.partition(",")
        stderr = metric.endswith("_stderr")
        label = metric_label(f"{metric.removesuffix('_stderr')},{filter_key}") + ("_stderr" if stderr else "")
        out[f"{prefix}{safe_name(task)}/{label}"] = float(value)
    return out


def item_values(logged: Sequence[Mapping[str, Any]], result_key: str,
                aggregate: Callable[[list[Any]], float] | None = None,
                output_type: str | None = None) -> list[dict[str, Any]]:
    """lm-eval's logged samples -> one `{"doc_id", "metric", "value", "prompt", "target",
    "response", ...}` row per document for the metric `result_key` (the readable fields:
    `workloads.eval.samples`). lm-eval logs every document once per filter: only the rows of that
    metric's filter are kept. A tuple-valued item (perplexity) goes through `aggregate`, the
    task's own aggregation of that metric, applied to the one item."""
    metric, _, filter_key = result_key.partition(",")
    label = metric_label(result_key)
    rows = []
    for sample in logged:
        if sample.get("filter", NO_FILTER) != (filter_key or NO_FILTER) or metric not in sample:
            continue
        value = sample[metric]
        if not isinstance(value, (int, float)) and aggregate is not None:
            value = aggregate([value])
        rows.append({"doc_id": int(sample["doc_id"]), "metric": label, "value": float(value),
                     **readable_fields(sample, output_type)})
    return sorted(rows, key=lambda r: r["doc_id"])


def primary_figure(per_task: Mapping[str, Mapping[str, Any]], primary: str) -> tuple[float, float]:
    """`eval/accuracy` and its stderr: the named task's primary metric, or with "mean" the
    unweighted mean of every task's primary metric (each task counts once, whatever its size;
    stderr = sqrt(sum se_i^2) / k, the tasks' samples being independent). The figure is read
    as "higher is better", so a lower-is-better primary (a perplexity) cannot be part of it."""
    chosen = list(per_task) if primary == PRIMARY_MEAN else [primary]
    missing = [name for name in chosen if name not in per_task]
    if missing:
        raise ValueError(f"eval.primary: {missing[0]!r} is not one of the evaluated tasks ({', '.join(per_task)})")
    lower = [name for name in chosen if not per_task[name]["higher_is_better"]]
    if lower:
        raise ValueError(f"eval.primary: task {lower[0]!r}'s primary metric {per_task[lower[0]]['primary']!r} is "
                         "lower-is-better and cannot be part of eval/accuracy")
    values = [float(per_task[name]["value"]) for name in chosen]
    stderrs = [float(per_task[name]["stderr"]) for name in chosen]
    k = len(values)
    return sum(values) / k, math.sqrt(sum(s * s for s in stderrs)) / k
