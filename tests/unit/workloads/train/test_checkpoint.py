"""Checkpoints on their own: what is saved comes back, a foreign or missing checkpoint is ignored,
and a write interrupted half-way never replaces the previous checkpoint."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from workloads.train.checkpoint import Checkpointer
from workloads.precision.grad_scaler import LoraGradScaler


class Scaler:
    """The state a delayed-scaling TensorScaler keeps between steps."""

    def __init__(self) -> None:
        self.amax_history, self.scale_inv, self._pos = torch.zeros(4), torch.ones(()), 0


def state(seed: int) -> SimpleNamespace:
    """A LoRA-like model (one trainable, one frozen tensor) with an optimizer that has taken a step."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 4)
    model.bias.requires_grad_(False)
    optimizer = torch.optim.AdamW([model.weight], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    scaler = Scaler()
    handle = SimpleNamespace(scaler=LoraGradScaler(), cast_sites=[SimpleNamespace(scaler=scaler), SimpleNamespace(scaler=None)])
    return SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler, handle=handle, scaler=scaler,
                           telemetry=SimpleNamespace(events_total=0))


def save(ckpt: Checkpointer, s: SimpleNamespace, step: int, partial: dict | None = None) -> None:
    ckpt.save(step, s.model, s.optimizer, s.scheduler, s.handle, s.telemetry, partial or {"steps_done": step})


def load(ckpt: Checkpointer, s: SimpleNamespace):
    return ckpt.load(s.model, s.optimizer, s.scheduler, s.handle, s.telemetry)


def test_due_every_n_steps_and_never_when_off(tmp_path: Path) -> None:
    assert [s for s in range(1, 10) if Checkpointer(tmp_path, 3, "r").due(s)] == [3, 6, 9]
    assert not any(Checkpointer(tmp_path, 0, "r").due(s) for s in range(1, 10))


def test_round_trip_restores_training_state(tmp_path: Path) -> None:
    saved = state(0)
    saved.scaler.amax_history, saved.scaler._pos = torch.tensor([1.0, 2.0, 0.0, 0.0]), 2
    saved.handle.scaler.scale, saved.handle.scaler.good_steps = 512.0, 3  # backed off once, then 3 good steps
    saved.telemetry.events_total = 7
    ckpt = Checkpointer(tmp_path / "c", every=2, run_id="run-1")
    save(ckpt, saved, 4, {"steps_done": 4, "tokens": 99})

    fresh = state(1)  # different weights, optimizer moments and scheduler position
    assert not torch.equal(fresh.model.weight, saved.model.weight)
    assert load(ckpt, fresh) == (4, {"steps_done": 4, "tokens": 99})
    assert torch.equal(fresh.model.weight, saved.model.weight)
    assert not torch.equal(fresh.model.bias, saved.model.bias)  # frozen: reloaded from its source, not saved
    moments = lambda s: s.optimizer.state_dict()["state"][0]["exp_avg"]  # noqa: E731
    assert torch.equal(moments(fresh), moments(saved))
    assert fresh.scheduler.state_dict() == saved.scheduler.state_dict()
    assert (fresh.handle.scaler.scale, fresh.handle.scaler.good_steps) == (512.0, 3)
    assert torch.equal(fresh.scaler.amax_history, saved.scaler.amax_history) and fresh.scaler._pos == 2
    assert fresh.telemetry.events_total == 7


def test_nothing_to_resume_without_a_file_or_when_off(tmp_path: Path) -> None:
    s = state(0)
    assert load(Checkpointer(tmp_path / "none", every=2, run_id="r"), s) is None
    save(Checkpointer(tmp_path / "c", every=2, run_id="r"), s, 2)
    assert load(Checkpointer(tmp_path / "c", every=0, run_id="r"), s) is None


def test_a_checkpoint_of_another_run_is_removed_not_resumed(tmp_path: Path) -> None:
    s = state(0)
    save(Checkpointer(tmp_path / "c", every=2, run_id="old-run"), s, 2)
    mine = Checkpointer(tmp_path / "c", every=2, run_id="new-run")
    assert load(mine, state(1)) is None
    assert not mine.folder.exists()


def test_an_interrupted_write_leaves_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = state(0)
    ckpt = Checkpointer(tmp_path / "c", every=2, run_id="r")
    save(ckpt, s, 2)
    real_save = torch.save

    def killed_mid_write(obj, path) -> None:
        Path(path).write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save(ckpt, s, 4)
    monkeypatch.setattr(torch, "save", real_save)
    assert load(ckpt, state(1))[0] == 2
