"""Training data: load prompt/answer examples with `datasets`, tokenize, and batch.

The text a model trains on is exactly what lm-eval scores at evaluation time:
`prompt + target_delimiter + answer`, with the loss on the answer tokens only. So a model that
learns the training format is measured on the same format, for any dataset.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from datasets import load_dataset


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


def resolve_data_files(path: str, embedded_dir: Path) -> dict[str, str] | None:
    """Split name -> JSONL file, or None when `path` names a HF dataset instead of local files."""
    folder = embedded_dir if path == "embedded" else Path(path).expanduser()
    if folder.is_dir():
        return {f.stem: str(f) for f in sorted(folder.glob("*.jsonl"))}
    if folder.is_file():
        return {"train": str(folder)}
    return None


def load_examples(data_cfg: dict[str, Any], embedded_dir: Path) -> list[Example]:
    """The training split as Examples (answer resolved from choices when given as an index)."""
    files = resolve_data_files(data_cfg["path"], embedded_dir)
    split = data_cfg["train_split"]
    if files is None:
        rows = load_dataset(data_cfg["path"], split=split)
    else:
        if split not in files:
            split = "train" if len(files) == 1 and "train" in files else split
        rows = load_dataset("json", data_files={split: files[split]}, split=split)
    examples = [_to_example(row, data_cfg) for row in rows]
    limit = data_cfg.get("max_train_examples")
    return examples[:limit] if limit else examples


def _to_example(row: dict[str, Any], data_cfg: dict[str, Any]) -> Example:
    answer = row[data_cfg["answer_field"]]
    choices_field = data_cfg.get("choices_field")
    if choices_field and not isinstance(answer, str):
        answer = row[choices_field][int(answer)]
    return Example(str(row[data_cfg["prompt_field"]]), str(answer))


@dataclass
class TokenizedData:
    """Right-padded token ids with prompt tokens masked out of the labels (-100)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def tokenize_examples(examples: list[Example], tokenizer: Any, max_seq_len: int, delimiter: str) -> TokenizedData:
    """Tokenize like lm-eval splits context/continuation: encode the whole text, mask the
    prompt's tokens. Over-long rows keep their end (the answer) and lose the prompt's start."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(examples), max_seq_len), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, ex in enumerate(examples):
        full = tokenizer(ex.prompt + delimiter + ex.answer)["input_ids"]
        n_prompt = len(tokenizer(ex.prompt)["input_ids"])
        cut = max(0, len(full) - max_seq_len)
        full = full[cut:]
        n_prompt = max(0, n_prompt - cut)
        ids[i, : len(full)] = torch.tensor(full)
        mask[i, : len(full)] = 1
        labels[i, n_prompt : len(full)] = ids[i, n_prompt : len(full)]
    return TokenizedData(ids, mask, labels)


def batches(data: TokenizedData, batch_size: int, steps: int, seed: int, start_step: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """`steps` batches from seeded reshuffled epochs; trimmed to the longest row in the batch
    so short tasks don't pay for padding. Deterministic in (seed, step), so resuming at
    `start_step` yields the same batches a full run would have."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)
    for step in range(steps):
        if order.numel() < batch_size:
            order = torch.cat([order, torch.randperm(len(data), generator=generator)])
        index, order = order[:batch_size], order[batch_size:]
        if step < start_step:
            continue
        width = int(data.attention_mask[index].sum(1).max())
        yield {
            "input_ids": data.input_ids[index, :width],
            "attention_mask": data.attention_mask[index, :width],
            "labels": data.labels[index, :width],
        }
