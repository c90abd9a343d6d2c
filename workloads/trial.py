"""One trial, top to bottom: load -> LoRA -> precision policy -> calibrate -> train -> evaluate
-> record. Every outcome is a result (FINISHED, DIVERGED or FAILED with a reason), never a crash.

The orchestrator created the MLflow run; this module fills it and closes it.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from fp8lab_conf.contracts import (
    TAG_ABLATION, TAG_ADAPTER_ERROR, TAG_BACKEND, TAG_BACKEND_REASON, TAG_CUDA_VISIBLE_DEVICES, TAG_DEVIATIONS, TAG_DEVICE,
    TAG_DIVERGED_STEP, TAG_EMULATED, TAG_EVAL_AGGREGATE, TAG_EVAL_PRIMARY, TAG_HOST, TAG_POLICY_VERSION, TAG_RAY_NODE_ID,
    TAG_RAY_RESOURCES, TAG_REASON, STATUS_STOPPED_EARLY, TAG_STATUS, TAG_STOPPED_EARLY, TAG_VERSIONS_PREFIX, TELEMETRY_COLUMNS, TrialLaunch,
    METRIC_FINAL_LOSS, METRIC_STEPS_DONE, METRIC_TOKENS_PER_S, METRIC_TRAIN_WALL_S, METRIC_TRIAL_WALL_S, METRIC_UNDERFLOW_EVENTS,
    RESULT_JSON,
)
from workloads.data import load as data_mod
from workloads.eval.metrics import (PRIMARY_MEAN, configured_tasks, eval_data_dirs, primary_figure, safe_name,
                                    task_metrics)
from workloads.eval.harness import embedded_paths, evaluate_tasks
from workloads.train.checkpoint import Checkpointer
from workloads.train.faults import FaultInjector
from workloads.train.memory import PeakMemory
from workloads.model.loading import attach_lora, load_base_model
from workloads.precision.backends import apply_backend, select_backend
from workloads.precision.ladder import ladder_tags
from workloads.precision.policy import get_policy
from workloads.precision.telemetry import Fp8Telemetry
from workloads.export.adapter import ADAPTER_ARTIFACT, save_adapter
from workloads.health.monitor import HealthMonitor, verdict_step
from workloads.health.reference import mlflow_reference
from workloads.health.rules import HealthRules
from workloads.health.signals import AdapterProbe, base_weight_norms
from workloads.record.run_inputs import run_inputs
from workloads.record.logger import MlflowTrialLogger, SystemMetrics, write_parquet
from workloads.train.loop import LoopSettings, ProgressFn, TrainResult, run_training

log = logging.getLogger("fp8lab.trial")


def run_trial(ctx: TrialLaunch, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Run one trial and return the result dict of docs/contracts.md (also logged as result.json)."""
    config = ctx.config
    logger = MlflowTrialLogger(ctx.tracking_uri, ctx.run_id)
    log_path, handler = _capture_log()
    result = _result_skeleton(config, ctx)
    started = time.perf_counter()
    system = None
    try:
        logger.client.update_run(ctx.run_id, status="RUNNING")
        logger.set_tags({TAG_STATUS: "RUNNING"})
        system = SystemMetrics(ctx.tracking_uri, ctx.run_id, float(config["tracking"].get("system_metrics_interval_s", 0)))
        _run(config, ctx, logger, result, progress)
    except Exception as exc:  # noqa: BLE001 - any failure becomes a FAILED result
        log.error("trial failed:\n%s", traceback.format_exc())
        result.update(status="FAILED", reason=f"{type(exc).__name__}: {exc}")
    finally:
        if system is not None:
            system.stop()  # while the run is still RUNNING: the monitor stops writing to closed runs
        logging.getLogger().removeHandler(handler)
        result["metrics"][METRIC_TRIAL_WALL_S] = time.perf_counter() - started
        _close_run(logger, result, log_path)
    return result


