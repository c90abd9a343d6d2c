"""Preflight of the `eval` section: everything about the evaluation tasks that can be known
before training, so a trial never trains for an hour and then fails in lm-eval.

Per task: it exists (did-you-mean), lm-eval builds it and loads its data (offline, from local
files or the HF cache), it reports a metric, the chosen primary metric is one it reports, and
few-shot is possible for its output type. Across tasks: `eval.metrics` and `eval.primary` name
evaluated tasks, and `eval/accuracy` (read as higher-is-better) is not built from a perplexity.
Tokenizer: generate_until needs an end-of-sequence token to stop on; a chat template must
exist when `eval.apply_chat_template` asks for one. One line per problem, `<key>: ... (fix: ...)`.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from workloads.eval.metrics import (EMBEDDED_TASK, PRIMARY_MEAN, TaskInfo, available, configured_tasks, eval_aggregate,
                                    eval_data_dirs,
                                    resolve_primary)

GENERATIVE = "generate_until"
ROLLING = "loglikelihood_rolling"


def check_eval_tasks(config: dict[str, Any], data_has_problems: bool = False) -> list[str]:
    """Every problem of the configured evaluation, one line each (empty = ready to train).
    A sweep's cells usually share their eval section: each distinct one is checked once.
    `data_has_problems`: the data checks already named problems of `data.path`, so a task that
    reads its rows from that folder is not loaded again (one line per problem, not two)."""
    key = json.dumps([config["eval"], config["data"]["path"], config["model"], data_has_problems],
                     sort_keys=True, default=str)
    return list(_check_cached(key))


def default_task_problems(config: dict[str, Any]) -> list[str]:
    """Your own training rows with no eval task set: the default task would score fp8lab's shipped
    synthetic task, not your data, and say nothing. A data folder is the exception: the embedded
    task scores its test.jsonl (`eval_data_dirs`), and the data checks say when it cannot."""
    ev, path = config["eval"], str(config["data"]["path"])
    if path == "embedded" or ev.get("task") or ev.get("tasks") or Path(path).expanduser().is_dir():
        return []
    return [f"eval.tasks: training on data.path={path} with no eval task set would score fp8lab's embedded "
            "synthetic task, not your data (fix: eval.tasks=[<an lm-eval task for your data>] with "
            f"eval.include_path=<your task YAMLs> if it is your own, or eval.task={EMBEDDED_TASK} to score the "
            "shipped task anyway; the held-out loss eval/loss needs a validation split in a data folder)"]


@functools.lru_cache(maxsize=32)
def _check_cached(key: str) -> tuple[str, ...]:
    ev, data_path, model, data_has_problems = json.loads(key)
    return tuple(_check({"eval": ev, "data": {"path": data_path}, "model": model}, data_has_problems))


def _check(config: dict[str, Any], data_has_problems: bool = False) -> list[str]:
    ev = config["eval"]
    if not data_has_problems and (unset := default_task_problems(config)):
        return unset
    key = "eval.tasks" if ev.get("tasks") else "eval.task"
    include = ev.get("include_path")
    if include and not Path(include).expanduser().is_dir():
        return [f"eval.include_path: {include} is not a folder (fix: a folder of lm-eval task YAMLs)"]
    names = configured_tasks(ev)
    data_dirs = eval_data_dirs(config["data"]["path"], names)
    if data_has_problems:  # the data checks named them already; the task would only repeat them
        names = [n for n in names if n not in data_dirs]
    infos, problems = _load_infos(names, key, include, data_dirs)
    for info in infos.values():
        problems += _check_task(info, ev)
    problems += _check_cross_task(infos, ev, loaded_all=not problems)
    problems += _check_tokenizer(config, infos)
    return problems


def _load_infos(names: list[str], key: str, include: str | None,
                data_dirs: dict[str, str]) -> tuple[dict[str, TaskInfo], list[str]]:
    """Build every task with lm-eval (this loads its data): {task: TaskInfo}, problems."""
    from workloads.eval.harness import load_tasks

    infos: dict[str, TaskInfo] = {}
    problems: list[str] = []
    for name in names:
        if name in data_dirs and not (Path(data_dirs[name]) / "test.jsonl").is_file():
            continue  # the data checks already say `data.path` lacks test.jsonl: one line, not two
        try:
            built = load_tasks([name], include, data_dirs)
        except ValueError as exc:
            if "unknown lm-eval task" in str(exc):
                problems.append(f"{key}: {exc} (fix: a task `lm-eval ls tasks` lists, or eval.include_path=<a folder of "
                                "task YAMLs> for your own)")
                continue
            problems.append(f"{key}: task {name!r}: {_first_line(exc)}")
            continue
        except Exception as exc:  # noqa: BLE001 - datasets/lm-eval raise many types for data that will not load
            problems.append(f"{key}: task {name!r} could not load its data ({type(exc).__name__}: {_first_line(exc)}) "
                            "(fix: point the task's YAML at local files, or download the dataset into the HF cache first)")
            continue
        infos.update({task_name: TaskInfo.of(task) for task_name, task in built.items()})
    return infos, problems


def _check_task(info: TaskInfo, ev: dict[str, Any]) -> list[str]:
    if not info.metrics:
        return [f"eval.tasks: task {info.name!r} reports no metric (fix: give its YAML a metric_list)"]
    problems = []
    spec = (ev.get("metrics") or {}).get(info.name)
    try:
        resolve_primary(info, spec)
    except ValueError as exc:
        problems.append(f"eval.metrics.{info.name}: {exc} (fix: eval.metrics.{info.name}={available(info)[0]})")
    if info.output_type == ROLLING and ev.get("num_fewshot"):
        problems.append(f"eval.num_fewshot: task {info.name!r} is {ROLLING} (perplexity), which lm-eval runs "
                        "0-shot only (fix: eval.num_fewshot=null)")
    return problems


def _check_cross_task(infos: dict[str, TaskInfo], ev: dict[str, Any], loaded_all: bool) -> list[str]:
    """`eval.metrics` / `eval.primary` name tasks that are evaluated; the primary figure is
    higher-is-better. Names are only judged when every task loaded (else the list is partial)."""
    if not loaded_all:
        return []
    names = ", ".join(infos)
    problems = [f"eval.metrics.{name}: {name} is not an evaluated task ({names}) (fix: name a task of eval.tasks)"
                for name in (ev.get("metrics") or {}) if name not in infos]
    primary = eval_aggregate(ev)
    if primary != PRIMARY_MEAN and primary not in infos:
        return problems + [f"eval.primary: must be {PRIMARY_MEAN} or an evaluated task ({names}), got {primary!r} "
                           f"(fix: eval.primary={PRIMARY_MEAN})"]
    for name in (list(infos) if primary == PRIMARY_MEAN else [primary]):
        try:
            metric = resolve_primary(infos[name], (ev.get("metrics") or {}).get(name)).partition(",")[0]
        except ValueError:
            continue  # reported per task
        if not infos[name].higher_is_better.get(metric, True):
            fix = "eval.primary=<a task scored by accuracy>" if len(infos) > 1 else "add an accuracy task to eval.tasks and name it in eval.primary"
            problems.append(f"eval.primary: eval/accuracy would include {name!r}'s {metric!r}, which is lower-is-better "
                            f"(it is still logged as eval/{name}/{metric}) (fix: {fix})")
    return problems


def _check_tokenizer(config: dict[str, Any], infos: dict[str, TaskInfo]) -> list[str]:
    ev = config["eval"]
    generative = [info.name for info in infos.values() if info.output_type == GENERATIVE]
    template = ev.get("apply_chat_template")
    if not generative and not template:
        return []
    tokenizer = _tokenizer(config["model"])
    if tokenizer is None:
        return []  # the model checks say why it does not load
    problems = []
    if generative and tokenizer.eos_token_id is None:
        problems.append(f"model.name_or_path: task {generative[0]!r} is {GENERATIVE} and the tokenizer has no eos token "
                        "to stop generating on (fix: a tokenizer with eos_token set, or only multiple-choice tasks)")
    if template:
        problems += _check_chat_template(tokenizer, template)
    return problems


def _check_chat_template(tokenizer: Any, template: bool | str) -> list[str]:
    templates = tokenizer.chat_template
    if not templates:
        return ["eval.apply_chat_template: the tokenizer has no chat template "
                "(fix: eval.apply_chat_template=false, or a model whose tokenizer_config.json has one)"]
    if isinstance(template, str) and isinstance(templates, dict) and template not in templates:
        return [f"eval.apply_chat_template: the tokenizer has no template {template!r} (it has: "
                f"{', '.join(templates)}) (fix: eval.apply_chat_template=true)"]
    if isinstance(template, str) and not isinstance(templates, dict):
        return [f"eval.apply_chat_template: the tokenizer has one unnamed template, not {template!r} "
                "(fix: eval.apply_chat_template=true)"]
    return []


def _tokenizer(model_cfg: dict[str, Any]) -> Any:
    """The trial's tokenizer, or None when it does not load (the model checks say why). Path
    resolution as in model_loading, without importing PEFT for it (seconds, in every preflight)."""
    from transformers import AutoTokenizer

    from workloads.embedded.paths import embedded_paths

    name = model_cfg["name_or_path"]
    local = Path(name).expanduser()
    path = str(embedded_paths().model_dir) if name == "embedded" else str(local) if local.exists() else name
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=bool(model_cfg.get("trust_remote_code", False)))
    except Exception:  # noqa: BLE001 - reported by the model checks
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
