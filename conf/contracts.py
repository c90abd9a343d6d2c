"""Names shared by orchestrator, workloads and analysis: MLflow tags, metric names, artifact paths,
telemetry columns. Imported as `fp8lab_conf.contracts`.

Why here: the three packages may not import each other in every direction (analysis never imports
workloads or orchestrator; workloads never imports orchestrator), but all three read the config
tree, so its package is the one place each can import. Pure constants: no torch, no third-party
imports. docs/contracts.md explains each name; change both together.
"""
from __future__ import annotations

# --- tags on every run -----------------------------------------------------------------------
TAG_ROLE = "fp8lab.role"  # parent sweep run or child trial run (values in orchestrator/tracking.py)
TAG_SWEEP_ID = "fp8lab.sweep_id"
TAG_SWEEP_NAME = "fp8lab.sweep_name"
TAG_VERSION = "fp8lab.version"

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

# --- health / early warning (filled in by the early-warning work) -----------------------------

# --- metrics ----------------------------------------------------------------------------------
METRIC_ACCURACY = "eval/accuracy"
METRIC_ACCURACY_STDERR = "eval/accuracy_stderr"
METRIC_TOKENS_PER_S = "train/tokens_per_s"
METRIC_TOKENS_PER_S_WINDOW = "train/tokens_per_s_window"
METRIC_LOSS = "train/loss"
METRIC_GRAD_NORM = "train/grad_norm"
METRIC_LORA_WEIGHT_STD = "train/lora_weight_std"
METRIC_LR = "train/lr"
METRIC_LOSS_SCALE = "fp8/loss_scale"

# --- artifacts --------------------------------------------------------------------------------
TELEMETRY_PATH = "telemetry/telemetry.parquet"
SAMPLES_DIR = "eval/samples"
RESULT_JSON = "result.json"

# Columns of the telemetry Parquet, in order. `value` holds the scalar of non-cast rows.
TELEMETRY_COLUMNS = ("step", "layer", "kind", "underflow_pct", "overflow_pct", "amax",
                     "scale_inv_min", "scale_inv_max", "mse", "nonfinite", "numel", "value")
