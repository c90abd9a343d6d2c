"""How long the training rows are, and what that decides before training: the default
`train.max_seq_len`, how much a limit cuts (refused above `data.max_truncated_pct`), and the step
count of `train.epochs`.

Why up front: a row longer than the limit loses its start (`tokenize_examples` keeps the answer),
so a limit below the data trains on fragments without a word; Axolotl and TRL users expect the
limit to fit their data, and a cut to be said. The lengths are the token counts training itself
produces (the same segments, the same special tokens), so what preflight measures is what trains.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# `train.max_seq_len: null` takes this percentile of the training rows' token counts...
LENGTH_PERCENTILE = 99
# ...rounded up to a multiple of this (headroom for rows a little longer than the percentile, and
# the round numbers users set by hand; batches are trimmed to their longest row, so the headroom
# costs no compute).
LENGTH_MULTIPLE = 16


@dataclass(frozen=True)
class Truncation:
    """What a limit of `max_seq_len` tokens cuts from the training rows."""

    max_seq_len: int
    rows: int
    rows_cut: int
    tokens: int
    tokens_cut: int
    longest: int

    @property
    def rows_pct(self) -> float:
        return 100.0 * self.rows_cut / self.rows if self.rows else 0.0

    @property
    def tokens_pct(self) -> float:
        return 100.0 * self.tokens_cut / self.tokens if self.tokens else 0.0

    def metrics(self) -> dict[str, float]:
        """What a trial logs about its data (`data/*`, docs/contracts.md)."""
        return {"data/max_seq_len": float(self.max_seq_len), "data/rows": float(self.rows),
                "data/longest_row_tokens": float(self.longest), "data/truncated_rows_pct": self.rows_pct,
                "data/truncated_tokens_pct": self.tokens_pct}


def measure(lengths: list[int], max_seq_len: int) -> Truncation:
    """Rows longer than `max_seq_len` and the tokens they lose."""
    cut = [n - max_seq_len for n in lengths if n > max_seq_len]
    return Truncation(max_seq_len, len(lengths), len(cut), int(sum(lengths)), int(sum(cut)), max(lengths, default=0))


def derived_max_seq_len(lengths: list[int], positions: int | None) -> int:
    """The default limit: the 99th percentile of the lengths, rounded up to a multiple of 16,
    at most the model's positions (the embedded task: every row 19 tokens -> 32)."""
    # inverted_cdf: the shortest length that 99% of the rows fit in (no interpolation towards an outlier)
    high = int(np.percentile(lengths, LENGTH_PERCENTILE, method="inverted_cdf")) if lengths else LENGTH_MULTIPLE
    rounded = _round_up(high)
    return min(rounded, positions) if positions else rounded


def _round_up(tokens: int) -> int:
    return max(LENGTH_MULTIPLE, math.ceil(tokens / LENGTH_MULTIPLE) * LENGTH_MULTIPLE)


def truncation_problem(cut: Truncation, limit_pct: float, positions: int | None) -> str | None:
    """One line refusing a cut above `data.max_truncated_pct` (share of rows or of tokens)."""
    if cut.rows_pct <= limit_pct and cut.tokens_pct <= limit_pct:
        return None
    fit = _round_up(cut.longest)
    if positions and fit > positions:
        fix = f"shorten or drop the rows over {positions} tokens (the model's positions)"
    else:
        fix = f"train.max_seq_len={fit} to fit every row"
    return (f"train.max_seq_len: {cut.max_seq_len} tokens cuts {cut.rows_cut} of {cut.rows} training rows "
            f"({cut.rows_pct:.1f}%; the longest has {cut.longest} tokens) and {cut.tokens_pct:.1f}% of their tokens, "
            f"above data.max_truncated_pct={limit_pct:g} (fix: {fix}, or "
            f"data.max_truncated_pct={math.ceil(max(cut.rows_pct, cut.tokens_pct))} to accept the cut)")


def epoch_steps(epochs: float, rows: int, batch_size: int, grad_accum: int) -> int:
    """Optimizer steps of `epochs` passes over `rows` (HF Trainer's rounding: a last partial
    batch counts as a step; at least one step)."""
    per_epoch = math.ceil(rows / (batch_size * grad_accum))
    return max(1, math.ceil(epochs * per_epoch))


