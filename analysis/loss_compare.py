"""The held-out loss of each policy against the baseline's, as a relative error with its interval
and an equivalence test: the quality metric that sees damage too small for accuracy to show.

Relative loss error of policy p: (loss_p - loss_bf16) / loss_bf16, in percent. Each trial logged
its per-row held-out losses (`eval/loss_rows.jsonl`: the same rows for every policy and seed), so
the comparison is paired on rows and, when both sides ran the same seeds, on seeds. Each row
enters weighted by its scored tokens, so the mean over rows is exactly the trial's `eval/loss`;
both sides are divided by the baseline's mean loss, which turns their difference into the
relative error in percent. The difference, its interval and the TOST against
`report.loss_margin_pct` come from ONE metric-agnostic function (`PAIRED_DIFFERENCE`: the seeds x items
t-test of `analysis.crossed`, with the seed term on S-1 degrees of freedom), the one accuracy uses.

The baseline's mean in the denominator is treated as known: its own noise changes the ratio by
a second-order amount next to the paired difference (it is a per-mille correction to a
per-cent error).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.options import ReportOptions
from analysis.crossed import seed_item_test
from analysis.paired import Comparison, holm

PAIRED_DIFFERENCE: Callable[..., Comparison] = seed_item_test
"""(x, y, *, paired_seeds, margin, confidence, score_range) -> Comparison on seeds x items
matrices: the one paired difference + CI + TOST function every quality comparison calls."""

LOSS_COLUMNS = ("loss_mean", "loss_rel_pct", "loss_low", "loss_high", "loss_p", "loss_tost_p", "loss_tost_low",
                "loss_tost_high", "loss_rows", "loss_note")


@dataclass(frozen=True)
class LossEvidence:
    """run_id -> per-row token-weighted losses (mean over rows = the run's eval/loss)."""

    by_run: dict[str, pd.Series] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: pd.DataFrame | None) -> LossEvidence:
        """From a frame with run_id, row, loss, tokens (`analysis.load.fetch_loss_rows`)."""
        if rows is None or rows.empty:
            return cls()
        out: dict[str, pd.Series] = {}
        for run, sub in rows.groupby("run_id", sort=False):
            sub = sub.drop_duplicates("row", keep="last").set_index("row").sort_index()
            tokens = sub["tokens"].astype(float)
            ok = tokens > 0
            if ok.any():
                out[str(run)] = (sub["loss"].astype(float) * tokens / tokens[ok].mean())[ok]
        return cls(out)


def loss_comparison(x_runs: list[tuple[str, int]], y_runs: list[tuple[str, int]], ev: LossEvidence,
                    options: ReportOptions) -> Comparison | None:
    """Relative loss error (%) of runs x vs baseline runs y, each given as (run_id, seed);
    None when a run has no per-row losses or the sides share fewer than two rows."""
    if not x_runs or not y_runs or any(r not in ev.by_run for r, _ in [*x_runs, *y_runs]):
        return None
    seeds_x, seeds_y = [s for _, s in x_runs], [s for _, s in y_runs]
    paired = sorted(seeds_x) == sorted(seeds_y) and len(set(seeds_x)) == len(seeds_x)
    if paired:
        by_seed = dict((s, r) for r, s in y_runs)
        y_runs = [(by_seed[s], s) for s in seeds_x]
    series = [ev.by_run[r] for r, _ in [*x_runs, *y_runs]]
    rows = series[0].index
    for s in series[1:]:
        rows = rows.intersection(s.index)
    if len(rows) < 2:
        return None
    x = np.vstack([ev.by_run[r].reindex(rows).to_numpy(float) for r, _ in x_runs])
    y = np.vstack([ev.by_run[r].reindex(rows).to_numpy(float) for r, _ in y_runs])
    base = float(y.mean())
    if not (math.isfinite(base) and base > 0):
        return None
    return PAIRED_DIFFERENCE(x * 100.0 / base, y * 100.0 / base, paired_seeds=paired, margin=options.loss_margin_pct,
                             confidence=options.confidence, score_range=None)  # a loss has no fixed range


def loss_cols(sub: pd.DataFrame, base_sub: pd.DataFrame | None, ev: LossEvidence,
              options: ReportOptions) -> dict[str, Any]:
    """A summary row's loss columns: the group's mean eval/loss and, against the baseline, the
    relative error (%) with its interval and equivalence test."""
    counted = sub[sub["counted"]] if "counted" in sub else sub
    runs = [(str(r), int(s)) for r, s in zip(counted["run_id"], counted["seed"]) if str(r) in ev.by_run]
    means = [float(ev.by_run[r].mean()) for r, _ in runs]
    out: dict[str, Any] = {c: math.nan for c in LOSS_COLUMNS}
    out.update(loss_mean=float(np.mean(means)) if means else math.nan, loss_rows=0, loss_note="")
    if base_sub is None or not runs:
        out["loss_note"] = "" if runs else "no held-out loss logged"
        return out
    base_counted = base_sub[base_sub["counted"]] if "counted" in base_sub else base_sub
    base_runs = [(str(r), int(s)) for r, s in zip(base_counted["run_id"], base_counted["seed"])]
    cmp = loss_comparison(runs, base_runs, ev, options)
    if cmp is None:
        out["loss_note"] = "no paired held-out rows with the baseline"
        return out
    out.update(loss_rel_pct=cmp.delta, loss_low=cmp.low, loss_high=cmp.high, loss_p=cmp.p, loss_tost_p=cmp.tost_p,
               loss_tost_low=cmp.tost_low, loss_tost_high=cmp.tost_high, loss_rows=cmp.items, loss_note=cmp.note)
    return out


