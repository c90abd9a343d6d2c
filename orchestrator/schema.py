"""Validate the whole composed config once, up front, and report every problem together.

The schema is declarative (one rule per key) so a new key is one line here. Each problem names
the key, what is allowed, what was given, and how to fix it. Checks that need the filesystem or
the training stack (model folder, dataset rows, policy names, lm-eval tasks) live in
workloads/preflight.py (run by orchestrator/preflight_child.py); this module only looks at the config itself.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from fp8lab_conf.contracts import GEMM_MODES
from workloads.precision.backends.entries import requestable_names  # torch-free registry


@dataclass(frozen=True)
class Rule:
    """What one key accepts. `check` returns None when fine, else what is allowed."""

    kinds: tuple[type, ...]
    allowed: str
    example: str
    nullable: bool = False
    check: Callable[[Any], bool] | None = None
    hi: int | None = None  # upper bound of a count (its own message: the value is valid, just absurd)


# Counts far beyond any LoRA fine-tune are typos (`train.steps=1e20` written as an int) that would
# otherwise train "step 115/100000000000000000000" until someone notices; each count has a sane
# upper bound, and train.steps above LONG_RUN_STEPS needs train.allow_long_run=true.
MAX_COUNT = 2**31 - 1
LONG_RUN_STEPS = 100_000


def _int(allowed: str, example: str, lo: int | None = None, nullable: bool = False, hi: int = MAX_COUNT) -> Rule:
    return Rule((int,), allowed, example, nullable, None if lo is None else (lambda v, lo=lo: v >= lo), hi)


def _pos_float(example: str, nullable: bool = False, upper: float | None = None) -> Rule:
    allowed = "a number > 0" + (f" and <= {upper}" if upper else "")
    return Rule((int, float), allowed, example, nullable,
                lambda v: v > 0 and (upper is None or v <= upper))


def _nonneg_float(example: str) -> Rule:
    return Rule((int, float), "a number >= 0", example, False, lambda v: v >= 0)


def _choice(*options: str, nullable: bool = False) -> Rule:
    return Rule((str,), "one of " + ", ".join(options), options[0], nullable, lambda v: v in options)


def _str(example: str, nullable: bool = False) -> Rule:
    return Rule((str,), "a non-empty string", example, nullable, lambda v: bool(v.strip()))


_BOOL = Rule((bool,), "true or false", "false")
_OPEN_DICT = Rule((dict,), "a mapping", "{}")

SCHEMA: dict[str, Any] = {
    "seed": _int("an integer >= 0", "0", lo=0),
    "trial": {"output": _str("result.json", nullable=True), "name": _str("my-run", nullable=True)},
    "model": {
        "name_or_path": _str("embedded"),
        "dtype": _choice("bfloat16", "float32", "float16"),
        "trust_remote_code": _BOOL,
    },
    "data": {
        "path": _str("embedded"),
        "train_split": _str("train"),
        "format": _choice("auto", "multiple_choice", "prompt_completion", "chat"),
        "prompt_field": _str("prompt"),
        "answer_field": _str("answer"),
        "choices_field": _str("choices", nullable=True),
        "completion_field": _str("completion"),
        "messages_field": _str("messages"),
        "target_delimiter": Rule((str,), "a string", '" "'),
        "max_train_examples": _int("an integer >= 1 or null", "1000", lo=1, nullable=True),
        "max_truncated_pct": Rule((int, float), "a percentage in [0, 100]", "1", False, lambda v: 0 <= v <= 100),
        "chat_template": _str("/path/to/template.jinja", nullable=True),
        "max_row_bytes": _int("an integer >= 1024", "1048576", lo=1024, hi=1 << 30),
    },
    "lora": {
        "r": _int("an integer >= 1", "8", lo=1, hi=65_536),
        "alpha": _pos_float("16"),
        "dropout": Rule((int, float), "a number in [0, 1)", "0.0", False, lambda v: 0 <= v < 1),
        "target_modules": Rule((str, list), '"all-linear" or a list of module names', "all-linear"),
    },
    "precision": {
        "policy": _str("bf16"),
        "backend": _choice(*requestable_names()),
        "gemm": _choice(*GEMM_MODES),
        "switches": _OPEN_DICT,
        "telemetry": {
            "enabled": _BOOL,
            "every": _int("an integer >= 1", "10", lo=1),
            "underflow_threshold_pct": _pos_float("10.0", upper=100),
            "whatif": _BOOL,
        },
    },
    "train": {
        "steps": _int("an integer >= 1", "400", lo=1, nullable=True),
        "epochs": _pos_float("2", nullable=True, upper=100_000),
        "batch_size": _int("an integer >= 1", "16", lo=1, hi=1_000_000),
        "grad_accum": _int("an integer >= 1", "1", lo=1, hi=1_000_000),
        "max_seq_len": _int("an integer >= 8", "32", lo=8, nullable=True, hi=10_000_000),
        "lr": _pos_float("2e-4", upper=1.0),
        "weight_decay": _nonneg_float("0.0"),
        "warmup_steps": _int("an integer >= 0", "20", lo=0),
        "lr_schedule": _choice("constant", "cosine", "linear"),
        "grad_clip": _pos_float("1.0", nullable=True),
        "log_every": _int("an integer >= 1", "10", lo=1),
        "num_threads": _int("an integer >= 1 or null", "1", lo=1, nullable=True),
        "device": _choice("auto", "cpu", "cuda"),
        "checkpoint_every": _int("an integer >= 0", "0", lo=0),
        "checkpoint_dir": _str("/path/to/checkpoints", nullable=True),
        "allow_long_run": _BOOL,
    },
    "eval": {
        "task": _str("fp8lab_embedded", nullable=True),
        "tasks": Rule((list,), "a non-empty list of distinct task names", "[fp8lab_embedded,arc_easy]", True,
                      lambda v: bool(v) and all(isinstance(t, str) and t.strip() for t in v) and len(set(v)) == len(v)),
        "metrics": Rule((dict,), "a mapping of task name -> primary metric, or null", '{gsm8k: "exact_match,strict-match"}', True,
                        lambda v: all(isinstance(k, str) and isinstance(m, str) and m.strip() for k, m in v.items())),
        "primary": _str("mean"),
        "include_path": _str("/path/to/tasks", nullable=True),
        "limit": _int("an integer >= 1 or null", "100", lo=1, nullable=True),
        "batch_size": _int("an integer >= 1", "32", lo=1),
        "num_fewshot": _int("an integer >= 0 or null", "0", lo=0, nullable=True),
        "apply_chat_template": Rule((bool, str), "true, false or a chat template name", "true", False,
                                    lambda v: isinstance(v, bool) or bool(v.strip())),
        "fewshot_as_multiturn": _BOOL,
        "system_instruction": _str("You are a careful assistant.", nullable=True),
        "before_training": _BOOL,
        "loss_split": _str("validation", nullable=True),
        "loss_rows": _int("an integer >= 1 or null", "200", lo=1, nullable=True),
        "loss_every": Rule((int, str), "an integer >= 0, or epoch", "100", False,
                           lambda v: v == "epoch" if isinstance(v, str) else v >= 0),
    },
    "health": {
        "at": _pos_float("0.1"),
        "reference_policy": _str("bf16"),
        "rules": Rule((list,), "a non-empty list of rules", "see conf/health/default.yaml"),  # entries: _check_health
    },
    "tracking": {
        "uri": _str("sqlite:///mlflow.db"),
        "artifact_location": _str("/path/to/artifacts", nullable=True),
        "log_adapter": _BOOL,
        "system_metrics_interval_s": _nonneg_float("10"),
    },
    "cluster": {
        "address": _str("auto", nullable=True),
        "num_cpus": _int("an integer >= 1 or null", "2", lo=1, nullable=True),
        "num_gpus": _int("an integer >= 0 or null", "0", lo=0, nullable=True),
        "include_dashboard": _BOOL,
        "dashboard_host": _str("127.0.0.1"),
        "cpus_per_trial": Rule((int, float), "a number > 0", "1", False, lambda v: v > 0),
        "gpus_per_trial": Rule((int, float), "0, a fraction in (0, 1), or a whole number", "1", False,
                               lambda v: v >= 0 and (v < 1 or float(v).is_integer())),
        "trial_resources": Rule((dict,), "a mapping of custom resource name -> amount > 0", "{node_a: 1}", False,
                                lambda v: all(isinstance(k, str) and isinstance(a, (int, float)) and not isinstance(a, bool)
                                              and a > 0 for k, a in v.items())),
        "pin_trials": Rule((list,), "a list of custom resource names", "[node_a,node_b]", False,
                           lambda v: all(isinstance(x, str) and x.strip() for x in v)),
        "runtime_env": _OPEN_DICT,
    },
    "sweep": {
        "name": _str("fp8lab-default"),
        "axes": _OPEN_DICT,
        "max_retries": _int("an integer >= 0", "1", lo=0, hi=100),
        "early_stop": _BOOL,
        "report": _BOOL,
        "speed_probe": _BOOL,
    },
    "fault": {
        "kind": _choice("nan_weights", "raise", "kill", "kill_in_eval", nullable=True),
        "step": _int("an integer >= 1", "1", lo=1),
        "once_file": _str("/tmp/fp8lab-fault-once", nullable=True),
    },
    "report": {
        "gpu_hour_price": _nonneg_float("2.5"),
        "utilization": _pos_float("0.8", upper=1.0),
        "n_gpu": _int("an integer >= 1", "1", lo=1, hi=1_000_000),
        "equivalence_margin_pts": _pos_float("2.0"),
        "loss_margin_pct": _pos_float("0.5"),
        "out": _str("report/", nullable=True),
    },
}


def validate_config(cfg: dict) -> list[str]:
    """Every problem in the config, one line each (empty list = valid)."""
    problems: list[str] = []
    _walk(cfg, SCHEMA, "", problems)
    problems += _check_axes(cfg.get("sweep", {}).get("axes"), cfg)
    problems += _check_eval(cfg.get("eval"))
    problems += _check_health(cfg.get("health"), cfg.get("train"))
    problems += _check_length(cfg.get("train"))
    problems += _check_long_run(cfg.get("train"))
    return problems


def _check_length(train: Any) -> list[str]:
    """How long training runs: `train.steps` or `train.epochs`, exactly one (never one silently
    winning over the other, as HF Trainer's max_steps does over num_train_epochs)."""
    if not isinstance(train, dict):
        return []
    steps, epochs = train.get("steps"), train.get("epochs")
    if steps is not None and epochs is not None:
        return [f"train.epochs: set together with train.steps={steps}; use one (fix: train.steps=null "
                f"train.epochs={epochs}, or train.epochs=null)"]
    if steps is None and epochs is None:
        return ["train.steps: null and train.epochs is null too: nothing says how long to train "
                "(fix: train.steps=400 or train.epochs=1)"]
    return []


def _check_long_run(train: Any) -> list[str]:
    """More than LONG_RUN_STEPS steps must be confirmed: at the embedded task's ~0.3 s a step that
    is over 8 hours of one trial, and a sweep multiplies it."""
    if not isinstance(train, dict) or train.get("allow_long_run") is True:
        return []
    steps = train.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and LONG_RUN_STEPS < steps <= MAX_COUNT:
        return [f"train.steps: {steps} steps is more than {LONG_RUN_STEPS} (a LoRA fine-tune needs hundreds to "
                f"thousands) (fix: fewer steps, or train.allow_long_run=true to confirm a run that long)"]
    return []


def _walk(node: Any, schema: dict, prefix: str, problems: list[str]) -> None:
    if not isinstance(node, dict):
        problems.append(f"{prefix.rstrip('.')}: must be a mapping, got {node!r}")
        return
    for key in node:
        if key not in schema:
            problems.append(_unknown_key(prefix + str(key), list(schema), prefix))
    for key, rule in schema.items():
        path = prefix + key
        if key not in node:
            problems.append(f"{path}: missing (fix: add {path}=... ; see `fp8lab trial --cfg job`)")
        elif isinstance(rule, dict):
            _walk(node[key], rule, path + ".", problems)
        else:
            problem = _check_value(path, node[key], rule)
            if problem:
                problems.append(problem)


def _unknown_key(path: str, known: list[str], prefix: str) -> str:
    leaf = path[len(prefix):]
    close = difflib.get_close_matches(leaf, known, n=1)
    hint = f"did you mean {prefix}{close[0]}? " if close else ""
    return f"{path}: unknown config key ({hint}known keys here: {', '.join(known)})"


def _check_value(path: str, value: Any, rule: Rule) -> str | None:
    if value is None:
        return None if rule.nullable else f"{path}: must be {rule.allowed}, got null (fix: {path}={rule.example})"
    ok_type = isinstance(value, rule.kinds) and not (isinstance(value, bool) and bool not in rule.kinds)
    if not ok_type or (rule.check is not None and not rule.check(value)):
        return f"{path}: must be {rule.allowed}, got {value!r} (fix: {path}={rule.example})"
    if rule.hi is not None and value > rule.hi:
        return f"{path}: {value} is more than the upper bound {rule.hi} (fix: {path}={rule.example})"
    return None


def _check_axes(axes: Any, cfg: dict) -> list[str]:
    """Each axis is a known group/key with a non-empty list of values; seeds are integers."""
    if not isinstance(axes, dict):
        return []
    from orchestrator.axes import flatten_axes

    problems = []
    for key, values in flatten_axes(axes).items():
        if not isinstance(values, list) or not values:
            problems.append(f"sweep.axes.{key}: must be a non-empty list, got {values!r} (fix: sweep.axes.{key}=[a,b])")
            continue
        if _lookup(cfg, key) is _MISSING:
            problems.append(f"sweep.axes.{key}: {key} is not a config key or group (fix: use a key printed by `fp8lab trial --cfg job`)")
        if len(set(map(repr, values))) != len(values):
            problems.append(f"sweep.axes.{key}: values repeat in {values!r} (fix: list each value once)")
        if key == "seed":
            bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < 0]
            if bad:
                problems.append(f"sweep.axes.seed: seeds must be integers >= 0, got {bad!r} (fix: sweep.axes.seed=[0,1])")
    return problems


