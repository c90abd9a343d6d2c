"""The paired speed probe: a sweep's policies timed back to back in one process, on the same model
and batch shape, interleaved over several rounds; each policy's step-time ratio to the reference
with a confidence interval.

Why paired: a trial's own tokens/s is taken under whatever load the machine had while it ran,
so two trials of a sweep (or a trial reused from another sweep) are not comparable. Here the
policies run in chunks A B C, B C A, C A B ... and each round's ratio A_i / ref_i is taken before
the median, so a burst of load from another process hits both sides of a ratio alike. The CI is
the distribution-free interval of the median of the per-round ratios (binomial order statistics).

The statistics here are the ones the benchmarks use (benchmarks/_common.py imports them): one
implementation. Building a policy's in-process trial is `probe_trial`, kept one small function
so it can follow the trial-building code wherever it lives.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def probe_trial(policy: str, overrides: list[str]) -> Any:
    """An in-process trial of `policy` built as a trial builds it, with `run_chunk(n) -> {"wall",
    "cpu"}` seconds per step. The one place the probe depends on the trial-building code."""
    import torch  # noqa: PLC0415

    threads = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("train.num_threads=")), 1)
    torch.set_num_threads(threads)  # one thread unless asked: CPU time is then the work done, steady under load
    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "_common.py").exists():
        raise RuntimeError("fp8lab bench: needs a source checkout (benchmarks/_common.py builds the in-process trial)")
    sys.path.insert(0, str(root / "benchmarks"))
    import _common  # noqa: PLC0415

    return _common.build_trial(policy, overrides=[o for o in overrides if not o.startswith("precision=")])


def run_probe(policies: list[str], overrides: list[str], settings: ProbeSettings,
              build: Callable[[str, list[str]], Any] = probe_trial) -> dict[str, Any]:
    """Time `policies` interleaved; per policy: seconds per step (median, IQR) on the wall and CPU
    clocks and the paired ratio to `REFERENCE` (median of per-round ratios, CI). Load average at
    start and end is recorded with the figures."""
    if REFERENCE not in policies:
        raise ValueError(f"the speed probe compares with {REFERENCE}: add it to the policies")
    load_start = _load()
    trials = {p: build(p, overrides) for p in policies}
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
            "probe_s": time.perf_counter() - started, "loadavg_start": load_start, "loadavg_end": _load(),
            "cpu_count": os.cpu_count()}


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
