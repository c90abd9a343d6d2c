"""A trial's datasets as MLflow run inputs (the run page's "Datasets used" and the runs table's
Dataset column): the training examples with their digest and source, and the lm-eval task.

The digest of the training set is MLflow's own, computed from the rows actually trained on
(after `data.max_train_examples`), so two runs on the same data show the same digest.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

TRAIN_CONTEXT, EVAL_CONTEXT = "training", "evaluation"


def run_inputs(config: dict[str, Any], rows: Any, embedded_dir: Path) -> list[Any]:
    """[training DatasetInput, evaluation DatasetInput] for `mlflow.MlflowClient.log_inputs`."""
    return [_with_context(training_dataset(config["data"], rows, embedded_dir), TRAIN_CONTEXT),
            _with_context(eval_dataset(config["eval"]), EVAL_CONTEXT)]


def training_dataset(data_cfg: dict[str, Any], rows: Any, embedded_dir: Path) -> Any:
    """The rows trained on (a `datasets.Dataset`) as an MLflow pandas dataset; nested cells (chat
    messages, choice lists) are JSON text so MLflow can hash and display them."""
    import mlflow.data

    frame = rows.to_pandas()
    for column in frame.columns:
        if frame[column].map(lambda v: isinstance(v, (list, dict)) or hasattr(v, "tolist")).any():
            frame[column] = frame[column].map(_json_cell)
    with warnings.catch_warnings():  # a file path "can be interpreted in multiple ways" (all of them local files)
        warnings.filterwarnings("ignore", message="The specified dataset source", category=UserWarning)
        return mlflow.data.from_pandas(frame, source=_train_source(data_cfg, embedded_dir),
                                       name=f"{data_cfg['path']}:{data_cfg['train_split']}")


def _json_cell(value: Any) -> str:
    return json.dumps(value.tolist() if hasattr(value, "tolist") else value, default=str)


def _train_source(data_cfg: dict[str, Any], embedded_dir: Path) -> Any:
    """The file (or save_to_disk folder) trained on, or the Hugging Face dataset page."""
    from mlflow.data.http_dataset_source import HTTPDatasetSource

    from workloads.data.load import locate

    source = locate(data_cfg["path"], embedded_dir)
    if source.hub_name:
        return HTTPDatasetSource(f"https://huggingface.co/datasets/{source.hub_name}")
    if source.saved:
        return str(source.saved)
    files = source.files or {}
    split = data_cfg["train_split"]
    return str(files.get(split) or files.get("train") or next(iter(files.values())))


def eval_dataset(eval_cfg: dict[str, Any]) -> Any:
    """The lm-eval tasks as a metadata-only dataset: lm-eval loads its documents itself."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.meta_dataset import MetaDataset

    from workloads.eval.metrics import configured_tasks

    tasks = configured_tasks(eval_cfg)
    what = {"lm_eval.tasks": ",".join(tasks), "lm_eval.limit": eval_cfg.get("limit"),
            "lm_eval.num_fewshot": eval_cfg.get("num_fewshot"), "lm_eval.include_path": eval_cfg.get("include_path")}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:8]
    source = CodeDatasetSource(tags={k: str(v) for k, v in what.items() if v is not None})
    return MetaDataset(source=source, name=f"lm-eval:{','.join(tasks)}", digest=digest)


def _with_context(dataset: Any, context: str) -> Any:
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    return DatasetInput(dataset=dataset._to_mlflow_entity(), tags=[InputTag(key=MLFLOW_DATASET_CONTEXT, value=context)])
