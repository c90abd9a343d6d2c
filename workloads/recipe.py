"""The recipe spine of a trial (after torchtune's recipes): ``run`` reads as the list of stages
(setup -> train -> evaluate -> export), and ``setup`` as the list of its own.

Each stage function takes its own part of the config (or a frozen settings object made from
it) and explicit values, never the whole config, so a reader sees what a stage depends on and
the benchmarks can build a trial from the same stages (``benchmarks/_common.build_trial``).
The order of the stages is the order of the random-number draws: changing it changes the
numbers, so it is fixed here, once.

``workloads.trial`` keeps only the run's lifecycle around this: it starts the recorder, runs
the recipe with hooks that record each setup stage as it happens, and records what ``run``
returns (an ``Outcome``: plain values, nothing written yet) before it closes the run.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from fp8lab_conf.contracts import (
    METRIC_EVAL_LOSS, METRIC_EVAL_LOSS_TOKENS, METRIC_FINAL_LOSS, METRIC_LOADAVG_END, METRIC_LOADAVG_START,
    METRIC_STEPS_DONE, METRIC_TOKENS_PER_S, METRIC_TOKENS_PER_S_MEAN, METRIC_TRAIN_WALL_S, METRIC_UNDERFLOW_EVENTS,
    STATUS_STOPPED_EARLY,
)
from workloads.data import load as data_mod
from workloads.data.chat_template import apply_chat_template_override
from workloads.data.heldout import load_heldout
from workloads.data.lengths import config_positions, loss_every_steps, measure, resolve_train_keys
from workloads.embedded.paths import embedded_paths
from workloads.eval.heldout import curve_hook, heldout_loss
from workloads.eval.metrics import eval_aggregate
from workloads.eval.score import score_tasks
from workloads.export.adapter import ADAPTER_ARTIFACT, save_adapter
from workloads.health.monitor import HealthMonitor, verdict_step
from workloads.health.rules import HealthRules
from workloads.health.signals import AdapterProbe
from workloads.model.loading import attach_lora, base_weight_norms, load_base_model
from workloads.precision.backends import apply_backend, select_backend
from workloads.precision.policy import PrecisionPolicy, get_policy
from workloads.precision.scaled_mm import enable_scaled_mm
from workloads.precision.telemetry import Fp8Telemetry
from workloads.precision.whatif import WhatIf
from workloads.train.checkpoint import Checkpointer
from workloads.train.faults import FaultInjector
from workloads.train.loop import LoopSettings, ProgressFn, TrainResult, run_training
from workloads.train.memory import PeakMemory
from workloads.train.step_clock import StepClock, load_average

log = logging.getLogger("fp8lab.trial")


# -- settings: one frozen dataclass per config part ------------------------------------------
@dataclass(frozen=True)
class RuntimeSettings:
    """Threads, seed and device (``train.num_threads``, ``seed``, ``train.device``)."""

    seed: int
    device: str
    num_threads: int | None

    @classmethod
    def from_config(cls, train_cfg: dict[str, Any], seed: int) -> RuntimeSettings:
        threads = train_cfg.get("num_threads") or int(os.environ.get("OMP_NUM_THREADS", 0)) or None
        return cls(int(seed), str(train_cfg["device"]), int(threads) if threads else None)


@dataclass(frozen=True)
class PrecisionSettings:
    """The policy (with its switches), the backend asked for, the telemetry threshold."""

    policy: str
    switches: tuple[tuple[str, Any], ...]
    backend: str
    underflow_threshold_pct: float
    gemm: str = "emulated"  # ``precision.gemm``: scaled_mm runs the FP8 GEMMs through torch._scaled_mm
    whatif: bool = False  # ``precision.telemetry.whatif``: every recipe on the same tensors (whatif.py)

    @classmethod
    def from_config(cls, precision_cfg: dict[str, Any]) -> PrecisionSettings:
        switches = tuple((precision_cfg["switches"] or {}).items())
        telemetry = precision_cfg["telemetry"]
        return cls(precision_cfg["policy"], switches, precision_cfg["backend"],
                   telemetry["underflow_threshold_pct"], precision_cfg.get("gemm", "emulated"),
                   bool(telemetry.get("whatif", False)))


@dataclass(frozen=True)
class HealthSettings:
    """When the verdict falls, the rules, the reference policy, and whether doomed trials stop
    (``sweep.early_stop``, handed in by the caller: the sweep part is not the health stage's)."""

    at: float
    reference_policy: str
    rules: Any
    early_stop: bool

    @classmethod
    def from_config(cls, health_cfg: dict[str, Any], early_stop: bool) -> HealthSettings:
        return cls(float(health_cfg["at"]), health_cfg["reference_policy"], health_cfg["rules"], bool(early_stop))


def loop_settings(train_cfg: dict[str, Any], telemetry_cfg: dict[str, Any]) -> LoopSettings:
    """The training loop's settings from ``train`` and ``precision.telemetry``."""
    return LoopSettings(
        steps=train_cfg["steps"], lr=train_cfg["lr"], weight_decay=train_cfg["weight_decay"],
        warmup_steps=train_cfg["warmup_steps"], lr_schedule=train_cfg["lr_schedule"], grad_clip=train_cfg["grad_clip"],
        log_every=train_cfg["log_every"],
        telemetry_every=telemetry_cfg["every"] if telemetry_cfg["enabled"] else None,
        grad_accum=int(train_cfg.get("grad_accum") or 1),
    )


# -- what setup leaves ready to train ---------------------------------------------------------
@dataclass(frozen=True)
class TrialData:
    """What the data stage leaves: the tokenized training rows, the held-out rows of `eval/loss`
    (tokenized like them, or None), what the limit cuts (`data/*`: logged, so a cut is never
    silent) and the loss curve's cadence in optimizer steps (`eval.loss_every`)."""

    train: data_mod.TokenizedData
    heldout: Any
    metrics: dict[str, float]
    loss_every: int


@dataclass
class Trial:
    """A trial as ``setup`` leaves it: everything the loop, evaluation and recording need."""

    device: torch.device
    model: Any
    tokenizer: Any
    policy: PrecisionPolicy
    telemetry: Fp8Telemetry
    choice: Any
    handle: Any
    base_norms: dict[str, float]  # ||W_base|| of each LoRA layer before conversion (the health signals' scale)
    memory: PeakMemory
    settings: LoopSettings
    batch_size: int
    seed: int
    base_metrics: dict[str, float]
    data: TrialData
    base_weight_bytes: int  # the frozen linears as the backend stores them (fixed from conversion on)

    @property
    def train_data(self) -> data_mod.TokenizedData:
        return self.data.train

    @property
    def heldout(self) -> Any:
        return self.data.heldout

    def batches(self, start_step: int = 0) -> Any:
        """The training batches after ``start_step`` (deterministic in seed and step): each one
        an optimizer step's rows, ``train.grad_accum`` micro-batches of ``batch_size``."""
        return data_mod.batches(self.train_data, self.batch_size * self.settings.grad_accum, self.settings.steps,
                                self.seed, start_step)


class SetupHooks(Protocol):
    """What a caller sees while ``setup`` runs (the trial records each as it happens)."""

    def on_device(self, device: torch.device) -> None: ...
    def on_rows(self, rows: Any, embedded_dir: Path) -> None: ...
    def on_precision(self, trial: Trial) -> None: ...


class RunHooks(SetupHooks, Protocol):
    """What the trial's lifecycle lends the stages after setup: where the training loop and the
    health monitor write (a ``TrialLogger``), and the store's side of two stages."""

    logger: Any

    def flush_at_checkpoints(self) -> None: ...
    def reference(self, policy: str) -> Callable[[int], float | None]: ...


@dataclass(frozen=True)
class Scores:
    """The evaluation stage's output: metrics and what the run keeps of them."""

    metrics: dict[str, float]
    heldout_rows: list[dict[str, float]]  # per-row held-out losses (`eval/loss_rows.jsonl`)
    lm_eval: dict[str, Any]  # lm-eval's output: per-task samples and results
    aggregate: str  # what `eval/accuracy` aggregates (``eval.primary``)


@dataclass(frozen=True)
class Outcome:
    """What ``run`` leaves for the lifecycle: the result's fields and the run's final records."""

    status: str  # FINISHED | DIVERGED | STOPPED_EARLY (a failure raises)
    reason: str
    metrics: dict[str, float]
    steps_done: int
    verdict: str  # the health verdict's line, or ""
    diverged_step: int | None
    stopped_step: int | None
    telemetry_rows: list[dict[str, Any]]
    scores: Scores | None  # None: not evaluated (diverged, stopped early)
    adapter: tuple[str, Callable[[Path], Path]] | None  # (artifact folder, save function), when kept
    logged_at_end: frozenset[str] = frozenset()  # final metrics the loop already logged at the last step
    whatif_rows: list[dict[str, Any]] | None = None  # every recipe on the cast tensors (precision.telemetry.whatif)


def run(config: dict[str, Any], hooks: RunHooks, checkpointer: Checkpointer | None = None,
        progress: ProgressFn | None = None) -> Outcome:
    """The whole trial, stage by stage. Only a trial that trained to the end is evaluated: a
    diverged one has nothing to score, and skipping it is the compute early stop saves.
    ``checkpointer`` (``setup_checkpointer``) is the lifecycle's: it outlives the run's records,
    so a worker killed during evaluation resumes after training instead of training again."""
    trial = setup(config, hooks)
    health = HealthSettings.from_config(config["health"], config["sweep"].get("early_stop", False))
    trained, train_scores = train(trial, config["train"], health, config.get("fault"), config["eval"], hooks,
                                  checkpointer, progress)
    scores = evaluate(trial, config["eval"], config["data"]["path"]) if trained.status == "FINISHED" else None
    return export(trial, trained, {**trial.base_metrics, **train_scores}, scores,
                  bool(config["tracking"].get("log_adapter", True)))


def setup(config: dict[str, Any], hooks: SetupHooks | None = None) -> Trial:
    """The stages of a trial, in order: runtime, model, data, the base model's scores, precision,
    health. ``hooks`` see the device once chosen, the training rows before tokenization (the run's
    dataset input), and the trial once its backend is applied (what ran), before calibration."""
    seed = int(config["seed"])
    device = setup_runtime(RuntimeSettings.from_config(config["train"], seed))
    if hooks is not None:
        hooks.on_device(device)
    paths = embedded_paths()
    memory = PeakMemory(device)  # before the model loads: the trial's peak is what it adds
    model, tokenizer, base_norms = setup_model(config["model"], config["lora"], paths.model_dir, device, seed)
    config, data = setup_data(config, tokenizer, config_positions(model.config), paths.data_dir,
                              hooks.on_rows if hooks is not None else None)
    base_metrics = (score_tasks(model, tokenizer, config["eval"], config["data"]["path"], device, prefix="eval/base_")[0]
                    if config["eval"]["before_training"] else {})
    precision = PrecisionSettings.from_config(config["precision"])
    policy, telemetry = setup_policy(precision)
    choice, handle = setup_backend(model, policy, telemetry, precision.backend, device, precision.gemm)
    trial = Trial(device, model, tokenizer, policy, telemetry, choice, handle, base_norms, memory,
                  loop_settings(config["train"], config["precision"]["telemetry"]), int(config["train"]["batch_size"]),
                  seed, base_metrics, data, handle.base_weight_bytes())
    if hooks is not None:
        hooks.on_precision(trial)
    calibrate(trial)
    return trial


# -- the stages -----------------------------------------------------------------------------
def setup_runtime(runtime: RuntimeSettings) -> torch.device:
    """Threads, seeds and device in one place (like nanoGPT's single setup block)."""
    if runtime.num_threads:
        torch.set_num_threads(runtime.num_threads)
    torch.manual_seed(runtime.seed)
    if runtime.device == "cuda" or (runtime.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", 0)  # Ray's CUDA_VISIBLE_DEVICES makes the assigned GPU cuda:0
    return torch.device("cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index or 0} {torch.cuda.get_device_name(device)}"
    return "cpu"


def setup_model(model_cfg: dict[str, Any], lora_cfg: dict[str, Any], embedded_model_dir: Path, device: torch.device,
                seed: int) -> tuple[Any, Any, dict[str, float]]:
    """(the base model with fresh LoRA adapters, its tokenizer, its base layers' norms) before any
    precision backend touches it: the norms are the BF16 weights' (the health signals' scale)."""
    model, tokenizer = load_base_model(model_cfg, embedded_model_dir, device)
    model = attach_lora(model, lora_cfg, seed)  # seeds its own draws: the data stage draws none
    return model, tokenizer, base_weight_norms(model)


def setup_data(config: dict[str, Any], tokenizer: Any, positions: int | None, embedded_dir: Path,
               on_rows: Callable[[Any, Path], None] | None = None) -> tuple[dict[str, Any], TrialData]:
    """(``config`` with the ``train`` keys its data decides filled in, the data the trial uses):
    the chat template, the training split tokenized (``on_rows`` sees the rows first: the run's
    dataset input), the held-out rows, what the limit cuts and the loss curve's cadence."""
    tokenizer = apply_chat_template_override(tokenizer, config["data"])
    config = resolve_train_keys(config, tokenizer, embedded_dir, positions)  # no-op once preflight did it
    data_cfg, train_cfg, eval_cfg = config["data"], config["train"], config["eval"]
    max_seq_len = int(train_cfg["max_seq_len"])
    rows = data_mod.load_training_rows(data_cfg, embedded_dir)
    if on_rows is not None:
        on_rows(rows, embedded_dir)
    train = data_mod.tokenize_rows(rows, data_cfg, tokenizer, max_seq_len)
    heldout = load_heldout(data_cfg, eval_cfg, max_seq_len, tokenizer, embedded_dir)
    lengths = train.lengths or []
    metrics = measure(lengths, int(train.input_ids.shape[1])).metrics() if lengths else {}
    loss_every = loss_every_steps(eval_cfg["loss_every"], len(train), int(train_cfg["batch_size"]),
                                  int(train_cfg.get("grad_accum") or 1))
    return config, TrialData(train, heldout, metrics, loss_every)


def setup_policy(precision: PrecisionSettings) -> tuple[PrecisionPolicy, Fp8Telemetry]:
    """The registered policy with its switches, and the telemetry collector it reports into."""
    policy = get_policy(precision.policy).with_switches(**dict(precision.switches))
    telemetry = Fp8Telemetry(underflow_threshold_pct=precision.underflow_threshold_pct)
    telemetry.whatif = WhatIf() if precision.whatif else None
    return policy, telemetry


def setup_backend(model: Any, policy: PrecisionPolicy, telemetry: Fp8Telemetry, backend: str,
                  device: torch.device, gemm: str = "emulated") -> tuple[Any, Any]:
    """(the backend choice, the handle) after applying ``policy`` to ``model`` through it; with
    ``gemm="scaled_mm"`` the FP8 GEMMs then run through ``torch._scaled_mm`` (each fallback is a
    plan row and a log line)."""
    choice = select_backend(backend, device)
    handle = apply_backend(model, policy, telemetry, choice)
    if gemm == "scaled_mm":
        handle.plan.extend(enable_scaled_mm(model))
    return choice, handle


def calibrate(trial: Trial) -> None:
    """Calibration forwards on their own batches (seed + 1), then the model goes to training."""
    calib = list(data_mod.batches(trial.train_data, trial.batch_size, trial.policy.calibration_steps, trial.seed + 1))
    trial.handle.calibrate(lambda b: trial.model(**{k: v.to(trial.device) for k, v in b.items()}), calib)
    trial.model.train()


def setup_health(health: HealthSettings, trial: Trial, reference: Callable[[int], float | None] | None,
                 logger: Any) -> HealthMonitor:
    """Signals at every logged step, the verdict at ``health.at``, the stop if early stop is on."""
    step, note = verdict_step(health.at, trial.settings.steps, trial.settings.log_every, trial.settings.telemetry_every)
    if note:
        log.info("health: %s", note)
    probe = AdapterProbe(trial.model, trial.base_norms)  # after the backend: it watches what the optimizer updates
    return HealthMonitor(probe, trial.handle, HealthRules.from_config(health.rules), step, health.early_stop, reference,
                         logger)


def setup_checkpointer(train_cfg: dict[str, Any], trial_id: str, run_id: str) -> Checkpointer | None:
    """Checkpoints every ``train.checkpoint_every`` steps under ``train.checkpoint_dir/<trial_id>``
    (None when off)."""
    every = int(train_cfg["checkpoint_every"])
    if every <= 0:
        return None
    root = Path(train_cfg["checkpoint_dir"] or "fp8lab-checkpoints").expanduser().resolve()
    return Checkpointer(root / trial_id, every, run_id)


def train(trial: Trial, train_cfg: dict[str, Any], health: HealthSettings, fault_cfg: dict[str, Any] | None,
          eval_cfg: dict[str, Any], hooks: RunHooks, checkpointer: Checkpointer | None = None,
          progress: ProgressFn | None = None) -> tuple[TrainResult, dict[str, float]]:
    """The training loop with what watches it (the health monitor, injected faults, checkpoints,
    the held-out loss curve): (the loop's result, its metrics with the load around it). A fault
    set for evaluation (``fault.kind=kill_in_eval``) fires as a finished training hands over."""
    if checkpointer:
        hooks.flush_at_checkpoints()
    curve = loss_curve(trial, eval_cfg)
    monitor = setup_health(health, trial, hooks.reference(health.reference_policy), hooks.logger)
    faults = FaultInjector(fault_cfg)
    load_start = load_average()
    result = run_training(trial.model, trial.handle, trial.telemetry, trial.batches, trial.settings, hooks.logger,
                          progress, before_step=faults.before_step, checkpointer=checkpointer, health=monitor,
                          heldout=curve)
    hooks.logger.flush()  # training's metrics are in the store before evaluation, which can take minutes
    if result.status == "FINISHED":
        faults.before_eval()
    load_end = load_average()
    return result, {**train_metrics(result, trial), METRIC_LOADAVG_START: load_start, METRIC_LOADAVG_END: load_end}


def train_metrics(train: TrainResult, trial: Trial) -> dict[str, float]:
    """The speed figure is the steady-state median of `StepClock`; a run too short to have one
    after its warm-up falls back to the whole-run mean (which is also logged under its own name)."""
    return {
        METRIC_TOKENS_PER_S: train.tokens_per_s,
        METRIC_TOKENS_PER_S_MEAN: train.tokens_per_s,
        **StepClock(trial.settings.steps, train.step_windows).summary(),
        METRIC_FINAL_LOSS: train.final_loss,
        METRIC_TRAIN_WALL_S: train.wall_s,
        METRIC_STEPS_DONE: float(train.steps_done),
        METRIC_UNDERFLOW_EVENTS: float(train.underflow_events),
        "memory/peak_bytes": float(trial.memory.peak_bytes()),
        "memory/base_weight_bytes": float(trial.base_weight_bytes),
        **trial.data.metrics,
    }


def loss_curve(trial: Trial, eval_cfg: dict[str, Any]) -> Callable[[int], dict[str, float]] | None:
    """The training loop's hook for the `eval/loss` curve every ``eval.loss_every`` steps."""
    return curve_hook(trial.model, trial.heldout, trial.data.loss_every, int(eval_cfg["batch_size"]), trial.device,
                      trial.handle)


def heldout_metrics(trial: Trial, eval_cfg: dict[str, Any]) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(`eval/loss` and its token count, the per-row losses) of the trained model, with the
    scaling state put back afterwards, so the lm-eval accuracy that follows is what it would be
    without it; ({}, []) without held-out rows."""
    if trial.heldout is None:
        return {}, []
    with trial.handle.preserved_scaling_state():
        out = heldout_loss(trial.model, trial.heldout, int(eval_cfg["batch_size"]), trial.device)
    return {METRIC_EVAL_LOSS: out.mean, METRIC_EVAL_LOSS_TOKENS: float(sum(r["tokens"] for r in out.rows))}, out.rows


def evaluate(trial: Trial, eval_cfg: dict[str, Any], data_path: Any) -> Scores:
    """The trained model's scores: the held-out loss first (it puts the scaling state back, so
    what lm-eval scores next is what it would be without it), then lm-eval on every task."""
    loss_metrics, loss_rows = heldout_metrics(trial, eval_cfg)
    eval_metrics, out = score_tasks(trial.model, trial.tokenizer, eval_cfg, data_path, trial.device)
    return Scores({**loss_metrics, **eval_metrics}, loss_rows, out, eval_aggregate(eval_cfg))


def export(trial: Trial, trained: TrainResult, metrics: dict[str, float], scores: Scores | None,
           keep_adapter: bool) -> Outcome:
    """What the run keeps: status and reason, every metric, the telemetry rows, the scores and,
    for a trial that finished (with ``tracking.log_adapter``), the trained LoRA adapter."""
    status, reason, stopped = trained.status, "", None
    if status == "DIVERGED":
        reason = f"non-finite loss at step {trained.diverged_step}"
    elif status == STATUS_STOPPED_EARLY:
        reason, stopped = f"stopped early at step {trained.steps_done}: {trained.verdict}", trained.steps_done
    metrics = {**metrics, **(scores.metrics if scores else {}),
               "train/tokens_per_epoch": float(trial.train_data.attention_mask.sum())}
    adapter = (ADAPTER_ARTIFACT, functools.partial(save_adapter, trial.model)) if status == "FINISHED" and keep_adapter else None
    logged = frozenset({METRIC_UNDERFLOW_EVENTS} if trained.underflow_logged_step == trained.steps_done else ())
    return Outcome(status, reason, metrics, trained.steps_done, trained.verdict, trained.diverged_step, stopped,
                   trained.telemetry_rows, scores, adapter, logged,
                   trial.telemetry.whatif.rows if trial.telemetry.whatif is not None else None)
