"""Names shared by orchestrator, workloads and analysis: MLflow tags, metric names, artifact paths,
telemetry columns. Imported as `fp8lab_conf.contracts`.

Why here: the three packages may not import each other in every direction (analysis never imports
workloads or orchestrator; workloads never imports orchestrator), but all three read the config
tree, so its package is the one place each can import. Pure constants: no torch, no third-party
imports. docs/contracts.md explains each name; change both together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# --- tags on every run -----------------------------------------------------------------------
TAG_ROLE = "fp8lab.role"  # ROLE_SWEEP (the parent run of a sweep) or ROLE_TRIAL (one child run per trial)
ROLE_SWEEP = "sweep"
ROLE_TRIAL = "trial"
TAG_SWEEP_ID = "fp8lab.sweep_id"
TAG_SWEEP_NAME = "fp8lab.sweep_name"
TAG_VERSION = "fp8lab.version"
TAG_VERSIONS_PREFIX = "fp8lab.versions."  # one tag per library a trial ran with: fp8lab.versions.<package>
TAG_GIT_COMMIT = "fp8lab.git_commit"  # optional (set by a user or CI); the report shows it next to MLflow's own

# --- trial identity and outcome ---------------------------------------------------------------
TAG_TRIAL_ID = "fp8lab.trial_id"
TAG_POLICY = "fp8lab.policy"
TAG_POLICY_VERSION = "fp8lab.policy_version"
TAG_SEED = "fp8lab.seed"
TAG_ABLATION = "fp8lab.ablation"
TAG_AXIS_PREFIX = "fp8lab.axis."  # one tag per swept axis: fp8lab.axis.<dotted key>
TAG_STATUS = "fp8lab.status"  # FINISHED | DIVERGED | FAILED | KILLED
TAG_REASON = "fp8lab.reason"
TAG_DIVERGED_STEP = "fp8lab.diverged_step"
TAG_RESUMED_FROM_STEP = "fp8lab.resumed_from_step"
TAG_ATTEMPT = "fp8lab.attempt"  # 1, 2, ...: which start of the trial's worker wrote this run
TAG_RETRY_OF = "fp8lab.retry_of"  # on a fresh attempt run: the run of the attempt it replaces
TAG_SUPERSEDED_BY = "fp8lab.superseded_by"  # on that replaced (KILLED) run: the fresh attempt's run
CHECKPOINT_OWNER_FILE = "run_id.txt"  # beside a trial's checkpoint.pt: the MLflow run it belongs to (read by the driver)
TAG_ADAPTER_ERROR = "fp8lab.adapter_error"  # why the adapter artifact could not be saved (the trial still counts)

# --- where and how it ran ---------------------------------------------------------------------
TAG_BACKEND = "fp8lab.backend"
TAG_BACKEND_REASON = "fp8lab.backend_reason"
TAG_EMULATED = "fp8lab.emulated"
TAG_DEVIATIONS = "fp8lab.deviations"  # "; "-joined: what the backend changed vs the policy
TAG_DEVICE = "fp8lab.device"
TAG_HOST = "fp8lab.host"
TAG_RAY_NODE_ID = "fp8lab.ray_node_id"
TAG_RAY_RESOURCES = "fp8lab.ray_resources"
TAG_CUDA_VISIBLE_DEVICES = "fp8lab.cuda_visible_devices"

# --- mechanism ladder -------------------------------------------------------------------------
TAG_LADDER = "fp8lab.ladder"  # "up" | "down" | "" (not a rung)
TAG_LADDER_BASE = "fp8lab.ladder_base"  # the policy the rung is one switch away from
TAG_MECHANISM = "fp8lab.mechanism"  # the mechanism id
TAG_MECHANISM_DESC = "fp8lab.mechanism_desc"  # one human sentence

# --- evaluation -------------------------------------------------------------------------------
TAG_EVAL_PRIMARY = "fp8lab.eval_primary"
TAG_EVAL_AGGREGATE = "fp8lab.eval_aggregate"

# --- sweep driver lease -----------------------------------------------------------------------
TAG_DRIVER = "fp8lab.driver"  # who drives the sweep: "pid P on HOST since T"
TAG_DRIVER_HEARTBEAT = "fp8lab.driver_heartbeat"  # epoch seconds of the driver's last sign of life
TAG_DRIVER_LOST = "fp8lab.driver_lost"  # on runs closed because their driver died: who it was

# --- model registry (fp8lab export --register) ------------------------------------------------
TAG_EXPORT_FORMAT = "fp8lab.export_format"

# --- health / early warning (docs/health.md) --------------------------------------------------
STATUS_STOPPED_EARLY = "STOPPED_EARLY"  # fp8lab.status of a trial stopped at its verdict (no eval)
TAG_STOPPED_EARLY = "fp8lab.stopped_early"  # why it was stopped (the verdict's reasons)
TAG_HEALTH_VERDICT = "fp8lab.health.verdict"  # healthy | at_risk | doomed
TAG_HEALTH_REASONS = "fp8lab.health.reasons"  # "; "-joined: the signals that decided the verdict
TAG_HEALTH_MISSING = "fp8lab.health.missing"  # "; "-joined: signals a rule needed but the step lacked
TAG_HEALTH_STEP = "fp8lab.health.step"  # the logged step the verdict was made at

# --- trial identity -----------------------------------------------------------------------------
# Config keys left out of a trial's id (orchestrator/trial_id.py) and of "the same configuration"
# when a trial looks up its bf16 reference (workloads/record/reference.py).
# Where a trial runs, how it is recorded and scheduled, and pure throughput knobs: none of these
# change what the trial computes.
NON_SEMANTIC_KEYS: tuple[str, ...] = (
    "trial",
    "tracking",
    "cluster",
    "sweep",
    "report",
    "health",  # the early warning only watches; stopping is sweep.early_stop, and a stopped trial is rerun
    "train.num_threads",
    "train.log_every",
    "train.device",
    "train.checkpoint_every",
    "train.checkpoint_dir",
    "train.allow_long_run",  # only confirms a long run; the steps themselves are in the id
    "data.max_row_bytes",  # only refuses over-long rows; the rows trained on are in the data digest
    "eval.batch_size",
    "data.max_truncated_pct",  # only refuses a cut before training; a trial that runs is the same trial
)
# Keys added after trial ids were published, at the value that trains exactly what a config
# without them trained: left out of the trial id at that value (and only then), so earlier
# results keep their ids and a rerun skips them (orchestrator/trial_id.py).
ID_NEUTRAL_DEFAULTS: dict[str, object] = {
    "train.epochs": None,
    "train.grad_accum": 1,
    "data.chat_template": None,
    "precision.telemetry.whatif": False,  # off: the run records exactly what it recorded before
}

# --- metrics ----------------------------------------------------------------------------------
METRIC_ACCURACY = "eval/accuracy"
METRIC_ACCURACY_STDERR = "eval/accuracy_stderr"
METRIC_TOKENS_PER_S = "train/tokens_per_s"  # the trial's speed: steady-state median (workloads/train/step_clock.py), once at the end
METRIC_TOKENS_PER_S_MEAN = "train/tokens_per_s_mean"  # whole-run mean (warm-up and all), once at the end
METRIC_TOKENS_PER_S_P25 = "train/tokens_per_s_p25"  # quartiles of the steady-state tokens/s over timed windows
METRIC_TOKENS_PER_S_P75 = "train/tokens_per_s_p75"
METRIC_STEP_S = "train/step_s"  # steady-state median seconds per step, once at the end
METRIC_STEP_S_P25 = "train/step_s_p25"
METRIC_STEP_S_P75 = "train/step_s_p75"
METRIC_STEPS_TIMED = "train/steps_timed"  # steps after warm-up that the figures above rest on
METRIC_STEP_S_WINDOW = "train/step_s_window"  # seconds per step since the previous sync, at every logged step
METRIC_LOADAVG_START = "sys/loadavg_start"  # 1-min load average when training starts / ends
METRIC_LOADAVG_END = "sys/loadavg_end"
METRIC_QUEUE_S = "trial/queue_s"  # run created (sweep planned) -> trial started: time spent waiting for a slot
METRIC_FINAL_LOSS = "train/final_loss"
METRIC_PEAK_BYTES = "memory/peak_bytes"
METRIC_UNDERFLOW_EVENTS = "underflow/events"
METRIC_TOKENS_PER_S_WINDOW = "train/tokens_per_s_window"
METRIC_LOSS = "train/loss"
METRIC_GRAD_NORM = "train/grad_norm"
METRIC_LORA_WEIGHT_STD = "train/lora_weight_std"
METRIC_LORA_WEIGHT_STD_MIN = "train/lora_weight_std_min"
METRIC_LR = "train/lr"
METRIC_LOSS_SCALE = "fp8/loss_scale"
METRIC_TRIAL_WALL_S = "trial/wall_s"
METRIC_TRAIN_WALL_S = "train/wall_s"
METRIC_EVAL_WALL_S = "eval/wall_s"
METRIC_STEPS_DONE = "train/steps_done"
# held-out loss (workloads/heldout.py): mean nats/token on eval.loss_split's fixed rows, at the end
# and every eval.loss_every steps; its per-row values in LOSS_ROWS_ARTIFACT
METRIC_EVAL_LOSS = "eval/loss"
METRIC_EVAL_LOSS_TOKENS = "eval/loss_tokens"
# health signals (docs/health.md), logged at every logged step (loss_vs_ref at the verdict step)
METRIC_HEALTH_MOVEMENT_MIN = "health/adapter_movement_min"  # min over adapters of ||dW||/||W_base||
METRIC_HEALTH_MOVEMENT_MEDIAN = "health/adapter_movement_median"
METRIC_HEALTH_STD_MIN = "health/lora_std_min"  # smallest std of any LoRA matrix
METRIC_HEALTH_SKIPS = "health/grad_scaler_skips"  # optimizer steps the LoRA grad scaler skipped so far
METRIC_HEALTH_REF_LOSS = "health/ref_loss"  # the reference (bf16) trial's train/loss at this step
METRIC_HEALTH_LOSS_VS_REF = "health/loss_vs_ref"  # train/loss / health/ref_loss

# --- precision.gemm: how fp8lab's own FP8 GEMMs run ------------------------------------------
# emulated: decode the FP8 operands, one BF16 GEMM (the default); scaled_mm: the FP8 codes and
# scales through torch._scaled_mm where the shape allows (workloads/precision/scaled_mm.py)
GEMM_MODES = ("emulated", "scaled_mm")

# --- artifacts --------------------------------------------------------------------------------
TELEMETRY_PATH = "telemetry/telemetry.parquet"
WHATIF_PATH = "telemetry/whatif.parquet"  # precision.telemetry.whatif: every recipe on the same tensors
SAMPLES_DIR = "eval/samples"
LOSS_ROWS_ARTIFACT = "eval/loss_rows.jsonl"  # one {"row", "loss", "tokens"} per held-out row
RESULT_JSON = "result.json"

# Columns of the telemetry Parquet, in order. `value` holds the scalar of non-cast rows.
TELEMETRY_COLUMNS = ("step", "layer", "kind", "underflow_pct", "overflow_pct", "amax",
                     "scale_inv_min", "scale_inv_max", "mse", "nonfinite", "numel", "value")


# The what-if telemetry (workloads/precision/whatif.py): one row per recorded step, cast tensor
# (layer, kind) and recipe, with the telemetry's own underflow / overflow / MSE definitions.
WHATIF_RECIPES = ("tensorwise", "rowwise", "block", "mxfp8", "nvfp4")
WHATIF_COLUMNS = ("step", "layer", "kind", "recipe", "underflow_pct", "overflow_pct", "mse", "numel")


@dataclass(frozen=True)
class TrialLaunch:
    """Everything one trial needs from its launcher (a Ray task or `fp8lab trial`), as plain data.

    The orchestrator builds it (after creating the MLflow run), Ray ships it to the worker, and
    `workloads.entry.run` hands it to the trial unchanged: one record, not three shapes of it.
    """

    config: dict[str, Any]  # the resolved config of this trial (plain containers)
    trial_id: str
    run_id: str  # the MLflow run the orchestrator created for this trial
    tracking_uri: str
    policy_label: str  # the run name's policy part (`fp8_protected`, `fp8_naive+lora_gemm=bf16`)
