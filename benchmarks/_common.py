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


def chunk_problem(chunk: int, policies: list[str]) -> str | None:
    """Why ``--chunk`` cannot time the default telemetry cadence, or None. A chunk is a fresh call of
    the training loop whose step count restarts at 1 (``InProcessTrial.run_chunk``), so a chunk
    shorter than, or not a multiple of, ``precision.telemetry.every`` holds no recorded step, or a
    share of them that is not the cadence's: a "default" variant would then time something else."""
    for policy in policies:
        every = default_config([f"precision={policy}"])["precision"]["telemetry"]["every"]
        if chunk < every or chunk % every:
            return (f"--chunk {chunk}: must be a multiple of precision.telemetry.every ({every}, policy {policy}), "
                    f"or its chunks do not hold the default cadence's recorded steps; use --chunk {every}")
    return None


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
    health: bool = False,
) -> InProcessTrial:
    """A trial of ``policy`` set up by the trial's own spine (``workloads.recipe.setup``: runtime,
    model, LoRA, data, policy, backend, calibration), on CPU with ``backend``, without the base
    model's evaluation; with ``hidden``, on a randomly initialised wider copy of the embedded
    architecture (``wide_model_folder``), loaded from its folder as any model is.

    ``health``: also compute the trial's health signals at every logged step, as a trial does
    (the verdict itself, a host-side rule check once per trial, is left out)."""
    from workloads import recipe
    from workloads.health.monitor import HealthMonitor
    from workloads.health.rules import HealthRules
    from workloads.health.signals import AdapterProbe

    flags = [f"precision={policy}", f"seed={seed}", f"precision.backend={backend}", "train.device=cpu",
             "eval.before_training=false"]
    if telemetry is not None:
        flags.append(f"precision.telemetry.enabled={str(telemetry).lower()}")
    if telemetry_every is not None:
        flags.append(f"precision.telemetry.every={telemetry_every}")
    if hidden is not None:
        flags.append(f"model.name_or_path={wide_model_folder(hidden, layers)}")
    config = default_config([*flags, *(overrides or [])])
    config["train"]["num_threads"] = None  # threads: the caller's (the benchmarks set one)
    built = recipe.setup(config)
    trial = InProcessTrial(name or policy, built.model, built.handle, built.telemetry, built.settings, built.train_data,
                           built.batch_size, seed, built.device)
    if health:
        rules = HealthRules.from_config(config["health"]["rules"])
        trial.health = HealthMonitor(AdapterProbe(built.model, built.base_norms), built.handle, rules, step=0,
                                     early_stop=False)
    return trial


_WIDE_MODELS: dict[tuple[int, int | None], Path] = {}


def wide_model_folder(hidden: int, layers: int | None = None) -> Path:
    """A model folder of the embedded architecture at width ``hidden`` (intermediate 4x, head_dim
    64, ``layers`` layers if given), random init (seed 0) in BF16, with the embedded tokenizer:
    the wider model of the FP8-emulation benchmark. Written once per process, removed at exit."""
    key = (hidden, layers)
    if key not in _WIDE_MODELS:
        import atexit
        import shutil
        import tempfile

        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from workloads.embedded.paths import embedded_paths

        model_dir = embedded_paths().model_dir
        cfg = AutoConfig.from_pretrained(model_dir)
        cfg.hidden_size = hidden
        cfg.intermediate_size = 4 * hidden
        cfg.head_dim = 64
        cfg.num_attention_heads = cfg.num_key_value_heads = max(1, hidden // 64)
        if layers is not None:
            cfg.num_hidden_layers = layers
        cfg.use_cache = False
        torch.manual_seed(0)
        folder = Path(tempfile.mkdtemp(prefix=f"fp8lab-wide-{hidden}-"))
        atexit.register(shutil.rmtree, folder, True)
        AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(folder)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(folder)
        _WIDE_MODELS[key] = folder
    return _WIDE_MODELS[key]


def free_memory() -> None:
    import gc

    gc.collect()
