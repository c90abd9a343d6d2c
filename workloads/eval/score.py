"""One evaluation as a trial records it: lm-eval on every configured task of the ``eval``
config part, named as MLflow metrics.

The recipe runs it twice at most, through this one function: on the base model before the
precision policy is applied (``eval.before_training``, metrics under ``eval/base_``) and on the
trained model (``eval/``).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from workloads.eval.harness import evaluate_tasks
from workloads.eval.metrics import configured_tasks, eval_aggregate, eval_data_dirs, primary_figure, task_metrics


def score_tasks(model: Any, tokenizer: Any, eval_cfg: dict[str, Any], data_path: Any, device: torch.device,
                prefix: str = "eval/") -> tuple[dict[str, float], dict[str, Any]]:
    """(metrics, lm-eval's output) of one evaluation of every configured task: ``<prefix>accuracy``
    (+ stderr) is the primary figure ``eval.primary`` chooses, ``eval/<task>/<metric>`` (+ stderr)
    every number lm-eval returned (``eval/base/<task>/...`` before training). ``data_path`` is
    ``data.path``: a data folder may hold the tasks' data too."""
    names = configured_tasks(eval_cfg)
    started = time.perf_counter()
    model.eval()
    with torch.no_grad():
        out = evaluate_tasks(
            model, tokenizer, names, metrics=eval_cfg.get("metrics") or {},
            data_dirs=eval_data_dirs(data_path, names),
            include_path=eval_cfg["include_path"], limit=eval_cfg["limit"], batch_size=eval_cfg["batch_size"],
            num_fewshot=eval_cfg["num_fewshot"], apply_chat_template=eval_cfg.get("apply_chat_template", False),
            fewshot_as_multiturn=eval_cfg.get("fewshot_as_multiturn", False),
            system_instruction=eval_cfg.get("system_instruction"), device=str(device),
        )
    accuracy, stderr = primary_figure(out["tasks"], eval_aggregate(eval_cfg))
    metrics = {f"{prefix}accuracy": accuracy, f"{prefix}accuracy_stderr": stderr,
               f"{prefix}n": float(sum(t["n"] for t in out["tasks"].values()))}
    for name, one in out["tasks"].items():
        metrics.update(task_metrics(name, one["raw"], prefix if prefix == "eval/" else prefix.rstrip("_") + "/"))
    metrics[f"{prefix}wall_s"] = time.perf_counter() - started
    return metrics, out
