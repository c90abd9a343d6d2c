"""The model card (README.md) of an export: what the model is, how well it did against bf16, how
it was trained and how to load it.

PEFT's `save_pretrained` writes an empty template; a user who finds the folder (or the registered
model) later needs the facts that decide whether to use it: the precision policy it was trained
under, its sweep and seed, accuracy and held-out loss next to the bf16 trial of the same seed and
configuration, and the recipe. Every number comes from the trial's MLflow run.
"""
from __future__ import annotations

import math
from typing import Any

from fp8lab_conf.contracts import (
    METRIC_ACCURACY, METRIC_ACCURACY_STDERR, METRIC_EVAL_LOSS, TAG_BACKEND, TAG_EMULATED, TAG_POLICY,
    TAG_POLICY_VERSION, TAG_SEED, TAG_SWEEP_ID, TAG_TRIAL_ID,
)

# The params a reader needs to redo the training (the rest is in the run's config/resolved.yaml).
_RECIPE_PREFIXES = ("model.", "data.", "lora.", "train.", "precision.policy", "eval.task")
_LOAD_HINT = {
    "adapter": ("from transformers import AutoModelForCausalLM\nfrom peft import PeftModel\n"
                "base = AutoModelForCausalLM.from_pretrained(BASE)  # see base_model below\n"
                "model = PeftModel.from_pretrained(base, EXPORT_FOLDER)"),
    "merged": "from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained(EXPORT_FOLDER)",
    "fp8-block128": ("from transformers import AutoModelForCausalLM\n"
                     "model = AutoModelForCausalLM.from_pretrained(EXPORT_FOLDER)  # or vllm.LLM(EXPORT_FOLDER)"),
}


def model_card(run: Any, reference: Any | None, fmt: str, base_ref: str, notes: tuple[str, ...] = ()) -> str:
    """README.md text for the export of `run` in format `fmt`; `reference` is the bf16 run of the
    same seed and configuration (None: not in the store, said so in the card); `notes`: the
    export's own lines (fp8-block128: which linears stayed BF16 and why)."""
    tags = run.data.tags
    policy = tags.get(TAG_POLICY, "?")
    lines = ["---", "library_name: " + ("peft" if fmt == "adapter" else "transformers"),
             f"base_model: {base_ref}", "tags:", "- fp8lab", "- lora", f"- {policy}", "---", "",
             f"# {tags.get('mlflow.runName', run.info.run_id)}: LoRA fine-tune under precision policy `{policy}`", "",
             f"Exported by `fp8lab export --format {fmt}` from MLflow run `{run.info.run_id}`.", "",
             f"- policy: `{policy}` (version {tags.get(TAG_POLICY_VERSION, '?')}), backend "
             f"`{tags.get(TAG_BACKEND, '?')}` (emulated: {tags.get(TAG_EMULATED, '?')})",
             f"- sweep: `{tags.get(TAG_SWEEP_ID, '') or 'none (a single trial)'}`, seed {tags.get(TAG_SEED, '?')}, "
             f"trial id `{tags.get(TAG_TRIAL_ID, '?')}`",
             f"- base model: `{base_ref}`", "", "## Quality against bf16", "", *_quality_table(run, reference), "",
             "## How it was trained", "", *_recipe(run.data.params), "",
             "The full configuration is the run's `config/resolved.yaml` artifact.", "", "## Load it", "",
             "```python", _LOAD_HINT[fmt], "```", "",
             *(["## Storage", "", "```", *(line.strip() for line in notes), "```", ""] if notes else [])]
    return "\n".join(lines)


def _quality_table(run: Any, reference: Any | None) -> list[str]:
    """Accuracy and held-out loss of this run, the bf16 run and the difference."""
    rows = ["| | this model | bf16, same seed and config | difference |", "|---|---|---|---|"]
    ref_metrics = reference.data.metrics if reference is not None else {}
    for label, key, scale, unit in (("accuracy", METRIC_ACCURACY, 100.0, " pts"), ("held-out loss", METRIC_EVAL_LOSS, 1.0, "")):
        mine, ref = run.data.metrics.get(key), ref_metrics.get(key)
        diff = f"{(mine - ref) * scale:+.4g}{unit}" if _finite(mine) and _finite(ref) else "n/a"
        rows.append(f"| {label} | {_num(mine, run.data.metrics.get(METRIC_ACCURACY_STDERR) if key == METRIC_ACCURACY else None)}"
                    f" | {_num(ref, ref_metrics.get(METRIC_ACCURACY_STDERR) if key == METRIC_ACCURACY else None)} | {diff} |")
    if reference is None:
        rows += ["", "No FINISHED bf16 trial with this seed and configuration is in the store, so there is no "
                     "comparison; the sweep's report compares over all seeds."]
    else:
        rows += ["", f"bf16 run: `{reference.info.run_id}`. One seed each: the sweep's report has the paired "
                     "statistics over seeds."]
    return rows


def _recipe(params: dict[str, str]) -> list[str]:
    return [f"- `{key}`: `{value}`" for key, value in sorted(params.items()) if key.startswith(_RECIPE_PREFIXES)]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _num(value: float | None, stderr: float | None) -> str:
    if not _finite(value):
        return "n/a"
    return f"{value:.4f}" + (f" ± {stderr:.4f}" if _finite(stderr) else "")
