"""Which evidence a comparison of two groups of trials uses, and Holm across a report's comparisons.

`compare` picks the method from what the runs logged (see `analysis.paired`): the seeds x items t-test
when every counted run of both groups has per-item results of the compared task on common items,
otherwise the binomial standard error of each seed plus the seed variance. The chosen method is in
the result and in the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.options import ReportOptions
from analysis.crossed import seed_item_test
from analysis.paired import Comparison, binomial_seeds, holm

_EMPTY_SAMPLES = pd.DataFrame(columns=["run_id", "task", "doc_id", "metric", "value"])


@dataclass(frozen=True)
class Evidence:
    """What comparisons may use beyond the tidy trials: per-item results (may be empty)."""

    samples: pd.DataFrame = field(default_factory=lambda: _EMPTY_SAMPLES)
    by_run: dict[str, dict[str, pd.Series]] = field(default_factory=dict)
    """run_id -> task -> per-item values indexed by doc_id (built from `samples`)."""
    done: dict[tuple, Comparison] = field(default_factory=dict)
    """Paired comparisons already computed (the aggregate is often one task's column too)."""

    @classmethod
    def of(cls, samples: pd.DataFrame | None) -> Evidence:
        if samples is None or samples.empty:
            return cls()
        by_run: dict[str, dict[str, pd.Series]] = {}
        for (run, task), sub in samples.groupby(["run_id", "task"], sort=False):
            by_run.setdefault(str(run), {})[str(task)] = (
                sub.drop_duplicates("doc_id", keep="last").set_index("doc_id")["value"].astype(float)
            )
        return cls(samples, by_run)

    def metric_of(self, task: str) -> str:
        """The primary metric name the samples of `task` carry ('' when none)."""
        if self.samples.empty:
            return ""
        names = self.samples.loc[self.samples["task"] == task, "metric"]
        return str(names.iloc[0]) if len(names) else ""


def _counted(sub: pd.DataFrame, col: str) -> pd.DataFrame:
    sel = sub[sub["counted"]]
    return sel[np.isfinite(sel[col].to_numpy(dtype=float))]


FRACTION_RANGE = 100.0
"""The possible range, in points, of a metric logged as a fraction (accuracy, exact match)."""


def _is_fraction(values: np.ndarray) -> bool:
    finite = values[np.isfinite(values)]
    return bool(finite.size and finite.min() >= 0 and finite.max() <= 1)


def _points(values: np.ndarray) -> np.ndarray:
    """Fractions (0..1) become points (0..100); anything else (perplexity) is left as it is."""
    return values * FRACTION_RANGE if _is_fraction(values) else values


def _range_of(*values: np.ndarray) -> float | None:
    """The scores' possible range in points when every array is a fraction, else None (unknown)."""
    return FRACTION_RANGE if all(_is_fraction(v) for v in values) else None


def _run_mean(tasks: Mapping[str, pd.Series], names: Sequence[str]) -> float:
    """A run's aggregate from its per-item results: the mean over `names` of each task's item mean."""
    return float(np.mean([_points(tasks[t].to_numpy(float)).mean() for t in names]))


def aggregate_tasks(runs: pd.DataFrame, ev: Evidence, value_col: str) -> list[str] | None:
    """The tasks whose per-item results make up the aggregate `value_col` of every run, else None.

    The aggregate the user chose (`eval/accuracy`) is one task's primary metric, or the mean of the
    tasks' primary metrics; whichever reproduces every run's value (to 0.05 points) is used.
    """
    per_run = [ev.by_run.get(str(rid), {}) for rid in runs["run_id"]]
    values = _points(runs[value_col].to_numpy(float))
    if not per_run or not all(per_run):
        return None
    names = sorted(set.intersection(*(set(t) for t in per_run)))
    fraction = [t for t in names if all(float(r[t].min()) >= 0 and float(r[t].max()) <= 1 for r in per_run)]
    for candidate in [[t] for t in names] + ([fraction] if len(fraction) > 1 else []):
        if all(abs(_run_mean(r, candidate) - v) <= 0.05 for r, v in zip(per_run, values, strict=True)):
            return candidate
    return None


def _block(x: pd.DataFrame, y: pd.DataFrame, ev: Evidence, task: str) -> tuple[np.ndarray, np.ndarray] | None:
    """seeds x common items matrices of one task for both sides (y's rows in x's seed order when paired)."""
    rx = [ev.by_run[str(r)][task] for r in x["run_id"]]
    ry = [ev.by_run[str(r)][task] for r in y["run_id"]]
    items = rx[0].index
    for r in [*rx[1:], *ry]:
        items = items.intersection(r.index)
    if len(items) < 2:
        return None
    return _matrix(rx, items), _matrix(ry, items)


def _matrix(rows: Sequence[pd.Series], items: pd.Index) -> np.ndarray:
    return _points(np.vstack([r.reindex(items).to_numpy(float) for r in rows]))


def _try_paired(
    x: pd.DataFrame, y: pd.DataFrame, ev: Evidence, task: str | None, value_col: str, options: ReportOptions, label: str
) -> Comparison | None:
    both = pd.concat([x, y])
    tasks = [task] if task else aggregate_tasks(both, ev, value_col)
    if not tasks or not all(t in ev.by_run.get(str(r), {}) for r in both["run_id"] for t in tasks):
        return None
    if task and not all(  # per-item results must be the numbers the report shows
        abs(_run_mean(ev.by_run[str(r)], tasks) - v) <= 0.05
        for r, v in zip(both["run_id"], _points(both[value_col].to_numpy(float)), strict=True)
    ):
        return None
    seeds_x, seeds_y = x["seed"].tolist(), y["seed"].tolist()
    paired = sorted(seeds_x) == sorted(seeds_y) and len(set(seeds_x)) == len(seeds_x)
    if paired:
        y = y.set_index("seed", drop=False).loc[seeds_x]
    key = (tuple(x["run_id"]), tuple(y["run_id"]), tuple(tasks))
    if key not in ev.done:  # same runs, same items: the same comparison (aggregate = one task's column)
        blocks = [_block(x, y, ev, t) for t in tasks]
        if any(b is None for b in blocks):
            return None
        raw = [ev.by_run[str(r)][t].to_numpy(float) for r in both["run_id"] for t in tasks]
        ev.done[key] = seed_item_test(
            [b[0] for b in blocks],  # type: ignore[index]
            [b[1] for b in blocks],  # type: ignore[index]
            paired_seeds=paired,
            margin=options.equivalence_margin_pts,
            confidence=options.confidence,
            score_range=_range_of(*raw),
        )
    return ev.done[key]


def compare(
    x_sub: pd.DataFrame,
    y_sub: pd.DataFrame,
    ev: Evidence,
    options: ReportOptions,
    label: str,
    task: str | None = None,
    value_col: str = "accuracy",
    stderr_col: str = "accuracy_stderr",
) -> Comparison:
    """mean(x) - mean(y) of `value_col` over counted trials, in points, with the best method available.

    `task`: compare that task's per-item results (per-task columns); None: the task(s) whose items
    make up the aggregate `eval/accuracy` (see `aggregate_tasks`).
    """
    x, y = _counted(x_sub, value_col), _counted(y_sub, value_col)
    if len(x) and len(y) and ev.by_run:
        c = _try_paired(x, y, ev, task, value_col, options, label)
        if c is not None:
            return c
    items = _n_items(x, y)
    vx, vy = x[value_col].to_numpy(float), y[value_col].to_numpy(float)
    return binomial_seeds(
        _points(vx),
        _points_like(x, value_col, stderr_col),
        _points(vy),
        _points_like(y, value_col, stderr_col),
        margin=options.equivalence_margin_pts,
        confidence=options.confidence,
        items=items,
        score_range=_range_of(vx, vy),
    )


def _points_like(runs: pd.DataFrame, value_col: str, stderr_col: str) -> np.ndarray:
    """Standard errors scaled like their values (fractions -> points)."""
    if stderr_col not in runs:
        return np.full(len(runs), math.nan)
    vals = runs[value_col].to_numpy(float)
    se = runs[stderr_col].to_numpy(float)
    return se * FRACTION_RANGE if _is_fraction(vals) else se


def _n_items(x: pd.DataFrame, y: pd.DataFrame) -> int | None:
    if "eval_n" not in x:
        return None
    n = pd.concat([x["eval_n"], y["eval_n"]]).to_numpy(float)
    n = n[np.isfinite(n)]
    return int(n.min()) if n.size else None


def holm_columns(frame: pd.DataFrame, alpha: float, margin_ok: pd.Series | None = None) -> pd.DataFrame:
    """Add `p_holm` (and `tost_p_holm`, `equivalent` when the frame has `tost_p`) and `significant`.

    One Holm family per column: every tested comparison in `frame` (one report's table).
    """
    if frame.empty:
        return frame
    out = frame.copy()
    out["p_holm"] = holm(out["p"].to_numpy(float))
    out["holm_m"] = int(np.isfinite(out["p"].to_numpy(float)).sum())
    out["significant"] = [bool(p < alpha) if math.isfinite(p) else None for p in out["p_holm"]]
    if "tost_p" in out:
        out["tost_p_holm"] = holm(out["tost_p"].to_numpy(float))
        inside = margin_ok if margin_ok is not None else pd.Series(True, index=out.index)
        out["equivalent"] = [
            bool(p < alpha and ok) if math.isfinite(p) else None
            for p, ok in zip(out["tost_p_holm"], inside, strict=True)
        ]
    return out
