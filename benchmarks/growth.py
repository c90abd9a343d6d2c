"""Growth: how `fp8lab sweep` wall time and MLflow store size grow from 3 to 12 to 48 short
trials, and where the time goes.

    python benchmarks/growth.py                   # 3, 12, 48 trials (48 dominates: minutes on 2 cores)
    python benchmarks/growth.py --sizes 3,12      # a shorter curve
    python benchmarks/growth.py --smoke           # one 1-trial sweep, for CI

Each size is a fresh sweep of short bf16 trials (``train.steps=5 eval.limit=8``, one seed per
trial, report off) in its own temp folder and SQLite store, launched as a user would. Reported
per size: wall time, seconds per trial, store size (SQLite file + artifacts) and bytes per trial,
and the split of the slots' time into worker start-up (process + imports), model load/setup,
training, evaluation, plus the driver's start-up and tail. The growth exponent between two
sizes is log(t2/t1)/log(n2/n1): 1.0 is linear.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import _sweeps  # noqa: E402

NAME = "growth"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one 1-trial sweep, to check the script runs")
    parser.add_argument("--sizes", default="3,12,48")
    parser.add_argument("--json", help="where to write the figures (default benchmarks/results/)")
    args = parser.parse_args(argv)
    sizes = [1] if args.smoke else [int(s) for s in args.sizes.split(",")]
    points = []
    with tempfile.TemporaryDirectory(prefix="fp8lab-bench-growth-") as tmp:
        for n in sizes:
            res = _sweeps.run_sweep(n, Path(tmp) / f"sweep-{n}", name=f"bench-growth-{n}", timeout_s=3600)
            slots = int(res.get("cli", {}).get("slots", min(os.cpu_count() or 1, n)))
            res["where_time_goes"] = _sweeps.where_time_goes(res, slots)
            res["slots"] = slots
            points.append(res)
            print(f"{n} trials: {res['wall_s']:.1f}s, store {res['store_bytes']['total'] / 2**20:.2f} MiB", flush=True)
    rows = []
    for i, p in enumerate(points):
        n, w = p["n_trials"], p["where_time_goes"]
        exp = ""
        if i:
            prev = points[i - 1]
            exp = f"{math.log(p['wall_s'] / prev['wall_s']) / math.log(n / prev['n_trials']):.2f}"
        rows.append([n, p["wall_s"], p["wall_s"] / n, exp, p["store_bytes"]["total"] / 2**20,
                     p["store_bytes"]["total"] / n / 1024, w.get("driver_startup_s", 0), w.get("driver_tail_s", 0),
                     w.get("slot_s_worker_start_and_idle", 0) / n, w.get("slot_s_trial_other", 0) / n,
                     w.get("slot_s_training", 0) / n, w.get("slot_s_eval", 0) / n])
    common.print_table("Sweep growth (short bf16 trials; per-trial columns are slot-seconds per trial)",
                       ["trials", "wall s", "s/trial", "exponent", "store MiB", "KiB/trial", "driver start s",
                        "driver tail s", "worker start", "load+setup", "train", "eval"], rows)
    path = common.write_json(args.json, NAME, {
        "smoke": args.smoke, "summary": [{"trials": p["n_trials"], "wall_s": p["wall_s"],
                                          "store_bytes": p["store_bytes"]["total"],
                                          "where_time_goes": p["where_time_goes"]} for p in points],
        "points": points, "command": "python benchmarks/growth.py"})
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
