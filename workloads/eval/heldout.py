"""The held-out loss: mean per-token loss on fixed rows that no trial trains on.

Why besides accuracy: a saturated multiple-choice score cannot see a quality loss smaller than a
couple of points, while the loss moves with every nat the model gives up. It is computed with
the trial's own model as it stands (trained adapter, the policy's FP8 forward), log-softmax in
FP32, on the first `eval.loss_rows` rows of `eval.loss_split` (default: the training data's
validation split), tokenized and masked exactly like the training rows: the same tokens for
every policy and seed, so two trials can be paired row by row (`eval/loss_rows.jsonl`).
The rows themselves are the data stage's (`workloads.data.heldout`): ``data`` here is its
tokenized rows (input_ids, attention_mask, labels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from fp8lab_conf.contracts import METRIC_EVAL_LOSS

@dataclass(frozen=True)
class HeldoutLoss:
    mean: float  # total loss / total scored tokens (a token-weighted mean, like the training loss)
    rows: list[dict[str, float]]  # per row: its own mean and its token count


@torch.no_grad()
def heldout_loss(model: Any, data: Any, batch_size: int, device: torch.device) -> HeldoutLoss:
    """Mean per-token loss of `model` on `data` (labels -100 are not scored), and each row's."""
    was_training = model.training
    model.eval()
    sums, counts = [], []
    try:
        for start in range(0, len(data), batch_size):
            ids, mask, labels = (t[start:start + batch_size] for t in (data.input_ids, data.attention_mask, data.labels))
            width = int(mask.sum(1).max())
            logits = model(input_ids=ids[:, :width].to(device), attention_mask=mask[:, :width].to(device)).logits
            row_sum, row_n = _row_losses(logits, labels[:, :width].to(device))
            sums.append(row_sum.cpu())
            counts.append(row_n.cpu())
    finally:
        model.train(was_training)
    total, n = torch.cat(sums), torch.cat(counts)
    rows = [{"row": i, "loss": float(s / c) if c else float("nan"), "tokens": int(c)}
            for i, (s, c) in enumerate(zip(total.tolist(), n.tolist()))]
    return HeldoutLoss(float(total.sum() / n.sum().clamp(min=1)), rows)


def _row_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: summed next-token cross-entropy (FP32 log-softmax) and the number of scored tokens."""
    shifted, target = logits[:, :-1].float(), labels[:, 1:]
    scored = target != -100
    nll = torch.nn.functional.cross_entropy(shifted.transpose(1, 2), target.clamp(min=0), reduction="none")
    return (nll * scored).sum(1), scored.sum(1)


def curve_hook(model: Any, data: Any | None, every: int, batch_size: int,
               device: torch.device, handle: Any) -> Callable[[int], dict[str, float]] | None:
    """For the training loop: `hook(step)` -> {"eval/loss": ...} every `every` steps, else {}.
    The policy's scaling state (amax histories) is put back afterwards, so the curve does not
    change what the trial trains."""
    if data is None or every <= 0:
        return None

    def hook(step: int) -> dict[str, float]:
        if step % every:
            return {}
        with handle.preserved_scaling_state():
            return {METRIC_EVAL_LOSS: heldout_loss(model, data, batch_size, device).mean}

    return hook
