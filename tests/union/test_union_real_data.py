"""Utility on the real datasets of ../shared/data (skipped when absent).

Fixed seeds, means of 5 runs. References: the WGM counts in ../shared/data/README.md
(an independent implementation: eps=1, delta=1e-5, max_items=100) and the orderings of
[DPSU] Table 2 (eps=3, delta=e^-10): Weighted > Count within each noise family at max_items >= 50.
"""
from __future__ import annotations

import math

import pytest

import dpsql

from conftest import seeded

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]

DATASETS = {
    "askreddit": ("reddit_askreddit_1pct/unigrams.parquet", 102),
    "health": ("health_news_tweets/tweet_tokens.parquet", 1500),
    "debian": ("debian_bookworm_descriptions/package_description_tokens.parquet", 2115),
}


def mean_released(path, method, eps, delta, runs=5, seed=1):
    con = seeded(seed)
    try:
        con.execute(f"CREATE VIEW t AS SELECT user_id, item FROM read_parquet('{path}')")
        return sum(dpsql.set_union(con, "t", method, epsilon=eps, delta=delta, max_items=100).num_rows
                   for _ in range(runs)) / runs
    finally:
        con.close()


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_weighted_gaussian_matches_the_reference_counts(shared_data, name):
    rel, reference = DATASETS[name]
    got = mean_released(shared_data / rel, "weighted_gaussian", 1.0, 1e-5)
    assert abs(got - reference) <= 0.1 * reference, (name, got, reference)


@pytest.mark.parametrize("name", ["askreddit", "health"])
def test_weighted_beats_count_in_each_noise_family(shared_data, name):
    path = shared_data / DATASETS[name][0]
    eps, delta = 3.0, math.exp(-10)
    n = {m: mean_released(path, m, eps, delta)
         for m in ("count_gaussian", "count_laplace", "weighted_gaussian", "weighted_laplace")}
    assert n["weighted_gaussian"] > n["count_gaussian"], n
    assert n["weighted_laplace"] > n["count_laplace"], n