def _run(config: dict[str, Any], ctx: TrialLaunch, logger: MlflowTrialLogger,
         result: dict[str, Any], progress: ProgressFn | None) -> None:
    device = _setup_runtime(config)
    result["device"] = _device_name(device)
    paths = embedded_paths()
    memory = PeakMemory(device)
    model, tokenizer = load_base_model(config["model"], paths.model_dir, device)
    train_data = _training_data(config, tokenizer, paths.data_dir, logger)
    model = attach_lora(model, config["lora"], config["seed"])
    base_norms = base_weight_norms(model)  # before the backend converts base layers: their BF16 norms
    policy = get_policy(config["precision"]["policy"]).with_switches(**(config["precision"]["switches"] or {}))
    tele_cfg = config["precision"]["telemetry"]
    telemetry = Fp8Telemetry(underflow_threshold_pct=tele_cfg["underflow_threshold_pct"])
    base_metrics = _evaluate(model, tokenizer, config, device, prefix="eval/base_") if config["eval"]["before_training"] else {}
    choice = select_backend(config["precision"]["backend"], device)
    handle = apply_backend(model, policy, telemetry, choice)
    probe = AdapterProbe(model, base_norms)  # after: it watches the parameters the optimizer updates
    result.update(backend=handle.backend, emulated=bool(handle.emulated), deviations=list(handle.deviations))
    logger.set_tags({TAG_BACKEND_REASON: choice.reason[:5000], TAG_DEVIATIONS: "; ".join(handle.deviations)[:5000]})
    _log_setup(logger, config, result, handle, policy)
    settings = _loop_settings(config)
    def make_batches(start_step: int):
        return data_mod.batches(train_data, settings_batch(config), settings.steps, config["seed"], start_step)

    calib = list(data_mod.batches(train_data, settings_batch(config), policy.calibration_steps, config["seed"] + 1))
    handle.calibrate(lambda b: model(**{k: v.to(device) for k, v in b.items()}), calib)
    model.train()
    faults = FaultInjector(config.get("fault"))
    checkpointer = _checkpointer(config, ctx, logger)
    health = _health_monitor(config, ctx, settings, probe, handle, logger)
    train = run_training(model, handle, telemetry, make_batches, settings, logger, progress,
                         before_step=faults.before_step, checkpointer=checkpointer, health=health)
    if checkpointer:
        checkpointer.remove()  # training is over: the checkpoint has served its purpose
    metrics = {**base_metrics, **_train_metrics(train, memory, handle)}
    if train.status == "DIVERGED":
        result.update(status="DIVERGED", reason=f"non-finite loss at step {train.diverged_step}",
                      diverged_step=train.diverged_step)
    elif train.status == STATUS_STOPPED_EARLY:  # no evaluation: that is the compute early stop saves
        result.update(status=STATUS_STOPPED_EARLY, reason=f"stopped early at step {train.steps_done}: {train.verdict}",
                      stopped_step=train.steps_done)
    else:
        metrics.update(_evaluate(model, tokenizer, config, device, logger=logger))
    metrics["train/tokens_per_epoch"] = float(train_data.attention_mask.sum())
    if train.verdict:
        result["health"] = train.verdict
    result["metrics"] = metrics
    logger.log_final(metrics, step=train.steps_done)  # at the last step, so MLflow's latest value is the final one
    _log_telemetry(logger, train)
    if result["status"] == "FINISHED" and config["tracking"].get("log_adapter", True):
        _log_adapter(logger, model)


def _health_monitor(config: dict[str, Any], ctx: TrialLaunch, settings: LoopSettings, probe: AdapterProbe,
                    handle: Any, logger: MlflowTrialLogger) -> HealthMonitor:
    """Signals at every logged step, the verdict at `health.at`, the stop if `sweep.early_stop`."""
    cfg = config["health"]
    step, note = verdict_step(float(cfg["at"]), settings.steps, settings.log_every, settings.telemetry_every)
    if note:
        log.info("health: %s", note)
    reference = mlflow_reference(ctx.tracking_uri, ctx.run_id, cfg["reference_policy"])
    return HealthMonitor(probe, handle, HealthRules.from_config(cfg["rules"]), step,
                         bool(config["sweep"].get("early_stop", False)), reference, logger)


def _checkpointer(config: dict[str, Any], ctx: TrialLaunch, logger: MlflowTrialLogger) -> Checkpointer | None:
    """Checkpoints every `train.checkpoint_every` steps under `train.checkpoint_dir/<trial_id>`.
    Metrics are then written at checkpoints (and the end) only, so a resumed run re-logs
    exactly the steps that were lost with the killed worker."""
    every = int(config["train"]["checkpoint_every"])
    if every <= 0:
        return None
    logger.flush_every = 10**9
    root = Path(config["train"]["checkpoint_dir"] or "fp8lab-checkpoints").expanduser().resolve()
    return Checkpointer(root / ctx.trial_id, every, ctx.run_id)


def settings_batch(config: dict[str, Any]) -> int:
    return int(config["train"]["batch_size"])


def _setup_runtime(config: dict[str, Any]) -> torch.device:
    """Threads, seeds and device in one place (like nanoGPT's single setup block)."""
    threads = config["train"].get("num_threads") or int(os.environ.get("OMP_NUM_THREADS", 0)) or None
    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(config["seed"])
    wanted = config["train"]["device"]
    if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", 0)  # Ray's CUDA_VISIBLE_DEVICES makes the assigned GPU cuda:0
    return torch.device("cpu")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index or 0} {torch.cuda.get_device_name(device)}"
    return "cpu"


