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
def summarize(samples: list[float]) -> dict[str, float]:
    """Median and quartiles (a benchmark's figure is the median; IQR shows the noise)."""
    if not samples:
        return {"median": float("nan"), "p25": float("nan"), "p75": float("nan"), "n": 0}
    ordered = sorted(samples)
    if len(ordered) >= 2:
        q = statistics.quantiles(ordered, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25 = p75 = ordered[0]
    return {"median": statistics.median(ordered), "p25": p25, "p75": p75, "n": len(ordered)}


def ratio_samples(a: list[float], b: list[float]) -> list[float]:
    """Per-round ratios a_i / b_i (rounds are paired by position)."""
    return [x / y for x, y in zip(a, b, strict=False) if y]


def interleave(variants: Mapping[str, Callable[[], Any]], rounds: int) -> dict[str, Any]:
    """Call each variant once per round, rotating the order each round; returns the samples.

    A variant returns a float (samples: ``{name: [floats]}``) or a dict of floats (samples:
    ``{name: {key: [floats]}}``)."""
    names = list(variants)
    samples: dict[str, Any] = {}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            value = variants[name]()
            if isinstance(value, Mapping):
                bucket = samples.setdefault(name, {})
                for key, v in value.items():
                    bucket.setdefault(key, []).append(float(v))
            else:
                samples.setdefault(name, []).append(float(value))
    return {n: samples[n] for n in names if n in samples}


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
class NullLogger:
    """A TrialLogger that drops everything (the training loop's logging cost minus MLflow I/O)."""

    def __init__(self) -> None:
        self.steps = 0

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self.steps += 1

    def log_final(self, metrics: dict[str, float], step: int = 0) -> None:
        pass

    def set_tags(self, tags: dict[str, Any]) -> None:
        pass

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_text(self, text: str, artifact_path: str) -> None:
        pass

    def log_file(self, local_path: Path, artifact_dir: str) -> None:
        pass

    def flush(self) -> None:
        pass


def default_config(overrides: list[str] | None = None) -> dict[str, Any]:
    """The composed, resolved fp8lab config (plain dict) for ``overrides``."""
    from orchestrator.config_loader import compose_config, to_container

    return to_container(compose_config(list(overrides or []), None))


@dataclass
class InProcessTrial:
    """One trial's model, policy and data, built exactly as ``workloads.trial`` builds them, whose
    training loop (``workloads.train.loop.run_training``) can be run in chunks so that several
    trials can be interleaved step-chunk by step-chunk in one process."""

    name: str
    model: Any
    handle: Any
    telemetry: Any
    settings: Any
    data: Any
    batch_size: int
    seed: int
    device: Any
    step: int = 0
    tokens: int = 0
    step_times: list[float] = field(default_factory=list)
    logger_factory: Callable[[], Any] | None = None  # default: NullLogger
    health: Any = None  # a workloads.health HealthMonitor computing its signals at logged steps
    _batches: Iterator[dict[str, Any]] | None = None

    def run_chunk(self, n_steps: int) -> dict[str, float]:
        """Train ``n_steps`` more steps through ``workloads.train.loop.run_training`` (a fresh
        call, so step numbers, and with them the telemetry/logging cadence, restart at 1 and a
        chunk of ``telemetry.every`` steps holds exactly one recorded step).

        Returns seconds per step on two clocks: ``wall`` (the loop's own ``TrainResult.wall_s``)
        and ``cpu`` (this process's CPU time over the call: with torch on one thread this is the
        work done, and it barely moves when other processes compete for the cores, which makes
        it the steadier figure on a shared machine; on an idle machine the two agree)."""
        batches = [next(self._batch_iter()) for _ in range(n_steps)]
        cpu0 = time.process_time()
        result = call_run_training(self.model, self.handle, self.telemetry, batches,
                                   dataclasses.replace(self.settings, steps=n_steps),
                                   self.logger_factory() if self.logger_factory else NullLogger(), self.health)
        cpu = time.process_time() - cpu0
        self.step += result.steps_done
        self.tokens += result.tokens
        done = max(result.steps_done, 1)
        per_step = {"wall": result.wall_s / done, "cpu": cpu / done}
        self.step_times.append(per_step["wall"])
        return per_step

    def _batch_iter(self) -> Iterator[dict[str, Any]]:
        if self._batches is None:
            from workloads.data import load as data_mod

            self._batches = data_mod.batches(self.data, self.batch_size, 10**9, self.seed)
        return self._batches


def call_run_training(model: Any, handle: Any, telemetry: Any, batches: list[dict[str, Any]],
                      settings: Any, logger: Any, health: Any = None) -> Any:
    """``run_training`` with a fixed list of batches, whichever way it takes them (an iterable
    of batches, or ``make_batches(start_step)`` since checkpoint/resume)."""
    from workloads.train.loop import run_training

    params = inspect.signature(run_training).parameters
    extra = {"health": health} if health is not None else {}
    if "make_batches" in params:
        return run_training(model, handle, telemetry, lambda start: batches[start:], settings, logger, **extra)
    return run_training(model, handle, telemetry, batches, settings, logger, **extra)


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
    ``hidden`` is given), attach LoRA and apply ``policy`` the way ``workloads.trial._run`` does.

    ``health``: also compute the trial's health signals at every logged step, as a trial does
    (the verdict itself, a host-side rule check once per trial, is left out)."""
    import torch

    from workloads.data import load as data_mod
    from workloads.eval.harness import embedded_paths
    from workloads.health.monitor import HealthMonitor
    from workloads.health.rules import HealthRules
    from workloads.health.signals import AdapterProbe, base_weight_norms
    from workloads.model.loading import attach_lora, load_base_model
    from workloads.precision.backends import apply_backend, select_backend
    from workloads.precision.policy import get_policy
    from workloads.precision.telemetry import Fp8Telemetry
    from workloads.trial import _loop_settings

    config = default_config([f"precision={policy}", f"seed={seed}", *(overrides or [])])
    tele = config["precision"]["telemetry"]
    if telemetry is not None:
        tele["enabled"] = telemetry
    if telemetry_every is not None:
        tele["every"] = telemetry_every
    device = torch.device("cpu")
    paths = embedded_paths()
    torch.manual_seed(seed)
    if hidden is None:
        model, tokenizer = load_base_model(config["model"], paths.model_dir, device)
    else:
        model, tokenizer = wide_model(paths.model_dir, hidden, layers)
    train_data = data_mod.load_training_data(config["data"], tokenizer, config["train"]["max_seq_len"], paths.data_dir)
    model = attach_lora(model, config["lora"], seed)
    base_norms = base_weight_norms(model) if health else None  # before the backend converts the base layers
    pol = get_policy(config["precision"]["policy"]).with_switches(**(config["precision"]["switches"] or {}))
    telem = Fp8Telemetry(underflow_threshold_pct=tele["underflow_threshold_pct"])
    handle = apply_backend(model, pol, telem, select_backend(backend, device))
    batch_size = int(config["train"]["batch_size"])
    if calibrate:
        calib = list(data_mod.batches(train_data, batch_size, pol.calibration_steps, seed + 1))
        handle.calibrate(lambda b: model(**b), calib)
    model.train()
    settings = _loop_settings(config)
    trial = InProcessTrial(name or policy, model, handle, telem, settings, train_data, batch_size, seed, device)
    if health:
        rules = HealthRules.from_config(config["health"]["rules"])
        trial.health = HealthMonitor(AdapterProbe(model, base_norms), handle, rules, step=0, early_stop=False)
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