def loss_every_steps(loss_every: int | str, rows: int, batch_size: int, grad_accum: int) -> int:
    """`eval.loss_every` in optimizer steps: a number as it is, `epoch` the steps of one pass over
    the rows (HF Trainer's eval_strategy="epoch")."""
    return epoch_steps(1, rows, batch_size, grad_accum) if loss_every == "epoch" else int(loss_every)


def row_lengths(rows: Any, data_cfg: dict[str, Any], tokenizer: Any) -> list[int]:
    """Each training row's token count, as `tokenize_rows` tokenizes it (untruncated)."""
    from workloads.data.formats import detect_format
    from workloads.data.load import row_chunks, row_segments

    fmt = detect_format(rows.column_names, data_cfg, f"data.path={data_cfg['path']}")
    lengths: list[int] = []
    for start, chunk in row_chunks(rows):  # in chunks: memory stays bounded on any file size
        texts = ["".join(s.text for s in row_segments(row, start + i, fmt, data_cfg, tokenizer))
                 for i, row in enumerate(chunk)]
        encoded = tokenizer(texts, add_special_tokens=fmt != "chat", return_attention_mask=False,
                            return_token_type_ids=False)  # the ids only: ~20% less CPU than the full encoding
        lengths += [len(ids) for ids in encoded["input_ids"]]
    return lengths


@dataclass(frozen=True)
class DataPlan:
    """What the training rows decide: the limit, the step count, the cut, and any refusal."""

    max_seq_len: int
    steps: int
    truncation: Truncation
    problem: str | None

    def overrides(self) -> dict[str, int]:
        """The resolved `train` keys (what a config with nulls/epochs trains with)."""
        return {"max_seq_len": self.max_seq_len, "steps": self.steps}


def plan_data(config: dict[str, Any], lengths: list[int], positions: int | None) -> DataPlan:
    """The limit (`train.max_seq_len`, or derived when null), the steps (`train.steps`, or from
    `train.epochs`), and the truncation check of that limit."""
    train, data = config["train"], config["data"]
    limit = int(train["max_seq_len"]) if train.get("max_seq_len") else derived_max_seq_len(lengths, positions)
    steps = train.get("steps") or epoch_steps(float(train["epochs"]), len(lengths), int(train["batch_size"]),
                                              int(train.get("grad_accum") or 1))
    cut = measure(lengths, limit)
    return DataPlan(limit, int(steps), cut, truncation_problem(cut, float(data.get("max_truncated_pct", 1.0)), positions))


def model_positions(model_cfg: dict[str, Any], embedded_model_dir: Any) -> int | None:
    """The model's position limit, read from its folder's config (before any weights load)."""
    from transformers import AutoConfig

    from workloads.model.loading import resolve_model_path

    path = resolve_model_path(model_cfg["name_or_path"], embedded_model_dir)
    trust = bool(model_cfg.get("trust_remote_code"))
    return config_positions(AutoConfig.from_pretrained(path, trust_remote_code=trust))


def config_positions(hf_config: Any) -> int | None:
    """`max_position_embeddings` / `n_positions` of a transformers config (its text part)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return int(positions) if positions else None


def load_data_plan(config: dict[str, Any], tokenizer: Any, embedded_dir: Any, positions: int | None,
                   rows: Any = None) -> DataPlan:
    """`plan_data` over the configured training rows (loaded unless given), for a model of
    `positions` positions (`model_positions` before the model loads, `config_positions` after)."""
    from workloads.data.load import load_training_rows

    rows = load_training_rows(config["data"], embedded_dir) if rows is None else rows
    return plan_data(config, row_lengths(rows, config["data"], tokenizer), positions)


def resolve_train_keys(config: dict[str, Any], tokenizer: Any, embedded_dir: Any,
                       positions: int | None) -> dict[str, Any]:
    """`config` with `train.max_seq_len` / `train.steps` filled from the data when null (the
    orchestrator's preflight normally did this already; a benchmark or a direct call did not).
    Raises ValueError with the refusal line when the limit cuts too much."""
    train = config["train"]
    if train.get("max_seq_len") and train.get("steps"):
        return config
    plan = load_data_plan(config, tokenizer, embedded_dir, positions)
    if plan.problem:
        raise ValueError(plan.problem)
    return {**config, "train": {**train, **plan.overrides()}}
