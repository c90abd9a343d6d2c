"""The paired speed probe: a sweep's policies timed back to back in one process, on the same model
and batch shape, interleaved over several rounds; each policy's step-time ratio to the reference
with a confidence interval.

Why paired: a trial's own tokens/s is taken under whatever load the machine had while it ran,
so two trials of a sweep (or a trial reused from another sweep) are not comparable. Here the
policies run in chunks A B C, B C A, C A B ... and each round's ratio A_i / ref_i is taken before
the median, so a burst of load from another process hits both sides of a ratio alike. The CI is
the distribution-free interval of the median of the per-round ratios (binomial order statistics).

The statistics and the chunked in-process trial here are the ones the benchmarks use
(benchmarks/_common.py imports them): one implementation. A policy's trial is set up by the
trial's own spine (`workloads.recipe.setup`), so the probe times what a trial runs.
"""
from __future__ import annotations

import math
import os
import statistics
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.train.step_clock import load_average

REFERENCE = "bf16"


# -- statistics (torch-free) ----------------------------------------------------------------------
def summarize(samples: list[float]) -> dict[str, float]:
    """Median and quartiles (a probe's figure is the median; the IQR shows the noise)."""
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


def interleave(variants: Mapping[str, Callable[[], Any]], rounds: int, passes: int = 1,
               before_pass: Callable[[], None] | None = None) -> dict[str, Any]:
    """Call each variant once per pass, ``passes`` passes per round, rotating the order every pass;
    returns one sample per round and variant: the sum of its passes.

    A variant returns a float (samples: ``{name: [floats]}``) or a dict of floats (samples:
    ``{name: {key: [floats]}}``). ``before_pass`` runs before each pass (e.g. to draw the batches
    every variant of that pass trains on). Several short passes per round put the variants of a
    round side by side many times, so a slow drift of the machine's speed (seconds long) hits
    them alike, where one long chunk each would not."""
    names = list(variants)
    samples: dict[str, Any] = {}
    for r in range(rounds):
        totals: dict[str, Any] = {}
        for p in range(passes):
            if before_pass is not None:
                before_pass()
            k = (r * passes + p) % len(names)
            for name in names[k:] + names[:k]:
                totals[name] = _add(totals.get(name), variants[name]())
        for name, value in totals.items():
            if isinstance(value, Mapping):
                bucket = samples.setdefault(name, {})
                for key, v in value.items():
                    bucket.setdefault(key, []).append(float(v))
            else:
                samples.setdefault(name, []).append(float(value))
    return {n: samples[n] for n in names if n in samples}


def _add(total: Any, value: Any) -> Any:
    """``total + value`` for floats, key by key for dicts of floats (``total`` None: ``value``)."""
    if total is None:
        return dict(value) if isinstance(value, Mapping) else float(value)
    if isinstance(value, Mapping):
        return {key: total[key] + float(v) for key, v in value.items()}
    return total + float(value)


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median: the order statistics (k, n-1-k) with the largest k whose
    binomial coverage is still >= `confidence`; the full range when n is too small for that."""
    x = sorted(values)
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    k = 0
    while k + 1 < n - 1 - (k + 1) and _coverage(n, k + 1) >= confidence:
        k += 1
    return x[k], x[n - 1 - k]


def _coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n-1-k)) for n independent draws (0-based order statistics)."""
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return 1.0 - 2.0 * tail


# -- the probe --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeSettings:
    rounds: int = 6
    chunk: int = 5  # steps per policy per round
    confidence: float = 0.95


