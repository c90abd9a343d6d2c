"""How often does the report call a policy "as good as" bf16 when it is exactly at the margin?

    python benchmarks/equivalence_calibration.py                  # full grid, 4000 runs a cell
    python benchmarks/equivalence_calibration.py --runs 500       # quicker, larger Monte Carlo error
    python benchmarks/equivalence_calibration.py --json out.json  # also write the table as JSON

Simulates the comparison the report makes and runs the report's own test on it
(`analysis.crossed.seed_item_test`, with the report's defaults: margin 2 points, 95%, Holm not
applied since one comparison is one family member). Each run draws a fresh item set (items are
part of the noise), seeds on both sides paired, and a true Δ of exactly -margin (half the runs)
or +margin (the other half), so any "as good as" is a false one; nominal rate: 5%.

Model, in points: item i has a bf16 success probability p_i ~ U(0.80, 0.88) (no clipping for
shifts up to 12 points, so the true Δ is exact); seed s of a policy adds a seed effect
a_s ~ N(0, seed_sd); the policy adds Δ. Run (seed, item) succeeds when u_si < p_i + shift, with
one uniform u_si shared by both policies of a seed (same seed, same data order: the two runs
agree on most items, as real runs do -- the discordant share is about |shift_x - shift_y|),
and u_si = u_i shared by every seed for half of the (seed, item) cells (an item effect: items
that fail or pass whatever the seed). Both give the crossed seeds x items structure the test
models, with few discordant items, like the embedded task (7 of 400 at Δ ≈ 0).
Grid: S in {2, 3, 5} seeds x seed SD in {0, 0.5, 1, 2} points x 400 items.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analysis.crossed import seed_item_test  # noqa: E402

SEEDS = (2, 3, 5)
SEED_SDS = (0.0, 0.5, 1.0, 2.0)
ITEMS = 400
MARGIN = 2.0
ALPHA = 0.05
ITEM_SHARE = 0.5
"""Share of (seed, item) cells whose uniform is the item's own (the same for every seed)."""


def simulate_pair(rng: np.random.Generator, seeds: int, seed_sd: float, delta: float, items: int) -> tuple[np.ndarray, np.ndarray]:
    """(policy, bf16) seeds x items 0/100 scores with a true difference of `delta` points."""
    p = rng.uniform(0.80, 0.88, items)
    shift_x = (delta + rng.normal(0.0, seed_sd, seeds)) / 100.0
    shift_y = rng.normal(0.0, seed_sd, seeds) / 100.0
    shared = rng.random((seeds, items)) < ITEM_SHARE
    u = np.where(shared, rng.random(items)[None, :], rng.random((seeds, items)))
    x = u < p[None, :] + shift_x[:, None]
    y = u < p[None, :] + shift_y[:, None]
    return x * 100.0, y * 100.0


def false_equivalence_rate(
    seeds: int, seed_sd: float, runs: int, seed: int = 0, items: int = ITEMS, true_delta: float = MARGIN
) -> float:
    """Share of `runs` at |true Δ| = `true_delta` (the margin: a false claim) called equivalent."""
    rng = np.random.default_rng([seed, seeds, int(seed_sd * 1000), int(true_delta * 1000)])
    hits = 0
    for k in range(runs):
        delta = -true_delta if k % 2 == 0 else true_delta
        x, y = simulate_pair(rng, seeds, seed_sd, delta, items)
        c = seed_item_test(x, y, paired_seeds=True, margin=MARGIN, confidence=1 - ALPHA, score_range=100.0)
        hits += bool(c.tost_p < ALPHA and c.inside_margin())
    return hits / runs


def mc_error(rate: float, runs: int) -> float:
    """Monte Carlo standard error of a rate, at the nominal 5% (the value the bound is about)."""
    p = max(rate, ALPHA)
    return math.sqrt(p * (1 - p) / runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0, cpu0 = time.time(), os.times()
    rows = []
    print(f"false 'as good as' at |Δ| = {MARGIN} (nominal {ALPHA:.0%}), {ITEMS} items, {args.runs} runs a cell")
    print("cells: false 'as good as' at |Δ| = margin (power: 'as good as' at Δ = 0, in brackets)")
    print("| seeds | seed SD 0 | seed SD 0.5 | seed SD 1 | seed SD 2 |\n|---|---|---|---|---|")
    for s in SEEDS:
        cells = []
        for sd in SEED_SDS:
            rate = false_equivalence_rate(s, sd, args.runs)
            power = false_equivalence_rate(s, sd, args.runs, true_delta=0.0)
            rows.append({"seeds": s, "seed_sd": sd, "rate": rate, "mc_se": mc_error(rate, args.runs),
                         "power_at_0": power, "runs": args.runs})  # fmt: skip
            cells.append(f"{rate:.1%} ({power:.0%})")
        print(f"| {s} | " + " | ".join(cells) + " |", flush=True)
    cpu = os.times()
    worst = max(r["rate"] for r in rows)
    print(f"worst cell {worst:.1%}; Monte Carlo SE at 5%: {mc_error(0.0, args.runs):.2%}; "
          f"{time.time() - t0:.0f} s wall, {cpu.user - cpu0.user + cpu.system - cpu0.system:.0f} s CPU")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"items": ITEMS, "margin": MARGIN, "alpha": ALPHA, "cells": rows}, indent=1))


if __name__ == "__main__":
    main()
