"""Utility of top-k and k-hitting set on the real datasets of ../shared/data (skipped when absent).

Fixed seeds, means of 5 runs, epsilon = 1, delta = 1e-5, max_items = 100 ([MM] Sec. 5.2-5.3).
Claims checked: WGM + peeling has a smaller top-k missing mass than the Durfee-Rogers limited-domain
baseline with k_bar = k (no per-user cap) ([MM] Figure 2); user peeling hits nearly as many users as
the non-private greedy ([MM] Figure 3).
"""
from __future__ import annotations

import pytest

from dpsql.tools import metrics
from dpsql import topk

from conftest import seeded

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]

ASKREDDIT = "reddit_askreddit_1pct/unigrams.parquet"
HEALTH = "health_news_tweets/tweet_tokens.parquet"
RUNS = 5


@pytest.fixture(scope="module")
def askreddit():
    from conftest import shared_data_dir
    root = shared_data_dir()
    if root is None:
        pytest.skip("the real datasets (../shared/data) are not available")
    con = seeded(1)
    con.execute(f"CREATE VIEW t AS SELECT user_id, item FROM read_parquet('{root / ASKREDDIT}')")
    counts = dict(con.execute("SELECT item, count(DISTINCT user_id) FROM t GROUP BY item").fetchall())
    yield con, counts
    con.close()


def top_k_mm(counts: dict, released: list, k: int) -> float:
    """MM^k from precomputed N(x) (NON-PRIVATE; same formula as metrics.top_k_missing_mass)."""
    ordered = sorted(counts.values(), reverse=True)
    return (sum(ordered[:k]) - sum(counts.get(x, 0) for x in released)) / sum(counts.values())


@pytest.mark.parametrize("k", [5, 10, 20, 50, 100])
def test_top_k_beats_the_limited_domain_baseline(askreddit, k):
    con, counts = askreddit
    budget = dict(epsilon=1.0, delta=1e-5)
    ours = sum(top_k_mm(counts, topk.top_k(con, "t", k, **budget).column("item").to_pylist(), k)
               for _ in range(RUNS)) / RUNS
    baseline = sum(top_k_mm(counts, topk.top_k_limited_domain(con, "t", k, k, **budget).column("item").to_pylist(), k)
                   for _ in range(RUNS)) / RUNS
    # Measured (seed 1): k=5: 0 vs 0; 10: 0 vs 0.018; 20: 0.0002 vs 0.041; 50: 0.002 vs 0.15;
    # 100: 0.099 vs 0.26. At k = 5 both find the exact top 5, so only "<=" can hold there.
    assert ours <= baseline, (k, ours, baseline)
    if k >= 10:
        assert ours < baseline, (k, ours, baseline)


def test_hitting_set_hits_nearly_as_many_users_as_the_greedy(shared_data):
    con = seeded(2)
    try:
        con.execute(f"CREATE VIEW t AS SELECT user_id, item FROM read_parquet('{shared_data / HEALTH}')")
        users: dict = {}
        for u, x in con.execute("SELECT user_id, item FROM t").fetchall():
            users.setdefault(u, set()).add(x)
        greedy = metrics.hits(users, metrics.greedy_hitting_set(users, 10))
        released = (topk.hitting_set(con, "t", 10, epsilon=1.0, delta=1e-5).column("item").to_pylist()
                    for _ in range(RUNS))
        private = sum(metrics.hits(users, items) for items in released) / RUNS
    finally:
        con.close()
    # Measured: greedy 51,343 users; dp_hitting_set mean 51,337 (ratio 0.9999).
    assert private >= 0.9 * greedy, (private, greedy)