def _check_eval(ev: Any) -> list[str]:
    """Cross-key rules of `eval` (each key's own type is checked by the schema; which tasks and
    metrics exist is known only to lm-eval: workloads/eval/checks.py checks those)."""
    if not isinstance(ev, dict):
        return []
    problems = []
    if ev.get("task") is not None and ev.get("tasks") is not None:
        problems.append(f"eval.task: set together with eval.tasks; use one (fix: eval.tasks=[{ev['task']},...] "
                        "and eval.task=null, or drop eval.tasks)")
    if ev.get("fewshot_as_multiturn") is True and ev.get("apply_chat_template") is False:
        problems.append("eval.fewshot_as_multiturn: needs a chat template (fix: eval.apply_chat_template=true, "
                        "or eval.fewshot_as_multiturn=false)")
    return problems


def _check_health(health: Any, train: Any) -> list[str]:
    """`health.at` names a step of this run; each rule of `health.rules` is well formed."""
    if not isinstance(health, dict):
        return []
    from workloads.health.rules import rule_problems  # torch-free: the rules engine is pure Python

    problems = rule_problems(health["rules"]) if isinstance(health.get("rules"), list) else []
    at, steps = health.get("at"), (train or {}).get("steps") if isinstance(train, dict) else None
    if isinstance(at, (int, float)) and not isinstance(at, bool) and at >= 1 and isinstance(steps, int):
        if not float(at).is_integer():
            problems.append(f"health.at: {at!r} is neither a fraction < 1 nor a step number (fix: health.at=0.1 or health.at={int(at)})")
        elif at > steps:
            problems.append(f"health.at: step {int(at)} is after the last step, train.steps={steps} "
                            f"(fix: health.at={max(1, steps // 10)} or a fraction such as health.at=0.1)")
    return problems


_MISSING = object()


def _lookup(cfg: dict, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node
