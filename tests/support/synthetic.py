"""Synthetic sweeps written to MLflow with the layout of docs/contracts.md, values known exactly.

For the report's tests and its benchmark (benchmarks/report_bench.py): lets `generate_report` run
against a real tracking store (SQLite) without training anything. Writes are batched (`log_batch`),
so 200 runs take seconds, not minutes. It lives under tests/ because it is test data, not product;
the benchmark imports it from here too (it puts the repository root on sys.path, as the tests do).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp8lab_conf.contracts import (
    ROLE_SWEEP, ROLE_TRIAL, TAG_ABLATION, TAG_AXIS_PREFIX, TAG_BACKEND, TAG_DEVICE, TAG_DIVERGED_STEP, TAG_EMULATED,
    TAG_POLICY, TAG_REASON, TAG_ROLE, TAG_SEED, TAG_STATUS, TAG_SWEEP_ID, TAG_TRIAL_ID,
)

KINDS = ("activation", "weight", "dgrad", "wgrad", "lora_weight")
_BATCH = 1000  # MLflow's log_batch limit on metrics per call


@dataclass(frozen=True)
class SynthTrial:
    """One trial with the final metrics it should report (None = metric not logged)."""

    policy: str
    seed: int
    accuracy: float | None = 0.8
    tokens_per_s: float | None = 1000.0
    peak_bytes: float | None = 2.0 * (1 << 30)
    status: str = "FINISHED"
    """fp8lab.status: FINISHED | DIVERGED | FAILED."""
    mlflow_status: str | None = None
    """MLflow run status; default FINISHED (FAILED for FAILED trials). 'RUNNING' leaves it open."""
    axes: Mapping[str, str] = field(default_factory=dict)
    ablation: str = ""
    reason: str = ""
    diverged_step: int | None = None
    trial_id: str | None = None
    underflow_events: float | None = 0.0
    final_loss: float | None = 0.5
    emulated: bool = True
    backend: str = "emulated"
    device: str = "cpu"
    start_offset_s: float = 0.0
    """Shifts the run's start time (to order retries)."""
    samples: Mapping[str, Sequence[float]] = field(default_factory=dict)
    """task -> per-item values (doc_id = position), written as `eval/samples/<task>.jsonl`."""
    sample_metric: str = "acc"
    sample_text: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """task -> per-item readable fields (prompt, target, response, ...) merged into its samples;
    absent: the samples of stores written before they carried them."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """Extra tags (fp8lab.ladder, fp8lab.deviations, ...)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Extra final metrics (eval/<task>/<metric>, eval/accuracy_stderr, telemetry/<kind>/..., ...)."""

    def resolved_trial_id(self) -> str:
        if self.trial_id:
            return self.trial_id
        key = f"{self.policy}|{self.seed}|" + "|".join(f"{k}={v}" for k, v in sorted(self.axes.items()))
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def run_name(self) -> str:
        return f"{self.policy}-s{self.seed}" + "".join(f"-{k}={v}" for k, v in sorted(self.axes.items()))


def loss_curve(trial: SynthTrial, n_steps: int) -> np.ndarray:
    """Deterministic decaying loss; a diverged trial ends in inf at its divergence step."""
    rng = np.random.default_rng(int(hashlib.sha1(f"{trial.policy}|{trial.seed}".encode()).hexdigest()[:8], 16))
    steps = np.arange(n_steps)
    loss = 2.0 * np.exp(-steps / max(n_steps / 4, 1)) + 0.3 + 0.02 * rng.standard_normal(n_steps)
    if trial.status == "DIVERGED" and trial.diverged_step is not None:
        loss = loss[: trial.diverged_step + 1].copy()
        loss[-1] = math.inf
    return loss


def telemetry_frame(trial: SynthTrial, n_steps: int, layers: int, every: int) -> pd.DataFrame:
    """Per-layer telemetry in the contract's columns; naive policies underflow more in deep layers."""
    steps = np.arange(0, n_steps, every)
    names = [f"base_model.model.layers.{i}.mlp.down_proj" for i in range(layers)]
    grid = np.meshgrid(steps, np.arange(layers), np.arange(len(KINDS)), indexing="ij")
    s, li, k = (g.ravel() for g in grid)
    severity = 30.0 if "naive" in trial.policy else 3.0
    under = severity * (li + 1) / layers * (1 + s / max(n_steps, 1)) * (k + 1) / len(KINDS)
    amax = 10.0 ** (k - 2.0) * (1 + li) * (1 + 0.1 * np.sin(s))
    return pd.DataFrame(
        {
            "step": s.astype(np.int64),
            "layer": np.array(names)[li],
            "kind": np.array(KINDS)[k],
            "underflow_pct": under,
            "overflow_pct": np.zeros_like(under),
            "amax": amax,
            "scale_inv_min": amax / 448.0,
            "scale_inv_max": amax / 448.0 * 2,
            "mse": under * 1e-6,
            "nonfinite": np.zeros(len(s), dtype=np.int64),
            "numel": np.full(len(s), 4096, dtype=np.int64),
        }
    )


def artifacts_beside(tracking_uri: str) -> str:
    """An artifact location for a test's experiment in a SQLite store: the folder `artifacts` next
    to the database, not MLflow's default `./mlruns` of the working folder (the checkout, where
    tests must leave nothing: tests/support/checkout_guard.py)."""
    return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "artifacts").resolve().as_uri()


