"""`python -m analysis` — generate a report without the fp8lab CLI (for development and CI).

    python -m analysis --tracking-uri sqlite:///mlflow.db --out report/
    python -m analysis --experiment fp8lab-default --sweep 3f2a... --out report/ --no-log

The user-facing command is `fp8lab report`, which calls the same `generate_report`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from analysis.errors import ReportError
from analysis.options import ReportOptions
from fp8lab_conf.contracts import TAG_SWEEP_ID


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Write report.md, report.html (self-contained), summary.csv and figures/*.png for an fp8lab "
        "sweep, reading MLflow only. With no --sweep/--all: the latest sweep in the store.",
    )
    p.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"),
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)",
    )
    p.add_argument("--experiment", default=None, help="experiment name (default: the latest sweep's)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--sweep", dest="sweep_id", default=None, help=f"sweep id (tag {TAG_SWEEP_ID})")
    scope.add_argument(
        "--all",
        dest="all_runs",
        action="store_true",
        help="every trial run of the experiment, all sweeps pooled (not logged to MLflow)",
    )
    p.add_argument("--out", type=Path, default=Path("report"), help="output folder (default: ./report)")
    p.add_argument(
        "--gpu-hour-price",
        type=float,
        default=ReportOptions.gpu_hour_price,
        help="USD per GPU-hour for the cost section (default: %(default)s)",
    )
    p.add_argument(
        "--utilization",
        type=float,
        default=ReportOptions.utilization,
        help="target utilisation in (0, 1] (default: %(default)s)",
    )
    p.add_argument("--n-gpu", type=int, default=ReportOptions.n_gpu, help="GPUs per job (default: %(default)s)")
    p.add_argument("--baseline", default=ReportOptions.baseline_policy, help="baseline policy (default: %(default)s)")
    p.add_argument("--no-log", action="store_true", help="do not log the report to the sweep's parent run")
    p.add_argument("--no-telemetry", action="store_true", help="skip telemetry Parquet downloads (no heatmaps)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress and timings")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        options = ReportOptions(
            gpu_hour_price=args.gpu_hour_price,
            utilization=args.utilization,
            n_gpu=args.n_gpu,
            baseline_policy=args.baseline,
            log_to_mlflow=not args.no_log,
            fetch_telemetry=not args.no_telemetry,
        )
        from analysis.report import generate_report

        res = generate_report(args.tracking_uri, args.experiment, args.sweep_id, args.all_runs, args.out, options)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"report of {res.n_runs} trial(s) ({res.n_counted} counted, {res.n_mlflow_runs} MLflow runs) "
        f"written in {res.seconds:.1f}s:"
    )
    for path in res.paths:
        print(f"  {path}")
    if res.logged_to_run_id:
        print(f"logged under report/ of run {res.logged_to_run_id}")
    for w in res.warnings:
        print(f"note: {w}")
    if args.verbose:
        print("timings: " + ", ".join(f"{k}={v:.2f}s" for k, v in res.timings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
