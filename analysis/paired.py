"""Accuracy differences that use every source of noise: seeds *and* evaluation items.

Pure numpy/scipy on arrays (no pandas, no MLflow). Two methods, chosen by what the runs logged:

- **paired bootstrap** (per-item results available): every policy answers the same items, so the
  comparison is paired on items, and on seeds when both sides ran the same seeds. The items are
  *shared* by all seeds (one eval set), so the design is crossed, not nested: a replicate draws
  seeds with replacement and one item resample that every drawn seed uses. This keeps the item
  noise that no number of seeds averages away (resampling items independently per seed would
  shrink it by 1/seeds and overstate the evidence). Percentile interval; p-values by inverting
  the percentile interval, (count + 1) / (reps + 1). Few discordant items (items on which the runs
  do not all score alike) make the percentile bootstrap anti-conservative — with none at all its
  distribution is a point mass and would "prove" any equivalence — so every replicate also adds
  the Agresti–Min pseudo-count: N+ - N- pseudo discordant items (N± ~ Poisson(½), the bootstrap
  draws of the ½ pseudo-count that Agresti & Min (2005) add to each discordant cell of the paired
  2x2 table), each worth the score range over the task's n items. It changes nothing when many
  items are discordant and keeps "0 of 40 items differ" from reading as equivalence.
- **binomial + seeds** (older runs without per-item results): per-seed accuracy and its binomial
  standard error (`eval/accuracy_stderr`): Var = s_x²/n_x + s_y²/n_y (seed noise) + mean(se_x²) +
  mean(se_y²) (item noise, shared by the seeds of one side, so not divided by their number). It
  ignores the positive item correlation between policies, so it is conservative. t quantiles with
  Welch–Satterthwaite df (item terms: df = items - 1). A seed's stderr is at least the Wald error of
  its accuracy with the same ½ pseudo-count added to the correct and wrong cells, so an accuracy of
  0% or 100% (binomial stderr 0) is not taken as noise-free; a side with no noise estimate at all
  gets no test.

Both give a difference, its two-sided interval and p-value, a TOST equivalence p-value against a
margin, the (1 - 2α) interval TOST is read from, and the variance components that say how many
seeds or items would make the comparison conclusive.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

NAN = float("nan")
PAIRED = "paired bootstrap"
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
    """Items (over all tasks) on which not every run of both sides scored alike; -1: not counted."""

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


def stable_seed(*parts: object) -> int:
    """A seed from labels, so a comparison's bootstrap does not depend on the order of the report."""
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16)


def _item_counts(rng: np.random.Generator, reps: int, n: int) -> np.ndarray:
    """reps x n matrix: how often each item is drawn in each replicate (resampling with replacement)."""
    draws = rng.integers(0, n, size=(reps, n)) + (np.arange(reps) * n)[:, None]
    return np.bincount(draws.ravel(), minlength=reps * n).reshape(reps, n).astype(float)


def _seed_counts(rng: np.random.Generator, reps: int, s: int) -> np.ndarray:
    if s == 1:
        return np.ones((reps, 1))
    return rng.multinomial(s, np.full(s, 1.0 / s), size=reps).astype(float)


