"""One trial's lifecycle: start the run, run the recipe, put the result together, close the run.
Every outcome is a result (FINISHED, DIVERGED, STOPPED_EARLY or FAILED with a reason), never a
crash. The stages themselves are ``workloads.recipe``; every MLflow write is the recorder's
(``workloads.record.recorder``).

The orchestrator created the MLflow run; this module fills it and closes it.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from fp8lab_conf.contracts import METRIC_QUEUE_S, METRIC_TRIAL_WALL_S, TrialLaunch
from fp8lab_conf.filesystem import process_exists
from workloads import recipe
from workloads.precision.ladder import ladder_tags
from workloads.record.recorder import TrialRecorder

log = logging.getLogger("fp8lab.trial")


def run_trial(ctx: TrialLaunch, progress: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run one trial and return the result dict of docs/contracts.md (also logged as result.json)."""
    config = ctx.config
    result = _result_skeleton(config, ctx)
    log_path, handler = _capture_log()
    recorder = TrialRecorder(ctx.tracking_uri, ctx.run_id)
    started = time.perf_counter()
    checkpointer = None
    try:
        checkpointer = recipe.setup_checkpointer(config["train"], ctx.trial_id, ctx.run_id)
        run_id = recorder.start(float(config["tracking"].get("system_metrics_interval_s", 0)),
                                resumable=bool(checkpointer and checkpointer.resumable()))
        if run_id != ctx.run_id:  # a retry that could not resume: a fresh attempt run (record/attempts.py)
            result["mlflow_run_id"] = run_id
            checkpointer = recipe.setup_checkpointer(config["train"], ctx.trial_id, run_id)
        result["metrics"][METRIC_QUEUE_S] = recorder.queue_seconds()
        outcome = recipe.run(config, _Hooks(config, recorder, result), checkpointer, progress)
        _put_together(result, outcome)
        _record_end(recorder, outcome)
    except Exception as exc:  # noqa: BLE001 - any failure becomes a FAILED result
        log.error("trial failed:\n%s", traceback.format_exc())
        result.update(status="FAILED", reason=f"{type(exc).__name__}: {exc}")
    finally:
        recorder.stop_system_metrics()  # while the run is still RUNNING
        logging.getLogger().removeHandler(handler)
        result["metrics"][METRIC_TRIAL_WALL_S] = time.perf_counter() - started
        try:
            recorder.close(result, log_path)
            if checkpointer:
                checkpointer.remove()  # the run is closed: only now has the checkpoint served its purpose
        finally:
            shutil.rmtree(log_path.parent, ignore_errors=True)  # the temp folder too: nothing left in /tmp
    return result


class _Hooks:
    """The recipe's hooks (``recipe.RunHooks``): the recorder writes each setup stage down as it
    happens, and the result notes what ran, so a trial that fails later still says so."""

    def __init__(self, config: dict[str, Any], recorder: TrialRecorder, result: dict[str, Any]) -> None:
        self.config, self.recorder, self.result = config, recorder, result
        self.logger = recorder.logger  # the training loop's and the health monitor's writer

    def on_device(self, device: Any) -> None:
        self.result["device"] = recipe.device_name(device)

    def on_rows(self, rows: Any, embedded_dir: Path) -> None:
        self.recorder.inputs(self.config, rows, embedded_dir)

    def on_precision(self, trial: recipe.Trial) -> None:
        handle, policy = trial.handle, trial.policy
        self.result.update(backend=handle.backend, emulated=bool(handle.emulated), deviations=list(handle.deviations))
        self.recorder.setup(self.config, self.result["device"], trial.choice, handle, policy,
                            ladder_tags(policy.ladder, policy.ladder_base, policy.mechanism))

    def flush_at_checkpoints(self) -> None:
        self.recorder.flush_at_checkpoints()

    def reference(self, policy: str) -> Callable[[int], float | None]:
        return self.recorder.reference(policy)


def _put_together(result: dict[str, Any], outcome: recipe.Outcome) -> None:
    """The recipe's outcome into the result of docs/contracts.md."""
    result.update(status=outcome.status, reason=outcome.reason)
    if outcome.diverged_step is not None:
        result["diverged_step"] = outcome.diverged_step
    if outcome.stopped_step is not None:
        result["stopped_step"] = outcome.stopped_step
    if outcome.verdict:
        result["health"] = outcome.verdict
    result["metrics"].update(outcome.metrics)


def _record_end(recorder: TrialRecorder, outcome: recipe.Outcome) -> None:
    """The run's final records, in the order a reader finds them: scores, then metrics and files."""
    if outcome.scores is not None:
        recorder.heldout(outcome.scores.heldout_rows)
        recorder.eval(outcome.scores.lm_eval, outcome.scores.aggregate)
    if outcome.whatif_rows is not None:
        recorder.whatif(outcome.whatif_rows)
    metrics = {k: v for k, v in outcome.metrics.items() if k not in outcome.logged_at_end}  # each (metric, step) once
    recorder.end(metrics, outcome.steps_done, outcome.telemetry_rows, adapter=outcome.adapter)


def _result_skeleton(config: dict[str, Any], ctx: TrialLaunch) -> dict[str, Any]:
    return {"trial_id": ctx.trial_id, "policy": ctx.policy_label, "seed": config["seed"], "status": "FINISHED",
            "reason": "", "backend": "emulated" if config["precision"]["backend"] == "auto" else config["precision"]["backend"],
            "device": "unknown", "emulated": True, "deviations": [],
            "mlflow_run_id": ctx.run_id, "metrics": {}}


LOG_DIR_PREFIX = "fp8lab-trial-"  # + the owning process's pid + "-" + mkdtemp's random part


def _capture_log() -> tuple[Path, logging.Handler]:
    """Everything logged during the trial also goes to a file logged as logs/trial.log."""
    remove_orphaned_log_dirs()
    path = Path(tempfile.mkdtemp(prefix=f"{LOG_DIR_PREFIX}{os.getpid()}-")) / "trial.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    return path, handler


def remove_orphaned_log_dirs() -> list[Path]:
    """Remove the log folders of trials whose process is gone; return them.

    A trial that ends, fails or is stopped removes its own folder (``run_trial``'s ``finally``),
    but a SIGKILLed one (the sweep's hard stop, the OOM killer) cannot. Its folder name holds its
    pid, so the next trial on the machine removes it once no process of that pid exists. A reused
    pid only delays the removal. Folders of other users' live processes are left alone."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{LOG_DIR_PREFIX}*-*"):
        pid = folder.name[len(LOG_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed

