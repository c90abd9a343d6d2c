"""Δ of a per-item metric between two policies, with seeds and items crossed: the t-test the report uses.

Every policy is scored on the same items, and (usually) with the same seeds, so the design is
seeds x items crossed. The difference of the grand means has variance

    Var(Δ̂) = σ²_seed / S + σ²_item / n + σ²_res / (S·n)

estimated from the two-way ANOVA mean squares (no replication). The seed term is estimated from
S - 1 degrees of freedom: with 2 seeds, from *one*. A percentile bootstrap over 2 seeds treats that
estimate as exact (and, drawing from 3 possible seed outcomes, even halves it), so at the margin it
called "as good as" in up to 9% of runs instead of 5%. Here the interval is a t-interval with
Satterthwaite's degrees of freedom for the linear combination of mean squares: when the seed term
dominates, df -> S - 1 and the quantile grows accordingly (t(0.95, 1) = 6.3). The calibration at
the margin is `benchmarks/equivalence_calibration.py` (table in docs/statistics.md) and, CI-sized,
`tests/unit/analysis/test_report_crossed.py`.

Metric-agnostic: any per-seed x per-item values (0/1 correctness in points, a per-row loss error)
in the same units on both sides. Few discordant items (items every run scored alike carry no
information about a difference) get the Agresti–Min ½ pseudo-count as known extra item variance
(`paired.pseudo_size`), so "0 of 40 items differ" does not read as proof of equivalence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as _st

from analysis.paired import (
    NAN,
    PAIRED,
    Comparison,
    VarianceParts,
    discordant_items,
    pseudo_size,
    pseudo_var,
)

__all__ = ["seed_item_test"]

Term = tuple[float, float]
"""(variance contribution c·MS to Var(Δ̂), degrees of freedom of MS)."""


def seed_item_test(
    x: np.ndarray | Sequence[np.ndarray],
    y: np.ndarray | Sequence[np.ndarray],
    *,
    paired_seeds: bool,
    margin: float,
    confidence: float = 0.95,
    score_range: float | None = None,
) -> Comparison:
    """mean(x) - mean(y) with a seeds x items t-interval (Satterthwaite df), two-sided test and TOST.

    x, y: seeds x items matrices with the *same* item columns, or lists of them (one per task;
    the aggregate is the mean of the tasks' means). `paired_seeds`: row k of x and of y is the
    same seed. `score_range`: the width of the scores' possible range (100 for 0/1 in points),
    the size of one pseudo discordant item; None: estimated from the data.
    """
    xs = [np.asarray(a, float) for a in (x if isinstance(x, (list, tuple)) else [x])]
    ys = [np.asarray(b, float) for b in (y if isinstance(y, (list, tuple)) else [y])]
    ok = bool(xs) and len(xs) == len(ys) and all(
        a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[1] and a.shape[1] >= 2 and a.size and b.size
        and a.shape[0] == xs[0].shape[0] and b.shape[0] == ys[0].shape[0]
        for a, b in zip(xs, ys, strict=False)
    )  # fmt: skip
    if not ok:
        return _untested("no paired items", margin, len(xs[0]) if xs else 0, len(ys[0]) if ys else 0)
    if paired_seeds and xs[0].shape[0] != ys[0].shape[0]:
        raise ValueError("paired seeds need the same number of seeds on both sides")
    sx, sy = xs[0].shape[0], ys[0].shape[0]
    delta = float(np.mean([a.mean() - b.mean() for a, b in zip(xs, ys, strict=True)]))
    n_items = int(sum(a.shape[1] for a in xs))
    discordant = sum(discordant_items(a, b, paired_seeds) for a, b in zip(xs, ys, strict=True))
    sizes = [(pseudo_size(a, b, score_range), a.shape[1]) for a, b in zip(xs, ys, strict=True)]
    if any(m <= 0 or not math.isfinite(m) for m, _ in sizes):
        note = "every run scored every item alike and the score range is unknown: no test"
        return _untested(note, margin, sx, sy, delta, n_items, paired_seeds, discordant)
    wx, wy = _weighted(xs), _weighted(ys)
    terms, parts, notes = (_paired_terms(wx - wy) if paired_seeds else _unpaired_terms(wx, wy))
    extra = pseudo_var(sizes)
    var = sum(v for v, _ in terms) + extra
    if var <= 0:
        return _untested("zero variance: no test", margin, sx, sy, delta, n_items, paired_seeds, discordant)
    df = satterthwaite([*terms, (extra, math.inf)])
    if extra > var / 2:
        notes.append(f"{discordant} discordant item(s) of {n_items}: the interval is mostly the Agresti–Min pseudo-count")
    se = math.sqrt(var)
    t = _st.t(df) if math.isfinite(df) else _st.norm()
    h = float(t.ppf(0.5 + confidence / 2)) * se
    p = float(min(1.0, 2 * t.sf(abs(delta) / se)))
    # TOST asks "could |Δ| be the margin?": its standard error is at least what Δ = ±margin implies
    cells = float(np.var(wx - wy, ddof=1)) / wx.size if paired_seeds else float(np.var(wx, ddof=1) / wx.size + np.var(wy, ddof=1) / wy.size)
    deff = max(1.0, var / cells) if cells > 0 else 1.0  # clustering of the cells (seeds, items)
    se_eq = math.sqrt(max(var, deff * null_floor(margin, score_range, sx, sy, n_items)))
    h1 = float(t.ppf(confidence)) * se_eq  # one-sided at alpha: the (1 - 2 alpha) interval TOST reads
    tost = max(float(t.sf((delta + margin) / se_eq)), float(t.cdf((delta - margin) / se_eq)))
    parts = VarianceParts(parts.seed, parts.item + extra * n_items, parts.residual, parts.seeds, parts.items)
    return Comparison(
        delta, delta - h, delta + h, p, tost, delta - h1, delta + h1, margin, PAIRED, sx, sy, n_items,
        paired_seeds, parts, "; ".join(notes), discordant, df,
    )  # fmt: skip


def null_floor(margin: float, score_range: float | None, sx: int, sy: int, items: int) -> float:
    """Smallest Var(Δ̂) a 0/1 metric allows when the true |Δ| is the margin (0 for other metrics).

    A difference of m points between 0/1 scores (range r) needs at least a share m/r of
    discordant (seed, item) cells, each worth ±r: per cell Var >= m(r - m), so
    Var(Δ̂) >= m(r - m) / (S·n). The observed variance can be far lower exactly when few cells
    happened to disagree, and then Δ̂ is also nearer 0 — the Wald-interval problem of a rare
    proportion, which put false equivalence at up to 10% in the calibration without this floor
    (the null-restricted variance of a score test, as in Tango's test for paired proportions).
    The caller scales it by the observed design effect (clustering of the cells).
    """
    if score_range is None or not 0 < margin < score_range:
        return 0.0
    return margin * (score_range - margin) / (max(sx, sy) * items)


def satterthwaite(terms: Sequence[Term]) -> float:
    """Degrees of freedom of Σ c_k·MS_k: (Σ c_k MS_k)² / Σ (c_k MS_k)² / df_k (inf when all df are)."""
    total = sum(v for v, _ in terms)
    denom = sum(v * v / d for v, d in terms if math.isfinite(d) and d > 0)
    return total * total / denom if denom > 0 else math.inf


def _weighted(blocks: list[np.ndarray]) -> np.ndarray:
    """Tasks side by side, each column weighted so that the plain mean is the mean of task means."""
    total, k = sum(b.shape[1] for b in blocks), len(blocks)
    return np.hstack([b * (total / (k * b.shape[1])) for b in blocks])


def _mean_squares(d: np.ndarray) -> tuple[float, float, float]:
    """(MS_seed, MS_item, MS_residual) of a seeds x items two-way layout without replication."""
    s, n = d.shape
    grand, row, col = d.mean(), d.mean(axis=1), d.mean(axis=0)
    ms_seed = n * float(((row - grand) ** 2).sum()) / (s - 1) if s > 1 else NAN
    ms_item = s * float(((col - grand) ** 2).sum()) / (n - 1)
    res = d - row[:, None] - col[None, :] + grand
    ms_res = float((res**2).sum()) / ((s - 1) * (n - 1)) if s > 1 else NAN
    return ms_seed, ms_item, ms_res


def _paired_terms(d: np.ndarray) -> tuple[list[Term], VarianceParts, list[str]]:
    """Var(mean d) = [MS_s + max(MS_i - MS_r, 0)] / (S·n), as c·MS terms.

    MS_s / n is the variance of the seed means (seed + residual / n), so the seed term is never
    dropped, even when its S - 1 = 1 df estimate falls below MS_r (often, with one df): it is the
    only seed information there is. The item term is truncated at zero.
    """
    s, n = d.shape
    ms_seed, ms_item, ms_res = _mean_squares(d)
    if s < 2:  # item + residual are not separable, the seed noise is unknown
        parts = VarianceParts(NAN, 0.0, ms_item, 1, n)
        return [(ms_item / n, n - 1)], parts, ["1 seed: the seed noise is not estimated"]
    keep_item = ms_item > ms_res
    sn = s * n
    terms = [
        (ms_seed / sn, s - 1),
        (keep_item * ms_item / sn, n - 1),
        (-keep_item * ms_res / sn, (s - 1) * (n - 1)),
    ]
    parts = VarianceParts(
        max(0.0, (ms_seed - ms_res) / n), max(0.0, (ms_item - ms_res) / s), ms_res, s, n
    )
    return terms, parts, []


def _unpaired_terms(x: np.ndarray, y: np.ndarray) -> tuple[list[Term], VarianceParts, list[str]]:
    """Different seeds on the two sides, shared items: each side's seed term, one item term of the
    item-mean differences, minus the residuals both of those count twice."""
    n = x.shape[1]
    terms: list[Term] = []
    notes: list[str] = []
    seed_sum, res_sum, res_over_s = 0.0, 0.0, 0.0
    for side in (x, y):
        s = side.shape[0]
        if s < 2:
            notes.append("a side has 1 seed: its seed noise is not estimated")
            continue
        _, _, ms_res = _mean_squares(side)
        rows = float(side.mean(axis=1).var(ddof=1))  # σ²_seed + σ²_res / n
        keep = rows > ms_res / n
        terms.append((keep * rows / s, s - 1))
        terms.append((-keep * ms_res / (n * s), (s - 1) * (n - 1)))
        seed_sum += max(0.0, rows - ms_res / n)
        res_sum += ms_res
        res_over_s += ms_res / s
    d_items = x.mean(axis=0) - y.mean(axis=0)
    v_items = float(d_items.var(ddof=1))  # σ²_item + Σ σ²_res / S
    terms.append((v_items / n, n - 1))  # item term + each side's residual / (S·n), once
    parts = VarianceParts(seed_sum, max(0.0, v_items - res_over_s), res_sum, min(x.shape[0], y.shape[0]), n)
    return terms, parts, notes


def _untested(
    note: str, margin: float, n_x: int, n_y: int, delta: float = NAN, items: int = 0,
    paired: bool = False, discordant: int = -1,
) -> Comparison:  # fmt: skip
    return Comparison(
        delta, NAN, NAN, NAN, NAN, NAN, NAN, margin, PAIRED, n_x, n_y, items, paired, None, note, discordant
    )
