"""Evaluation statistics."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` attempts of which ``c`` passed (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", arXiv 2107.03374, eq. 1):

        pass@k = 1 - C(n - c, k) / C(n, k)

    computed as a running product for numerical stability.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean(values: list[float]) -> float:
    """Arithmetic mean; NaN for an empty list."""
    return math.fsum(values) / len(values) if values else float("nan")
