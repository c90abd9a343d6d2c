"""The kept model, offline on the embedded model: a trial's adapter exported and registered
(`--register`) is an MLflow `transformers` model that both `mlflow.transformers.load_model` and
`mlflow.pyfunc.load_model` load from the registry; the export has a model card with the policy,
sweep, seed and the comparison with bf16, a portable base reference and ordinary file modes.

The trial runs are written directly into a SQLite store (adapter artifact, resolved config, the
tags and metrics a trial logs), so the test exercises exactly the export and registry code."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mlflow.tracking import MlflowClient

from fp8lab_conf.contracts import (METRIC_ACCURACY, METRIC_EVAL_LOSS, ROLE_TRIAL, TAG_POLICY, TAG_ROLE, TAG_SEED,
                                   TAG_STATUS, TAG_SWEEP_ID)
from orchestrator.export_cmd import register_export
from workloads.embedded.paths import embedded_paths
from workloads.export.adapter import save_adapter
from workloads.export.run import export_run
from workloads.model.loading import attach_lora, load_base_model

pytestmark = pytest.mark.integration
PROMPT = "Question: which is larger, 3 or 7? Answer:"
CONFIG = "model:\n  name_or_path: embedded\n  trust_remote_code: false\nhealth:\n  reference_policy: bf16\n"


def _trial_run(client: MlflowClient, experiment_id: str, policy: str, accuracy: float, loss: float, adapter: Path) -> str:
    run = client.create_run(experiment_id, run_name=f"{policy}-s0", tags={
        TAG_ROLE: ROLE_TRIAL, TAG_STATUS: "FINISHED", TAG_POLICY: policy, TAG_SEED: "0", TAG_SWEEP_ID: "sweep123"})
    run_id = run.info.run_id
    for key, value in {"lora.r": "4", "train.steps": "6", "precision.policy": policy}.items():
        client.log_param(run_id, key, value if key != "precision.policy" else policy)
    client.log_metric(run_id, METRIC_ACCURACY, accuracy)
    client.log_metric(run_id, METRIC_EVAL_LOSS, loss)
    client.log_artifacts(run_id, str(adapter), "adapter")
    client.log_text(run_id, CONFIG, "config/resolved.yaml")
    client.set_terminated(run_id, "FINISHED")
    return run_id


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("registry")
    model, _ = load_base_model({"name_or_path": "embedded", "dtype": "float32"}, embedded_paths().model_dir,
                               torch.device("cpu"))
    model = attach_lora(model, {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"}, seed=0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05, generator=torch.Generator().manual_seed(0))
    adapter = save_adapter(model, root / "trained")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    artifacts = root / "artifacts"
    experiment_id = client.create_experiment("t-registry", artifact_location=str(artifacts))
    _trial_run(client, experiment_id, "bf16", 0.60, 2.00, adapter)
    run_id = _trial_run(client, experiment_id, "fp8_naive", 0.55, 2.10, adapter)
    out = export_run(uri, run_id, "adapter", root / "export").out_dir
    version = register_export(client, uri, run_id, out, "adapter", "fp8lab-adapter")
    return SimpleNamespace(uri=uri, client=client, run_id=run_id, out=out, version=version, model=model,
                           artifacts=artifacts)


def test_registered_adapter_loads_with_the_transformers_flavour(registered: SimpleNamespace) -> None:
    import mlflow
    from peft import PeftModel

    mlflow.set_registry_uri(registered.uri)
    pipe = mlflow.transformers.load_model(f"models:/fp8lab-adapter/{registered.version}")
    assert isinstance(pipe.model, PeftModel)
    batch = pipe.tokenizer([PROMPT], return_tensors="pt")
    with torch.no_grad():
        got = pipe.model.float()(**batch).logits
        want = registered.model(**batch).logits
    assert torch.allclose(got, want, atol=1e-4)  # the trained adapter, not a fresh one


def test_registered_adapter_loads_and_predicts_with_pyfunc(registered: SimpleNamespace) -> None:
    import mlflow

    mlflow.set_registry_uri(registered.uri)
    model = mlflow.pyfunc.load_model(f"models:/fp8lab-adapter/{registered.version}")
    schema = model.metadata.get_input_schema()
    assert schema is not None and [c.type.name for c in schema.inputs] == ["string"]
    out = model.predict([PROMPT])
    assert isinstance(out[0], str) and out[0]


def test_version_is_tagged_and_points_at_a_logged_model(registered: SimpleNamespace) -> None:
    version = registered.client.get_model_version("fp8lab-adapter", registered.version)
    assert version.run_id == registered.run_id and version.source.startswith("models:/")
    assert version.tags["fp8lab.policy"] == "fp8_naive" and version.tags["fp8lab.export_format"] == "adapter"
    model = registered.client.get_logged_model(version.source.removeprefix("models:/"))  # with its run, in its artifacts
    assert model.experiment_id == registered.client.get_run(registered.run_id).info.experiment_id
    assert Path(model.artifact_location).is_relative_to(registered.artifacts), model.artifact_location


def test_model_card_says_policy_sweep_seed_and_the_difference_to_bf16(registered: SimpleNamespace) -> None:
    card = (registered.out / "README.md").read_text()
    assert "`fp8_naive`" in card and "sweep123" in card and "seed 0" in card
    assert "| accuracy | 0.5500 | 0.6000 | -5 pts |" in card
    assert "| held-out loss | 2.1000 | 2.0000 | +0.1 |" in card
    assert "`lora.r`: `4`" in card


def test_base_model_reference_is_relative_to_the_export(registered: SimpleNamespace) -> None:
    ref = json.loads((registered.out / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert not os.path.isabs(ref)
    assert (registered.out / ref).resolve() == embedded_paths().model_dir.resolve()


def test_export_has_ordinary_file_modes(registered: SimpleNamespace) -> None:
    umask = os.umask(0)
    os.umask(umask)
    paths = [registered.out, *registered.out.rglob("*")]
    assert registered.out / "adapter_model.safetensors" in paths
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == (0o777 if path.is_dir() else 0o666) & ~umask, path


def test_registered_merged_model_loads_with_both_flavours(registered: SimpleNamespace, tmp_path: Path) -> None:
    import mlflow

    out = export_run(registered.uri, registered.run_id, "merged", tmp_path / "merged").out_dir
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~umask  # was 0600, in a 0700 folder
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    version = register_export(registered.client, registered.uri, registered.run_id, out, "merged", "fp8lab-merged")
    mlflow.set_registry_uri(registered.uri)
    pipe = mlflow.transformers.load_model(f"models:/fp8lab-merged/{version}")
    batch = pipe.tokenizer([PROMPT], return_tensors="pt")
    with torch.no_grad():
        got, want = pipe.model.float()(**batch).logits, registered.model(**batch).logits
    assert torch.allclose(got, want, atol=0.1)  # BF16-rounded merge of the same adapter
    assert isinstance(mlflow.pyfunc.load_model(f"models:/fp8lab-merged/{version}").predict([PROMPT])[0], str)
