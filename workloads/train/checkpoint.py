"""Checkpoints of a trial's training state so a retried trial resumes instead of restarting.

Only what changes during a LoRA fine-tune is saved: the LoRA parameters, optimizer and LR
scheduler state, the LoRA gradient scaler, delayed-scaling amax histories, telemetry counters
and the partial result. The frozen base is reloaded from its source. A checkpoint belongs to
one MLflow run: a retry of the same run resumes from it (its metrics up to the checkpoint are
already in MLflow), any other run starts fresh, so a run's metric history is always complete.
Writes are atomic (temp file + fsync + rename): a kill mid-write leaves the previous checkpoint,
and a full disk is one line (`CheckpointDiskFull`) with the temp file removed.
"""
from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fp8lab_conf.contracts import CHECKPOINT_OWNER_FILE


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointDiskFull(OSError):
    """The checkpoint did not fit on its disk: one line that says so, instead of torch's
    `[enforce fail at inline_container.cc:672] unexpected pos ...`."""

    def __init__(self, path: Path, step: int, folder: Path) -> None:
        free = shutil.disk_usage(folder).free if folder.exists() else 0
        kept = "the previous checkpoint is intact" if path.exists() else "no earlier checkpoint exists"
        super().__init__(errno.ENOSPC, f"out of disk space writing checkpoint {path} at step {step} ({free // 1024} KiB free; "
                         f"{kept}, no temp file left) (fix: free space on that disk, or train.checkpoint_dir=<a folder "
                         "on a disk with room>, or train.checkpoint_every=0)")

    def __str__(self) -> str:
        return str(self.strerror)


def _disk_full(exc: BaseException, folder: Path) -> bool:
    """torch's zip writer reports a full disk as a RuntimeError without an errno; then the disk
    itself is asked (less free space than a LoRA checkpoint's smallest write)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return shutil.disk_usage(folder).free < _MIN_FREE_BYTES
    except OSError:
        return False


_MIN_FREE_BYTES = 1 << 20


@dataclass
class Checkpointer:
    folder: Path
    every: int
    run_id: str

    @property
    def path(self) -> Path:
        return self.folder / "checkpoint.pt"

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def save(self, step: int, model: Any, optimizer: Any, scheduler: Any, handle: Any, telemetry: Any,
             partial: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        state = {
            "run_id": self.run_id,
            "step": step,
            "lora": {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "grad_scaler": handle.scaler.state_dict() if getattr(handle, "scaler", None) else None,
            "scalers": [_scaler_state(site.scaler) for site in getattr(handle, "cast_sites", [])],
            "telemetry_events": telemetry.events_total,
            "partial": partial,
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            torch.save(state, tmp)
            _fsync(tmp)  # ENOSPC of a delayed write surfaces here, not after the rename
        except (OSError, RuntimeError) as exc:
            tmp.unlink(missing_ok=True)
            if not _disk_full(exc, self.folder):
                raise
            raise CheckpointDiskFull(self.path, step, self.folder) from None
        os.replace(tmp, self.path)
        owner = self.folder / CHECKPOINT_OWNER_FILE
        if not owner.exists() or owner.read_text() != self.run_id:
            owner.write_text(self.run_id)  # lets the rerun of a lost driver reopen this run and resume

    def load(self, model: Any, optimizer: Any, scheduler: Any, handle: Any, telemetry: Any) -> tuple[int, dict[str, Any]] | None:
        """Restore state and return (step, partial result); None when there is nothing to resume."""
        if self.every <= 0 or not self.path.exists():
            return None
        state = torch.load(self.path, weights_only=False)
        if state["run_id"] != self.run_id:
            self.remove()  # left by another run of this trial: that run's history is not ours
            return None
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in state["lora"].items():
                params[name].copy_(value)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state["grad_scaler"] is not None:
            handle.scaler.load_state_dict(state["grad_scaler"])
        for site, saved in zip(getattr(handle, "cast_sites", []), state["scalers"]):
            _restore_scaler(site.scaler, saved)
        telemetry.events_total = state["telemetry_events"]
        return int(state["step"]), state["partial"]

    def resumable(self) -> bool:
        """Whether this run has a checkpoint to resume from (a retry then stays in the run)."""
        if self.every <= 0 or not self.path.exists():
            return False
        try:
            return torch.load(self.path, weights_only=False, map_location="cpu")["run_id"] == self.run_id
        except Exception:  # noqa: BLE001 - an unreadable checkpoint cannot be resumed from
            return False

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _scaler_state(scaler: Any) -> dict[str, Any] | None:
    if scaler is None:
        return None
    return {"amax_history": scaler.amax_history, "scale_inv": scaler.scale_inv, "pos": scaler._pos}


def _restore_scaler(scaler: Any, saved: dict[str, Any] | None) -> None:
    if scaler is None or saved is None:
        return
    scaler.amax_history, scaler.scale_inv = saved["amax_history"], saved["scale_inv"]
    scaler._pos = saved["pos"]
