"""analysis.paired: crossed bootstrap, binomial fallback, TOST, Holm — against scipy and hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from analysis.paired import VarianceParts, binomial_seeds, holm, needed, paired_bootstrap


def test_one_seed_matches_scipy_percentile_bootstrap() -> None:
    rng = np.random.default_rng(3)
    x = (rng.random((1, 400)) < 0.80) * 100.0
    y = (rng.random((1, 400)) < 0.70) * 100.0
    c = paired_bootstrap(x, y, paired_seeds=True, margin=2.0, reps=20_000, seed=1)
    ref = st.bootstrap((x[0] - y[0],), np.mean, n_resamples=20_000, method="percentile", random_state=2)
    assert c.delta == pytest.approx((x - y).mean())
    assert c.low == pytest.approx(ref.confidence_interval.low, abs=0.6)
    assert c.high == pytest.approx(ref.confidence_interval.high, abs=0.6)
    assert c.method == "paired bootstrap" and c.items == 400


def test_item_noise_is_not_averaged_away_by_seeds() -> None:
    """Shared items: an item effect common to every seed keeps its full 1/items variance."""
    rng = np.random.default_rng(0)
    a = rng.normal(0, 10, 200)
    d = np.tile(a, (8, 1))  # 8 seeds, identical per-item differences: only item noise
    c = paired_bootstrap(d, np.zeros_like(d), paired_seeds=True, margin=1.0, reps=20_000, seed=5)
    se_expected = a.std(ddof=0) / math.sqrt(a.size)  # not / sqrt(8 * 200)
    assert (c.high - c.low) / (2 * 1.96) == pytest.approx(se_expected, rel=0.07)
    assert c.parts is not None and c.parts.seed == pytest.approx(0.0, abs=1e-9)


def test_seed_noise_enters_through_seed_resampling() -> None:
    b = np.array([-3.0, 0.0, 3.0, 6.0])
    d = np.repeat(b[:, None], 50, axis=1)  # differences constant within a seed: only seed noise
    c = paired_bootstrap(d, np.zeros_like(d), paired_seeds=True, margin=1.0, reps=20_000, seed=2)
    assert (c.high - c.low) / (2 * 1.96) == pytest.approx(b.std(ddof=0) / 2, rel=0.1)
    assert c.parts is not None and c.parts.item == pytest.approx(0.0) and c.parts.seed == pytest.approx(b.var(ddof=1))


def test_pairing_removes_shared_item_difficulty() -> None:
    rng = np.random.default_rng(7)
    easy = rng.random(300) < 0.7
    x = np.tile(easy * 100.0, (3, 1))
    y = x.copy()
    y[:, :6] = 100 - y[:, :6]  # 6 items answered differently: the difference is tiny and certain
    c = paired_bootstrap(x, y, paired_seeds=True, margin=5.0, reps=5000, seed=0)
    assert c.high - c.low < 4.0 and c.inside_margin() and c.tost_p < 0.05
    se = math.sqrt(70 * 30 / 300)  # the binomial standard error that ignores the pairing
    unpaired = binomial_seeds(x.mean(axis=1), [se] * 3, y.mean(axis=1), [se] * 3, margin=5.0, items=300)
    assert unpaired.high - unpaired.low > 3 * (c.high - c.low) and not unpaired.inside_margin()


def test_bootstrap_is_reproducible_and_unpaired_seeds_work() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.random((3, 50)) * 100, rng.random((2, 50)) * 100
    a = paired_bootstrap(x, y, paired_seeds=False, margin=2.0, reps=2000, seed=9)
    b = paired_bootstrap(x, y, paired_seeds=False, margin=2.0, reps=2000, seed=9)
    assert a == b and a.n_x == 3 and a.n_y == 2 and not a.paired_seeds
    with pytest.raises(ValueError):
        paired_bootstrap(x, y, paired_seeds=True, margin=2.0)


def test_tost_decision_is_the_interval_inside_the_margin() -> None:
    rng = np.random.default_rng(4)
    for shift in (0.0, 1.0, 3.0):
        x = rng.normal(50 + shift, 5, (3, 400))
        y = rng.normal(50, 5, (3, 400))
        c = paired_bootstrap(x, y, paired_seeds=True, margin=2.0, reps=4000, seed=3)
        assert (c.tost_p < 0.05) == c.inside_margin(), (shift, c)


def test_binomial_fallback_against_hand_computation() -> None:
    x, y = np.array([80.0, 82.0, 81.0]), np.array([79.0, 80.0, 78.0])
    se_x, se_y = np.array([2.0, 2.0, 2.0]), np.array([2.1, 2.1, 2.1])
    c = binomial_seeds(x, se_x, y, se_y, margin=2.0, items=400)
    vx, vy = x.var(ddof=1) / 3, y.var(ddof=1) / 3
    var = vx + vy + 4.0 + 2.1**2
    df = var**2 / (vx**2 / 2 + vy**2 / 2 + 4.0**2 / 399 + 2.1**4 / 399)
    d, se = x.mean() - y.mean(), math.sqrt(var)
    assert c.delta == pytest.approx(d) and c.method == "binomial + seeds"
    assert (c.low, c.high) == pytest.approx((d - st.t.ppf(0.975, df) * se, d + st.t.ppf(0.975, df) * se))
    assert c.p == pytest.approx(2 * st.t.sf(abs(d) / se, df))
    tost = max(st.t.sf((d + 2) / se, df), st.t.cdf((d - 2) / se, df))
    assert c.tost_p == pytest.approx(tost)
    assert (c.tost_p < 0.05) == c.inside_margin()


def test_binomial_without_stderr_is_welch() -> None:
    x, y = [60.0, 66.0, 30.0], [80.0, 82.0, 84.0]
    c = binomial_seeds(x, [math.nan] * 3, y, [math.nan] * 3, margin=2.0)
    ref = st.ttest_ind(x, y, equal_var=False)
    assert c.p == pytest.approx(ref.pvalue) and "item noise unknown" in c.note
    ci = ref.confidence_interval(0.95)
    assert (c.low, c.high) == pytest.approx((ci.low, ci.high))


def test_binomial_with_one_seed_uses_item_noise_only() -> None:
    c = binomial_seeds([80.0], [2.0], [70.0], [2.3], margin=2.0, items=400)
    assert math.isfinite(c.p) and "seed noise not estimable" in c.note
    assert c.high - c.low == pytest.approx(2 * st.t.ppf(0.975, (4 + 2.3**2) ** 2 / ((16 + 2.3**4) / 399)) * math.sqrt(4 + 2.3**2))


def test_holm_hand_computed() -> None:
    # sorted 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm([0.2, math.nan, 0.9])
    assert out[0] == pytest.approx(0.4) and math.isnan(out[1]) and out[2] == pytest.approx(0.9)
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def test_variance_parts_and_sample_size() -> None:
    parts = VarianceParts(seed=4.0, item=400.0, residual=0.0, seeds=2, items=400)
    assert parts.var(2, 400) == pytest.approx(2.0 + 1.0)
    # se 1.0 -> 4/S + 1 <= 1 impossible by seeds; items: 400/n <= 1 - 2 impossible too
    assert parts.seeds_needed(1.0) is None and parts.items_needed(1.0) is None
    assert parts.seeds_needed(2.0) == 2 and parts.items_needed(2.0) == 200
    assert parts.seeds_needed(1.5) == math.ceil(4 / (2.25 - 1))


def test_needed_names_seeds_or_items() -> None:
    rng = np.random.default_rng(2)
    x = (rng.random((3, 400)) < 0.8) * 100.0
    y = (rng.random((3, 400)) < 0.8) * 100.0
    c = paired_bootstrap(x, y, paired_seeds=True, margin=2.0, reps=2000, seed=0)
    text = needed(c, 0.05)
    assert "items at 3 seeds" in text or "neither alone" in text
    one = paired_bootstrap(x[:1], y[:1], paired_seeds=True, margin=2.0, reps=500, seed=0)
    assert "at least 3 seeds" in needed(one, 0.05)