# -- the chunked in-process trial (the probe's and the benchmarks' one) ---------------------------
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

    def run_chunk(self, n_steps: int, batches: list[dict[str, Any]] | None = None) -> dict[str, float]:
        """Train ``n_steps`` more steps through ``workloads.train.loop.run_training`` (a fresh
        call, so step numbers, and with them the telemetry/logging cadence, restart at 1 and a
        chunk of ``telemetry.every`` steps holds exactly one recorded step), on ``batches`` when
        given (e.g. the same ones for every variant of a pass), else on this trial's next ones.

        Returns seconds per step on two clocks: ``wall`` (the loop's own ``TrainResult.wall_s``)
        and ``cpu`` (this process's CPU time over the call: with torch on one thread this is the
        work done, and it barely moves when other processes compete for the cores, which makes
        it the steadier figure on a shared machine; on an idle machine the two agree)."""
        batches = self.next_batches(n_steps) if batches is None else batches[:n_steps]
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

    def next_batches(self, n: int) -> list[dict[str, Any]]:
        """This trial's next ``n`` batches (its data, batch size and seed, as ``Trial.batches``)."""
        return [next(self._batch_iter()) for _ in range(n)]

    def with_monitoring(self, telemetry_every: int | None, health: Any) -> "InProcessTrial":
        """The same trial (model, policy, telemetry collector, data) trained with other monitoring:
        telemetry every ``telemetry_every`` steps (None: off, as ``precision.telemetry.enabled=false``
        builds it) and ``health`` signals (None: none). Comparing monitoring settings on one model
        keeps out what two copies of a model differ in besides it (where their memory lies)."""
        return dataclasses.replace(self, settings=dataclasses.replace(self.settings, telemetry_every=telemetry_every),
                                   health=health, step_times=[], logger_factory=None)

    def _batch_iter(self) -> Iterator[dict[str, Any]]:
        if self._batches is None:
            from workloads.data import load as data_mod

            rows = self.batch_size * self.settings.grad_accum  # an optimizer step's rows, as Trial.batches
            self._batches = data_mod.batches(self.data, rows, 10**9, self.seed)
        return self._batches



def call_run_training(model: Any, handle: Any, telemetry: Any, batches: list[dict[str, Any]],
                      settings: Any, logger: Any, health: Any = None) -> Any:
    """``run_training`` over a fixed list of batches (its ``make_batches(start_step)`` serves them)."""
    from workloads.train.loop import run_training

    return run_training(model, handle, telemetry, lambda start: batches[start:], settings, logger, health=health)



def probe_trial(policy: str, config: dict[str, Any]) -> InProcessTrial:
    """An in-process trial of `policy` set up by the trial's own spine (`workloads.recipe.setup`:
    model, data, LoRA, policy, backend, calibration), with `run_chunk(n) -> {"wall", "cpu"}`
    seconds per step. No evaluation before training: the probe only times steps."""
    import torch  # noqa: PLC0415

    from workloads import recipe  # noqa: PLC0415 - the training stack, only when a probe runs

    torch.set_num_threads(int(config["train"].get("num_threads") or 1))  # one thread unless asked: CPU time is then the work done
    config = {**config, "eval": {**config["eval"], "before_training": False}}
    trial = recipe.setup(config)
    return InProcessTrial(policy, trial.model, trial.handle, trial.telemetry, trial.settings, trial.train_data,
                          trial.batch_size, trial.seed, trial.device)


def run_probe(configs: Mapping[str, dict[str, Any]], settings: ProbeSettings,
              build: Callable[[str, dict[str, Any]], Any] = probe_trial) -> dict[str, Any]:
    """Time the policies of `configs` (policy -> its composed config) interleaved; per policy: seconds per step (median, IQR) on the wall and CPU
    clocks and the paired ratio to `REFERENCE` (median of per-round ratios, CI). Load average at
    start and end is recorded with the figures."""
    policies = list(configs)
    if REFERENCE not in policies:
        raise ValueError(f"the speed probe compares with {REFERENCE}: add it to the policies")
    load_start = load_average()
    trials = {p: build(p, configs[p]) for p in policies}
    for trial in trials.values():
        trial.run_chunk(1)  # warm-up: first-step allocations and compilation stay out of the rounds
    started = time.perf_counter()
    samples = interleave({p: (lambda t=t: t.run_chunk(settings.chunk)) for p, t in trials.items()}, settings.rounds)
    out: dict[str, Any] = {}
    for policy, clocks in samples.items():
        out[policy] = {}
        for clock, values in clocks.items():
            ratios = ratio_samples(values, samples[REFERENCE][clock])
            low, high = median_ci(ratios, settings.confidence)
            out[policy][clock] = {"step_s": summarize(values), "ratio": summarize(ratios) | {"low": low, "high": high}}
    return {"policies": out, "rounds": settings.rounds, "chunk": settings.chunk, "confidence": settings.confidence,
            "probe_s": time.perf_counter() - started, "loadavg_start": load_start, "loadavg_end": load_average(),
            "cpu_count": os.cpu_count()}
