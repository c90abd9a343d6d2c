"""The LoRA training loop. `train_step` is the whole step and holds no bookkeeping; `run_training`
around it decides when to sync, log, report progress and stop.

Sync points (device -> host) are marked `# SYNC:`; there is at most one per logged step: the
loss, grad norm, divergence flag and telemetry travel together in `telemetry.end_step`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from transformers import get_scheduler

from fp8lab_conf.contracts import (
    METRIC_GRAD_NORM, METRIC_LORA_WEIGHT_STD, METRIC_LOSS, METRIC_LOSS_SCALE, METRIC_LR, METRIC_STEP_S_WINDOW,
    METRIC_TOKENS_PER_S_WINDOW, METRIC_UNDERFLOW_EVENTS, STATUS_STOPPED_EARLY, TAG_RESUMED_FROM_STEP,
)
from workloads.train.step_clock import StepClock

ProgressFn = Callable[[int, dict[str, Any]], None]
# The health verdict's line rides along with the progress update of the verdict step (not logged).
HEALTH_FIELD = "health"


@dataclass(frozen=True)
class LoopSettings:
    steps: int
    lr: float
    weight_decay: float
    warmup_steps: int
    lr_schedule: str  # constant | cosine | linear (after warmup)
    grad_clip: float | None
    log_every: int
    telemetry_every: int | None  # None = telemetry off
    grad_accum: int = 1  # micro-batches per optimizer step (``train.grad_accum``)


@dataclass
class TrainResult:
    status: str = "FINISHED"  # FINISHED | DIVERGED | STOPPED_EARLY (doomed at the health verdict)
    steps_done: int = 0
    final_loss: float = math.nan
    tokens: int = 0
    wall_s: float = 0.0
    diverged_step: int | None = None
    underflow_events: int = 0
    underflow_logged_step: int = 0  # the step whose telemetry logged `underflow_events` (final metrics skip it there)
    verdict: str = ""  # the health verdict's line, when one was made (docs/health.md)
    telemetry_rows: list[dict[str, Any]] = field(default_factory=list)
    step_windows: list[list[float]] = field(default_factory=list)  # StepClock's timed windows (steady-state speed)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def train_step(model: Any, batch: dict[str, torch.Tensor], handle: Any, optimizer: torch.optim.Optimizer,
               scheduler: Any, params: list[torch.nn.Parameter], clip: float,
               grad_accum: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step under the precision policy; returns (loss, LoRA grad norm) on device.
    With ``grad_accum`` > 1 the batch is split into that many micro-batches (`accumulate`)."""
    if grad_accum == 1:
        loss = model(**batch).loss
        handle.scale_loss(loss).backward()
    else:
        loss = accumulate(model, batch, handle, grad_accum)
    stepped = handle.prepare_step(optimizer)  # FP8 gradient hop, unscale, overflow check, LoRA telemetry
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
    if stepped:
        optimizer.step()
        handle.after_step()  # e.g. FP8 adapter storage rounds LoRA weights back into E4M3
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm.detach()


def accumulate(model: Any, batch: dict[str, torch.Tensor], handle: Any, parts: int) -> torch.Tensor:
    """Forward and backward of ``batch`` in ``parts`` micro-batches, gradients summed: the same
    gradient as the whole batch at once. Each micro-batch's loss is its summed token loss over
    the whole batch's trained-token count (transformers' ``num_items_in_batch``, what HF Trainer
    passes under gradient accumulation), so short and long micro-batches weigh as in one batch.
    Returns the whole batch's mean loss (on device: no sync)."""
    trained = (batch["labels"][:, 1:] != -100).sum()  # the tokens the causal LM loss counts
    total = torch.zeros((), device=trained.device)
    for index in torch.arange(batch["input_ids"].shape[0]).chunk(parts):
        loss = model(**{k: v[index] for k, v in batch.items()}, num_items_in_batch=trained).loss
        handle.scale_loss(loss).backward()
        total = total + loss.detach()
    return total


def make_optimizer(params: list[torch.nn.Parameter], settings: LoopSettings) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    name = "constant_with_warmup" if settings.lr_schedule == "constant" else settings.lr_schedule
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=settings.warmup_steps, num_training_steps=settings.steps)
    return optimizer, scheduler


