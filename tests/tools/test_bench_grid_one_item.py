"""benchmarks/bench_grid_one_item.py: the expected counts of the one-item rules, against direct draws.

The script releases nothing: it sums each rule's keep probability over the item counts. These tests draw
the rules themselves (numpy's seeded generator; a test option, not dpsql's noise) on a fixed set of counts
and check the sums within five standard deviations of the drawn totals.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

_saved_path = list(sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_grid_one_item as one  # noqa: E402

sys.path[:] = _saved_path

from dpsql.groupby.selection import keep_probabilities  # noqa: E402

COUNTS = np.repeat(np.arange(1, 41), 50)  # 2,000 items held by 1..40 users each
DRAWS = 400


def _check(expected: float, kept: np.ndarray) -> None:
    # kept: DRAWS totals of independent Bernoulli keeps; each total's variance is at most len(COUNTS) / 4
    sd = math.sqrt(len(COUNTS) / 4 / DRAWS)
    assert abs(kept.mean() - expected) < 5 * sd, (kept.mean(), expected, sd)


def test_count_laplace_expectation_matches_draws():
    rng = np.random.default_rng(20261129)
    for epsilon, delta in ((1.0, 1e-5), (3.0, math.exp(-10))):
        t = 1.0 + math.log(1.0 / (2.0 * delta)) / epsilon
        noisy = COUNTS[None, :] + rng.laplace(0.0, 1.0 / epsilon, (DRAWS, len(COUNTS)))
        _check(one.expected_count_laplace(COUNTS, epsilon, delta), (noisy >= t).sum(axis=1))


def test_truncated_geometric_expectation_matches_draws():
    rng = np.random.default_rng(20261130)
    for epsilon, delta in ((1.0, 1e-5), (3.0, math.exp(-10))):
        p = keep_probabilities(epsilon, delta)
        prob = np.where(COUNTS < len(p), p[np.minimum(COUNTS, len(p) - 1)], 1.0)
        kept = (rng.random((DRAWS, len(COUNTS))) < prob[None, :]).sum(axis=1)
        _check(one.expected_truncated_geometric(COUNTS, epsilon, delta), kept)


def test_the_optimal_rule_keeps_at_least_the_laplace_rule_at_every_count():
    # the truncated geometric keep probabilities are the largest of any (epsilon, delta)-DP rule of one count
    for epsilon, delta in ((1.0, 1e-5), (3.0, math.exp(-10)), (0.5, 1e-6)):
        for n in range(1, 80):
            c = np.array([n])
            assert (one.expected_truncated_geometric(c, epsilon, delta)
                    >= one.expected_count_laplace(c, epsilon, delta) - 1e-12), (epsilon, delta, n)
