"""analysis.stats and analysis.cost against independent computations (scipy / by hand)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats as st

from analysis.cost import training_cost
from analysis.stats import mean_ci, pareto_front, ratio_ci, welch


def test_mean_ci_matches_scipy_t_interval() -> None:
    x = [80.0, 82.0, 84.0, 79.5]
    r = mean_ci(x, 0.95)
    lo, hi = st.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=st.sem(x))
    assert r.n == 4 and r.mean == pytest.approx(81.375)
    assert (r.low, r.high) == pytest.approx((lo, hi))
    assert r.half_width == pytest.approx((hi - lo) / 2)


def test_mean_ci_by_hand_three_seeds() -> None:
    # mean 82, s = 2, t(0.975, 2) = 4.302653 -> h = 4.302653 * 2 / sqrt(3) = 4.968275
    r = mean_ci([80, 82, 84])
    assert r.half_width == pytest.approx(4.968275, rel=1e-6)


def test_mean_ci_degenerate_cases() -> None:
    one = mean_ci([0.7])
    assert one.mean == 0.7 and one.n == 1 and math.isnan(one.low) and "n=1" in one.note
    none = mean_ci([])
    assert none.n == 0 and math.isnan(none.mean)
    flat = mean_ci([5.0, 5.0, 5.0])
    assert flat.low == flat.high == 5.0 and "zero variance" in flat.note
    with_nan = mean_ci([1.0, float("nan"), 3.0, float("inf")])
    assert with_nan.n == 2 and with_nan.mean == 2.0


def test_welch_matches_scipy() -> None:
    x = [79.0, 81.0, 83.0]
    y = [80.0, 82.0, 84.0, 81.0, 79.0]
    r = welch(x, y, 0.95)
    ref = st.ttest_ind(x, y, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert r.delta == pytest.approx(np.mean(x) - np.mean(y))
    assert r.t == pytest.approx(ref.statistic) and r.p == pytest.approx(ref.pvalue)
    assert r.df == pytest.approx(ref.df)
    assert (r.low, r.high) == pytest.approx((ci.low, ci.high))
    assert r.significant(0.05) is False


def test_welch_significant_difference() -> None:
    x, y = [60.0, 66.0, 63.0], [80.0, 82.0, 84.0]
    r = welch(x, y)
    assert r.p == pytest.approx(st.ttest_ind(x, y, equal_var=False).pvalue)
    assert r.p < 0.05 and r.significant() is True and r.high < 0


def test_welch_degenerate_cases() -> None:
    small = welch([0.8], [0.7, 0.75])
    assert small.delta == pytest.approx(0.8 - 0.725) and not small.tested and small.significant() is None
    assert "n<2" in small.note
    flat = welch([1.0, 1.0], [2.0, 2.0])
    assert flat.delta == -1.0 and not flat.tested and "zero variance" in flat.note
    one_flat = welch([1.0, 1.0, 1.0], [2.0, 3.0, 4.0])  # only one side constant: still a valid Welch test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy warns about the constant sample
        ref = st.ttest_ind([1.0, 1.0, 1.0], [2.0, 3.0, 4.0], equal_var=False)
    assert one_flat.p == pytest.approx(ref.pvalue) and one_flat.df == pytest.approx(2.0)
    assert math.isnan(welch([], [1.0, 2.0]).delta)


def test_ratio_ci_delta_method_by_hand() -> None:
    x, y = np.array([1400.0, 1420.0, 1380.0]), np.array([1000.0, 1010.0, 990.0])
    r = ratio_ci(x, y, 0.95)
    u = x.var(ddof=1) / (3 * x.mean() ** 2)
    v = y.var(ddof=1) / (3 * y.mean() ** 2)
    df = (u + v) ** 2 / (u**2 / 2 + v**2 / 2)
    h = st.t.ppf(0.975, df) * math.sqrt(u + v)
    assert r.ratio == pytest.approx(1.4)
    assert r.df == pytest.approx(df)
    assert (r.low, r.high) == pytest.approx((1.4 * math.exp(-h), 1.4 * math.exp(h)))
    assert r.low < r.ratio < r.high


def test_ratio_ci_degenerate_cases() -> None:
    assert "n<2" in ratio_ci([2.0], [1.0, 1.0]).note and ratio_ci([2.0], [1.0, 1.0]).ratio == 2.0
    flat = ratio_ci([2.0, 2.0], [1.0, 1.0])
    assert flat.low == flat.high == 2.0
    assert math.isnan(ratio_ci([1.0, 2.0], [0.0, 0.0]).ratio)
    assert math.isnan(ratio_ci([], [1.0]).ratio)


def test_ratio_ci_coverage_is_near_nominal() -> None:
    """Monte Carlo: the delta-method interval covers the true ratio about 95% of the time."""
    rng = np.random.default_rng(0)
    hits, n_sim = 0, 2000
    for _ in range(n_sim):
        x = rng.normal(1500, 60, size=8)
        y = rng.normal(1000, 40, size=8)
        r = ratio_ci(x, y)
        hits += r.low <= 1.5 <= r.high
    assert 0.93 <= hits / n_sim <= 0.97


def test_pareto_front_maximises_both() -> None:
    acc = [86.0, 85.0, 76.0, 54.0, 85.0, float("nan")]
    tps = [1010.0, 1415.0, 1420.0, 1390.0, 1300.0, 5000.0]
    # 0: most accurate; 1: best trade-off; 2: fastest; 3 dominated by 1; 4 dominated by 1; 5 NaN never on front
    assert pareto_front(acc, tps).tolist() == [True, True, True, False, False, False]
    assert pareto_front([1.0, 1.0], [2.0, 2.0]).tolist() == [True, True]  # ties do not dominate each other
    assert pareto_front([], []).tolist() == []


def test_cost_formulas_by_hand() -> None:
    # price 2.5, 1 GPU, U 0.8 -> 3.125 USD/h; 1000 tok/s -> 3.6M tok/h
    c = training_cost(1000.0, 256_000.0, 2.5, 0.8, 1)
    assert c.eff_cost_per_hour == pytest.approx(3.125)
    assert c.tokens_per_hour == pytest.approx(3.6e6)
    assert c.cost_per_1m_tokens == pytest.approx(3.125 / 3.6)
    assert c.cost_per_epoch == pytest.approx(3.125 * 256_000 / 3.6e6)
    c4 = training_cost(1000.0, None, 2.0, 1.0, 4)  # TokensPerHour and EffCost both scale with N_gpu
    assert c4.eff_cost_per_hour == 8.0 and c4.tokens_per_hour == pytest.approx(14.4e6)
    assert c4.cost_per_1m_tokens == pytest.approx(8.0 / 14.4) and math.isnan(c4.cost_per_epoch)
    none = training_cost(float("nan"), 1e6, 2.5, 0.8, 1)
    assert math.isnan(none.cost_per_1m_tokens) and math.isnan(none.cost_per_epoch)


def test_bands_stay_inside_the_metric_range() -> None:
    import pandas as pd

    from analysis import fmt
    from analysis.figures import _band

    acc = mean_ci([0.0, 0.0, 3.0], 0.95, (0.0, 100.0))  # t-interval would reach below 0
    assert acc.low == 0.0 and acc.high == pytest.approx(1.0 + st.t.ppf(0.975, 2) * st.sem([0.0, 0.0, 3.0]))
    assert fmt.spread(acc.mean, acc.low, acc.high, 3, "", 3) == f"1.0 [0.0, {acc.high:.1f}]"  # asymmetric: shown as such
    top = mean_ci([100.0, 98.0, 100.0], 0.95, (0.0, 100.0))
    assert top.high == 100.0
    loss = pd.DataFrame({"mean": [0.5, 0.1], "std": [0.1, 2.0], "count": [3, 3]})
    lo, hi = _band(loss, 0.95)
    assert lo[1] == 0.0 and lo[0] > 0 and hi[1] > 0.1  # a loss band never goes below 0
    two = pd.DataFrame({"mean": [0.5], "std": [0.1], "count": [2]})
    assert np.isnan(_band(two, 0.95, 3)[1]).all()  # 2 seeds: no t-band at all


def test_zero_variance_and_few_seeds_are_said() -> None:
    from analysis import fmt

    assert fmt.spread(19.25, 19.25, 19.25, 3, "", 3) == "19.2 ± 0.0 (zero variance over 3 seeds)"
    assert fmt.spread(19.25, 19.25, 19.25, 2, "19.2, 19.2", 3) == "19.2, 19.2 (per seed, 2 seeds: too few for a t-interval)"
    assert fmt.spread(80.0, 75.0, 85.0, 4, "", 3) == "80.0 ± 5.0"
