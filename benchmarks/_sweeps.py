"""Run `fp8lab sweep` as a user would (a subprocess, in a temp folder with its own SQLite MLflow
store) and read back from MLflow where its time went. Shared by orchestration.py and growth.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

SHORT_TRIAL = ["train.steps=5", "eval.limit=8", "train.log_every=1", "sweep.report=false"]
_EFFICIENCY = re.compile(
    r"makespan (?P<makespan>[\d.]+)s for (?P<n>\d+) trials on (?P<slots>\d+) parallel slot\(s\); "
    r"sum of trial durations / slots = (?P<ideal>[\d.]+)s -> scheduling efficiency (?P<eff>[\d.]+)")


def fp8lab_command() -> list[str]:
    exe = shutil.which("fp8lab", path=str(Path(sys.executable).parent)) or shutil.which("fp8lab")
    return [exe] if exe else [sys.executable, "-m", "orchestrator.cli"]


def sweep_overrides(n_trials: int, name: str, store: Path, extra: list[str] | None = None) -> list[str]:
    seeds = ",".join(str(i) for i in range(n_trials))
    return ["sweep.axes.precision=[bf16]", f"sweep.axes.seed=[{seeds}]", f"sweep.name={name}",
            f"tracking.uri=sqlite:///{store / 'mlflow.db'}", *SHORT_TRIAL, *(extra or [])]


def run_sweep(n_trials: int, workdir: Path, name: str = "bench", extra: list[str] | None = None,
              timeout_s: float = 900) -> dict[str, Any]:
    """Run one sweep of ``n_trials`` short bf16 trials in ``workdir``; return timings and sizes."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = fp8lab_command() + ["sweep", *sweep_overrides(n_trials, name, workdir, extra)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"fp8lab sweep exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = {"n_trials": n_trials, "command": " ".join(["fp8lab", "sweep", *cmd[len(fp8lab_command()) + 1:]]),
                           "wall_s": wall, "t0": t0}
    match = _EFFICIENCY.search(proc.stdout)
    if match:
        out["cli"] = {k: float(v) for k, v in match.groupdict().items()}
    out.update(read_store(workdir, name, t0))
    out["store_bytes"] = store_bytes(workdir)
    return out


def read_store(workdir: Path, name: str, t0: float) -> dict[str, Any]:
    """Per-trial timestamps from MLflow, relative to the command's start ``t0`` (seconds)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    parent = [r for r in runs if r.data.tags.get("fp8lab.role") == "sweep"]
    trials = []
    for run in runs:
        if run.data.tags.get("fp8lab.role") != "trial":
            continue
        history = client.get_metric_history(run.info.run_id, "train/loss")
        first_step = min((m.timestamp for m in history), default=None)
        m = run.data.metrics
        end = (run.info.end_time or 0) / 1000
        trial_wall = m.get("trial/wall_s", float("nan"))
        trials.append({
            "run": run.info.run_name,
            "status": run.data.tags.get("fp8lab.status"),
            "created_s": run.info.start_time / 1000 - t0,  # the driver creates every run before scheduling
            "trial_start_s": end - trial_wall - t0,  # run_trial() entered (worker started, imports done)
            "first_step_s": (first_step / 1000 - t0) if first_step else None,
            "end_s": end - t0,
            "trial_wall_s": trial_wall,
            "train_wall_s": m.get("train/wall_s"),
            "eval_wall_s": m.get("eval/wall_s"),
        })
    trials.sort(key=lambda t: t["trial_start_s"])
    first = [t["first_step_s"] for t in trials if t["first_step_s"] is not None]
    return {
        "parent_created_s": (parent[0].info.start_time / 1000 - t0) if parent else None,
        "first_step_s": min(first) if first else None,
        "trials": trials,
        "all_finished": all(t["status"] == "FINISHED" for t in trials),
    }


def store_bytes(workdir: Path) -> dict[str, int]:
    """Size of the SQLite file and of the artifact folder(s) next to it."""
    db = workdir / "mlflow.db"
    artifacts = sum(p.stat().st_size for p in workdir.rglob("*") if p.is_file() and p != db
                    and "mlflow.db" not in p.name)
    return {"sqlite": db.stat().st_size if db.exists() else 0, "artifacts": artifacts,
            "total": (db.stat().st_size if db.exists() else 0) + artifacts}


def where_time_goes(res: dict[str, Any], slots: int) -> dict[str, float]:
    """Split a sweep's wall time into driver start-up, worker start (process + imports), trial
    work (model load, train, eval, MLflow writes: ``trial/wall_s``) and driver tail."""
    trials = res["trials"]
    if not trials:
        return {}
    first_start = min(t["trial_start_s"] for t in trials)
    last_end = max(t["end_s"] for t in trials)
    busy = sum(t["trial_wall_s"] for t in trials)
    window = last_end - first_start
    # the slots' time between the first trial start and the last end not spent in run_trial():
    # starting the next worker process and importing the training stack (plus idle slots)
    worker_gaps = max(0.0, window * slots - busy)
    train = sum(t["train_wall_s"] or 0 for t in trials)
    evals = sum(t["eval_wall_s"] or 0 for t in trials)
    return {
        "driver_startup_s": res["parent_created_s"] or 0.0,
        "first_worker_start_s": first_start - (res["parent_created_s"] or 0.0),
        "trials_window_s": window,
        "driver_tail_s": res["wall_s"] - last_end,
        "slot_s_in_trials": busy,
        "slot_s_training": train,
        "slot_s_eval": evals,
        "slot_s_trial_other": busy - train - evals,  # model load, policy, MLflow setup/close, artifacts
        "slot_s_worker_start_and_idle": worker_gaps,
    }


def import_time() -> float:
    """Seconds for a fresh interpreter to import the training stack (what each Ray worker pays)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import workloads.entry"], cwd=common.ROOT, check=True,
                   capture_output=True, env=dict(os.environ, PYTHONPATH=str(common.ROOT)))
    return time.perf_counter() - started
