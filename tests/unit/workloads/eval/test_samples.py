"""Per-item samples carry what lm-eval's `--log_samples` shows: prompt, target, the model's
response (chosen option or generated text) and per-choice log-likelihoods, from lm-eval's own
sample records of a real evaluation."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workloads.embedded.paths import embedded_paths
from workloads.eval.harness import evaluate_model
from workloads.eval.samples import readable_fields


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    paths = embedded_paths()
    model = AutoModelForCausalLM.from_pretrained(paths.model_dir, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(paths.model_dir)
    return evaluate_model(model, tokenizer, limit=8, batch_size=8)["samples"]


def test_multiple_choice_items_say_what_the_model_chose(samples: list[dict]) -> None:
    assert len(samples) == 8
    for row in samples:
        json.dumps(row)  # one JSON line each, as logged
        assert row["prompt"].startswith("Which number is the largest:") and row["prompt"].endswith("Answer:")
        lls = row["choice_loglikelihoods"]
        assert len(lls) == len(row["choices"]) == 4 and all(ll < 0 for ll in lls)
        assert row["response"] == row["choices"][lls.index(max(lls))]
        assert row["gold"] == row["choices"][int(row["target"])]
        assert row["value"] == float(row["response"] == row["gold"])  # lm-eval's acc agrees with the fields
        assert {"doc_hash", "prompt_hash", "target_hash"} <= set(row)


def test_generated_text_is_the_filtered_response() -> None:
    logged = {"doc_id": 3, "arguments": [["Q: 2+2?\nA:", {"until": ["\n"]}]], "target": "4",
              "resps": [["The answer is 4."]], "filtered_resps": ["4"], "filter": "strict-match", "exact_match": 1.0}
    assert readable_fields(logged, "generate_until") == {"prompt": "Q: 2+2?\nA:", "target": "4", "response": "4"}
    assert readable_fields({"doc_id": 0}, None) == {}  # an old record without the fields: nothing invented
