"""The held-out rows of the held-out loss: fixed rows no trial trains on, tokenized and masked
exactly like the training rows, so every policy and seed scores the same tokens
(the loss itself is the evaluation stage's, `workloads.eval.heldout`)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from workloads.data import load as data_mod

log = logging.getLogger("fp8lab.heldout")


def load_heldout(data_cfg: dict[str, Any], eval_cfg: dict[str, Any], max_seq_len: int, tokenizer: Any,
                 embedded_dir: Path) -> data_mod.TokenizedData | None:
    """The held-out rows (``eval.loss_split``, the first ``eval.loss_rows``), tokenized like the
    training rows; None when there are none to use."""
    ev = eval_cfg
    split = ev.get("loss_split")
    if not split:
        return None
    rows = split_rows(data_cfg, split, embedded_dir)
    if rows is None:
        log.warning("held-out loss skipped: data.path=%s has no %r split (set eval.loss_split, or null)",
                    data_cfg["path"], split)
        return None
    limit = ev.get("loss_rows")
    rows = rows.select(range(min(int(limit), len(rows)))) if limit else rows
    return data_mod.tokenize_rows(rows, data_cfg, tokenizer, int(max_seq_len))


def split_rows(data_cfg: dict[str, Any], split: str, embedded_dir: Path) -> Any | None:
    """Split `split` of the data source as a `datasets.Dataset`, or None if it has no such split
    (unlike the training loader, never another split in its place)."""
    source = data_mod.locate(data_cfg["path"], embedded_dir)
    if source.files is not None and split not in source.files:
        return None
    if source.saved is not None:
        import datasets

        loaded = datasets.load_from_disk(str(source.saved))
        if not isinstance(loaded, datasets.DatasetDict) or split not in loaded:
            return None
    try:
        return data_mod.load_rows({**data_cfg, "train_split": split}, embedded_dir)
    except ValueError:  # a hub dataset without that split
        return None