def loss_holm(summary: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    """Holm over the report's loss tests (one family for differences, one for equivalence), and
    the flags: `loss_worse`/`loss_better` (significant) and `loss_equivalent` (TOST inside the margin)."""
    if summary.empty or "loss_p" not in summary:
        return summary
    out = summary.copy()
    out["loss_p_holm"] = holm(out["loss_p"].to_numpy(float))
    out["loss_tost_p_holm"] = holm(out["loss_tost_p"].to_numpy(float))
    m, alpha = options.loss_margin_pct, options.alpha
    inside = (out["loss_tost_low"] > -m) & (out["loss_tost_high"] < m)
    out["loss_equivalent"] = [bool(p < alpha and ok) if math.isfinite(p) else None
                              for p, ok in zip(out["loss_tost_p_holm"], inside, strict=True)]
    out["loss_significant"] = [bool(p < alpha) if math.isfinite(p) else None for p in out["loss_p_holm"]]
    return out


def loss_phrase(r: Mapping[str, Any], options: ReportOptions) -> str:
    """The held-out loss part of a verdict line ('' when the group has no loss comparison)."""
    d = r.get("loss_rel_pct")
    if d is None or not math.isfinite(float(d)):
        return ""
    base, m = options.baseline_policy, options.loss_margin_pct
    ci = f"[{float(r['loss_low']):+.2f}, {float(r['loss_high']):+.2f}]%"
    if _true(r.get("loss_significant")):
        word = "higher" if float(d) > 0 else "lower"
        return (f"held-out loss {abs(float(d)):.2f}% {word} than {base}, {options.confidence:.0%} CI {ci} "
                f"(Holm-corrected p={float(r['loss_p_holm']):.3g})")
    if _true(r.get("loss_equivalent")):
        return (f"held-out loss as good as {base} within ±{m:g}%: {float(d):+.2f}%, {1 - 2 * options.alpha:.0%} CI "
                f"[{float(r['loss_tost_low']):+.2f}, {float(r['loss_tost_high']):+.2f}]% (TOST, Holm-corrected "
                f"p={float(r['loss_tost_p_holm']):.3g})")
    return (f"held-out loss not distinguishable from {base}: {float(d):+.2f}%, {options.confidence:.0%} CI {ci}, "
            f"neither a difference nor equivalence within ±{m:g}%")


def overall_phrase(r: Mapping[str, Any], options: ReportOptions) -> str:
    """'as good as bf16' needs both the accuracy and the loss equivalence tests; a one-sided pass
    is said as such ('' when the group has no loss comparison)."""
    d = r.get("loss_rel_pct")
    if d is None or not math.isfinite(float(d)):
        return ""
    acc, loss, base = _true(r.get("equivalent")), _true(r.get("loss_equivalent")), options.baseline_policy
    if acc and loss:
        return f"overall: as good as {base} (accuracy and held-out loss both pass their equivalence tests)"
    if acc:
        return f"overall: accuracy-only pass (the held-out loss is not shown equivalent to {base})"
    if loss:
        return f"overall: loss-only pass (the accuracy is not shown equivalent to {base})"
    return ""


def loss_cells(r: Mapping[str, Any], options: ReportOptions) -> dict[str, str]:
    """The Summary table's loss columns of one row (the baseline shows its own loss only)."""
    is_base = r["policy"] == options.baseline_policy
    mean = r.get("loss_mean")
    d = r.get("loss_rel_pct")
    has = d is not None and math.isfinite(float(d))
    ci = f"{float(d):+.2f} [{float(r['loss_low']):+.2f}, {float(r['loss_high']):+.2f}]" if has else "—"
    p = r.get("loss_tost_p_holm")
    return {
        "held-out loss": f"{float(mean):.4f}" if mean is not None and math.isfinite(float(mean)) else "—",
        f"loss vs {options.baseline_policy}, % [{options.confidence:.0%} CI]": "—" if is_base else ci,
        f"loss TOST ±{options.loss_margin_pct:g}% p (Holm)": "—" if is_base or p is None or not math.isfinite(float(p))
        else f"{float(p):.3g}",
        "overall": "—" if is_base else overall_word(r),
    }


def overall_word(r: Mapping[str, Any]) -> str:
    """Both equivalence tests in a word: as good / accuracy only / loss only / not shown."""
    acc, loss = _true(r.get("equivalent")), _true(r.get("loss_equivalent"))
    if not math.isfinite(float(r.get("loss_rel_pct", math.nan) or math.nan)):
        return "no loss test"
    return {(True, True): "as good", (True, False): "accuracy only", (False, True): "loss only"}.get((acc, loss), "not shown")


def _true(value: object) -> bool:
    """A table cell that is a real True (None, NaN and False are not)."""
    return isinstance(value, (bool, np.bool_)) and bool(value)
