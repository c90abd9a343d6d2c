"""A trial's datasets as MLflow run inputs (the run page's "Datasets used" and the runs table's
Dataset column): the training examples with their digest and source, and the lm-eval task.

The digest of the training set is MLflow's own, computed from the examples actually trained on
(after `data.max_train_examples`), so two runs on the same data show the same digest.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any, Sequence

TRAIN_CONTEXT, EVAL_CONTEXT = "training", "evaluation"


def run_inputs(config: dict[str, Any], examples: Sequence[Any], embedded_dir: Path) -> list[Any]:
    """[training DatasetInput, evaluation DatasetInput] for `mlflow.MlflowClient.log_inputs`."""
    return [_with_context(training_dataset(config["data"], examples, embedded_dir), TRAIN_CONTEXT),
            _with_context(eval_dataset(config["eval"]), EVAL_CONTEXT)]


def training_dataset(data_cfg: dict[str, Any], examples: Sequence[Any], embedded_dir: Path) -> Any:
    import mlflow.data
    import pandas as pd

    from workloads.data import resolve_data_files

    frame = pd.DataFrame([{"prompt": e.prompt, "answer": e.answer} for e in examples], columns=["prompt", "answer"])
    with warnings.catch_warnings():  # a file path "can be interpreted in multiple ways" (all of them local files)
        warnings.filterwarnings("ignore", message="The specified dataset source", category=UserWarning)
        return mlflow.data.from_pandas(frame, source=_train_source(data_cfg, embedded_dir, resolve_data_files),
                                       name=f"{data_cfg['path']}:{data_cfg['train_split']}")


def _train_source(data_cfg: dict[str, Any], embedded_dir: Path, resolve_files: Any) -> Any:
    """The JSONL file trained on, or the Hugging Face dataset page for a hub dataset."""
    from mlflow.data.http_dataset_source import HTTPDatasetSource

    files = resolve_files(data_cfg["path"], embedded_dir)
    if files is None:
        return HTTPDatasetSource(f"https://huggingface.co/datasets/{data_cfg['path']}")
    split = data_cfg["train_split"]
    return files.get(split) or files.get("train") or next(iter(files.values()))


def eval_dataset(eval_cfg: dict[str, Any]) -> Any:
    """The lm-eval task as a metadata-only dataset: lm-eval loads its documents itself."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.meta_dataset import MetaDataset

    what = {"lm_eval.task": eval_cfg["task"], "lm_eval.limit": eval_cfg["limit"],
            "lm_eval.num_fewshot": eval_cfg["num_fewshot"], "lm_eval.include_path": eval_cfg["include_path"]}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:8]
    source = CodeDatasetSource(tags={k: str(v) for k, v in what.items() if v is not None})
    return MetaDataset(source=source, name=f"lm-eval:{eval_cfg['task']}", digest=digest)


def _with_context(dataset: Any, context: str) -> Any:
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    return DatasetInput(dataset=dataset._to_mlflow_entity(), tags=[InputTag(key=MLFLOW_DATASET_CONTEXT, value=context)])
