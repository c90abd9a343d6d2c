"""What-if telemetry overhead: a trial's step time with ``precision.telemetry.whatif=true`` vs
the shipped config (telemetry every 10 steps, what-if off), paired in one process.

    python benchmarks/whatif_overhead.py                 # fp8_naive and fp8_protected, ~3 min quiet
    python benchmarks/whatif_overhead.py --smoke         # seconds, for CI
    python benchmarks/whatif_overhead.py --rounds 12 --json out.json

Both variants are copies of the default trial (embedded model, LoRA, policy, data, seed) built
by ``_common.build_trial`` as a trial builds them, trained through ``run_training``; they run
interleaved in chunks of ``--chunk`` steps (a chunk of 10 holds exactly one recorded step), the
order rotating each round. The figure is the median over rounds of the per-round ratio
``whatif / default`` -- the what-if's share of a trial at the default cadence (goal <= 3%,
otherwise it stays off by default). Torch uses one thread; the machine's load is recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

NAME = "whatif_overhead"
GOAL_PCT = 3.0


def measure(policy: str, rounds: int, chunk: int) -> dict[str, Any]:
    variants = {
        "default": common.build_trial(policy),
        "whatif": common.build_trial(policy, overrides=["precision.telemetry.whatif=true"]),
    }
    for trial in variants.values():  # warm-up: first-call allocations, lazy imports
        trial.run_chunk(chunk)
    samples = common.interleave({n: (lambda t=t: t.run_chunk(chunk)) for n, t in variants.items()}, rounds)
    figures = common.compare(samples, "default")
    for clock in figures["whatif"].values():
        clock["overhead_pct"] = (clock["ratio"]["median"] - 1.0) * 100.0
    rows = len(variants["whatif"].telemetry.whatif.rows)
    return {"policy": policy, "chunk_steps": chunk, "rounds": rounds, "whatif_rows": rows, "variants": figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few steps, to check the script runs")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--chunk", type=int, default=10, help="steps per variant per round")
    parser.add_argument("--policies", default="fp8_naive,fp8_protected")
    parser.add_argument("--json", help="where to write the figures (default benchmarks/results/)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.chunk, args.policies = 1, 10, "fp8_naive"
    if problem := common.chunk_problem(args.chunk, args.policies.split(",")):
        parser.error(problem)
    common.pin_threads(1)
    load_before = os.getloadavg()
    results = [measure(p, args.rounds, args.chunk) for p in args.policies.split(",")]
    load_after = os.getloadavg()
    rows = []
    for res in results:
        w, c = res["variants"]["whatif"]["wall"], res["variants"]["whatif"]["cpu"]
        base = res["variants"]["default"]["wall"]["step_s"]["median"]
        rows.append([res["policy"], base * 1e3, w["step_s"]["median"] * 1e3, f"{w['overhead_pct']:+.1f}%",
                     f"{w['ratio']['p25']:.3f}..{w['ratio']['p75']:.3f}", f"{c['overhead_pct']:+.1f}%"])
    common.print_table(f"What-if telemetry overhead vs the default telemetry (median of {args.rounds} interleaved "
                       f"rounds of {args.chunk} steps, 1 thread)",
                       ["policy", "default ms/step", "whatif ms/step", "wall overhead", "IQR of ratio",
                        "cpu overhead"], rows)
    summary = {"goal_overhead_pct": GOAL_PCT, "load_before": load_before, "load_after": load_after,
               "whatif_overhead_pct": {r["policy"]: {k: r["variants"]["whatif"][k]["overhead_pct"]
                                                     for k in ("wall", "cpu")} for r in results}}
    path = common.write_json(args.json, NAME, {"smoke": args.smoke, "summary": summary, "results": results,
                                               "command": " ".join(["python", "benchmarks/whatif_overhead.py",
                                                                    *(sys.argv[1:] if argv is None else argv)])})
    line = ", ".join(f"{p}: wall {v['wall']:+.1f}% / cpu {v['cpu']:+.1f}%"
                     for p, v in summary["whatif_overhead_pct"].items())
    print(f"\nwhat-if overhead: {line} (goal <= {GOAL_PCT:.0f}%; load {load_before[0]:.1f} -> {load_after[0]:.1f})"
          f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
