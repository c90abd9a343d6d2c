"""Statistics over seeds: pure functions on arrays, no pandas, no MLflow.

Choices (the report states them):
- mean of a metric over seeds: Student t-interval, mean ± t(1-a/2, n-1) * s / sqrt(n); n=1 has no CI.
- difference of two policies: Welch's unequal-variance t-test and its interval, with
  Welch–Satterthwaite degrees of freedom (seeds are few and variances differ between policies).
- ratio of two means (throughput, memory): delta method on log(mean_x / mean_y), so the interval
  is asymmetric and stays positive; degrees of freedom by Welch–Satterthwaite on the two
  variance components.
- Pareto front: non-dominated points when every objective is maximised.
Non-finite inputs are dropped first; degenerate cases (n < 2, zero variance) return NaN where a
quantity is undefined plus a `note` that the report prints instead of a number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

NAN = float("nan")


def finite(values: Iterable[float] | np.ndarray) -> np.ndarray:
    """Values as a float array with NaN/inf removed (missing metrics never poison a mean)."""
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    return arr[np.isfinite(arr)]


@dataclass(frozen=True)
class MeanCI:
    """Mean over seeds with its t-interval."""

    mean: float
    sd: float
    n: int
    low: float
    high: float
    note: str = ""

    @property
    def half_width(self) -> float:
        """Half the interval width (the ± in 'x ± h'); NaN when there is no interval."""
        return (self.high - self.low) / 2.0


def mean_ci(
    values: Iterable[float] | np.ndarray, confidence: float = 0.95, bounds: tuple[float, float] | None = None
) -> MeanCI:
    """Mean and Student-t confidence interval over seeds.

    `bounds`: the metric's possible range (accuracy [0, 100], a loss [0, inf)); the interval is
    clipped to it, because a band outside what the metric can take says nothing true.
    """
    x = finite(values)
    n = int(x.size)
    if n == 0:
        return MeanCI(NAN, NAN, 0, NAN, NAN, "no data")
    mean = float(x.mean())
    if n == 1:
        return MeanCI(mean, NAN, 1, NAN, NAN, "n=1: no CI")
    sd = float(x.std(ddof=1))
    h = float(_st.t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)
    note = "zero variance" if sd == 0.0 else ""
    low, high = mean - h, mean + h
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return MeanCI(mean, sd, n, low, high, note)


@dataclass(frozen=True)
class WelchResult:
    """Difference of means x - y with Welch's t-test."""

    delta: float
    low: float
    high: float
    df: float
    t: float
    p: float
    n_x: int
    n_y: int
    note: str = ""

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0

    @property
    def tested(self) -> bool:
        """Whether a p-value exists (both groups have n >= 2 and some variance)."""
        return math.isfinite(self.p)

    def significant(self, alpha: float = 0.05) -> bool | None:
        """True/False when tested; None when no test was possible."""
        return bool(self.p < alpha) if self.tested else None


def welch(x: Iterable[float] | np.ndarray, y: Iterable[float] | np.ndarray, confidence: float = 0.95) -> WelchResult:
    """Welch's two-sided t-test of mean(x) - mean(y) and its confidence interval."""
    a, b = finite(x), finite(y)
    nx, ny = int(a.size), int(b.size)
    if nx == 0 or ny == 0:
        return WelchResult(NAN, NAN, NAN, NAN, NAN, NAN, nx, ny, "no data")
    delta = float(a.mean() - b.mean())
    if nx < 2 or ny < 2:
        return WelchResult(delta, NAN, NAN, NAN, NAN, NAN, nx, ny, "n<2: no test")
    vx, vy = float(a.var(ddof=1)) / nx, float(b.var(ddof=1)) / ny
    se2 = vx + vy
    if se2 == 0.0:
        return WelchResult(delta, delta, delta, NAN, NAN, NAN, nx, ny, "zero variance: no test")
    df = se2**2 / (vx**2 / (nx - 1) + vy**2 / (ny - 1))
    se = math.sqrt(se2)
    t = delta / se
    p = float(2.0 * _st.t.sf(abs(t), df))
    h = float(_st.t.ppf(0.5 + confidence / 2.0, df)) * se
    return WelchResult(delta, delta - h, delta + h, float(df), float(t), p, nx, ny)


@dataclass(frozen=True)
class RatioCI:
    """Ratio of means mean(x) / mean(y) with a delta-method interval on the log scale."""

    ratio: float
    low: float
    high: float
    df: float
    note: str = ""


def ratio_ci(x: Iterable[float] | np.ndarray, y: Iterable[float] | np.ndarray, confidence: float = 0.95) -> RatioCI:
    """CI of mean(x)/mean(y): Var(log R) ≈ s_x²/(n_x x̄²) + s_y²/(n_y ȳ²), t with Welch df."""
    a, b = finite(x), finite(y)
    nx, ny = int(a.size), int(b.size)
    if nx == 0 or ny == 0:
        return RatioCI(NAN, NAN, NAN, NAN, "no data")
    mx, my = float(a.mean()), float(b.mean())
    if my == 0.0:
        return RatioCI(NAN, NAN, NAN, NAN, "baseline mean is zero")
    ratio = mx / my
    if nx < 2 or ny < 2:
        return RatioCI(ratio, NAN, NAN, NAN, "n<2: no CI")
    if mx <= 0.0 or my <= 0.0:
        return RatioCI(ratio, NAN, NAN, NAN, "non-positive mean: no CI")
    u = float(a.var(ddof=1)) / (nx * mx * mx)
    v = float(b.var(ddof=1)) / (ny * my * my)
    var_log = u + v
    if var_log == 0.0:
        return RatioCI(ratio, ratio, ratio, NAN, "zero variance")
    df = var_log**2 / (u**2 / (nx - 1) + v**2 / (ny - 1))
    h = float(_st.t.ppf(0.5 + confidence / 2.0, df)) * math.sqrt(var_log)
    return RatioCI(ratio, ratio * math.exp(-h), ratio * math.exp(h), float(df))


def pareto_front(*objectives: Iterable[float] | np.ndarray) -> np.ndarray:
    """Boolean mask of points not dominated by any other (every objective maximised).

    A point dominates another when it is >= in every objective and > in at least one.
    Points with a non-finite objective are never on the front. O(n²), fine for tens of points.
    """
    cols = [np.asarray(list(o) if not isinstance(o, np.ndarray) else o, dtype=float) for o in objectives]
    if not cols:
        return np.zeros(0, dtype=bool)
    pts = np.column_stack(cols)
    ok = np.all(np.isfinite(pts), axis=1)
    mask = ok.copy()
    for i in np.flatnonzero(ok):
        others = pts[ok]
        dominated = np.any(np.all(others >= pts[i], axis=1) & np.any(others > pts[i], axis=1))
        mask[i] = not dominated
    return mask
