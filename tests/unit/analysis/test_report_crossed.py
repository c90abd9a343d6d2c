"""analysis.crossed: the seeds x items t-test, calibrated at the equivalence margin (CI-sized)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.crossed import null_floor, satterthwaite, seed_item_test
from benchmarks.equivalence_calibration import ALPHA, false_equivalence_rate, mc_error

RUNS = 1000


@pytest.mark.parametrize(("seeds", "seed_sd"), [(2, 0.5), (2, 1.0), (5, 0.0)])
def test_false_equivalence_at_the_margin_is_at_most_nominal(seeds: int, seed_sd: float) -> None:
    """A true Δ of ±2 points (the margin) is called "as good as" in at most 5% of runs (+2 Monte
    Carlo SE). Without the S - 1 df seed term or the null floor these cells gave 6-10% (400 runs)."""
    rate = false_equivalence_rate(seeds, seed_sd, RUNS, seed=1)
    assert rate <= ALPHA + 2 * mc_error(rate, RUNS), rate


def test_two_seeds_with_seed_noise_use_about_one_degree_of_freedom() -> None:
    """Seed means 3 points apart and no item noise: the interval is the 1-df t-interval."""
    d = np.repeat(np.array([[0.0], [3.0]]), 200, axis=1)
    c = seed_item_test(d, np.zeros_like(d), paired_seeds=True, margin=2.0)
    assert c.df == pytest.approx(1.0, rel=0.01)
    assert (c.high - c.low) / 2 == pytest.approx(12.706 * 1.5, rel=0.01)  # t(0.975, 1) x s / sqrt(2)
    assert not c.inside_margin()


def test_the_null_floor_keeps_few_one_way_disagreements_from_proving_equivalence() -> None:
    """2 seeds x 400 items, 2 items one way per seed: Δ = -0.5, observed Var tiny; the TOST
    interval must use at least the variance a 2-point difference implies."""
    y = np.full((2, 400), 100.0)
    x = y.copy()
    x[:, :2] = 0.0
    c = seed_item_test(x, y, paired_seeds=True, margin=2.0, score_range=100.0)
    floor = null_floor(2.0, 100.0, 2, 2, 400)
    assert floor == pytest.approx(2 * 98 / 800)
    assert (c.tost_high - c.tost_low) / 2 >= 1.64 * math.sqrt(floor)
    assert null_floor(2.0, None, 2, 2, 400) == 0.0  # unknown range (a loss): no floor


def test_satterthwaite_reduces_to_each_terms_df() -> None:
    assert satterthwaite([(4.0, 3.0)]) == pytest.approx(3.0)
    assert satterthwaite([(1.0, 5.0), (1.0, 5.0)]) == pytest.approx(10.0)
    assert satterthwaite([(1.0, math.inf)]) == math.inf


def test_unpaired_seeds_and_tasks_are_accepted_and_the_discordant_count_is_per_pair() -> None:
    rng = np.random.default_rng(0)
    x = (rng.random((3, 300)) < 0.8) * 100.0
    y = x[:2].copy()
    y[:, :5] = 100.0 - y[:, :5]
    c = seed_item_test(x, y, paired_seeds=False, margin=2.0, score_range=100.0)
    assert c.tested and not c.paired_seeds and c.n_x == 3 and c.n_y == 2
    # paired seeds: only items where a seed's two runs differ count, not baseline seed-to-seed noise
    b = np.zeros((2, 10))
    b[1, 0] = 100.0  # baseline seeds disagree on item 0
    a = b.copy()
    a[:, 5] = 100.0  # the policy differs from its seed's baseline run on item 5 only
    assert seed_item_test(a, b, paired_seeds=True, margin=2.0, score_range=100.0).discordant == 1
    two = seed_item_test([x, x[:, :100]], [x[:, ::-1], x[:, :100]], paired_seeds=True, margin=2.0)
    assert two.items == 400 and math.isfinite(two.tost_p)
