"""benchmarks/bench_rdp_rule.py: the Rényi-DP keep rule it builds, and the sums it compares.

The rule is benchmark code only (no release uses it), but the comparison means something only if the rule
keeps the constraint it is built on: these tests check the conversion against ``dp_accounting``, the
constraint at every pair of grid points and between them, the novel-item bound, and the Rényi divergence
of the whole keep decision on random neighbouring data sets.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

_saved_path = list(sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_rdp_rule as rdp  # noqa: E402

sys.path[:] = _saved_path

SETTINGS = ((1.0, 1e-5), (3.0, math.exp(-10)))
STEP = 0.05  # coarser than the script's, to keep the tests fast; the constraint holds at any step


@pytest.fixture(scope="module")
def rules():
    return {(e, d): rdp.build(12, e, d, step=STEP) for e, d in SETTINGS}


def test_the_budget_converts_to_epsilon_by_dp_accounting():
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    for epsilon, delta in SETTINGS:
        for alpha in (12.0, 32.0):
            r = rdp.renyi_budget(alpha, epsilon, delta)
            assert r > 0
            eps, order = compute_epsilon([alpha], [r], delta)
            assert eps == pytest.approx(epsilon, rel=1e-12) and order == alpha
    # an order too small for (1, 1e-5/2): no budget is left after the conversion, and no rule
    assert rdp.renyi_budget(4.0, 1.0, 1e-5 / 2) <= 0
    assert rdp.build(4.0, 1.0, 1e-5) is None


def test_bernoulli_renyi_is_the_textbook_formula():
    rng = np.random.default_rng(7)
    p1, p0 = rng.uniform(0.01, 0.99, 200), rng.uniform(0.01, 0.99, 200)
    for alpha in (2.0, 5.5, 16.0):
        want = np.log(p1 ** alpha * p0 ** (1 - alpha) + (1 - p1) ** alpha * (1 - p0) ** (1 - alpha)) / (alpha - 1)
        got = rdp.bernoulli_renyi(np.log(p1), np.log1p(-p1), np.log(p0), np.log1p(-p0), alpha)
        np.testing.assert_allclose(got, want, rtol=1e-10)


def test_the_rule_keeps_its_constraint_at_every_pair_of_grid_points(rules):
    for (epsilon, delta), rule in rules.items():
        p = rule.p
        assert np.all(np.diff(p) >= 0) and p[-1] < 1.0
        assert np.all(p[rule.c <= 1.0 + 1e-12] == delta / 2.0 / rdp.MAX_ITEMS)
        n = int(round(1.0 / STEP))
        for lag in range(1, n + 1):
            d = rdp._both(p[lag:], p[:-lag], rule.alpha)
            assert np.all(d <= rule.budget * (lag * STEP) ** 2 * (1 + 1e-9)), (epsilon, lag)


def test_between_the_grid_points_the_script_s_step_holds_to_a_thousandth():
    # linear interpolation keeps the constraint only up to the grid's curvature: the script reports the
    # largest ratio it sees; at its step it must not change the comparison (a thousandth of the budget)
    for epsilon, delta in SETTINGS:
        rule = rdp.build(12, epsilon, delta)
        assert rdp.worst_ratio(rule, samples=20_000) <= 1.001, (epsilon, delta)


def test_a_greedy_step_could_not_be_larger(rules):
    # pointwise largest: raising any value above the first floor step breaks a constraint with its past
    rule = rules[SETTINGS[0]]
    n = int(round(1.0 / STEP))
    for k in range(n + 1, len(rule.p) - 1, 37):
        bigger = rule.p[k] + 1e-6 * (1 - rule.p[k])
        lags = np.arange(1, n + 1)
        d = rdp._both(bigger, rule.p[k - lags], rule.alpha)
        assert np.any(d > rule.budget * (lags * STEP) ** 2), k


def test_novel_items_are_kept_with_probability_at_most_half_delta(rules):
    for (epsilon, delta), rule in rules.items():
        for t in (1, 2, 7, 50, rdp.MAX_ITEMS):
            weights = np.full(t, 1.0 / math.sqrt(t))  # a new user's t items, each held by it alone
            assert 1.0 - np.prod(1.0 - rule(weights)) <= delta / 2.0 * (1 + 1e-12)


def test_the_keep_decision_moves_by_at_most_the_budget_on_random_neighbours(rules):
    # D = random weight sums; D' = D plus one user's l2-bounded vector on some of its items. The keep
    # decisions are independent per item, so the Renyi divergence of the whole output is the sum.
    rng = np.random.default_rng(33)
    for (epsilon, delta), rule in rules.items():
        worst = 0.0
        for _ in range(300):
            sums = rng.gamma(2.0, rng.uniform(1, 15), 400)
            t = int(rng.integers(1, 60))
            idx = rng.choice(len(sums), t, replace=False)
            x = rng.random(t) ** rng.uniform(0.2, 3)
            x /= np.linalg.norm(x) / rng.uniform(0.5, 1.0)
            after = sums.copy()
            after[idx] += x
            p0, p1 = rule(sums[idx]), rule(after[idx])
            worst = max(worst, float(rdp._both(p1, p0, rule.alpha).sum()) / rule.budget)
        assert worst <= 1.01, (epsilon, worst)


def test_gaussian_keep_is_basic_threshold_rule():
    from dpsql.union.basic import weighted_gaussian_calibration

    for epsilon, delta in SETTINGS:
        cal = weighted_gaussian_calibration(epsilon, delta, rdp.MAX_ITEMS)
        assert rdp.gaussian_keep([cal.threshold], epsilon, delta)[0] == pytest.approx(0.5)
        assert rdp.gaussian_where(0.5, epsilon, delta) == pytest.approx(cal.threshold)
        rng = np.random.default_rng(11)  # direct draws of c + N(0, sigma^2) >= rho
        c = np.array([cal.threshold - cal.scale, cal.threshold + 0.5 * cal.scale])
        kept = (c[None, :] + rng.normal(0.0, cal.scale, (20_000, 2)) >= cal.threshold).mean(axis=0)
        np.testing.assert_allclose(kept, rdp.gaussian_keep(c, epsilon, delta), atol=5 * 0.5 / math.sqrt(20_000))


def test_weight_sums_cap_each_user_and_weigh_by_one_over_root_degree(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    users = [1, 2, 2, 3, 3, 3, 3, 3]
    items = [10, 10, 11, 10, 11, 12, 13, 13]  # user 3 holds 4 distinct items (13 twice)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"user_id": users, "item": items}), path)
    got = np.sort(rdp.weight_sums(path))
    want = np.sort([1 + 1 / math.sqrt(2) + 1 / 2, 1 / math.sqrt(2) + 1 / 2, 1 / 2, 1 / 2])
    np.testing.assert_allclose(got, want)
    capped = rdp.weight_sums(path, max_items=2)  # user 3 keeps 2 of its 4 items, 1/sqrt(2) each
    assert capped.sum() == pytest.approx(1 + 2 / math.sqrt(2) + 2 / math.sqrt(2))


def test_the_gaussian_accounted_by_renyi_dp_is_calibrated_by_the_same_conversion():
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    for epsilon, delta in SETTINGS:
        sigma = rdp.rdp_gaussian_sigma(epsilon, delta)
        orders = [float(a) for a in rdp.ORDERS]
        eps, _ = compute_epsilon(orders, [a / (2 * sigma ** 2) for a in orders], delta)
        assert eps == pytest.approx(epsilon, rel=1e-9)
        # and never below the exact (analytic) calibration, which the conversion can only lose to
        from dpsql.core.calibration import gaussian_sigma
        assert sigma > gaussian_sigma(epsilon, delta)
