"""The shipped base model and tokenizer load with the plain HF auto classes, offline, and the
model has learned its corpus (it is not random weights)."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workloads.embedded import synth
from workloads.eval.harness import embedded_paths

MAX_ASSET_BYTES = 10_500_000


@pytest.fixture(scope="module")
def info():
    return json.loads((embedded_paths().model_dir.parent / "BUILD_INFO.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(embedded_paths().model_dir)


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(embedded_paths().model_dir).eval()


def test_paths_exist():
    paths = embedded_paths()
    assert (paths.model_dir / "config.json").is_file()
    assert (paths.model_dir / "model.safetensors").is_file()
    assert (paths.data_dir / "test.jsonl").is_file()
    assert (paths.tasks_dir / "fp8lab_embedded.yaml").is_file()


def test_tokenizer_special_tokens(tokenizer):
    assert tokenizer.bos_token and tokenizer.eos_token and tokenizer.pad_token
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    ids = tokenizer("Which number is the largest: 3, 97?")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id  # prepended like Llama tokenizers
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Which number is the largest: 3, 97?"


def test_numbers_are_single_tokens(tokenizer):
    for n in range(synth.NUMBER_MAX + 1):
        assert len(tokenizer(f" {n}", add_special_tokens=False)["input_ids"]) == 1


def test_model_is_small_llama(model, tokenizer):
    assert model.config.model_type == "llama"
    assert model.config.vocab_size >= len(tokenizer)
    assert model.config.hidden_size % 128 == 0 and model.config.intermediate_size % 128 == 0
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert sum(p.numel() for p in model.parameters()) < 3_000_000


def test_model_learned_its_corpus(model, tokenizer, info):
    """Held-out perplexity of the trained model is far below a random-init model's."""
    assert info["perplexity_heldout"]["trained"] < 0.02 * info["perplexity_heldout"]["random_init"]
    text = "Count up from 40: 40, 41, 42, 43, 44, 45, 46, 47,"
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        next_id = int(model(input_ids=ids).logits[0, -1].argmax())
    assert tokenizer.decode([next_id]).strip() == "48"


def test_assets_are_small(info):
    root = embedded_paths().model_dir.parent
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert total < MAX_ASSET_BYTES


def test_bf16_forward(tokenizer):
    model = AutoModelForCausalLM.from_pretrained(embedded_paths().model_dir, dtype=torch.bfloat16)
    batch = tokenizer(["Which color is the", "Count down from 9: 9, 8,"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
