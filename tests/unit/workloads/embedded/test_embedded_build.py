"""A miniature build runs end to end and writes loadable assets (the real one is committed)."""
from __future__ import annotations

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

from workloads.embedded.build import BuildConfig, build


def test_tiny_build(tmp_path):
    cfg = BuildConfig(n_docs=400, n_heldout_docs=40, vocab_size=400, steps=6, batch_size=4,
                      seq_len=64, warmup_steps=2, task_sizes=(("train", 8), ("validation", 4), ("test", 6)))
    info = build(cfg, tmp_path)
    assert info["perplexity_heldout"]["trained"] < info["perplexity_heldout"]["random_init"]
    saved = json.loads((tmp_path / "BUILD_INFO.json").read_text())
    assert saved["task"]["sizes"] == {"train": 8, "validation": 4, "test": 6}
    assert AutoTokenizer.from_pretrained(tmp_path / "base_model").bos_token == "<s>"
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "base_model").config.model_type == "llama"
    assert len((tmp_path / "task" / "test.jsonl").read_text().splitlines()) == 6
