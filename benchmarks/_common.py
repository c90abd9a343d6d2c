"""Shared helpers of the fp8lab benchmarks (not a benchmark itself).

Every benchmark compares two or more things *in the same run*: the variants are interleaved
(A B A B ..., the order rotated each round so no variant always runs first), each figure is the
median over repeats, and the ratio is taken per round (A_i / B_i) before the median, so a burst of
load from another process hits both sides of a ratio alike. Torch runs on one thread unless a
benchmark says otherwise (the machine this was written on has 2 shared cores).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS_DIR = ROOT / "benchmarks" / "results"
# The load when the benchmark started (this module is imported first thing): a busy machine
# at the start is the reason to rerun; the load at the end is recorded too.
_LOAD_AT_START = list(os.getloadavg()) if hasattr(os, "getloadavg") else None


# -- statistics --------------------------------------------------------------------------------
# One implementation, shared with the product's paired speed probe (`fp8lab bench`).
from workloads.bench import InProcessTrial, NullLogger, call_run_training, interleave, ratio_samples, summarize  # noqa: E402,F401


def compare(samples: dict[str, dict[str, list[float]]], reference: str) -> dict[str, dict[str, Any]]:
    """Per variant and clock (``wall``, ``cpu``): the per-step figure and the ratio to
    ``reference`` (median of per-round ratios)."""
    out: dict[str, dict[str, Any]] = {}
    for name, clocks in samples.items():
        out[name] = {}
        for clock, values in clocks.items():
            out[name][clock] = {"step_s": summarize(values),
                                "ratio": summarize(ratio_samples(values, samples[reference][clock]))}
    return out


# -- environment -------------------------------------------------------------------------------
def pin_threads(n: int = 1) -> None:
    """Pin torch (and the BLAS it calls) to ``n`` threads."""
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # already set once in this process
        pass


def environment() -> dict[str, Any]:
    """What the figures were measured on (written into every JSON)."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": _LOAD_AT_START,
        "loadavg_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def write_json(path: str | Path | None, name: str, data: dict[str, Any]) -> Path:
    """Write ``data`` (plus the environment) to ``path`` or benchmarks/results/<name>.json."""
    target = Path(path) if path else RESULTS_DIR / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "environment": environment(), **data}
    target.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    return target


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """A plain fixed-width table on stdout (readable in CI logs)."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    sys.stdout.flush()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "n/a"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 1:
            return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


# -- in-process trials ---------------------------------------------------------------------------
def default_config(overrides: list[str] | None = None) -> dict[str, Any]:
    """The composed, resolved fp8lab config (plain dict) for ``overrides``."""
    from orchestrator.config_loader import compose_config, to_container

    return to_container(compose_config(list(overrides or []), None))


def build_trial(
    policy: str = "bf16",
    *,
    name: str | None = None,
    overrides: list[str] | None = None,
    hidden: int | None = None,
    layers: int | None = None,
    backend: str = "emulated",
    telemetry: bool | None = None,
    telemetry_every: int | None = None,
    seed: int = 0,
    calibrate: bool = True,
    health: bool = False,
) -> InProcessTrial:
    """Load the embedded model (or a randomly initialised wider copy of its architecture when
    ``hidden`` is given), attach LoRA and apply ``policy`` through the stages of
    ``workloads.recipe`` (the ones a trial's ``setup`` runs), on CPU and with ``backend``.

    ``health``: also compute the trial's health signals at every logged step, as a trial does
    (the verdict itself, a host-side rule check once per trial, is left out)."""
    from workloads import recipe
    from workloads.embedded.paths import embedded_paths
    from workloads.data.lengths import resolve_train_keys
    from workloads.health.monitor import HealthMonitor
    from workloads.health.rules import HealthRules
    from workloads.health.signals import AdapterProbe, base_weight_norms
    from workloads.model.loading import attach_lora, load_base_model
    from workloads.train.memory import PeakMemory

    config = default_config([f"precision={policy}", f"seed={seed}", *(overrides or [])])
    tele = config["precision"]["telemetry"]
    if telemetry is not None:
        tele["enabled"] = telemetry
    if telemetry_every is not None:
        tele["every"] = telemetry_every
    device = recipe.setup_runtime(recipe.RuntimeSettings(seed, "cpu", None))  # threads: the caller's
    paths = embedded_paths()
    if hidden is None:
        model, tokenizer = load_base_model(config["model"], paths.model_dir, device)
    else:
        model, tokenizer = wide_model(paths.model_dir, hidden, layers)
    config = resolve_train_keys(config, tokenizer, paths.data_dir, paths.model_dir)  # train.max_seq_len: null -> from the data
    model = attach_lora(model, config["lora"], seed)
    train_data = recipe.setup_data(config["data"], config["train"]["max_seq_len"], tokenizer, paths.data_dir)
    base_norms = base_weight_norms(model) if health else None  # before the backend converts the base layers
    pol, telem = recipe.setup_policy(recipe.PrecisionSettings.from_config(config["precision"]))
    choice, handle = recipe.setup_backend(model, pol, telem, backend, device)
    built = recipe.Trial(device, model, tokenizer, train_data, pol, telem, choice, handle,
                         AdapterProbe(model, base_norms) if health else None, PeakMemory(device),
                         recipe.loop_settings(config["train"], tele), int(config["train"]["batch_size"]), seed, {})
    if calibrate:
        recipe.calibrate(built)
    else:
        model.train()
    trial = InProcessTrial(name or policy, model, handle, telem, built.settings, train_data, built.batch_size, seed, device)
    if health:
        rules = HealthRules.from_config(config["health"]["rules"])
        trial.health = HealthMonitor(built.probe, handle, rules, step=0, early_stop=False)
    return trial


def wide_model(model_dir: Path, hidden: int, layers: int | None = None) -> tuple[Any, Any]:
    """The embedded architecture at width ``hidden`` (intermediate 4x, head_dim 64), random
    init in BF16, with the embedded tokenizer: the wider model of the FP8-emulation benchmark."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir)
    cfg.hidden_size = hidden
    cfg.intermediate_size = 4 * hidden
    cfg.head_dim = 64
    cfg.num_attention_heads = cfg.num_key_value_heads = max(1, hidden // 64)
    if layers is not None:
        cfg.num_hidden_layers = layers
    cfg.use_cache = False
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def free_memory() -> None:
    import gc

    gc.collect()
