"""Orchestration: time from `fp8lab sweep` start to the first training step, and scheduling
efficiency (makespan vs ideal) for 12 short trials.

    python benchmarks/orchestration.py            # ~2-4 min on 2 cores: one sweep of 12 trials
    python benchmarks/orchestration.py --smoke    # 2 trials, for CI
    python benchmarks/orchestration.py --trials 12 --json out.json

Goals: first training step within 20 s of the command's start; efficiency >= 0.9.

The sweep is the real CLI in a temp folder with its own SQLite store:
``fp8lab sweep sweep.axes.precision=[bf16] sweep.axes.seed=[0..11] train.steps=5 eval.limit=8
train.log_every=1 sweep.report=false`` (Ray local, ``cluster.cpus_per_trial=1``: one trial per
core). Time to first step = earliest timestamp of a ``train/loss`` metric (logged when step 1
ends) minus the moment the command was launched. Efficiency is the CLI's own figure: the sum of
the trial tasks' durations (worker start-up and imports included) / parallel slots / makespan
(from the first submission to the last result). A stricter figure divides only the time inside
``run_trial`` (``trial/wall_s``): the rest of the slots' time is worker start-up and idle.
Both sides of each comparison come from the same sweep.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import _sweeps  # noqa: E402

NAME = "orchestration"
GOAL_FIRST_STEP_S = 20.0
GOAL_EFFICIENCY = 0.9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 trials, to check the script runs")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--json", help="where to write the figures (default benchmarks/results/)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials = 2
    slots = max(1, min(os.cpu_count() or 1, args.trials))
    imports_s = _sweeps.import_time()
    with tempfile.TemporaryDirectory(prefix="fp8lab-bench-orch-") as tmp:
        res = _sweeps.run_sweep(args.trials, Path(tmp) / "sweep", name="bench-orch")
    cli = res.get("cli", {})
    slots = int(cli.get("slots", slots))
    split = _sweeps.where_time_goes(res, slots)
    makespan = cli.get("makespan", float("nan"))
    strict = (split.get("slot_s_in_trials", 0.0) / slots) / makespan if makespan == makespan and makespan else float("nan")
    summary = {
        "first_step_s": res["first_step_s"],
        "efficiency_cli": cli.get("eff"),
        "efficiency_in_run_trial": strict,
        "makespan_s": makespan,
        "ideal_s": cli.get("ideal"),
        "sweep_wall_s": res["wall_s"],
        "slots": slots,
        "worker_import_s": imports_s,
        "all_finished": res["all_finished"],
    }
    rows = [["first training step after launch", f"{res['first_step_s']:.1f} s", f"<= {GOAL_FIRST_STEP_S:.0f} s"],
            ["scheduling efficiency (CLI: task time / slots / makespan)", cli.get("eff"), f">= {GOAL_EFFICIENCY}"],
            ["efficiency counting run_trial() time only", strict, "(info)"],
            ["makespan / ideal", f"{makespan:.1f} / {cli.get('ideal', float('nan')):.1f} s", ""],
            ["sweep wall (command start to exit)", f"{res['wall_s']:.1f} s", ""],
            ["import of the training stack in a fresh process", f"{imports_s:.1f} s", "(paid by every trial)"]]
    rows += [[f"  {k}", f"{v:.1f}", ""] for k, v in split.items()]
    common.print_table(f"Orchestration: {args.trials} short trials on {slots} slot(s)", ["figure", "measured", "goal"], rows)
    path = common.write_json(args.json, NAME, {
        "smoke": args.smoke, "goals": {"first_step_s": GOAL_FIRST_STEP_S, "efficiency": GOAL_EFFICIENCY},
        "summary": summary, "where_time_goes": split, "sweep": res,
        "command": "python benchmarks/orchestration.py"})
    print(f"\nJSON: {path}")
    return 0 if res["all_finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
