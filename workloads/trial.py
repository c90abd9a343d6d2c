"""One trial's lifecycle: start the run, run the recipe, put the result together, close the run.
Every outcome is a result (FINISHED, DIVERGED, STOPPED_EARLY or FAILED with a reason), never a
crash. The stages themselves are ``workloads.recipe``; every MLflow write is the recorder's
(``workloads.record.recorder``).

The orchestrator created the MLflow run; this module fills it and closes it.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from fp8lab_conf.contracts import (
    METRIC_LOADAVG_END, METRIC_LOADAVG_START, METRIC_QUEUE_S, METRIC_TRIAL_WALL_S, STATUS_STOPPED_EARLY, TrialLaunch,
)
from workloads import recipe
from workloads.eval.metrics import safe_name
from workloads.export.adapter import ADAPTER_ARTIFACT, save_adapter
from workloads.precision.ladder import ladder_tags
from workloads.record.recorder import TrialRecorder
from workloads.record.reference import mlflow_reference
from workloads.train.faults import FaultInjector
from workloads.train.loop import ProgressFn, run_training
from workloads.train.step_clock import load_average

log = logging.getLogger("fp8lab.trial")


def run_trial(ctx: TrialLaunch, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Run one trial and return the result dict of docs/contracts.md (also logged as result.json)."""
    config = ctx.config
    recorder = TrialRecorder(ctx.tracking_uri, ctx.run_id)
    log_path, handler = _capture_log()
    result = _result_skeleton(config, ctx)
    started = time.perf_counter()
    try:
        recorder.start(float(config["tracking"].get("system_metrics_interval_s", 0)))
        result["metrics"][METRIC_QUEUE_S] = recorder.queue_seconds()
        _run(config, ctx, recorder, result, progress)
    except Exception as exc:  # noqa: BLE001 - any failure becomes a FAILED result
        log.error("trial failed:\n%s", traceback.format_exc())
        result.update(status="FAILED", reason=f"{type(exc).__name__}: {exc}")
    finally:
        recorder.stop_system_metrics()  # while the run is still RUNNING
        logging.getLogger().removeHandler(handler)
        result["metrics"][METRIC_TRIAL_WALL_S] = time.perf_counter() - started
        try:
            recorder.close(result, log_path)
        finally:
            shutil.rmtree(log_path.parent, ignore_errors=True)  # the temp folder too: nothing left in /tmp
    return result


class _SetupRecord:
    """What the trial writes down while the recipe sets up (recipe.SetupHooks)."""

    def __init__(self, config: dict[str, Any], recorder: TrialRecorder, result: dict[str, Any]) -> None:
        self.config, self.recorder, self.result = config, recorder, result

    def on_device(self, device: Any) -> None:
        self.result["device"] = recipe.device_name(device)

    def on_rows(self, rows: Any, embedded_dir: Path) -> None:
        self.recorder.inputs(self.config, rows, embedded_dir)

    def on_precision(self, trial: recipe.Trial) -> None:
        handle, policy = trial.handle, trial.policy
        self.result.update(backend=handle.backend, emulated=bool(handle.emulated), deviations=list(handle.deviations))
        self.recorder.setup(self.config, self.result["device"], trial.choice, handle, policy,
                            ladder_tags(policy.ladder, policy.ladder_base, policy.mechanism))


def _run(config: dict[str, Any], ctx: TrialLaunch, recorder: TrialRecorder,
         result: dict[str, Any], progress: ProgressFn | None) -> None:
    trial = recipe.setup(config, _SetupRecord(config, recorder, result))
    faults = FaultInjector(config.get("fault"))
    checkpointer = recipe.setup_checkpointer(config["train"], ctx.trial_id, ctx.run_id)
    if checkpointer:
        recorder.logger.hold_until_flush()  # metrics at checkpoints only: a resume re-logs exactly the lost steps
    health_cfg = recipe.HealthSettings.from_config(config["health"], config["sweep"].get("early_stop", False))
    health = recipe.setup_health(health_cfg, trial, mlflow_reference(ctx.tracking_uri, ctx.run_id, health_cfg.reference_policy),
                                 recorder.logger)
    load_start = load_average()
    train = run_training(trial.model, trial.handle, trial.telemetry, trial.batches, trial.settings, recorder.logger,
                         progress, before_step=faults.before_step, checkpointer=checkpointer, health=health,
                         heldout=recipe.loss_curve(trial, config["eval"]))
    if checkpointer:
        checkpointer.remove()  # training is over: the checkpoint has served its purpose
    metrics = {**trial.base_metrics, **recipe.train_metrics(train, trial),
               METRIC_LOADAVG_START: load_start, METRIC_LOADAVG_END: load_average()}
    if train.status == "DIVERGED":
        result.update(status="DIVERGED", reason=f"non-finite loss at step {train.diverged_step}",
                      diverged_step=train.diverged_step)
    elif train.status == STATUS_STOPPED_EARLY:  # no evaluation: that is the compute early stop saves
        result.update(status=STATUS_STOPPED_EARLY, reason=f"stopped early at step {train.steps_done}: {train.verdict}",
                      stopped_step=train.steps_done)
    else:
        loss_metrics, loss_rows = recipe.heldout_metrics(trial, config["eval"])
        recorder.heldout(loss_rows)
        metrics.update(loss_metrics)
        eval_metrics, out = recipe.evaluate(trial.model, trial.tokenizer, config["eval"], config["data"]["path"], trial.device)
        recorder.eval(out, recipe.eval_aggregate(config["eval"]), safe_name)
        metrics.update(eval_metrics)
    metrics["train/tokens_per_epoch"] = float(trial.train_data.attention_mask.sum())
    if train.verdict:
        result["health"] = train.verdict
    result["metrics"].update(metrics)
    keep_adapter = result["status"] == "FINISHED" and config["tracking"].get("log_adapter", True)
    recorder.end(metrics, train.steps_done, train.telemetry_rows,
                 adapter=(ADAPTER_ARTIFACT, lambda folder: save_adapter(trial.model, folder)) if keep_adapter else None)


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