def _training_data(config: dict[str, Any], tokenizer: Any, embedded_dir: Path,
                   logger: MlflowTrialLogger) -> data_mod.TokenizedData:
    rows = data_mod.load_training_rows(config["data"], embedded_dir)
    logger.log_inputs(run_inputs(config, rows, embedded_dir))
    return data_mod.tokenize_rows(rows, config["data"], tokenizer, config["train"]["max_seq_len"])


def _loop_settings(config: dict[str, Any]) -> LoopSettings:
    train, tele = config["train"], config["precision"]["telemetry"]
    return LoopSettings(
        steps=train["steps"], lr=train["lr"], weight_decay=train["weight_decay"],
        warmup_steps=train["warmup_steps"], lr_schedule=train["lr_schedule"], grad_clip=train["grad_clip"],
        log_every=train["log_every"],
        telemetry_every=tele["every"] if tele["enabled"] else None,
    )


def _log_setup(logger: MlflowTrialLogger, config: dict[str, Any], result: dict[str, Any], handle: Any, policy: Any) -> None:
    from omegaconf import OmegaConf

    logger.set_tags({TAG_BACKEND: handle.backend, TAG_EMULATED: str(bool(handle.emulated)).lower(),
                     TAG_DEVICE: result["device"], TAG_POLICY_VERSION: policy.version,
                     TAG_ABLATION: policy.ablation,
                     **ladder_tags(policy.ladder, policy.ladder_base, policy.mechanism),
                     TAG_CUDA_VISIBLE_DEVICES: os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                     TAG_HOST: socket.gethostname(), **_ray_placement_tags(), **_version_tags()})
    logger.log_text(OmegaConf.to_yaml(OmegaConf.create(config)), "config/resolved.yaml")
    logger.log_dict({"policy": policy.to_dict(), "plan": handle.plan}, "precision/plan.json")


def _ray_placement_tags() -> dict[str, str]:
    """Which Ray node ran this trial and which resources Ray gave it (nothing outside Ray)."""
    try:
        import ray

        if not ray.is_initialized():
            return {}
        context = ray.get_runtime_context()
        return {TAG_RAY_NODE_ID: context.get_node_id(),
                TAG_RAY_RESOURCES: json.dumps(context.get_assigned_resources(), sort_keys=True)}
    except Exception:  # noqa: BLE001 - placement tags are informative only
        return {}


def _version_tags() -> dict[str, str]:
    """Versions of the stack that computed the numbers (the report's Environment section)."""
    from importlib.metadata import PackageNotFoundError, version

    tags = {}
    for package in ("torch", "transformers", "peft", "lm_eval", "mlflow", "ray", "torchao"):
        try:
            tags[f"{TAG_VERSIONS_PREFIX}{package}"] = version(package.replace("_", "-"))
        except PackageNotFoundError:
            continue
    return tags


def _train_metrics(train: TrainResult, memory: PeakMemory, handle: Any) -> dict[str, float]:
    return {
        METRIC_TOKENS_PER_S: train.tokens_per_s,
        METRIC_FINAL_LOSS: train.final_loss,
        METRIC_TRAIN_WALL_S: train.wall_s,
        METRIC_STEPS_DONE: float(train.steps_done),
        METRIC_UNDERFLOW_EVENTS: float(train.underflow_events),
        "memory/peak_bytes": float(memory.peak_bytes()),
        "memory/base_weight_bytes": float(handle.base_weight_bytes()),
    }


def _evaluate(model: Any, tokenizer: Any, config: dict[str, Any], device: torch.device,
              prefix: str = "eval/", logger: MlflowTrialLogger | None = None) -> dict[str, float]:
    """Metrics of one evaluation of every configured task: `<prefix>accuracy` (+ stderr) is the
    primary figure `eval.primary` chooses, `eval/<task>/<metric>` (+ stderr) every number
    lm-eval returned (`eval/base/<task>/...` before training). With a logger, also lm-eval's
    results and per-item samples as artifacts (`eval/results.json`,
    `eval/samples/<task>.jsonl`) for paired statistics."""
    ev = config["eval"]
    names = configured_tasks(ev)
    started = time.perf_counter()
    model.eval()
    with torch.no_grad():
        out = evaluate_tasks(
            model, tokenizer, names, metrics=ev.get("metrics") or {},
            data_dirs=eval_data_dirs(config["data"]["path"], names),
            include_path=ev["include_path"], limit=ev["limit"], batch_size=ev["batch_size"],
            num_fewshot=ev["num_fewshot"], apply_chat_template=ev.get("apply_chat_template", False),
            fewshot_as_multiturn=ev.get("fewshot_as_multiturn", False),
            system_instruction=ev.get("system_instruction"), device=str(device),
        )
    aggregate = ev.get("primary") or PRIMARY_MEAN
    if logger is not None:
        _log_eval_artifacts(logger, out, aggregate)
    accuracy, stderr = primary_figure(out["tasks"], aggregate)
    metrics = {f"{prefix}accuracy": accuracy, f"{prefix}accuracy_stderr": stderr,
               f"{prefix}n": float(sum(t["n"] for t in out["tasks"].values()))}
    for name, one in out["tasks"].items():
        metrics.update(task_metrics(name, one["raw"], prefix if prefix == "eval/" else prefix.rstrip("_") + "/"))
    metrics[f"{prefix}wall_s"] = time.perf_counter() - started
    return metrics


def _log_eval_artifacts(logger: MlflowTrialLogger, out: dict[str, Any], aggregate: str) -> None:
    """Samples and results as artifacts; tags say which metric of each task is its primary one
    (the report's per-task column) and what eval/accuracy aggregates."""
    primaries = {safe_name(name): one["primary"] for name, one in out["tasks"].items()}
    logger.set_tags({TAG_EVAL_PRIMARY: json.dumps(primaries), TAG_EVAL_AGGREGATE: aggregate})
    for name, one in out["tasks"].items():
        lines = "".join(json.dumps(row) + "\n" for row in one["samples"])
        logger.log_text(lines, f"eval/samples/{safe_name(name)}.jsonl")
    logger.log_dict(out["results"], "eval/results.json")


def _log_adapter(logger: MlflowTrialLogger, model: Any) -> None:
    """The trained LoRA adapter as artifact `adapter/` (PEFT layout), for `fp8lab export`. A
    failure here is logged and tagged but does not undo a finished trial's results."""
    try:
        with tempfile.TemporaryDirectory(prefix="fp8lab-adapter-") as tmp:
            logger.log_dir(save_adapter(model, Path(tmp) / ADAPTER_ARTIFACT), ADAPTER_ARTIFACT)
    except Exception as exc:  # noqa: BLE001
        log.error("adapter not saved: %s", exc)
        logger.set_tags({TAG_ADAPTER_ERROR: f"{type(exc).__name__}: {exc}"[:5000]})


def _log_telemetry(logger: MlflowTrialLogger, train: TrainResult) -> None:
    if train.telemetry_rows:
        parquet = write_parquet(train.telemetry_rows, TELEMETRY_COLUMNS)
        try:
            logger.log_file(parquet, "telemetry")
        finally:
            shutil.rmtree(parquet.parent, ignore_errors=True)


def _result_skeleton(config: dict[str, Any], ctx: TrialLaunch) -> dict[str, Any]:
    return {"trial_id": ctx.trial_id, "policy": ctx.policy_label, "seed": config["seed"], "status": "FINISHED",
            "reason": "", "backend": "emulated" if config["precision"]["backend"] == "auto" else config["precision"]["backend"],
            "device": "unknown", "emulated": True, "deviations": [],
            "mlflow_run_id": ctx.run_id, "metrics": {}}


def _capture_log() -> tuple[Path, logging.Handler]:
    """Everything logged during the trial also goes to a file logged as logs/trial.log."""
    path = Path(tempfile.mkdtemp(prefix="fp8lab-trial-")) / "trial.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    return path, handler


def _close_run(logger: MlflowTrialLogger, result: dict[str, Any], log_path: Path) -> None:
    """Tags, result.json, the log file and the run's terminal status; best effort when the
    store is down (the orchestrator then records the failure from the returned result)."""
    status = "FAILED" if result["status"] == "FAILED" else "FINISHED"
    try:
        tags = {TAG_STATUS: result["status"], TAG_REASON: result["reason"][:5000]}
        if result.get("diverged_step") is not None:
            tags[TAG_DIVERGED_STEP] = result["diverged_step"]
        if result["status"] == STATUS_STOPPED_EARLY:
            tags[TAG_STOPPED_EARLY] = result["reason"][:5000]
        logger.log_step(int(result["metrics"].get(METRIC_STEPS_DONE, 0)), {METRIC_TRIAL_WALL_S: result["metrics"][METRIC_TRIAL_WALL_S]})
        logger.flush()
        logger.set_tags(tags)
        logger.log_text(json.dumps(result, indent=2, default=str), RESULT_JSON)
        if log_path.exists():
            logger.log_file(log_path, "logs")
        logger.client.set_terminated(result["mlflow_run_id"], status)
    except Exception as exc:  # noqa: BLE001
        result.update(status="FAILED", reason=result["reason"] or f"tracking store unavailable: {exc}")
        log.error("could not finish MLflow run: %s", exc)
    finally:
        shutil.rmtree(log_path.parent, ignore_errors=True)  # the temp folder too: nothing left in /tmp