def write_sweep(
    tracking_uri: str,
    experiment: str,
    sweep_id: str,
    trials: Sequence[SynthTrial],
    *,
    n_steps: int = 20,
    per_step_metrics: int = 2,
    layers: int = 4,
    telemetry_every: int = 5,
    telemetry: bool = True,
    params: Mapping[str, Any] | None = None,
    parent: bool = True,
    parent_tags: Mapping[str, str] | None = None,
    base_time_ms: int | None = None,
    artifact_root: str | None = None,
) -> dict[str, Any]:
    """Create (or reuse) `experiment`, a parent run and one child run per trial; return their ids.

    artifact_root: where a new experiment stores artifacts (default for sqlite:///x.db: x's folder/artifacts).
    per_step_metrics: how many per-step series to log (train/loss always, then train/tokens_per_s,
    train/lr, train/grad_norm, ...), to make histories realistic. Final metrics are logged at step 0
    after the per-step ones, as workloads' `log_final` does.
    """
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        if artifact_root is None and tracking_uri.startswith("sqlite:///"):
            artifact_root = artifacts_beside(tracking_uri)
        exp_id = client.create_experiment(experiment, artifact_location=artifact_root)
    else:
        exp_id = exp.experiment_id
    now = base_time_ms or int(time.time() * 1000)
    parent_id = None
    if parent:
        tags = {
            TAG_ROLE: ROLE_SWEEP,
            TAG_SWEEP_ID: sweep_id,
            "mlflow.runName": f"sweep-{sweep_id}",
            **(parent_tags or {}),
        }
        parent_id = client.create_run(exp_id, start_time=now, tags=tags).info.run_id
    extra = [
        "train/tokens_per_s",
        "train/lr",
        "train/grad_norm",
        "train/step_time_s",
        "train/lora_weight_std",
        "fp8/loss_scale",
        "telemetry/nonfinite",
        "underflow/events",
    ]
    series = ["train/loss", *extra[: max(per_step_metrics - 1, 0)]]
    run_ids = []
    tmp = Path(tempfile.mkdtemp(prefix="fp8lab-synth-"))
    try:
        for i, t in enumerate(trials):
            start = now + 1000 * (i + 1) + int(t.start_offset_s * 1000)
            tags = {
                TAG_ROLE: ROLE_TRIAL,
                TAG_SWEEP_ID: sweep_id,
                TAG_TRIAL_ID: t.resolved_trial_id(),
                TAG_POLICY: t.policy,
                TAG_SEED: str(t.seed),
                TAG_BACKEND: t.backend,
                TAG_EMULATED: "true" if t.emulated else "false",
                TAG_DEVICE: t.device,
                TAG_STATUS: t.status,
                TAG_ABLATION: t.ablation,
                "mlflow.runName": t.run_name(),
            }
            if parent_id:
                tags["mlflow.parentRunId"] = parent_id
            if t.reason:
                tags[TAG_REASON] = t.reason
            if t.diverged_step is not None:
                tags[TAG_DIVERGED_STEP] = str(t.diverged_step)
            tags.update({f"{TAG_AXIS_PREFIX}{k}": str(v) for k, v in t.axes.items()})
            tags.update(t.tags)
            run_id = client.create_run(exp_id, start_time=start, tags=tags).info.run_id
            loss = loss_curve(t, n_steps)
            metrics = []
            for key in series:
                if key == "train/loss":
                    vals = loss
                elif key == "train/tokens_per_s":  # instantaneous readings, deliberately not the final mean
                    vals = np.full(len(loss), 0.5 * (t.tokens_per_s or 0.0))
                else:
                    vals = np.linspace(1.0, 0.1, len(loss))
                metrics += [Metric(key, float(v), start + j, j) for j, v in enumerate(vals)]
            last = len(loss)
            finals = {
                "eval/accuracy": t.accuracy,
                "train/tokens_per_s": t.tokens_per_s,
                "memory/peak_bytes": t.peak_bytes,
                "underflow/events": t.underflow_events,
                "train/final_loss": t.final_loss,
            }
            # like workloads' log_final: final metrics at step 0, written after every per-step value
            finals.update(t.metrics)
            metrics += [Metric(k, float(v), start + last + 10, 0) for k, v in finals.items() if v is not None]
            prm = [Param("precision.policy", t.policy), Param("train.seed", str(t.seed))]
            prm += [Param(k, str(v)) for k, v in (params or {}).items()]
            for j in range(0, max(len(metrics), 1), _BATCH):
                client.log_batch(
                    run_id,
                    metrics=metrics[j : j + _BATCH],
                    params=prm if j == 0 else [],
                    tags=[RunTag("fp8lab.synthetic", "true")] if j == 0 else [],
                )
            if telemetry and t.policy != "bf16" and t.status != "FAILED":
                path = tmp / "telemetry.parquet"
                telemetry_frame(t, last, layers, telemetry_every).to_parquet(path, index=False)
                client.log_artifact(run_id, str(path), "telemetry")
            for task, values in t.samples.items():
                path = tmp / f"{task}.jsonl"
                text = t.sample_text.get(task, ())
                lines = (json.dumps({"doc_id": i, "metric": t.sample_metric, "value": float(v), **(text[i] if i < len(text) else {})})
                         for i, v in enumerate(values))
                path.write_text("\n".join(lines) + "\n", encoding="utf-8")
                client.log_artifact(run_id, str(path), "eval/samples")
            status = t.mlflow_status or ("FAILED" if t.status == "FAILED" else "FINISHED")
            if status != "RUNNING":
                client.set_terminated(run_id, status=status, end_time=start + 500)
            run_ids.append(run_id)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the artifacts are in the store now
    if parent_id:
        client.set_terminated(parent_id, status="FINISHED")
    return {"experiment_id": exp_id, "parent_run_id": parent_id, "run_ids": run_ids}
