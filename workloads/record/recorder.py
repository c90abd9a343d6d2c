"""A trial's MLflow run as one object with lifecycle hooks (after Ray's ``MLflowLoggerCallback``).

The trial calls ``start``, runs the recipe (whose hooks call ``inputs`` and ``setup`` as the
stages happen; the training loop and the health monitor write through ``logger``), then
``heldout`` -> ``eval`` -> ``end`` with what the recipe returned, and ``close``; nothing else in
a trial talks to MLflow. The run
itself was created by the orchestrator, so a retried trial writes into the run it was given.
Every name written here is a constant of ``fp8lab_conf.contracts`` (docs/contracts.md).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from fp8lab_conf.contracts import (
    LOSS_ROWS_ARTIFACT,
    RESULT_JSON, STATUS_STOPPED_EARLY, TAG_ABLATION, TAG_ADAPTER_ERROR, TAG_BACKEND, TAG_BACKEND_REASON,
    TAG_CUDA_VISIBLE_DEVICES, TAG_DEVIATIONS, TAG_DEVICE, TAG_DIVERGED_STEP, TAG_EMULATED, TAG_EVAL_AGGREGATE,
    TAG_EVAL_PRIMARY, TAG_HOST, TAG_POLICY_VERSION, TAG_RAY_NODE_ID, TAG_RAY_RESOURCES, TAG_REASON, TAG_STATUS,
    TAG_STOPPED_EARLY, TAG_VERSIONS_PREFIX, TELEMETRY_COLUMNS, TELEMETRY_PATH, WHATIF_COLUMNS, WHATIF_PATH, METRIC_QUEUE_S, METRIC_STEPS_DONE, METRIC_TRIAL_WALL_S,
)
from workloads.eval.metrics import safe_name
from workloads.record.attempts import Attempt, begin_attempt
from workloads.record.logger import MlflowTrialLogger, SystemMetrics, write_parquet
from workloads.record.reference import mlflow_reference
from workloads.record.run_inputs import run_inputs

log = logging.getLogger("fp8lab.trial")

_VERSIONED = ("torch", "transformers", "peft", "lm_eval", "mlflow", "ray", "torchao")


class TrialRecorder:
    """The one writer of a trial's run: tags, params, metrics, artifacts and its final status."""

    def __init__(self, tracking_uri: str, run_id: str, logger: Any = None) -> None:
        """``logger``: a ``TrialLogger`` in place of the MLflow one (tests, benchmarks)."""
        self.tracking_uri, self.run_id = tracking_uri, run_id
        self.logger = logger if logger is not None else MlflowTrialLogger(tracking_uri, run_id)  # the loop's and health's writer
        self._system: SystemMetrics | None = None
        self._attempt: Attempt | None = None

    # -- start --------------------------------------------------------------------------------
    def start(self, system_metrics_interval_s: float, resumable: bool = False) -> str:
        """Mark the run RUNNING and attach MLflow's system-metrics monitor. A retried worker that
        cannot resume from a checkpoint (`resumable` False) continues in a fresh attempt run
        (`record.attempts`); returns the run id this trial writes to."""
        self._attempt = begin_attempt(self.logger.client, self.run_id, resumable)
        self.run_id = self.logger.run_id = self._attempt.run_id
        self.logger.client.update_run(self.run_id, status="RUNNING")
        self.logger.set_tags({TAG_STATUS: "RUNNING"})
        self._system = SystemMetrics(self.tracking_uri, self.run_id, system_metrics_interval_s)
        return self.run_id

    def queue_seconds(self) -> float:
        """Seconds from the run's creation (when the sweep gave it a slot) to this trial's start,
        logged as its own metric so MLflow's Duration is never read as the trial's time."""
        created_ms = self.logger.client.get_run(self.run_id).info.start_time
        queued = max(0.0, time.time() - created_ms / 1000.0) if created_ms else float("nan")
        if self._attempt is None or self._attempt.fresh_history:  # a resumed run has its step-0 value
            self.logger.log_final({METRIC_QUEUE_S: queued})
        return queued

    def inputs(self, config: dict[str, Any], rows: Any, embedded_dir: Path) -> None:
        """The training rows and the eval task as the run's dataset inputs."""
        self.logger.log_inputs(run_inputs(config, rows, embedded_dir))

    def setup(self, config: dict[str, Any], device: str, choice: Any, handle: Any, policy: Any,
              ladder_tags: dict[str, str]) -> None:
        """What ran: backend (and why), device, policy, placement, versions; the resolved config
        and the precision plan as artifacts."""
        from omegaconf import OmegaConf

        self.logger.set_tags({TAG_BACKEND_REASON: choice.reason[:5000], TAG_DEVIATIONS: "; ".join(handle.deviations)[:5000]})
        self.logger.set_tags({TAG_BACKEND: handle.backend, TAG_EMULATED: str(bool(handle.emulated)).lower(),
                              TAG_DEVICE: device, TAG_POLICY_VERSION: policy.version, TAG_ABLATION: policy.ablation,
                              **ladder_tags, TAG_CUDA_VISIBLE_DEVICES: os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                              TAG_HOST: socket.gethostname(), **_ray_placement_tags(), **_version_tags()})
        self.logger.log_text(OmegaConf.to_yaml(OmegaConf.create(config)), "config/resolved.yaml")
        self.logger.log_dict({"policy": policy.to_dict(), "plan": handle.plan}, "precision/plan.json")

    # -- step: the training loop and the health monitor write through `self.logger` ----------
    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.logger.log_step(step, metrics)

    def flush_at_checkpoints(self) -> None:
        """Metrics reach the store at checkpoints only (the loop flushes before each), so a
        resumed trial re-logs exactly the steps its lost worker had not checkpointed."""
        self.logger.hold_until_flush()

    def reference(self, policy: str) -> Callable[[int], float | None]:
        """step -> the reference trial's train/loss at that step (the health verdict's lookup)."""
        return mlflow_reference(self.tracking_uri, self.run_id, policy)

    # -- eval ---------------------------------------------------------------------------------
    def heldout(self, rows: list[dict[str, float]]) -> None:
        """The held-out loss per row (`eval/loss_rows.jsonl`), for the report's pairing on rows."""
        if rows:
            self.logger.log_text("".join(json.dumps(row) + "\n" for row in rows), LOSS_ROWS_ARTIFACT)

    def eval(self, out: dict[str, Any], aggregate: str) -> None:
        """lm-eval's per-item samples and results as artifacts; tags say which metric of each
        task is its primary one and what eval/accuracy aggregates."""
        primaries = {safe_name(name): one["primary"] for name, one in out["tasks"].items()}
        self.logger.set_tags({TAG_EVAL_PRIMARY: json.dumps(primaries), TAG_EVAL_AGGREGATE: aggregate})
        for name, one in out["tasks"].items():
            lines = "".join(json.dumps(row) + "\n" for row in one["samples"])
            self.logger.log_text(lines, f"eval/samples/{safe_name(name)}.jsonl")
        self.logger.log_dict(out["results"], "eval/results.json")

    # -- end ----------------------------------------------------------------------------------
    def end(self, metrics: dict[str, float], step: int, telemetry_rows: list[dict[str, Any]],
            adapter: tuple[str, Callable[[Path], Path]] | None = None) -> None:
        """Final metrics at the last step (so MLflow's latest value is the final one), the
        telemetry Parquet, and, when ``adapter`` = (artifact folder, save function) is given,
        the trained adapter."""
        self.logger.log_final(metrics, step=step)
        self._log_parquet(telemetry_rows, TELEMETRY_COLUMNS, TELEMETRY_PATH)
        if adapter is not None:
            self._log_adapter(*adapter)

    def whatif(self, rows: list[dict[str, Any]]) -> None:
        """The what-if telemetry (``precision.telemetry.whatif``) as ``telemetry/whatif.parquet``."""
        self._log_parquet(rows, WHATIF_COLUMNS, WHATIF_PATH)

    def _log_parquet(self, rows: list[dict[str, Any]], columns: Any, artifact: str) -> None:
        """``rows`` as the Parquet artifact ``artifact`` (nothing when there are none)."""
        if not rows:
            return
        folder, name = artifact.rsplit("/", 1)
        parquet = write_parquet(rows, columns, name)
        try:
            self.logger.log_file(parquet, folder)
        finally:
            shutil.rmtree(parquet.parent, ignore_errors=True)

    def _log_adapter(self, artifact: str, save: Callable[[Path], Path]) -> None:
        """The trained LoRA adapter as an artifact folder (PEFT layout), for `fp8lab export`. A
        failure here is logged and tagged but does not undo a finished trial's results."""
        try:
            with tempfile.TemporaryDirectory(prefix="fp8lab-adapter-") as tmp:
                self.logger.log_dir(save(Path(tmp) / artifact), artifact)
        except Exception as exc:  # noqa: BLE001
            log.error("adapter not saved: %s", exc)
            self.logger.set_tags({TAG_ADAPTER_ERROR: f"{type(exc).__name__}: {exc}"[:5000]})

    def close(self, result: dict[str, Any], log_path: Path) -> None:
        """Tags, result.json, the log file and the run's terminal status; best effort when the
        store is down (the orchestrator then records the failure from the returned result)."""
        status = "FAILED" if result["status"] == "FAILED" else "FINISHED"
        try:
            tags = {TAG_STATUS: result["status"], TAG_REASON: result["reason"][:5000]}
            if result.get("diverged_step") is not None:
                tags[TAG_DIVERGED_STEP] = result["diverged_step"]
            if result["status"] == STATUS_STOPPED_EARLY:
                tags[TAG_STOPPED_EARLY] = result["reason"][:5000]
            self.logger.log_step(int(result["metrics"].get(METRIC_STEPS_DONE, 0)),
                                 {METRIC_TRIAL_WALL_S: result["metrics"][METRIC_TRIAL_WALL_S]})
            self.logger.flush()
            self.logger.set_tags(tags)
            self.logger.log_text(json.dumps(result, indent=2, default=str), RESULT_JSON)
            if log_path.exists():
                self.logger.log_file(log_path, "logs")
            self.logger.client.set_terminated(result["mlflow_run_id"], status)
        except Exception as exc:  # noqa: BLE001
            result.update(status="FAILED", reason=result["reason"] or f"tracking store unavailable: {exc}")
            log.error("could not finish MLflow run: %s", exc)

    def stop_system_metrics(self) -> None:
        """Stop the monitor while the run is still RUNNING (it stops writing to closed runs)."""
        if self._system is not None:
            self._system.stop()
            self._system = None


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
    for package in _VERSIONED:
        try:
            tags[f"{TAG_VERSIONS_PREFIX}{package}"] = version(package.replace("_", "-"))
        except PackageNotFoundError:
            continue
    return tags
