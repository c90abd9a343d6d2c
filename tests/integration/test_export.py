"""One real `fp8lab trial`, then what it leaves behind: a complete MLflow record (clean params,
dataset inputs, system metrics, one value per metric per step, the adapter) and `fp8lab export`
(the fp8-block128 checkpoint reloads at the trial's accuracy and registers in the model registry;
an unfinished run is refused with one line)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.integration.conftest import TINY, client_for, read_json, run_cli, seed_store, store_uri

pytestmark = pytest.mark.integration

EVAL_N = 100  # one item = 1 point, so "within 1 point" allows one changed answer
PLUMBING = ("tracking.", "cluster.", "fault.", "report.", "trial.", "sweep.", "train.num_threads", "train.log_every")


@pytest.fixture(scope="module")
def trial(tmp_path_factory: pytest.TempPathFactory, store_template: Path) -> SimpleNamespace:
    workdir = seed_store(tmp_path_factory.mktemp("export"), store_template)
    args = [a for a in TINY if not a.startswith("eval.limit")] + [f"eval.limit={EVAL_N}", "sweep.name=t-export",
                                                                   "trial.output=result.json"]
    run_cli(["trial", *args], workdir)
    result = read_json(workdir / "result.json")
    client = client_for(workdir)
    return SimpleNamespace(workdir=workdir, result=result, client=client, run=client.get_run(result["mlflow_run_id"]))


def test_trial_run_has_clean_params_inputs_system_metrics_and_adapter(trial: SimpleNamespace) -> None:
    run, client = trial.run, trial.client
    params = run.data.params
    assert {"lora.r", "train.lr", "precision.policy", "seed", "data.path", "eval.task"} <= set(params)
    assert not [k for k in params if k.startswith(PLUMBING)]
    contexts = {d.dataset.name: [t.value for t in d.tags] for d in run.inputs.dataset_inputs}
    assert contexts == {"embedded:train": ["training"], "lm-eval:fp8lab_embedded": ["evaluation"]}
    train = next(d.dataset for d in run.inputs.dataset_inputs if d.dataset.name == "embedded:train")
    assert train.digest and "train.jsonl" in train.source
    assert any(k.startswith("system/cpu_utilization") for k in run.data.metrics)
    whole_run = client.get_metric_history(run.info.run_id, "train/tokens_per_s")
    assert len(whole_run) == 1 and whole_run[0].value == pytest.approx(trial.result["metrics"]["train/tokens_per_s"])
    for key in ("train/loss", "train/tokens_per_s_window"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert steps and len(steps) == len(set(steps)), key
    adapter = {a.path for a in client.list_artifacts(run.info.run_id, "adapter")}
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"} <= adapter


def test_adapter_artifact_loads_with_lm_evals_peft_argument_at_the_trial_accuracy(trial: SimpleNamespace,
                                                                                 tmp_path: Path) -> None:
    from lm_eval.models.huggingface import HFLM
    from peft import PeftModel

    from workloads.eval.harness import evaluate_model
    from workloads.embedded.paths import embedded_paths

    adapter = trial.client.download_artifacts(trial.run.info.run_id, "adapter", str(tmp_path))
    lm = HFLM(pretrained=str(embedded_paths().model_dir), peft=adapter, dtype="bfloat16", device="cpu")  # lm-eval's loader
    assert isinstance(lm.model, PeftModel)
    accuracy = evaluate_model(lm.model, lm.tokenizer, limit=EVAL_N)["accuracy"]
    assert abs(accuracy - trial.result["metrics"]["eval/accuracy"]) <= 0.01 + 1e-9


def test_fp8_export_reloads_at_the_trial_accuracy_and_registers(trial: SimpleNamespace) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.eval.harness import evaluate_model

    out = trial.workdir / "model-fp8"
    proc = run_cli(["export", trial.run.info.run_id, "--format", "fp8-block128", "--out", str(out),
                    "--register", "fp8lab-test"], trial.workdir)
    assert "x BF16" in proc.stdout and "registered as model 'fp8lab-test' version 1" in proc.stdout
    model = AutoModelForCausalLM.from_pretrained(str(out))  # CPU: transformers dequantizes to BF16
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    accuracy = evaluate_model(model, tokenizer, limit=EVAL_N)["accuracy"]
    assert abs(accuracy - trial.result["metrics"]["eval/accuracy"]) <= 0.01 + 1e-9
    version = trial.client.get_model_version("fp8lab-test", "1")
    assert version.run_id == trial.run.info.run_id
    assert version.tags["fp8lab.policy"] == "bf16" and version.tags["fp8lab.export_format"] == "fp8-block128"
    assert version.source.endswith("export/fp8-block128")


def test_export_of_an_unfinished_run_is_one_line_and_writes_nothing(trial: SimpleNamespace) -> None:
    client = trial.client
    failed = client.create_run(trial.run.info.experiment_id, tags={"fp8lab.role": "trial", "fp8lab.status": "FAILED"})
    client.set_terminated(failed.info.run_id, "FAILED")
    out = trial.workdir / "never"
    proc = run_cli(["export", failed.info.run_id, "--format", "merged", "--out", str(out)], trial.workdir, check=False)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fp8lab: error:")]
    assert len(errors) == 1 and "is FAILED, not FINISHED" in errors[0]
    assert not out.exists() and not list(trial.workdir.glob(".never.partial-*"))


def test_export_check_benchmark_scores_the_export_on_the_trials_items(trial: SimpleNamespace, tmp_path: Path) -> None:
    """benchmarks/export_check.py: the fp8-block128 export and the merged BF16 export, scored on the
    trial's own items (its eval.limit) and compared with the trial."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import export_check

    out = tmp_path / "check.json"
    uri = store_uri(trial.workdir)
    assert export_check.main([trial.run.info.run_id, "--tracking-uri", uri, "--merged", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["eval_limit"] == EVAL_N and report["export"]["n"] == EVAL_N == report["merged_bf16"]["n"]
    assert report["trial_accuracy"] == trial.result["metrics"]["eval/accuracy"]
    assert abs(report["diff_pts"]) <= 1 and report["passed"]