def _columns(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(x, y, counts, items): identical item columns merged when that makes them much fewer.

    Items whose columns (every seed's score on both sides) are identical are interchangeable, so
    drawing counts of the distinct columns (a multinomial) is the same resampling, and far cheaper
    for 0/1 scores (a few dozen distinct columns instead of hundreds of items).
    """
    n = x.shape[1]
    cols, counts = np.unique(np.vstack([x, y]).T, axis=0, return_counts=True)
    if cols.shape[0] < n // 2:
        return cols[:, : x.shape[0]].T, cols[:, x.shape[0] :].T, counts / n, n
    return x, y, None, n


def _bootstrap(blocks: Sequence[tuple[np.ndarray, np.ndarray]], paired: bool, reps: int, seed: int) -> np.ndarray:
    """Replicates of the mean over blocks (tasks) of mean(x) - mean(y).

    Each block is a seeds x items pair sharing its item columns. A replicate draws the seeds once
    (the same seeds for every task: a seed is one trained model) and the items of each task.
    """
    rng = np.random.default_rng(seed)
    prepared = [_columns(x, y) for x, y in blocks]
    sx, sy = blocks[0][0].shape[0], blocks[0][1].shape[0]
    chunk = 10_000 if all(p[2] is not None for p in prepared) else 2000  # memory: chunk x columns
    out = np.empty(reps)
    for start in range(0, reps, chunk):
        k = min(chunk, reps - start)
        vx = _seed_counts(rng, k, sx) / sx
        vy = vx if paired else _seed_counts(rng, k, sy) / sy
        total = np.zeros(k)
        for x, y, probs, n in prepared:
            w = (rng.multinomial(n, probs, size=k) if probs is not None else _item_counts(rng, k, n)) / n
            total += (vx * (w @ x.T)).sum(axis=1) - (vy * (w @ y.T)).sum(axis=1)  # each seed's item mean
        out[start : start + k] = total / len(prepared)
    return out


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


def discordant_items(x: np.ndarray, y: np.ndarray) -> int:
    """Items on which not every run of both sides scored alike (the only ones that carry a difference)."""
    return int((np.ptp(np.vstack([x, y]), axis=0) > 0).sum())


def _pseudo(sizes: Sequence[tuple[float, int]], reps: int, seed: int) -> np.ndarray:
    """Per replicate, the mean over tasks of m·(N+ - N-)/n with N± ~ Poisson(½) (Agresti–Min pseudo-count).

    Drawn from a stream of its own, so the resampling replicates are the same with and without it.
    Its variance (`_pseudo_var`) is the sum over the T tasks of m²/n², divided by T²: (range/items)²
    for one task, negligible next to the resampling variance unless few items are discordant.
    """
    rng = np.random.default_rng([seed, 1])
    out = np.zeros(reps)
    for m, n in sizes:
        out += m * (rng.poisson(PSEUDO, reps) - rng.poisson(PSEUDO, reps)) / n
    return out / len(sizes)


def _pseudo_var(sizes: Sequence[tuple[float, int]]) -> float:
    return sum(2 * PSEUDO * m * m / (n * n) for m, n in sizes) / len(sizes) ** 2


def _tail(boot: np.ndarray, below: float | None = None, above: float | None = None) -> float:
    """(count + 1) / (reps + 1) of replicates <= below (or >= above): a valid bootstrap p-value."""
    count = int((boot <= below).sum()) if below is not None else int((boot >= above).sum())
    return (count + 1) / (boot.size + 1)


def crossed_parts(x: np.ndarray, y: np.ndarray, paired: bool) -> VarianceParts:
    """Variance components of Δ̂ from two-way (seed x item) ANOVA without replication.

    Paired seeds: on d = x - y. Unpaired: seed and residual terms of each side add; the item term
    is estimated on the item means of the difference (shared items).
    """
    if paired:
        return _anova(x - y)
    px, py = _anova(x), _anova(y)
    d_items = x.mean(axis=0) - y.mean(axis=0)
    # Var over items of the difference of seed means = item + residual_x/seeds_x + residual_y/seeds_y
    item = float(d_items.var(ddof=1)) - px.residual / x.shape[0] - py.residual / y.shape[0] if d_items.size > 1 else NAN
    return VarianceParts(
        px.seed + py.seed, max(0.0, item), px.residual + py.residual, min(x.shape[0], y.shape[0]), x.shape[1]
    )


def _anova(d: np.ndarray) -> VarianceParts:
    s, n = d.shape
    grand = d.mean()
    row = d.mean(axis=1)
    col = d.mean(axis=0)
    if s < 2:
        item_total = float(d[0].var(ddof=1)) if n > 1 else NAN  # item + residual, not separable
        return VarianceParts(NAN, 0.0, item_total, 1, n)
    ms_seed = n * float(((row - grand) ** 2).sum()) / (s - 1)
    if n < 2:
        return VarianceParts(ms_seed, 0.0, 0.0, s, 1)
    ms_item = s * float(((col - grand) ** 2).sum()) / (n - 1)
    res = d - row[:, None] - col[None, :] + grand
    ms_res = float((res**2).sum()) / ((s - 1) * (n - 1))
    return VarianceParts(max(0.0, (ms_seed - ms_res) / n), max(0.0, (ms_item - ms_res) / s), ms_res, s, n)


def paired_bootstrap(
    x: np.ndarray | Sequence[np.ndarray],
    y: np.ndarray | Sequence[np.ndarray],
    *,
    paired_seeds: bool,
    margin: float,
    confidence: float = 0.95,
    reps: int = 10_000,
    seed: int = 0,
    score_range: float | None = None,
) -> Comparison:
    """Crossed bootstrap of mean(x) - mean(y), in the units of x and y (points).

    x, y: seeds x items matrices of per-item scores with the *same* item columns — or lists of
    them, one per task, for an aggregate that is the mean of the tasks' scores; with
    `paired_seeds`, row k of x and row k of y are the same seed. `score_range`: the width of the
    scores' possible range (100 for a 0/1 metric in points), the size of a pseudo discordant item;
    None: estimated from the data (`pseudo_size`).
    """
    xs = [np.asarray(a, float) for a in (x if isinstance(x, (list, tuple)) else [x])]
    ys = [np.asarray(b, float) for b in (y if isinstance(y, (list, tuple)) else [y])]
    ok = len(xs) == len(ys) and all(
        a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[1] and a.shape[1] and a.size and b.size
        and a.shape[0] == xs[0].shape[0] and b.shape[0] == ys[0].shape[0]
        for a, b in zip(xs, ys, strict=False)
    )  # fmt: skip
    if not ok or not xs:
        return _none("no paired items", margin, PAIRED, len(xs[0]) if xs else 0, len(ys[0]) if ys else 0)
    if paired_seeds and xs[0].shape[0] != ys[0].shape[0]:
        raise ValueError("paired seeds need the same number of seeds on both sides")
    delta = float(np.mean([a.mean() - b.mean() for a, b in zip(xs, ys, strict=True)]))
    n_items = int(sum(a.shape[1] for a in xs))
    discordant = sum(discordant_items(a, b) for a, b in zip(xs, ys, strict=True))
    sizes = [(pseudo_size(a, b, score_range), a.shape[1]) for a, b in zip(xs, ys, strict=True)]
    if any(m <= 0 or not math.isfinite(m) for m, _ in sizes):
        note = "every run scored every item alike and the score range is unknown: no test"
        return Comparison(
            delta, NAN, NAN, NAN, NAN, NAN, NAN, margin, PAIRED, xs[0].shape[0], ys[0].shape[0], n_items,
            paired_seeds, None, note, discordant,
        )  # fmt: skip
    resampled = _bootstrap(list(zip(xs, ys, strict=True)), paired_seeds, reps, seed)
    boot = resampled + _pseudo(sizes, reps, seed)
    alpha = 1.0 - confidence
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    tlow, thigh = np.quantile(boot, [alpha, 1 - alpha])
    p = min(1.0, 2.0 * min(_tail(boot, below=0.0), _tail(boot, above=0.0)))
    tost = max(_tail(boot, below=-margin), _tail(boot, above=margin))
    raw = crossed_parts(np.hstack(xs), np.hstack(ys), paired_seeds)
    # the pseudo-count's variance as an item term: it is the item noise the data could not show
    parts = VarianceParts(raw.seed, raw.item + _pseudo_var(sizes) * n_items, raw.residual, raw.seeds, raw.items)
    note = ""
    if _pseudo_var(sizes) > float(resampled.var()):
        note = f"{discordant} discordant item(s) of {n_items}: the interval is mostly the Agresti–Min pseudo-count"
    return Comparison(
        delta, float(low), float(high), p, tost, float(tlow), float(thigh), margin, PAIRED,
        xs[0].shape[0], ys[0].shape[0], n_items, paired_seeds, parts, note, discordant,
    )  # fmt: skip


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
        items or 0, False, parts, "; ".join(notes),
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
