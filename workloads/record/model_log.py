"""An export logged as an MLflow model (the `transformers` flavour), so that a registered
version loads with `mlflow.transformers.load_model` and `mlflow.pyfunc.load_model`.

A LoRA adapter is logged the PEFT-aware way MLflow documents: only the adapter and the tokenizer
are stored, with a reference to the base model (a hub id, or a local folder through
`base_model_path`, which `load_model(..., base_model_path=...)` can repoint on another machine);
a merged model is logged whole. The pip requirements are the installed versions, given
explicitly: MLflow's own guess adds torchvision, which a text model does not need (and which is
not installed here).

The model is logged into the run's own experiment. MLflow 3 files a logged model under the
process's active experiment, which outside a `start_run` is the Default experiment (id 0), not the
source run's: the model then sat apart from its run in the UI, with its files in experiment 0's
artifact folder (by default `./mlruns/0` of whichever folder created the store) rather than the
sweep's `tracking.artifact_location`.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

MODEL_ARTIFACT = "model"  # name of the logged model
TASK = "text-generation"
_REQUIREMENTS = ("torch", "transformers", "peft", "accelerate", "safetensors")


def log_transformers_model(tracking_uri: str, run_id: str, model: Any, base_model_path: str | None,
                           card: str, example: str) -> str:
    """Log `model` ({"model": a PeftModel or a transformers model, "tokenizer": ...}) under run
    `run_id`; returns the model URI to register. `base_model_path`: the local base folder of a PEFT
    model (None for a hub id, which MLflow records with its revision)."""
    import mlflow
    from huggingface_hub import ModelCard

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment_id=mlflow.MlflowClient(tracking_uri).get_run(run_id).info.experiment_id)
    info = mlflow.transformers.log_model(
        model, name=MODEL_ARTIFACT, task=TASK, run_id=run_id, model_card=ModelCard(card), input_example=[example],
        base_model_path=base_model_path, pip_requirements=_pinned())
    return info.model_uri  # the signature (string -> string) is inferred from the example


def _pinned() -> list[str]:
    pins = []
    for package in _REQUIREMENTS:
        try:
            pins.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            continue
    return pins
