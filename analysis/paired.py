"""Accuracy differences that use every source of noise: seeds *and* evaluation items.

Pure numpy/scipy on arrays (no pandas, no MLflow). Two methods, chosen by what the runs logged:

- **seeds x items t** (per-item results available, `analysis.crossed.seed_item_test`): every
  policy answers the same items, so the comparison is paired on items, and on seeds when both
  sides ran the same seeds; seeds and items are crossed. Variance components from the two-way
  ANOVA, Satterthwaite degrees of freedom, so the seed term counts as estimated from S - 1 df.
  Few discordant items get the Agresti–Min ½ pseudo-count (Agresti & Min 2005: ½ added to each
  discordant cell of the paired 2x2 table) as known extra variance: N+ - N- pseudo discordant
  items, N± ~ Poisson(½), each worth the score range over the task's n items.
- **binomial + seeds** (older runs without per-item results): per-seed accuracy and its binomial
  standard error (`eval/accuracy_stderr`): Var = s_x²/n_x + s_y²/n_y (seed noise) + mean(se_x²) +
  mean(se_y²) (item noise, shared by the seeds of one side, so not divided by their number). It
  ignores the positive item correlation between policies, so it is conservative. t quantiles with
  Welch–Satterthwaite df (item terms: df = items - 1). A seed's stderr is at least the Wald error of
  its accuracy with the same ½ pseudo-count added to the correct and wrong cells, so an accuracy of
  0% or 100% (binomial stderr 0) is not taken as noise-free; a side with no noise estimate at all
  gets no test.

This module holds what both share (the result type, the pseudo-count, Holm, the evidence
estimate); both give a difference, its two-sided interval and p-value, a TOST equivalence p-value against a
margin, the (1 - 2α) interval TOST is read from, and the variance components that say how many
seeds or items would make the comparison conclusive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

NAN = float("nan")
PAIRED = "seeds x items t"
BINOMIAL = "binomial + seeds"
POWER = 0.8
"""Power assumed when estimating how many seeds or items a conclusive comparison needs."""
PSEUDO = 0.5
"""Agresti–Min pseudo-count added to each discordant cell (paired) or each binomial cell (fallback)."""


@dataclass(frozen=True)
class VarianceParts:
    """Var(Δ̂)(seeds, items) = seed/seeds + item/items + residual/(seeds·items), in points²."""

    seed: float
    item: float
    residual: float
    seeds: int
    items: int

    def var(self, seeds: float, items: float) -> float:
        return self.seed / seeds + self.item / items + self.residual / (seeds * items)

    def seeds_needed(self, se: float) -> int | None:
        """Seeds (at the current number of items) for a standard error of `se`; None if impossible."""
        room = se * se - self.item / self.items
        need = self.seed + self.residual / self.items
        if not math.isfinite(need) or room <= 0:
            return None
        return max(2, math.ceil(need / room))

    def items_needed(self, se: float) -> int | None:
        """Items (at the current number of seeds) for a standard error of `se`; None if impossible."""
        room = se * se - self.seed / self.seeds
        need = self.item + self.residual / self.seeds
        if not math.isfinite(room) or room <= 0:
            return None
        return max(1, math.ceil(need / room))


@dataclass(frozen=True)
class Comparison:
    """Δ = mean(x) - mean(y) in points, with both tests and the evidence behind them."""

    delta: float
    low: float
    high: float
    p: float
    """Two-sided p-value of H0: Δ = 0 (before any multiple-comparison correction)."""
    tost_p: float
    """TOST p-value of H0: |Δ| >= margin (max of the two one-sided p-values)."""
    tost_low: float
    tost_high: float
    """The (1 - 2α) interval: equivalence at α iff it lies inside (-margin, +margin)."""
    margin: float
    method: str
    n_x: int
    n_y: int
    items: int
    paired_seeds: bool
    parts: VarianceParts | None
    note: str = ""
    discordant: int = -1
    """Items (over all tasks) on which the compared pair disagrees (`discordant_items`); -1: not counted."""
    df: float = NAN
    """Degrees of freedom of the t quantiles (Satterthwaite; inf: normal)."""

    @property
    def se(self) -> float:
        return math.sqrt(self.parts.var(self.parts.seeds, self.parts.items)) if self.parts else NAN

    @property
    def tested(self) -> bool:
        return math.isfinite(self.p)

    def inside_margin(self) -> bool:
        """Whether the TOST interval lies strictly inside the equivalence margin."""
        return bool(math.isfinite(self.tost_low) and -self.margin < self.tost_low and self.tost_high < self.margin)


def _none(note: str, margin: float, method: str, n_x: int = 0, n_y: int = 0) -> Comparison:
    return Comparison(NAN, NAN, NAN, NAN, NAN, NAN, NAN, margin, method, n_x, n_y, 0, False, None, note)


def pseudo_size(x: np.ndarray, y: np.ndarray, score_range: float | None) -> float:
    """Size (points) of one pseudo discordant item of a task: what an unseen disagreement could weigh.

    The score range when it is known (100 for a 0/1 metric in points: a fully discordant item, as in
    Agresti–Min's 2x2 table); otherwise the root mean square of the item-mean differences that are
    not zero (the typical observed disagreement), else the observed range of the scores; 0 when
    every run scored every item alike and nothing says how far apart a score could be.
    """
    if score_range is not None:
        return float(score_range)
    d = x.mean(axis=0) - y.mean(axis=0)
    nonzero = d[d != 0]
    if nonzero.size:
        return float(np.sqrt(np.mean(nonzero**2)))
    return float(np.ptp(np.vstack([x, y])))


def discordant_items(x: np.ndarray, y: np.ndarray, paired_seeds: bool = True) -> int:
    """Items on which the compared pair disagrees: with paired seeds, where some seed's run differs
    from the other side's run of that seed; otherwise, where the two sides' item means differ.

    Only the pair's own disagreements count: an item on which two baseline seeds differ while
    each policy run matches its seed's baseline run is not discordant for this comparison.
    """
    if paired_seeds and x.shape == y.shape:
        return int((x != y).any(axis=0).sum())
    return int((x.mean(axis=0) != y.mean(axis=0)).sum())


def pseudo_var(sizes: Sequence[tuple[float, int]]) -> float:
    """Variance of the mean over the T tasks of m·(N+ - N-)/n, N± ~ Poisson(½): Σ m²/n² / T².

    (range/items)² for one task: negligible next to the observed variance unless few items are
    discordant, and what keeps "0 of 40 items differ" from reading as equivalence.
    """
    return sum(2 * PSEUDO * m * m / (n * n) for m, n in sizes) / len(sizes) ** 2


def binomial_seeds(
    x: Sequence[float] | np.ndarray,
    se_x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    se_y: Sequence[float] | np.ndarray,
    *,
    margin: float,
    confidence: float = 0.95,
    items: int | None = None,
    score_range: float | None = None,
) -> Comparison:
    """Δ of mean accuracies from per-seed values and their binomial standard errors (points).

    Seed noise: s²/n per side (needs n >= 2 on a side, else that side contributes only item
    noise and the note says so). Item noise: mean(se²) per side. Missing stderr: seed noise only.
    With `items` and `score_range` (100 for a 0/1 metric in points) known, a stderr is raised to
    `binomial_floor`, so 0% or 100% accuracy (stderr 0) does not count as noise-free. A side whose
    seeds agree and whose stderr is 0 or unknown has no noise estimate: no test.
    """
    a, b = np.asarray(x, float), np.asarray(y, float)
    ea, eb = np.asarray(se_x, float), np.asarray(se_y, float)
    keep_a, keep_b = np.isfinite(a), np.isfinite(b)
    a, ea, b, eb = a[keep_a], ea[keep_a], b[keep_b], eb[keep_b]
    nx, ny = a.size, b.size
    if nx == 0 or ny == 0:
        return _none("no data", margin, BINOMIAL, nx, ny)
    delta = float(a.mean() - b.mean())
    floor_a, floor_b = binomial_floor(a, items, score_range), binomial_floor(b, items, score_range)
    floored = bool(np.any(floor_a > ea) or np.any(floor_b > eb))  # NaN compares False
    ea = np.where(np.isfinite(ea), np.fmax(ea, floor_a), ea)
    eb = np.where(np.isfinite(eb), np.fmax(eb, floor_b), eb)
    seed_terms = [(float(v.var(ddof=1)) / v.size, v.size - 1) for v in (a, b) if v.size >= 2]
    item_a = float(np.mean(ea**2)) if np.isfinite(ea).all() and ea.size else NAN
    item_b = float(np.mean(eb**2)) if np.isfinite(eb).all() and eb.size else NAN
    item_df = (items - 1) if items and items > 1 else math.inf
    item_terms = [(v, item_df) for v in (item_a, item_b) if math.isfinite(v)]
    notes = []
    if len(seed_terms) < 2:
        notes.append("seed noise not estimable (a side has 1 seed)")
    if len(item_terms) < 2:
        notes.append("item noise unknown (no accuracy_stderr)")
    if floored:
        notes.append("stderr raised to the ½ pseudo-count floor (accuracy at or near 0% or 100%)")
    terms = seed_terms + item_terms
    var = sum(v for v, _ in terms)
    side_noise = [  # a side with none would count as noise-free
        (float(v.var(ddof=1)) / v.size if v.size >= 2 else 0.0) + (e if math.isfinite(e) else 0.0)
        for v, e in ((a, item_a), (b, item_b))
    ]
    if (len(seed_terms) < 2 and len(item_terms) < 2) or var <= 0 or min(side_noise) <= 0:
        if var > 0 and min(side_noise) <= 0:
            notes.append("a side has no noise estimate (its seeds agree and its stderr is 0 or unknown): no test")
        return Comparison(
            delta, NAN, NAN, NAN, NAN, NAN, NAN, margin, BINOMIAL, nx, ny, items or 0, False, None,
            "; ".join(notes) or "zero variance: no test",
        )  # fmt: skip
    denom = sum(v * v / d for v, d in terms if math.isfinite(d))
    df = var * var / denom if denom > 0 else math.inf
    se = math.sqrt(var)
    t = _st.t(df) if math.isfinite(df) else _st.norm()
    h = float(t.ppf(0.5 + confidence / 2)) * se
    h2 = float(t.ppf(confidence)) * se  # one-sided at alpha = the (1 - 2 alpha) two-sided interval
    p = float(2 * t.sf(abs(delta) / se))
    tost = max(float(t.sf((delta + margin) / se)), float(t.cdf((delta - margin) / se)))
    parts = None
    if len(seed_terms) == 2:  # per-seed variances (s²) and per-item variance (se² x items) of both sides
        seed_var = sum(v * (dof + 1) for v, dof in seed_terms)
        item_var = (item_a + item_b) * items if len(item_terms) == 2 and items else 0.0
        parts = VarianceParts(seed_var, item_var, 0.0, min(nx, ny), items or 1)
    return Comparison(
        delta, delta - h, delta + h, p, tost, delta - h2, delta + h2, margin, BINOMIAL, nx, ny,
        items or 0, False, parts, "; ".join(notes), -1, df,
    )  # fmt: skip


def binomial_floor(acc: np.ndarray, items: int | None, score_range: float | None) -> np.ndarray:
    """Smallest stderr (points) each accuracy can claim: Wald with ½ pseudo-count per binomial cell.

    p~ = (k + ½) / (n + 1) with k = the number of items right, stderr = range·sqrt(p~(1 - p~) / (n + 1)).
    Below lm-eval's stderr sqrt(p(1 - p) / (n - 1)) except near 0% or 100%, where that one goes to 0
    (100% on 40 items: 1.7 points instead of 0). NaN when the items or the range are unknown.
    """
    if not items or items < 1 or score_range is None or score_range <= 0:
        return np.full(np.shape(acc), NAN)
    n = float(items)
    p = (np.clip(np.asarray(acc, float) / score_range, 0.0, 1.0) * n + PSEUDO) / (n + 2 * PSEUDO)
    return score_range * np.sqrt(p * (1 - p) / (n + 2 * PSEUDO))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (NaN stays NaN and does not count as a test).

    Sorted ascending, p_(i) is multiplied by (m - i + 1); then running maximum, capped at 1.
    """
    p = np.asarray(pvalues, float)
    out = np.full(p.shape, NAN)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out.tolist()
    order = ok[np.argsort(p[ok], kind="stable")]
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out[order] = adj
    return out.tolist()


def needed(c: Comparison, alpha: float) -> str:
    """How much more evidence would make a non-conclusive comparison conclusive (plain words)."""
    if c.parts is None:
        return "run at least 3 seeds with per-item results to estimate how much evidence is needed"
    z_a, z_b = float(_st.norm.ppf(1 - alpha)), float(_st.norm.ppf(POWER))
    d = abs(c.delta)
    if d < c.margin:
        goal = f"to show equivalence within ±{c.margin:g} points"
        se = (c.margin - d) / (z_a + z_b)
    else:
        goal = f"to show the {d:.1f}-point difference"
        se = d / (float(_st.norm.ppf(1 - alpha / 2)) + z_b)
    if c.parts.seeds < 2 or not math.isfinite(c.parts.seed):
        return f"{goal}: run at least 3 seeds to estimate the seed noise first"
    s, n = c.parts.seeds_needed(se), c.parts.items_needed(se)
    bits = []
    if s is not None:
        bits.append(f"~{s} seeds" + (f" at {c.parts.items} items" if c.parts.item > 0 else ""))
    if n is not None and c.parts.item + c.parts.residual > 0:
        bits.append(f"~{n} items at {c.parts.seeds} seeds")
    if not bits:
        return f"{goal} needs more seeds *and* more items (neither alone suffices)"
    return f"{goal} ({POWER:.0%} power, if the true difference is the observed one) would take " + " or ".join(bits)
