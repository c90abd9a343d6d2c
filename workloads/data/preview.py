"""What a trial trains on, row by row: the rendered text with the trained (loss) tokens marked,
token counts and what the length limit cuts - `fp8lab data preview`, as Axolotl's
`preprocess --debug` shows it.

Why: the loss mask is where a fine-tune goes wrong without an error (a chat template that trains
on the user's turn, a delimiter that glues the answer to the prompt, a limit that cuts the
answer's context); seeing it before training costs seconds. Everything is computed by the code a
trial trains with (`load.tokenize_rows`, `lengths.load_data_plan`), so the preview cannot drift.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.data.chat_template import training_tokenizer
from workloads.data.formats import detect_format
from workloads.data.lengths import DataPlan, load_data_plan, model_positions
from workloads.data.load import load_training_rows, tokenize_rows


@dataclass(frozen=True)
class Span:
    """Consecutive tokens with the same loss mask: their text and ids."""

    text: str
    ids: list[int]
    tokens: list[str]
    trained: bool


@dataclass(frozen=True)
class RowPreview:
    index: int
    length: int  # tokens before the cut
    kept: int  # tokens trained on after the cut (what fits in train.max_seq_len)
    trained: int  # tokens with a loss
    spans: list[Span]

    @property
    def cut(self) -> int:
        return self.length - self.kept


@dataclass(frozen=True)
class DataPreview:
    path: str
    fmt: str
    plan: DataPlan
    derived: bool  # train.max_seq_len came from the data (it was null)
    rows: list[RowPreview]


def preview(config: dict[str, Any], n_rows: int, start: int, embedded_dir: Path, embedded_model_dir: Path) -> DataPreview:
    """The first `n_rows` training rows from `start`, tokenized and masked as training does, with
    the data plan (limit, truncation, steps) of the whole training split."""
    import datasets

    datasets.disable_progress_bars()  # a preview prints the rows, not datasets' progress
    tokenizer = training_tokenizer(config["model"], config["data"], embedded_model_dir)
    rows = load_training_rows(config["data"], embedded_dir)
    plan = load_data_plan(config, tokenizer, embedded_dir, model_positions(config["model"], embedded_model_dir), rows=rows)
    chosen = rows.select(range(min(start, len(rows)), min(start + n_rows, len(rows))))
    data = tokenize_rows(chosen, config["data"], tokenizer, plan.max_seq_len)
    shown = [_row(start + i, data, i, tokenizer) for i in range(len(data))]
    fmt = detect_format(rows.column_names, config["data"], f"data.path={config['data']['path']}")
    return DataPreview(str(config["data"]["path"]), fmt, plan, not config["train"].get("max_seq_len"), shown)


def _row(index: int, data: Any, i: int, tokenizer: Any) -> RowPreview:
    kept = int(data.attention_mask[i].sum())
    ids = data.input_ids[i, :kept].tolist()
    trained = (data.labels[i, :kept] != -100).tolist()
    spans: list[Span] = []
    start = 0
    for end in range(1, kept + 1):
        if end == kept or trained[end] != trained[start]:
            part = ids[start:end]
            spans.append(Span(tokenizer.decode(part), part, tokenizer.convert_ids_to_tokens(part), bool(trained[start])))
            start = end
    return RowPreview(index, int(data.lengths[i]), kept, int(sum(trained)), spans)
