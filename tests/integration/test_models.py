"""A user's own model through the real CLI: a GPT-2-architecture folder (transformers Conv1D,
tied input/output embeddings) under fp8_naive trains, evaluates with lm-eval and plans every
linear. (Every other family x policy runs in-process: tests/unit/workloads/precision/test_precision_models.py.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from tests.integration.conftest import TINY, client_for, read_json, run_cli

pytestmark = pytest.mark.integration

EMBEDDED = Path(__file__).parents[2] / "workloads" / "embedded" / "assets" / "base_model"


def tiny_gpt2(folder: Path) -> Path:
    """A random 1-layer GPT-2 with the embedded tokenizer (its vocabulary: 896 tokens)."""
    vocab = json.loads((EMBEDDED / "config.json").read_text())["vocab_size"]
    config = GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=64, vocab_size=vocab,
                        bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    GPT2LMHeadModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EMBEDDED / name, folder / name)
    return folder


def test_gpt2_conv1d_with_tied_embeddings_under_fp8_naive(workdir: Path) -> None:
    model = tiny_gpt2(workdir / "gpt2")
    out = workdir / "result.json"
    fast = ["train.steps=2", "train.log_every=1", "eval.limit=4"]
    run_cli(["trial", "precision=fp8_naive", f"model.name_or_path={model}", *TINY, *fast, f"trial.output={out}"], workdir)
    result = read_json(out)
    assert result["status"] == "FINISHED", result
    assert 0.0 <= result["metrics"]["eval/accuracy"] <= 1.0 and result["deviations"] == []

    client = client_for(workdir)
    run = client.get_run(result["mlflow_run_id"])
    tags = run.data.tags
    assert tags["fp8lab.deviations"] == "" and tags["fp8lab.policy_version"] == "3"
    assert (tags["fp8lab.ladder"], tags["fp8lab.mechanism"]) == ("", "")
    plan = json.loads(Path(client.download_artifacts(run.info.run_id, "precision/plan.json", str(workdir))).read_text())
    weights = {r["module"].rsplit(".", 1)[-1]: r for r in plan["plan"] if r["tensor"] == "weight" and r["role"] != "lora"}
    assert set(weights) == {"c_attn", "c_proj", "c_fc", "lm_head"}  # attn and mlp c_proj share a suffix
    assert all(r["format"] == "e4m3/current" for r in weights.values())
    assert "transformers Conv1D" in weights["c_attn"]["note"] and "tied" in weights["lm_head"]["note"]
