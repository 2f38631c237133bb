from itertools import combinations

import pytest

from tasks.evaluate.stats import pass_at_k


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 6), (10, 1, 4), (4, 4, 2)])
def test_pass_at_k_equals_fraction_of_k_subsets_with_a_pass(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_1_is_the_mean():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


import numpy as np  # noqa: E402

from tasks.evaluate.stats import min_detectable_difference, paired_bootstrap  # noqa: E402


def test_paired_bootstrap_is_seeded_paired_and_matches_a_loop():
    rng = np.random.default_rng(0)
    b = rng.random(40)
    a = b + 0.1 + rng.normal(0, 0.01, 40)  # a beats b by ~0.1 on every task: pairing makes the CI tight
    est, lo, hi, p = paired_bootstrap(a, b, 2000, seed=7, level=0.95)
    assert est == pytest.approx(float(np.mean(a - b)))
    assert 0.09 < lo < est < hi < 0.11 and p == 0.0
    assert paired_bootstrap(a, b, 2000, seed=7, level=0.95) == (est, lo, hi, p)
    # the same resamples by an explicit loop
    idx = np.random.default_rng(7).integers(0, 40, size=(2000, 40), dtype=np.int32)
    boot = np.array([np.mean((a - b)[i]) for i in idx])
    assert lo == pytest.approx(np.quantile(boot, 0.025)) and hi == pytest.approx(np.quantile(boot, 0.975))


def test_paired_bootstrap_of_no_difference_has_p_one():
    x = np.array([0.0, 1.0, 0.5, 0.5])
    assert paired_bootstrap(x, x, 500, seed=1, level=0.9) == (0.0, 0.0, 0.0, 1.0)


def test_mdd_formula():
    # (z_{1-0.05/(2*4)} + z_{0.8}) * 0.5 / sqrt(100) = (2.4977 + 0.8416) * 0.05
    assert min_detectable_difference(0.5, 100, 0.05, 4, 0.8) == pytest.approx((2.497705 + 0.841621) * 0.05, abs=1e-5)
    with pytest.raises(ValueError, match="n=0"):
        min_detectable_difference(0.5, 0, 0.05, 1, 0.8)
