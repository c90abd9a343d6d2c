"""The report's opening line: which configuration to use, on what quality evidence, and what its
speed claim rests on (measured on real FP8, or nothing, when FP8 was emulated).

The rule is the one `fp8lab export --best` applies (orchestrator/best.py), on the report's own
statistics: only a configuration shown *as good as* the baseline (TOST equivalence, or
significantly better) qualifies; on real FP8 the fastest of those whose paired speed ratio to
the baseline exceeds 1 wins; on emulated FP8, whose speed is the emulator's, the most accurate
one wins and no speed-up is claimed. The GPU projection (analysis/projection.py) has not passed
its validation (analysis/projection_check.py), so it is never the evidence.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from analysis import fmt
from analysis.options import ReportOptions
from analysis.summary import OTHER_CONTEXT_NOTE, _quality_phrase, _sig

EMULATED_SPEED = ("nothing measured: FP8 was emulated, so the measured speed is the emulator's, and the GPU projection "
                  "has not passed its validation (README, \"GPU projection\"), so no speed-up is claimed")


def recommendation(summary: pd.DataFrame, options: ReportOptions) -> str:
    base = options.baseline_policy
    rows = [r.to_dict() for _, r in summary.iterrows() if r["policy"] != base]
    good = [r for r in rows if _sig(r.get("equivalent")) or (_sig(r.get("significant")) and float(r["delta_pts"]) > 0)]
    if not any(r["policy"] == base for _, r in summary.iterrows()):
        return f"Recommendation: none — the sweep has no `{base}` arm to compare with."
    if not good:
        return (f"Recommendation: stay with `{base}` — no FP8 configuration was shown as good as `{base}` "
                f"(equivalence within ±{options.equivalence_margin_pts:g} points); speed does not enter.")
    if bool(summary["emulated"].any()):
        pick = max(good, key=lambda r: (float(r["acc_mean"]), str(r["group"])))
        return f"Recommendation: `{pick['group']}` — {_quality_phrase(pick, options)}; speed: {EMULATED_SPEED}."
    return _measured(good, base, options)


def _measured(good: list[dict[str, Any]], base: str, options: ReportOptions) -> str:
    faster = [r for r in good if fmt.ok(r["tps_ratio"]) and float(r["tps_ratio"]) > 1.0]
    if not faster:
        why = ("their speed was timed in another context" if all(r.get("tps_ratio_note") == OTHER_CONTEXT_NOTE for r in good)
               else f"none was measured faster than `{base}`")
        return f"Recommendation: stay with `{base}` — FP8 configurations match its quality but {why}."
    pick = max(faster, key=lambda r: float(r["tps_ratio"]))
    ci = fmt.interval(pick["tps_ratio_low"], pick["tps_ratio_high"])
    source = pick.get("tps_ratio_source") or "sweep-time tokens/s"
    speed = f"measured on real FP8 ({source}), {fmt.num(pick['tps_ratio'], 2)}x `{base}`'s tokens/s" + (f" {ci}" if ci else "")
    return f"Recommendation: `{pick['group']}` — {_quality_phrase(pick, options)}; speed: {speed}."
