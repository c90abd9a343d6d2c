"""Training batches (workloads/data/load.py `batches`) on their own: deterministic in (seed, step),
every row once per epoch, resumable at any step, trimmed to the longest row of the batch."""
from __future__ import annotations

import torch

from workloads.data.load import TokenizedData, batches

ROWS, WIDTH = 10, 8


def data() -> TokenizedData:
    """Row i starts with token 100 + i (so a batch says which rows it holds) and is 3 + i % 5 tokens long."""
    lengths = torch.tensor([3 + i % 5 for i in range(ROWS)])
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).long()
    ids = torch.where(mask.bool(), torch.arange(ROWS)[:, None] * 0 + 7, torch.zeros(ROWS, WIDTH, dtype=torch.long))
    ids[:, 0] = 100 + torch.arange(ROWS)
    return TokenizedData(ids, mask, torch.where(mask.bool(), ids, torch.full_like(ids, -100)))


def rows(batch: dict[str, torch.Tensor]) -> list[int]:
    return (batch["input_ids"][:, 0] - 100).tolist()


def test_exactly_steps_batches_of_batch_size() -> None:
    got = list(batches(data(), 3, 7, seed=0))
    assert len(got) == 7 and all(b["input_ids"].shape[0] == 3 for b in got)


def test_each_epoch_sees_every_row_once_before_any_repeats() -> None:
    seen = [r for b in batches(data(), 2, 10, seed=0) for r in rows(b)]  # 20 rows = two epochs
    assert sorted(seen[:ROWS]) == list(range(ROWS)) and sorted(seen[ROWS:]) == list(range(ROWS))
    assert seen[:ROWS] != seen[ROWS:]  # each epoch is reshuffled


def test_deterministic_in_seed_and_different_across_seeds() -> None:
    order = lambda seed: [rows(b) for b in batches(data(), 3, 6, seed)]  # noqa: E731
    assert order(0) == order(0)
    assert order(0) != order(1)


def test_resuming_at_a_step_yields_the_batches_a_full_run_sees_there() -> None:
    full = list(batches(data(), 3, 9, seed=4))
    for start in (0, 1, 4, 8, 9):
        resumed = list(batches(data(), 3, 9, seed=4, start_step=start))
        assert len(resumed) == 9 - start
        assert all(torch.equal(a[k], b[k]) for a, b in zip(full[start:], resumed) for k in a)


def test_batches_are_trimmed_to_their_longest_row() -> None:
    source = data()
    for batch in batches(source, 3, 6, seed=0):
        longest = int(source.attention_mask[rows(batch)].sum(1).max())
        assert {t.shape[1] for t in batch.values()} == {longest}
        assert torch.equal(batch["labels"], source.labels[rows(batch), :longest])