def lora_weight_std(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Mean std of LoRA matrices: the collapse detector of docs/background.md §1 (on device)."""
    return torch.stack([p.detach().float().std() for p in params if p.dim() == 2]).mean()


def run_training(model: Any, handle: Any, telemetry: Any, make_batches: Callable[[int], Iterable[dict[str, torch.Tensor]]],
                 settings: LoopSettings, logger: Any, progress: ProgressFn | None = None,
                 before_step: Callable[[int, list[torch.nn.Parameter]], None] | None = None,
                 checkpointer: Any = None, health: Any = None,
                 heldout: Callable[[int], dict[str, float]] | None = None) -> TrainResult:
    """Train for `settings.steps`, logging every `log_every` steps; stop early on divergence, or
    when `health` (a workloads.health.monitor.HealthMonitor) calls the trial doomed and may stop it.
    `heldout(step)` (workloads.eval.heldout.curve_hook) measures the held-out loss on the steps it
    chooses before the last; its time is not training time (left out of wall_s and tokens/s).

    `make_batches(start_step)` yields the batches after `start_step` (the same ones a run from
    scratch would see there), so a run resumed from a checkpoint continues exactly."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = make_optimizer(params, settings)
    result, start_step = _resume(checkpointer, model, optimizer, scheduler, handle, telemetry, logger)
    clip = settings.grad_clip if settings.grad_clip is not None else math.inf
    first_bad = torch.tensor(-1, device=_device(model))  # step of the first non-finite loss
    window_tokens, window_start, started, prior_wall = 0, time.perf_counter(), time.perf_counter(), result.wall_s
    clock, every_step_syncs = StepClock(settings.steps, result.step_windows), _device(model).type == "cpu"
    for step, batch in enumerate(make_batches(start_step), start=start_step + 1):
        record = settings.telemetry_every is not None and step % settings.telemetry_every == 0
        telemetry.begin_step(step, record)
        if before_step:
            before_step(step, params)
        n_tokens = int(batch["attention_mask"].sum())  # batches are built on the host: no sync
        batch = {k: v.to(_device(model)) for k, v in batch.items()}
        loss, grad_norm = train_step(model, batch, handle, optimizer, scheduler, params, clip, settings.grad_accum)
        first_bad = torch.where((first_bad < 0) & ~torch.isfinite(loss), step, first_bad)
        window_tokens += n_tokens
        result.tokens += n_tokens
        result.steps_done = step
        logged = step % settings.log_every == 0 or step == settings.steps or record
        if not logged:  # CPU: the step's ops ran inline, so it is over; an accelerator may still be on it
            clock.step_done(step, n_tokens, synced=every_step_syncs)
        else:
            extras = {"loss": loss, "grad_norm": grad_norm, "first_bad": first_bad, "lora_std": lora_weight_std(params),
                      **(health.device_signals() if health else {})}
            report = telemetry.end_step(extras)  # SYNC: the one transfer of this step (None if not recording)
            values = report.metrics if report else _sync_scalars(extras)
            now = time.perf_counter()
            metrics = _step_metrics(values, optimizer, handle, window_tokens / max(now - window_start, 1e-9))
            metrics[METRIC_STEP_S_WINDOW] = clock.step_done(step, n_tokens, synced=True)  # after this step's sync
            window_tokens, window_start = 0, now
            result.final_loss = metrics[METRIC_LOSS]
            if report:
                result.telemetry_rows += report.rows
                result.underflow_events = int(report.metrics[METRIC_UNDERFLOW_EVENTS])
                result.underflow_logged_step = step
            verdict = health.observe(step, metrics) if health else None  # host-side signals; the verdict step judges
            logger.log_step(step, metrics)
            if progress:
                progress(step, {**metrics, HEALTH_FIELD: verdict.line()} if verdict else metrics)
            if values["first_bad"] >= 0:
                result.status, result.diverged_step = "DIVERGED", int(values["first_bad"])
                break
            result.verdict = verdict.line() if verdict else result.verdict
            if health and health.stops(verdict):
                result.status = STATUS_STOPPED_EARLY
                break
        if heldout and step < settings.steps:
            measured_at = time.perf_counter()
            if curve := heldout(step):
                logger.log_step(step, curve)
            measured_s = time.perf_counter() - measured_at
            started += measured_s
            window_start += measured_s
        # The last step is checkpointed too: the trial keeps its checkpoint until the run is closed,
        # so a worker killed during evaluation resumes after training instead of training again.
        if checkpointer and (checkpointer.due(step) or step == settings.steps):
            result.wall_s = prior_wall + time.perf_counter() - started
            logger.flush()  # metrics up to this step are in MLflow before the checkpoint claims them
            checkpointer.save(step, model, optimizer, scheduler, handle, telemetry, dataclasses.asdict(result))
    result.wall_s = prior_wall + time.perf_counter() - started
    return result


def _resume(checkpointer: Any, model: Any, optimizer: Any, scheduler: Any, handle: Any, telemetry: Any,
            logger: Any) -> tuple[TrainResult, int]:
    """Fresh state, or the state of this run's last checkpoint (after a retried worker death)."""
    resumed = checkpointer.load(model, optimizer, scheduler, handle, telemetry) if checkpointer else None
    if resumed is None:
        return TrainResult(), 0
    step, partial = resumed
    logger.set_tags({TAG_RESUMED_FROM_STEP: step})
    return TrainResult(**partial), step


def _sync_scalars(extras: dict[str, torch.Tensor]) -> dict[str, float]:
    """Steps without telemetry still log: the scalars travel in one transfer."""
    values = torch.stack([v.detach().float().reshape(()) for v in extras.values()]).tolist()  # SYNC: one transfer
    return dict(zip(extras, values))


def _step_metrics(values: dict[str, float], optimizer: torch.optim.Optimizer, handle: Any,
                  tokens_per_s: float) -> dict[str, float]:
    """MLflow names (docs/contracts.md) for one logged step."""
    metrics = {k: v for k, v in values.items() if "/" in k}  # telemetry aggregates, if recorded
    metrics.update({
        METRIC_LOSS: values["loss"],
        METRIC_GRAD_NORM: values["grad_norm"],
        METRIC_LORA_WEIGHT_STD: values["lora_std"],
        METRIC_LR: optimizer.param_groups[0]["lr"],
        # tokens/s since the previous logged step; the whole-run mean is logged once at the end
        # under its own name (METRIC_TOKENS_PER_S), so each metric has one value per step
        METRIC_TOKENS_PER_S_WINDOW: tokens_per_s,
    })
    if handle.loss_scale is not None:
        metrics[METRIC_LOSS_SCALE] = float(handle.loss_scale)
    return metrics


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device
