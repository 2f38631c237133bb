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
