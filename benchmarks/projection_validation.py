"""Does the GPU projection (analysis/projection.py) reproduce the published FP8 speed-ups?

Rebuilds each published setup (analysis/projection_check.py) and prints published vs projected,
with the error against the issue's +-15% gate. No measurement: pure arithmetic, seconds on any
machine. The sensitivity block re-runs the checks with the two fixed efficiencies moved up and
down, to show whether the verdict hangs on their exact values (they are not fitted).

    python benchmarks/projection_validation.py          # table + benchmarks/results/projection_validation.json
"""
from __future__ import annotations

import argparse
import sys
from unittest import mock

from _common import print_table, write_json

from analysis import projection, projection_check


def _rows() -> list[dict]:
    return [{"source": c.source, "setup": c.setup, "device": c.device, "published": c.published,
             "projected": round(c.projected, 3), "error_pct": round(100 * c.error, 1), "ok": c.ok}
            for c in projection_check.checks()]


def sensitivity() -> list[dict]:
    """The checks under other (equally plausible) GEMM and bandwidth efficiencies."""
    out = []
    for eta in (0.6, 0.7, 0.8):
        for beta in (0.7, 0.8, 0.9):
            with mock.patch.object(projection, "GEMM_EFFICIENCY", eta), mock.patch.object(projection, "BANDWIDTH_EFFICIENCY", beta):
                errors = [round(100 * c.error, 1) for c in projection_check.checks()]
            out.append({"gemm_efficiency": eta, "bandwidth_efficiency": beta, "errors_pct": errors,
                        "all_within": all(abs(e) <= 100 * projection_check.TOLERANCE for e in errors)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true", help="same as a full run (it takes a second)")
    args = parser.parse_args(argv)
    rows = _rows()
    print_table("projection vs published FP8 speed-ups (gate: within +-15% each)",
                ["source", "setup", "device", "published", "projected", "error %", "ok"],
                [[r["source"], r["setup"], r["device"], f"{r['published']:.2f}x", f"{r['projected']:.2f}x",
                  f"{r['error_pct']:+.1f}", "yes" if r["ok"] else "NO"] for r in rows])
    sens = sensitivity()
    print_table("sensitivity: error % of each check (same order) under other fixed efficiencies",
                ["GEMM eff.", "HBM eff.", "errors %", "all within"],
                [[s["gemm_efficiency"], s["bandwidth_efficiency"], " ".join(f"{e:+.1f}" for e in s["errors_pct"]),
                  "yes" if s["all_within"] else "no"] for s in sens])
    validated = all(r["ok"] for r in rows)
    print(f"projection validated: {'yes' if validated else 'no'} -> "
          f"{'may be shown' if validated else 'kept out of the report'}")
    write_json(args.json, "projection_validation", {"smoke": args.smoke, "results": rows, "sensitivity": sens,
                                                   "validated": validated,
                                                   "gemm_efficiency": projection.GEMM_EFFICIENCY,
                                                   "bandwidth_efficiency": projection.BANDWIDTH_EFFICIENCY})
    return 0


if __name__ == "__main__":
    sys.exit(main())
