"""analysis.paired: crossed bootstrap, binomial fallback, TOST, Holm — against scipy and hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from analysis.crossed import seed_item_test
from analysis.paired import VarianceParts, binomial_floor, binomial_seeds, holm, needed


def test_one_seed_matches_scipy_percentile_bootstrap() -> None:
    rng = np.random.default_rng(3)
    x = (rng.random((1, 400)) < 0.80) * 100.0
    y = (rng.random((1, 400)) < 0.70) * 100.0
    c = seed_item_test(x, y, paired_seeds=True, margin=2.0)
    ref = st.bootstrap((x[0] - y[0],), np.mean, n_resamples=20_000, method="percentile", random_state=2)
    assert c.delta == pytest.approx((x - y).mean())
    assert c.low == pytest.approx(ref.confidence_interval.low, abs=0.6)
    assert c.high == pytest.approx(ref.confidence_interval.high, abs=0.6)
    assert c.method == "seeds x items t" and c.items == 400


def test_item_noise_is_not_averaged_away_by_seeds() -> None:
    """Shared items: an item effect common to every seed keeps its full 1/items variance."""
    rng = np.random.default_rng(0)
    a = rng.normal(0, 10, 200)
    d = np.tile(a, (8, 1))  # 8 seeds, identical per-item differences: only item noise
    c = seed_item_test(d, np.zeros_like(d), paired_seeds=True, margin=1.0)
    se_expected = a.std(ddof=0) / math.sqrt(a.size)  # not / sqrt(8 * 200)
    assert (c.high - c.low) / (2 * 1.96) == pytest.approx(se_expected, rel=0.07)
    assert c.parts is not None and c.parts.seed == pytest.approx(0.0, abs=1e-9)


def test_seed_noise_counts_with_its_degrees_of_freedom() -> None:
    """Only seed noise: the interval is the one-sample t-interval over the 4 seed means (3 df)."""
    b = np.array([-3.0, 0.0, 3.0, 6.0])
    d = np.repeat(b[:, None], 50, axis=1)  # differences constant within a seed: only seed noise
    c = seed_item_test(d, np.zeros_like(d), paired_seeds=True, margin=1.0)
    half = st.t.ppf(0.975, 3) * b.std(ddof=1) / 2
    assert (c.high - c.low) / 2 == pytest.approx(half, rel=0.01) and c.df == pytest.approx(3.0, rel=0.01)
    # no item noise in the data: the item term is only the pseudo-count's (m/n)² x n, m = the 1.5-point item difference
    assert c.parts is not None and c.parts.seed == pytest.approx(b.var(ddof=1))
    assert c.parts.item == pytest.approx(1.5**2 / 50)


def test_pairing_removes_shared_item_difficulty() -> None:
    rng = np.random.default_rng(7)
    easy = rng.random(300) < 0.7
    x = np.tile(easy * 100.0, (3, 1))
    y = x.copy()
    y[:, :6] = 100 - y[:, :6]  # 6 items answered differently: the difference is tiny and certain
    c = seed_item_test(x, y, paired_seeds=True, margin=5.0)
    assert c.high - c.low < 4.0 and c.inside_margin() and c.tost_p < 0.05
    se = math.sqrt(70 * 30 / 300)  # the binomial standard error that ignores the pairing
    unpaired = binomial_seeds(x.mean(axis=1), [se] * 3, y.mean(axis=1), [se] * 3, margin=5.0, items=300)
    assert unpaired.high - unpaired.low > 3 * (c.high - c.low) and not unpaired.inside_margin()


def test_bootstrap_is_reproducible_and_unpaired_seeds_work() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.random((3, 50)) * 100, rng.random((2, 50)) * 100
    a = seed_item_test(x, y, paired_seeds=False, margin=2.0)
    b = seed_item_test(x, y, paired_seeds=False, margin=2.0)
    assert a == b and a.n_x == 3 and a.n_y == 2 and not a.paired_seeds
    with pytest.raises(ValueError):
        seed_item_test(x, y, paired_seeds=True, margin=2.0)


def test_tost_decision_is_the_interval_inside_the_margin() -> None:
    rng = np.random.default_rng(4)
    for shift in (0.0, 1.0, 3.0):
        x = rng.normal(50 + shift, 5, (3, 400))
        y = rng.normal(50, 5, (3, 400))
        c = seed_item_test(x, y, paired_seeds=True, margin=2.0)
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
    c = seed_item_test(x, y, paired_seeds=True, margin=2.0)
    text = needed(c, 0.05)
    assert "items at 3 seeds" in text or "neither alone" in text
    one = seed_item_test(x[:1], y[:1], paired_seeds=True, margin=2.0)
    assert "at least 3 seeds" in needed(one, 0.05)


# ----------------------------------------------------------------- few or no discordant items


def _same_answers(seeds: int, items: int, p: float = 0.19) -> np.ndarray:
    """seeds x items 0/100 scores, every seed answering alike (an adapter that has not moved yet)."""
    return np.tile((np.random.default_rng(11).random(items) < p) * 100.0, (seeds, 1))


def test_no_discordant_item_of_40_is_not_equivalence() -> None:
    """2 seeds x 40 items answered identically: Δ = 0 exactly, but 40 items cannot exclude 2 points."""
    x = _same_answers(2, 40)
    c = seed_item_test(x, x.copy(), paired_seeds=True, margin=2.0, score_range=100.0)
    assert c.delta == 0.0 and c.discordant == 0 and c.tested
    assert not c.inside_margin() and c.low <= -2.0 and c.high >= 2.0
    # the only variance is the pseudo-count's, 2 x ½ x (100/40)² = 2.5²: TOST p = P(Z > 2 / 2.5)
    assert c.tost_p == pytest.approx(st.norm.sf(2.0 / 2.5)) and c.tost_p > 0.2
    assert c.p == pytest.approx(1.0)
    assert "items at 2 seeds" in needed(c, 0.05) and "pseudo-count" in c.note


def test_no_or_few_discordant_items_of_thousands_can_be_equivalent() -> None:
    x = _same_answers(2, 2000)
    c = seed_item_test(x, x.copy(), paired_seeds=True, margin=2.0, score_range=100.0)
    assert c.inside_margin() and c.tost_p < 0.01 and c.high - c.low < 0.5
    y = _same_answers(2, 3000)
    flip = np.flatnonzero(y[0] == 0)[:3]
    y[:, flip] = 100.0  # 3 items of 3000 answered differently, all one way
    c3 = seed_item_test(y, _same_answers(2, 3000), paired_seeds=True, margin=2.0,
                          score_range=100.0)  # fmt: skip
    assert c3.discordant == 3 and c3.delta == pytest.approx(0.1)
    assert c3.inside_margin() and c3.tost_p < 0.01


def test_few_discordant_items_make_the_difference_test_cautious() -> None:
    """3 of 40 items better, none worse (1 seed): McNemar's exact p = 0.25, a bare t-test on the 40
    differences 0.08; with the pseudo-count the difference is not significant and 0 is inside the CI."""
    y = _same_answers(1, 40)
    x = y.copy()
    x[0, np.flatnonzero(y[0] == 0)[:3]] = 100.0
    c = seed_item_test(x, y, paired_seeds=True, margin=2.0, score_range=100.0)
    assert c.delta == pytest.approx(7.5) and c.discordant == 3
    bare = st.ttest_1samp((x - y)[0], 0.0).pvalue
    assert c.p > bare + 0.03 and c.p > 0.1 and c.low <= 0.0 < c.high


def test_many_discordant_items_keep_the_t_interval() -> None:
    """The pseudo-count adds (range/items)² = 0.0625 points² to a variance of ~9 here: no visible change."""
    rng = np.random.default_rng(3)
    x = (rng.random((1, 400)) < 0.80) * 100.0
    y = (rng.random((1, 400)) < 0.70) * 100.0
    with_range = seed_item_test(x, y, paired_seeds=True, margin=2.0, score_range=100.0)
    d = (x - y)[0]
    se = d.std(ddof=0) / math.sqrt(d.size)
    assert (with_range.high - with_range.low) / (2 * 1.96) == pytest.approx(se, rel=0.04)
    assert with_range.note == "1 seed: the seed noise is not estimated"


def test_identical_scores_of_unknown_range_get_no_test() -> None:
    x = np.full((2, 30), 5.0)
    c = seed_item_test(x, x.copy(), paired_seeds=True, margin=2.0)
    assert not c.tested and not c.inside_margin() and "no test" in c.note and c.delta == 0.0


def test_binomial_floor_hand_computed() -> None:
    p = 40.5 / 41  # 40 of 40 right plus half a right and half a wrong answer
    assert binomial_floor(np.array([100.0]), 40, 100.0)[0] == pytest.approx(100 * math.sqrt(p * (1 - p) / 41))
    assert np.isnan(binomial_floor(np.array([100.0]), None, 100.0)).all()
    assert np.isnan(binomial_floor(np.array([100.0]), 40, None)).all()
    # away from 0% and 100% lm-eval's stderr sqrt(p(1-p)/(n-1)) is larger: the floor does not bind
    assert binomial_floor(np.array([50.0]), 400, 100.0)[0] < 100 * math.sqrt(0.25 / 399)


def test_binomial_at_100_percent_with_zero_stderr() -> None:
    """Every seed 100% (stderr 0, seed variance 0) on both sides: not noise-free, not equivalent on 40 items."""
    kw = dict(margin=2.0, score_range=100.0)
    c40 = binomial_seeds([100.0, 100.0], [0.0, 0.0], [100.0, 100.0], [0.0, 0.0], items=40, **kw)
    assert c40.tested and not c40.inside_margin() and c40.tost_p > 0.05 and "pseudo-count floor" in c40.note
    c2000 = binomial_seeds([100.0, 100.0], [0.0, 0.0], [100.0, 100.0], [0.0, 0.0], items=2000, **kw)
    assert c2000.inside_margin() and c2000.tost_p < 0.01
    # nothing to floor with (items unknown): one side would count as noise-free -> no test
    one = binomial_seeds([100.0, 100.0], [0.0, 0.0], [80.0, 84.0], [2.0, 2.0], margin=2.0)
    assert not one.tested and "no noise estimate" in one.note
    both = binomial_seeds([0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], margin=2.0)
    assert not both.tested
