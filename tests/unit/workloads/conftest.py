"""Shared fixtures for the workload tests: the embedded model, optionally with a chat template."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.eval.harness import embedded_paths

# ChatML, the template many instruct models ship; the embedded (base) model has none.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's files (linked) with a chat template in its tokenizer config."""
    folder = tmp_path_factory.mktemp("chat-model")
    source = embedded_paths().model_dir
    for file in source.iterdir():
        if file.name != "tokenizer_config.json":
            (folder / file.name).symlink_to(file)
    config = json.loads((source / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    return folder
