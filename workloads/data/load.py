"""Training data: load rows with `datasets`, turn them into text with a loss mask, tokenize, batch.

Rows come from a local JSONL or Parquet file, a folder of `<split>.jsonl`/`<split>.parquet`
files, a folder written by `Dataset.save_to_disk`, or a Hugging Face dataset name; their format
(multiple choice, prompt/completion, chat) is described in `workloads.data.formats`. For
multiple choice the text trained on is exactly what lm-eval scores at evaluation time:
`prompt + target_delimiter + answer`, with the loss on the answer tokens only.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from workloads.data.formats import Segment, chat_segments, detect_format, row_problems, text_segments

log = logging.getLogger(__name__)

DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class DataSource:
    """Where rows come from: split -> file (`files`), a save_to_disk folder, or a hub name."""

    files: dict[str, Path] | None = None
    saved: Path | None = None
    hub_name: str | None = None


def is_saved_dataset(folder: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def locate(path: str, embedded_dir: Path) -> DataSource:
    """`data.path` as a DataSource ("embedded" is the task shipped with fp8lab)."""
    local = embedded_dir if path == "embedded" else Path(path).expanduser()
    if local.is_dir():
        if is_saved_dataset(local):
            return DataSource(saved=local)
        files: dict[str, Path] = {}
        for file in sorted(local.iterdir()):
            if file.suffix in DATA_SUFFIXES and file.suffix != ".json":
                files.setdefault(file.stem, file)
        return DataSource(files=files)
    if local.is_file():
        return DataSource(files={"train": local})  # one file is the training split, whatever its name
    return DataSource(hub_name=path)


def load_rows(data_cfg: dict[str, Any], embedded_dir: Path) -> Any:
    """The training split as a `datasets.Dataset`."""
    import datasets

    source, split = locate(data_cfg["path"], embedded_dir), data_cfg["train_split"]
    if source.hub_name:
        return datasets.load_dataset(source.hub_name, split=split)
    if source.saved:
        loaded = datasets.load_from_disk(str(source.saved))
        return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
    files = source.files or {}
    file = files[split] if split in files else files["train"]
    return datasets.load_dataset(DATA_SUFFIXES[file.suffix], data_files={split: str(file)}, split=split)


def load_training_rows(data_cfg: dict[str, Any], embedded_dir: Path) -> Any:
    """The training split as a `datasets.Dataset`, cut to `data.max_train_examples`."""
    rows = load_rows(data_cfg, embedded_dir)
    limit = data_cfg.get("max_train_examples")
    return rows.select(range(min(limit, len(rows)))) if limit else rows


ROW_CHUNK = 4096  # rows converted (and, for lengths, tokenized) at once: memory stays bounded on any file size


def row_chunks(rows: Any, size: int = ROW_CHUNK) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """A `datasets.Dataset`'s rows as plain dicts, `size` at a time: (index of the first, rows).

    Why not `for row in rows`: iterating a Dataset converts one row per call, ~13 us a row
    (5.1 s of CPU for 400k short rows); `to_list()` of a slice converts a whole Arrow batch at
    once (0.4 s for the same rows), with the same values in the same order."""
    for start in range(0, len(rows), size):
        yield start, rows.select(range(start, min(start + size, len(rows)))).to_list()


def tokenize_rows(rows: Any, data_cfg: dict[str, Any], tokenizer: Any, max_seq_len: int) -> TokenizedData:
    """Rows -> segments (by format) -> right-padded tokens with masked labels."""
    fmt = detect_format(rows.column_names, data_cfg, f"data.path={data_cfg['path']}")
    examples = [row_segments(row, start + i, fmt, data_cfg, tokenizer)
                for start, chunk in row_chunks(rows) for i, row in enumerate(chunk)]
    log.info("loaded %d training examples (%s)", len(examples), fmt)
    # A chat template writes its own BOS; for plain text the tokenizer adds it, as lm-eval's does.
    return tokenize_examples(examples, tokenizer, max_seq_len, add_special_tokens=fmt != "chat")


def load_training_data(data_cfg: dict[str, Any], tokenizer: Any, max_seq_len: int, embedded_dir: Path) -> TokenizedData:
    """The training split, tokenized (what a trial trains on)."""
    return tokenize_rows(load_training_rows(data_cfg, embedded_dir), data_cfg, tokenizer, max_seq_len)


def row_segments(row: dict[str, Any], index: int, fmt: str, data_cfg: dict[str, Any], tokenizer: Any) -> list[Segment]:
    """One row's segments; a bad row (only possible for data preflight cannot read, e.g. a hub
    dataset) fails the trial with the row and the reason rather than training on "None"."""
    problems = row_problems(row, fmt, data_cfg)
    if problems:
        first = problems[0]
        raise ValueError(f"{first.key}: training row {index} {first.text} (fix: {first.fix})")
    if fmt == "chat":
        return chat_segments(row[data_cfg["messages_field"]], tokenizer)
    return text_segments(row, fmt, data_cfg)


@dataclass
class TokenizedData:
    """Right-padded token ids with untrained tokens masked out of the labels (-100)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    lengths: list[int] | None = None  # each row's token count before the cut to max_seq_len

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def tokenize_examples(examples: list[list[Segment]], tokenizer: Any, max_seq_len: int,
                      add_special_tokens: bool = True) -> TokenizedData:
    """Tokenize like lm-eval splits context/continuation: encode the whole text, and each prefix
    up to a segment boundary; tokens between boundaries take their segment's mask. Over-long
    rows keep their end (the answer) and lose the start."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(examples), max_seq_len), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    lengths = []
    for i, segments in enumerate(examples):
        full, trained = _encode(segments, tokenizer, add_special_tokens)
        lengths.append(len(full))
        cut = max(0, len(full) - max_seq_len)
        full, trained = full[cut:], trained[cut:]
        ids[i, : len(full)] = torch.tensor(full)
        mask[i, : len(full)] = 1
        keep = torch.tensor(trained, dtype=torch.bool)
        labels[i, : len(full)] = torch.where(keep, ids[i, : len(full)], torch.full_like(keep, -100, dtype=torch.long))
    return TokenizedData(ids, mask, labels, lengths)


def _encode(segments: list[Segment], tokenizer: Any, add_special_tokens: bool) -> tuple[list[int], list[bool]]:
    """Token ids of the whole text and, per token, whether it is trained on."""
    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    text = "".join(s.text for s in segments)
    full = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    trained = [False] * len(full)
    start, prefix = 0, ""
    for segment in segments:
        prefix += segment.text
        end = len(full) if prefix == text else count(prefix)
        if segment.trained:
            trained[start:end] = [True] * (end - start)
        start = end
    return list(full), trained


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
