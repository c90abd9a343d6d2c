"""Raw MLflow rows -> one tidy row per trial (pure pandas, no MLflow calls).

The raw frame follows `mlflow.search_runs`' column convention (`tags.*`, `params.*`,
`metrics.*` plus `run_id`, `run_name`, `mlflow_status`, `start_time`), so tests can build it by
hand. This module decides what a run *is* for the statistics:

- status: FINISHED / DIVERGED / STOPPED_EARLY / FAILED from tag `fp8lab.status` (MLflow's own status says FINISHED
  for diverged trials), INCOMPLETE when MLflow says RUNNING / SCHEDULED / KILLED, and FAILED when
  MLflow says FAILED whatever the tag says (someone marked the run failed after the trial ended:
  its numbers are not trusted). Only FINISHED
  and DIVERGED trials are *counted* (a diverged seed is part of what a policy delivers; dropping it
  would flatter unstable policies). STOPPED_EARLY (the health verdict stopped it, docs/health.md),
  FAILED and INCOMPLETE runs are listed, never averaged.
- retries: one row per `fp8lab.trial_id`; the FINISHED run wins, then DIVERGED, FAILED,
  INCOMPLETE, then the latest start time. The others are kept aside as "superseded".
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from analysis.options import ReportOptions
from fp8lab_conf.contracts import (
    METRIC_ACCURACY_STDERR, METRIC_FINAL_LOSS, METRIC_LORA_WEIGHT_STD, METRIC_LORA_WEIGHT_STD_MIN, METRIC_UNDERFLOW_EVENTS,
    TAG_ABLATION, TAG_AXIS_PREFIX, TAG_BACKEND, TAG_DEVIATIONS, TAG_DEVICE, TAG_DIVERGED_STEP, TAG_EMULATED, TAG_LADDER,
    TAG_LADDER_BASE, TAG_MECHANISM, TAG_MECHANISM_DESC, TAG_POLICY, TAG_REASON, TAG_SEED, TAG_STATUS, TAG_SWEEP_ID,
    TAG_TRIAL_ID,
)
from fp8lab_conf.contracts import NON_SEMANTIC_KEYS
from fp8lab_conf.contracts import (METRIC_EVAL_WALL_S, METRIC_STEPS_DONE, METRIC_TRIAL_WALL_S, STATUS_STOPPED_EARLY,
                                   TAG_HEALTH_MISSING, TAG_HEALTH_REASONS, TAG_HEALTH_STEP, TAG_HEALTH_VERDICT,
                                   TAG_STOPPED_EARLY)

STATUSES = ("FINISHED", "DIVERGED", STATUS_STOPPED_EARLY, "FAILED", "INCOMPLETE")
COUNTED = ("FINISHED", "DIVERGED")
_STATUS_RANK = {s: i for i, s in enumerate(STATUSES)}
_INCOMPLETE_MLFLOW = {"RUNNING", "SCHEDULED", "KILLED"}
AXIS_TAG_PREFIX = f"tags.{TAG_AXIS_PREFIX}"
# Config groups that decide what a trial trains and is scored on: in a report over several sweeps,
# a key of these that differs between runs becomes an axis (`axes_where_runs_differ`).
RECIPE_PREFIXES = ("model.", "data.", "eval.", "lora.", "train.")
AXIS_PREFIX = "axis."
# MLflow stores +-inf as +-float max; anything this large is treated as non-finite.
_HUGE = 1e300

# Short column names of the tidy frame -> where they come from.
METRIC_COLUMNS = {
    "accuracy": "accuracy_metric",
    "tokens_per_s": "throughput_metric",
    "peak_bytes": "memory_metric",
}
FIXED_METRICS = {
    "accuracy_stderr": METRIC_ACCURACY_STDERR,
    "final_loss": METRIC_FINAL_LOSS,
    "underflow_events": METRIC_UNDERFLOW_EVENTS,
    "wall_s": "train/wall_s",
    "lora_std_min": METRIC_LORA_WEIGHT_STD_MIN,
    "lora_std": METRIC_LORA_WEIGHT_STD,
    "eval_n": "eval/n",
    "trial_wall_s": METRIC_TRIAL_WALL_S,
    "eval_wall_s": METRIC_EVAL_WALL_S,
    "steps_done": METRIC_STEPS_DONE,
}
# Tags of docs/contracts.md read here -> tidy column.
TAG_COLUMNS = {
    "deviations": TAG_DEVIATIONS,
    "ladder": TAG_LADDER,
    "ladder_base": TAG_LADDER_BASE,
    "mechanism": TAG_MECHANISM,
    "mechanism_desc": TAG_MECHANISM_DESC,
    "health_verdict": TAG_HEALTH_VERDICT,
    "health_reasons": TAG_HEALTH_REASONS,
    "health_missing": TAG_HEALTH_MISSING,
    "health_step": TAG_HEALTH_STEP,
    "stopped_early": TAG_STOPPED_EARLY,
}
TELEMETRY_KINDS = ("activation", "weight", "dgrad", "wgrad", "lora_weight")
TEL_PREFIX = "tel."
# An underflow event is a cast at or above this share flushed (docs/telemetry.md); the report's
# "underflow events" column says the threshold, or a 0 reads as "no underflow" next to heatmaps.
UNDERFLOW_THRESHOLD_PARAM = "precision.telemetry.underflow_threshold_pct"
"""`tel.<kind>.underflow_pct` / `tel.<kind>.overflow_pct`: the last logged per-kind mean over layers."""
TASK_PREFIX = "task."
"""`task.<task>/<metric>` (and `..._stderr`): every per-task metric lm-eval returned (`eval/<task>/<metric>`)."""


def natural_key(value: object) -> tuple:
    """Sort key where 'layers.10' comes after 'layers.9' and numbers sort numerically."""
    parts = re.split(r"(\d+(?:\.\d+)?)", str(value))
    return tuple((0, float(p), "") if re.fullmatch(r"\d+(?:\.\d+)?", p) else (1, 0.0, p) for p in parts)


def to_float(value: object) -> float:
    """Parse a metric/param value; missing, unparsable or +-inf (MLflow's float max) -> NaN."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) and abs(x) < _HUGE else math.nan


def _col(raw: pd.DataFrame, name: str) -> pd.Series:
    """A column of the raw frame, or an all-missing one (absent tags never crash)."""
    if name in raw.columns:
        return raw[name]
    return pd.Series([None] * len(raw), index=raw.index, dtype=object)


def _str_col(raw: pd.DataFrame, name: str, default: str = "") -> pd.Series:
    s = _col(raw, name)
    return s.where(s.notna(), default).astype(str)


def _num_col(raw: pd.DataFrame, name: str) -> pd.Series:
    return _col(raw, name).map(to_float).astype(float)


def axis_columns(frame: pd.DataFrame) -> list[str]:
    """The tidy frame's sweep-axis columns (`axis.<key>`), in a stable order."""
    return sorted((c for c in frame.columns if c.startswith(AXIS_PREFIX)), key=natural_key)


def classify_status(mlflow_status: str, tag_status: str) -> str:
    """Trial status from MLflow's run status and the `fp8lab.status` tag.

    The orchestrator also writes SCHEDULED / RUNNING / KILLED into the tag; any of those, in the
    tag or as MLflow's status, means the trial has no result (yet).
    """
    tag = str(tag_status or "").upper()
    if str(mlflow_status).upper() in _INCOMPLETE_MLFLOW or tag in _INCOMPLETE_MLFLOW:
        return "INCOMPLETE"
    if str(mlflow_status).upper() == "FAILED":
        return "FAILED"
    return tag if tag in ("FINISHED", "DIVERGED", "FAILED", STATUS_STOPPED_EARLY) else "FINISHED"


def tidy_runs(raw: pd.DataFrame, options: ReportOptions | None = None) -> pd.DataFrame:
    """One row per MLflow run with the columns the statistics use.

    Missing tags become "" and missing metrics NaN; nothing here raises on absent data.
    """
    options = options or ReportOptions()
    out = pd.DataFrame(index=raw.index)
    out["run_id"] = _str_col(raw, "run_id")
    out["run_name"] = _str_col(raw, "run_name")
    out["mlflow_status"] = _str_col(raw, "mlflow_status", "UNKNOWN").str.upper()
    out["start_time"] = _num_col(raw, "start_time")
    out["sweep_id"] = _str_col(raw, f"tags.{TAG_SWEEP_ID}")
    trial = _str_col(raw, f"tags.{TAG_TRIAL_ID}")
    out["trial_id"] = trial.where(trial != "", out["run_id"])
    out["policy"] = _str_col(raw, f"tags.{TAG_POLICY}")
    fallback = _str_col(raw, "params.precision.policy")
    out["policy"] = out["policy"].where(out["policy"] != "", fallback).replace("", "unknown")
    out["seed"] = _num_col(raw, f"tags.{TAG_SEED}")
    out["ablation"] = _str_col(raw, f"tags.{TAG_ABLATION}")
    out["status"] = [
        classify_status(m, t) for m, t in zip(out["mlflow_status"], _str_col(raw, f"tags.{TAG_STATUS}"), strict=True)
    ]
    out["counted"] = out["status"].isin(COUNTED)
    out["reason"] = _str_col(raw, f"tags.{TAG_REASON}")
    tag_status = _str_col(raw, f"tags.{TAG_STATUS}").str.upper()
    overruled = (out["mlflow_status"] == "FAILED") & tag_status.isin(COUNTED)
    out.loc[overruled, "reason"] = [
        f"run marked FAILED in MLflow after the trial recorded {t}" + (f" ({r})" if r else "")
        for t, r in zip(tag_status[overruled], out.loc[overruled, "reason"], strict=True)
    ]
    out["diverged_step"] = _num_col(raw, f"tags.{TAG_DIVERGED_STEP}")
    out["backend"] = _str_col(raw, f"tags.{TAG_BACKEND}")
    out["device"] = _str_col(raw, f"tags.{TAG_DEVICE}")
    out["emulated"] = _str_col(raw, f"tags.{TAG_EMULATED}").str.lower().isin(("true", "1", "yes"))
    out["reused"] = _col(raw, "reused").eq(True)
    for short, attr in METRIC_COLUMNS.items():
        out[short] = _num_col(raw, "metrics." + getattr(options, attr))
    for short, key in FIXED_METRICS.items():
        out[short] = _num_col(raw, "metrics." + key)
    for short, tag in TAG_COLUMNS.items():
        out[short] = _str_col(raw, "tags." + tag)
    for kind in TELEMETRY_KINDS:
        for stat in ("underflow_pct", "overflow_pct"):
            out[f"{TEL_PREFIX}{kind}.{stat}"] = _num_col(raw, f"metrics.telemetry/{kind}/{stat}")
    for col in sorted(c for c in raw.columns if _is_task_metric(c)):
        out[TASK_PREFIX + col[len("metrics.eval/") :]] = _num_col(raw, col)
    out["tokens_per_epoch"] = _tokens_per_epoch(raw, options)
    out["train_steps"] = _num_col(raw, "params.train.steps")
    out["underflow_threshold_pct"] = _num_col(raw, "params." + UNDERFLOW_THRESHOLD_PARAM)
    for col in sorted(c for c in raw.columns if c.startswith(AXIS_TAG_PREFIX)):
        out[AXIS_PREFIX + col[len(AXIS_TAG_PREFIX) :]] = _str_col(raw, col)
    return out.reset_index(drop=True)


def axes_where_runs_differ(raw: pd.DataFrame) -> pd.DataFrame:
    """Several sweeps in one report: every recipe param (model, data, eval task, LoRA, training)
    whose value differs between the runs becomes an axis tag, so each policy is compared with the
    baseline of its own model, task and recipe, never with another sweep's. Within one sweep such
    keys are axes already (the tag wins where it is set)."""
    out = raw.copy()
    for col in [c for c in raw.columns if c.startswith("params.")]:
        key = col[len("params."):]
        if not key.startswith(RECIPE_PREFIXES) or key.startswith(NON_SEMANTIC_KEYS) or key.rsplit(".", 1)[-1] == "seed":
            continue  # a seed is the replicate the statistics pair on, never an axis
        values = raw[col].fillna("").astype(str)
        if values.nunique() < 2:
            continue
        tag = AXIS_TAG_PREFIX + key
        current = out[tag].fillna("").astype(str) if tag in out else pd.Series("", index=out.index)
        out[tag] = current.where(current != "", values)
    return out


def _is_task_metric(col: str) -> bool:
    """`metrics.eval/<task>/<metric>`: three or more path parts (eval/accuracy has two)."""
    return col.startswith("metrics.eval/") and col.count("/") >= 2


def task_metrics(frame: pd.DataFrame) -> dict[str, list[str]]:
    """task -> its metric names (stderr columns excluded), from the tidy frame's `task.` columns."""
    out: dict[str, list[str]] = {}
    for col in frame.columns:
        if col.startswith(TASK_PREFIX) and not col.endswith("_stderr"):
            task, _, metric = col[len(TASK_PREFIX) :].partition("/")
            out.setdefault(task, []).append(metric)
    return {t: sorted(m) for t, m in sorted(out.items())}


def _tokens_per_epoch(raw: pd.DataFrame, options: ReportOptions) -> pd.Series:
    """params size * seq_len when both are numbers, else the tokens-per-epoch metric, else NaN."""
    size_key, len_key = options.tokens_per_epoch_params
    from_params = _num_col(raw, "params." + size_key) * _num_col(raw, "params." + len_key)
    from_metric = _num_col(raw, "metrics." + options.tokens_per_epoch_metric)
    return from_params.where(np.isfinite(from_params), from_metric)


def dedupe_trials(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Keep one run per trial_id (retries count once); return (kept, superseded).

    Preference: FINISHED, DIVERGED, FAILED, INCOMPLETE, then the latest start time.
    `superseded` gains a `superseded_by` column naming the kept run.
    """
    if runs.empty:
        return runs.copy(), runs.assign(superseded_by=pd.Series(dtype=str))
    ranked = runs.assign(
        _rank=runs["status"].map(_STATUS_RANK).fillna(len(STATUSES)),
        _start=runs["start_time"].fillna(-np.inf),
    ).sort_values(["trial_id", "_rank", "_start"], ascending=[True, True, False], kind="stable")
    first = ~ranked["trial_id"].duplicated(keep="first")
    kept = ranked[first].drop(columns=["_rank", "_start"])
    sup = ranked[~first].drop(columns=["_rank", "_start"])
    winner = kept.set_index("trial_id")["run_id"]
    sup = sup.assign(superseded_by=sup["trial_id"].map(winner))
    return kept.sort_index().reset_index(drop=True), sup.reset_index(drop=True)


def policy_rank(policy: str, options: ReportOptions) -> tuple[int, str]:
    """Order policies as a reader expects: baseline, naive, protected, its ablations, others."""
    fixed = [options.baseline_policy, options.naive_policy, options.protected_policy]
    if policy in fixed:
        return (fixed.index(policy), "")
    if policy.startswith(options.protected_policy):
        return (3, policy)
    return (4, policy)


def step_series(hist: pd.DataFrame, key: str) -> pd.DataFrame:
    """One value per (run, step) of `key`: run_id, step, value; the last write of a step wins."""
    sel = hist[hist["key"] == key] if "key" in hist else hist
    if sel.empty:
        return pd.DataFrame(
            {"run_id": pd.Series(dtype=str), "step": pd.Series(dtype="int64"), "value": pd.Series(dtype=float)}
        )
    sel = sel.sort_values(["run_id", "step", "timestamp"], kind="stable").drop_duplicates(
        ["run_id", "step"], keep="last"
    )
    return sel[["run_id", "step", "value"]].reset_index(drop=True)


def last_written(hist: pd.DataFrame, key: str) -> pd.Series:
    """run_id -> the value of `key` written last in time (ties: highest step).

    Why: a trial logs `train/tokens_per_s` every step *and* once at the end as the whole-run mean,
    under the same key. MLflow's "latest" value (what search_runs returns) is the one with the
    highest step, so a final value logged at step 0 would be hidden behind the last step's
    instantaneous reading. The final write is always the newest one.
    """
    sel = hist[(hist["key"] == key) & hist["value"].notna()] if "key" in hist else hist.iloc[:0]
    if sel.empty:
        return pd.Series(dtype=float)
    last = sel.sort_values(["run_id", "timestamp", "step"], kind="stable").drop_duplicates("run_id", keep="last")
    return last.set_index("run_id")["value"].astype(float)


def apply_final_values(trials: pd.DataFrame, hist: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    """Replace the tidy columns of `options.final_from_history` metrics by their last-written value."""
    by_key = {getattr(options, attr): col for col, attr in METRIC_COLUMNS.items()}
    by_key.update({key: col for col, key in FIXED_METRICS.items()})
    out = trials.copy()
    for key in options.final_from_history:
        col = by_key.get(key)
        if col is None:
            continue
        final = last_written(hist, key)
        if len(final):
            mapped = out["run_id"].map(final)
            out[col] = mapped.where(mapped.notna(), out[col])
    return out


def clean_history(hist: pd.DataFrame) -> pd.DataFrame:
    """Metric history with MLflow's +-float-max (its encoding of inf) turned into NaN."""
    if hist.empty:
        return hist
    vals = hist["value"].astype(float)
    return hist.assign(value=vals.where(np.isfinite(vals) & (vals.abs() < _HUGE)))
