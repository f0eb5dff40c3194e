"""dp_group_by's own selection rules: selection := 'truncated_geometric' and 'post_threshold'
(dpsql.groupby.selection; docs/proofs/truncated_geometric.md, docs/proofs/post_threshold.md).

Exact numbers are recomputed here from the formulas (high-precision decimals, direct sums of the pmfs), the DP
constraints are checked in exact rational arithmetic, the sensitivity on random neighbouring datasets, and the
release frequencies against the exact probabilities with fixed seeds and explicit tolerances."""
from __future__ import annotations

import math
import random
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest

import dpsql
from dpsql import groupby as gb
from dpsql.core import accounting
from dpsql.core.noise import NoiseSource
from dpsql.core.validation import DPParameterError
from dpsql.groupby import selection as rules

from conftest import seeded
from test_group_by import load

getcontext().prec = 60
SETTINGS = [(0.5, 5e-6), (1.0, 1e-5), (0.5 / 3, 5e-6 / 3), (1.5, math.exp(-10) / 2), (0.05, 1e-7)]


def _exp(x: float) -> Fraction:
    """e^x to 60 digits, as a Fraction (its error, < 1e-55 relative, is far below every margin here)."""
    return Fraction(Decimal(x).exp())


def _ideal(epsilon: float, delta: float, n_max: int) -> list[Fraction]:
    """The optimal recursion pi(n) = min(e^eps pi(n-1) + delta, 1 - e^-eps (1 - pi(n-1) - delta), 1) (DVGM22), exactly
    up to the 60-digit e^eps."""
    a, d = _exp(epsilon), Fraction(delta)
    out = [Fraction(0)]
    for _ in range(n_max):
        p = out[-1]
        out.append(min(a * p + d, 1 - (1 - p - d) / a, Fraction(1)))
    return out


# -- the truncated geometric coin: exact numbers -----------------------------------------------------


@pytest.mark.parametrize("epsilon,delta", SETTINGS)
def test_keep_probabilities_are_the_optimal_ones_rounded_down_to_the_grid(epsilon, delta):
    k = rules.keep_numerators(epsilon, delta)
    ideal = _ideal(epsilon, delta, len(k) + 2)
    assert k[0] == 0 and k[-1] == 2 ** 53 and all(x < 2 ** 53 for x in k[:-1])
    assert ideal[len(k) - 2] < 1  # the table ends where the ideal reaches 1 (or one step after)
    for n, kn in enumerate(k):
        p, q = Fraction(kn, 2 ** 53), ideal[n]
        assert p <= q
        # the rounding costs at most ~2^-53 per step, amplified by e^(n eps) in the geometric phase: relative to
        # pi(n) ~ delta e^(n eps)/(e^eps - 1) that is <= ~2^-50 / delta
        assert q - p <= q * Fraction(2 ** -50 / delta) + Fraction(2 ** -50)
    assert ideal[len(k) - 1] == 1 or ideal[len(k)] == 1


@pytest.mark.parametrize("epsilon,delta", SETTINGS)
def test_the_closed_form_is_the_recursion(epsilon, delta):
    ideal = _ideal(epsilon, delta, len(rules.keep_numerators(epsilon, delta)) + 5)
    for n, q in enumerate(ideal):
        assert rules.release_probability(n, epsilon, delta) == pytest.approx(float(q), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("epsilon,delta", SETTINGS)
def test_neighbouring_counts_meet_the_dp_constraints_exactly(epsilon, delta):
    # n -> n + 1 (a user added to the group; removal is the same pair read backwards): both outcomes, both ways
    p = [Fraction(x, 2 ** 53) for x in rules.keep_numerators(epsilon, delta)] + [Fraction(1)]
    a, d = _exp(epsilon), Fraction(delta)
    for lo, hi in zip(p, p[1:]):
        assert lo <= hi                        # keep: P[n] <= P[n+1] <= e^eps P[n] + delta
        assert hi <= a * lo + d
        assert 1 - lo <= a * (1 - hi) + d      # drop: P[n+1] <= P[n] <= e^eps P[n+1] + delta


def test_reference_numbers():
    # (eps, delta) = (1, 1e-5), split 0.5, max_groups 1: per group (0.5, 5e-6); p(1) = delta rounded down to 2^-53,
    # p(2) = e^0.5 p(1) + delta rounded down
    cal = gb.group_by_calibration(1.0, 1e-5, 10, selection="truncated_geometric", max_groups=1)
    assert (cal.selection_epsilon, cal.selection_delta) == (0.5, 0.5e-5)
    assert (cal.selection_group_epsilon, cal.selection_group_delta, cal.selection_cap) == (0.5, 0.5e-5, 1)
    k = rules.keep_numerators(0.5, 0.5e-5)
    assert k[1] == math.floor(Fraction(0.5e-5) * 2 ** 53)
    assert abs(Fraction(k[2], 2 ** 53) - (_exp(0.5) * Fraction(k[1], 2 ** 53) + Fraction(0.5e-5))) < Fraction(2 ** -52)
    ideal = _ideal(0.5, 0.5e-5, 60)
    full = ideal.index(1)
    # closed form: c = d0/(e^0.5 - 1), pi* = (1 - d0)/(1 + e^0.5), m = 1 + floor(ln(1 + pi*/c)/0.5) = 22,
    # pi(22) = c (e^11 - 1); pi(n) = 1 at the least n with e^(-(n - 22)/2) (1 - pi(22) + c) <= c: n = 45
    assert full == 45 and len(k) - 1 in (full, full + 1)
    # max_groups 3: (eps split / 3, delta split / 3) per group, basic composition over the user's 3 groups
    cal3 = gb.group_by_calibration(1.0, 1e-5, 10, selection="truncated_geometric", max_groups=3)
    assert cal3.selection_group_epsilon == 0.5 / 3 and cal3.selection_group_delta == 0.5e-5 / 3


def test_the_aggregates_compose_by_basic_composition():
    cal = gb.group_by_calibration(1.0, 1e-5, 10, selection="truncated_geometric", max_groups=2)
    assert cal.accounting.accountant == accounting.BASIC
    assert cal.aggregate_delta == pytest.approx(0.5e-5, rel=1e-15)
    assert cal.aggregate_rho == accounting.zcdp_budget(0.5, 0.5e-5)
    assert cal.count_scale == pytest.approx(math.sqrt(2) / math.sqrt(2 * cal.aggregate_rho), rel=1e-12)
    lap = gb.group_by_calibration(1.0, 1e-5, 10, selection="truncated_geometric", max_groups=2, noise="laplace")
    assert (lap.selection_epsilon, lap.selection_delta, lap.aggregate_epsilon) == (0.5, 1e-5, 0.5)


def test_a_table_too_long_is_refused_before_anything_runs():
    with pytest.raises(DPParameterError, match="too small for the truncated geometric"):
        gb.group_by_calibration(0.01, 1e-5, 10, selection="truncated_geometric", max_groups=10 ** 4)


# -- the coin: its draws and its frequency ----------------------------------------------------------------


def test_the_uniforms_are_on_the_2_to_the_minus_53_grid():
    # the keep probability is exactly K_n / 2^53 only if U = k / 2^53 with k uniform on 53 bits
    u = NoiseSource(seed=7).uniform(100_000)
    k = u * 2.0 ** 53
    assert np.all(k == np.floor(k)) and np.all((0 <= u) & (u < 1))
    assert 2.0 ** 52 < k.max() and len(np.unique(k)) == len(k)


def test_the_coin_keeps_with_the_tabled_probability():
    e0, d0 = 0.5, 0.5e-5
    p = rules.keep_probabilities(e0, d0)
    src = NoiseSource(seed=11)
    trials = 40_000
    for n in (18, 22, 25, 30):
        kept = rules.keep(src.uniform(trials), np.full(trials, n), e0, d0)
        sd = math.sqrt(p[n] * (1 - p[n]) / trials)
        assert abs(kept.mean() - p[n]) <= 5 * sd
    assert not rules.keep(src.uniform(1000), np.zeros(1000, dtype=np.int64), e0, d0).any()
    assert rules.keep(src.uniform(1000), np.full(1000, 10 ** 6), e0, d0).all()


def _one_group_per_user(groups: dict[int, int]) -> list[tuple[int, str, float]]:
    """Rows (user, group, value) where ``groups[n]`` groups have n users each, every user in one group only."""
    rows, uid = [], 0
    for n, g in groups.items():
        for j in range(g):
            rows += [(uid + u, f"n{n}_{j:03d}", 0.0) for u in range(n)]
            uid += n
    return rows


def test_the_release_keeps_groups_with_the_tabled_probability():
    # 1500 groups of n users each (one group per user), max_groups 1: each released w.p. p(n) independently
    con = seeded(20261128)
    groups = {18: 500, 21: 500, 24: 500}
    load(con, _one_group_per_user(groups))
    out = dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, selection="truncated_geometric", max_groups=1)
    con.close()
    p = rules.keep_probabilities(0.5, 0.5e-5)
    released = out.column("item").to_pylist()
    for n, g in groups.items():
        k = sum(1 for x in released if x.startswith(f"n{n}_"))
        assert abs(k / g - p[n]) <= 5 * math.sqrt(p[n] * (1 - p[n]) / g)


# -- sensitivity: random neighbouring datasets ------------------------------------------------------------


def _capped_counts(rows, cap: int, seed: int) -> dict[str, int]:
    """The users per group after each keeps <= cap groups (dp__capped_user_items: the truncated geometric's counts),
    on a fresh connection of ``seed`` (the same salt for neighbouring tables)."""
    con = seeded(seed)
    load(con, rows)
    out = dict(con.sql(f"SELECT item, count(*) FROM dp__capped_user_items('t', max_items := {cap}) GROUP BY item")
               .fetchall())
    con.close()
    return out


@pytest.mark.parametrize("trial", range(12))
def test_adding_a_user_moves_at_most_max_groups_counts_by_one(trial):
    rnd = random.Random(trial)
    cap = rnd.choice([1, 2, 3])
    items = [f"x{k}" for k in range(15)]
    rows = [(u, rnd.choice(items), 0.0) for u in range(rnd.randint(5, 60)) for _ in range(rnd.randint(1, 6))]
    added = [(999, rnd.choice(items + ["only_new"]), 0.0) for _ in range(rnd.randint(1, 8))]
    before, after = _capped_counts(rows, cap, 100 + trial), _capped_counts(rows + added, cap, 100 + trial)
    assert set(before) <= set(after)
    moved = {x: after[x] - before.get(x, 0) for x in after if after[x] != before.get(x, 0)}
    assert len(moved) <= cap and all(v == 1 for v in moved.values())


@pytest.mark.parametrize("trial", range(8))
def test_post_threshold_counts_move_by_the_added_user_only(trial):
    # Same seed, same groups on D and D' (the added user holds existing groups): the same salt and the same noise
    # per group, so each released count moves by that group's count change: at most 1, on at most max_groups
    rnd = random.Random(1000 + trial)
    cap = rnd.choice([1, 2, 3])
    items = [f"x{k}" for k in range(8)]
    rows = [(u, rnd.choice(items), 0.0) for u in range(400) for _ in range(rnd.randint(1, 4))]
    added = [(9999, rnd.choice(items), 0.0) for _ in range(rnd.randint(1, 6))]
    counts = []
    for data in (rows, rows + added):
        con = seeded(500 + trial)
        load(con, data)
        out = dpsql.group_by(con, "t", epsilon=2.0, delta=1e-5, selection="post_threshold", max_groups=cap)
        counts.append(dict(zip(out.column("item").to_pylist(), out.column("count").to_pylist())))
        con.close()
    both = set(counts[0]) & set(counts[1])
    assert len(both) >= 6  # ~50 users per group, far above the threshold: (almost) every group released in both
    moved = {x: counts[1][x] - counts[0][x] for x in both if counts[1][x] != counts[0][x]}
    assert len(moved) <= cap and all(v == 1 for v in moved.values())
    assert set(counts[1]) >= set(counts[0])  # counts only grow: a group released on D is released on D'


# -- post_threshold: calibration ----------------------------------------------------------------------


def _dgauss_tail(s: float, m: int) -> float:
    """P[Z >= m], Z ~ N_Z(0, s^2), by direct sums of the pmf (math.fsum)."""
    r = int(60 * s) + 60
    w = [math.exp(-z * z / (2 * s * s)) for z in range(-r, r + 1)]
    return math.fsum(w[r + m:]) / math.fsum(w)


@pytest.mark.parametrize("epsilon,delta,max_groups", [(1.0, 1e-5, 1), (1.0, 1e-5, 3), (3.0, math.exp(-10), 3),
                                                      (0.5, 1e-6, 10)])
def test_post_threshold_gaussian_calibration(epsilon, delta, max_groups):
    cal = gb.group_by_calibration(epsilon, delta, 100, selection="post_threshold", max_groups=max_groups)
    # no selection epsilon; delta * split (0.5) for the threshold event, the rest for the Gaussian
    assert (cal.selection_epsilon, cal.aggregate_epsilon) == (0.0, epsilon)
    assert cal.selection_delta == delta * 0.5 and cal.aggregate_delta == delta - delta * 0.5
    rho = accounting.zcdp_budget(epsilon, delta - delta * 0.5)
    assert cal.aggregate_rho == rho and cal.accounting.accountant == accounting.ZCDP
    assert cal.accounting.delta <= delta and cal.accounting.event_delta == delta * 0.5
    s = math.sqrt(max_groups) / math.sqrt(2 * rho)
    assert cal.count_scale == pytest.approx(s, rel=1e-12) and cal.max_groups == max_groups
    # tau = 1 + m, m the least with 1 - (1 - P[Z >= m])^L0 <= (1 - 1e-9) delta/2
    target = (1 - 1e-9) * delta * 0.5
    m = next(m for m in range(10 ** 5) if 1 - (1 - _dgauss_tail(s, m)) ** max_groups <= target)
    assert cal.selection_threshold == 1.0 + m


@pytest.mark.parametrize("epsilon,delta,max_groups", [(1.0, 1e-5, 1), (1.0, 1e-5, 3)])
def test_post_threshold_laplace_calibration(epsilon, delta, max_groups):
    cal = gb.group_by_calibration(epsilon, delta, 100, selection="post_threshold", max_groups=max_groups,
                                  noise="laplace")
    assert (cal.selection_epsilon, cal.aggregate_epsilon, cal.selection_delta) == (0.0, epsilon, delta)
    b, g = cal.count_scale, cal.count_granularity
    assert b == pytest.approx(max_groups / epsilon, rel=1e-12)  # l1 sensitivity L0, the whole epsilon
    t = b / g
    alpha = math.exp(-1 / t)

    def tail(m):  # P[DLap(t) >= m] summed from the pmf (1 - alpha)/(1 + alpha) alpha^|z|
        return (1 - alpha) / (1 + alpha) * alpha ** m / (1 - alpha)

    target = (1 - 1e-9) * delta
    m0 = int(t * math.log(1 / delta)) - 50 * int(t)  # start below the answer, then walk up
    m = next(m for m in range(max(0, m0), 10 ** 9) if 1 - (1 - tail(m)) ** max_groups <= target)
    assert tail(max(0, m0)) > target
    assert cal.selection_threshold == 1.0 + g * m


def test_post_threshold_measures_the_count_even_when_not_released():
    cal = gb.group_by_calibration(1.0, 1e-5, 10, ["sum"], "v", 0, 5, selection="post_threshold")
    assert [m.name for m in cal.measures] == ["count", "sum"]
    assert cal.measure("count").rho == cal.measure("sum").rho == cal.aggregate_rho / 2


def test_post_threshold_ignores_the_number_released():
    # its count noise selects, so every measurement is calibrated before the selection: L0 = max_groups
    a = gb.group_by_calibration(1.0, 1e-5, 10, selection="post_threshold", max_groups=5)
    b = gb.group_by_calibration(1.0, 1e-5, 10, selection="post_threshold", max_groups=5, groups=2)
    assert a.count_scale == b.count_scale and b.max_groups == 5
    c = gb.group_by_calibration(1.0, 1e-5, 10, selection="truncated_geometric", max_groups=5, groups=2)
    assert c.max_groups == 2  # a selection before the aggregates: L0 = min(max_groups, released)


@pytest.mark.parametrize("kwargs,match", [
    ({"selection": "nope"}, "selection must be one of truncated_geometric, post_threshold"),
    ({"selection": "post_threshold", "pre_threshold": 3}, "pre_threshold > 1 needs selection"),
    ({"selection": "truncated_geometric", "pre_threshold": 3}, "pre_threshold > 1 needs selection"),
])
def test_bad_selections_are_refused(kwargs, match):
    with pytest.raises(DPParameterError, match=match):
        gb.group_by_calibration(1.0, 1e-5, 10, **kwargs)


# -- post_threshold: release frequency and the released count ------------------------------------------------


def test_post_threshold_releases_with_the_exact_probability_and_its_count():
    cal = gb.group_by_calibration(1.0, 1e-5, 10, selection="post_threshold", max_groups=1)
    tau, s = cal.selection_threshold, cal.count_scale
    con = seeded(20261129)
    groups = {int(tau) - 3: 600, int(tau): 600, int(tau) + 4: 600}
    load(con, _one_group_per_user(groups))
    out = dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, max_items=10, selection="post_threshold", max_groups=1)
    con.close()
    items, counts = out.column("item").to_pylist(), out.column("count").to_pylist()
    assert min(counts) >= tau  # the released count is the selecting one (integer noise: no rounding)
    for n, g in groups.items():
        k = sum(1 for x in items if x.startswith(f"n{n}_"))
        p = _dgauss_tail(s, int(tau) - n)  # P[n + Z >= tau]
        assert abs(k / g - p) <= 5 * math.sqrt(p * (1 - p) / g)


@pytest.mark.slow
def test_post_threshold_intervals_cover_far_above_the_threshold():
    # groups far above tau (released w.p. ~1): the released count is n + Z, so count_ci covers at its level
    cal = gb.group_by_calibration(2.0, 1e-5, 10, selection="post_threshold", max_groups=2, confidence=0.9)
    n = int(cal.selection_threshold + 8 * cal.count_scale)
    con = seeded(20261130)
    rows = [(g * 1000 + u, f"g{g:04d}", 0.0) for g in range(1500) for u in range(n)]
    load(con, rows)
    out = dpsql.group_by(con, "t", epsilon=2.0, delta=1e-5, max_items=10, selection="post_threshold", max_groups=2,
                         confidence=0.9)
    con.close()
    assert out.num_rows == 1500
    err = np.array(out.column("count").to_pylist()) - n
    ci = out.column("count_ci")[0].as_py()
    assert ci == cal.count_ci
    covered = float(np.mean(np.abs(err) <= ci))
    assert covered >= 0.9 - 3 * math.sqrt(0.09 / 1500)
    assert np.std(err) == pytest.approx(cal.count_scale, rel=0.06)


# -- the audit cases -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["group_by_truncated_geometric", "group_by_truncated_geometric_l0",
                                  "group_by_post_threshold"])
def test_audit_does_not_refute_the_selection_rules(case):
    from dpsql.tools import audit

    r = audit.audit(case, epsilon=1.0, delta=1e-5, runs=3000, confidence=0.95, seed=5)
    claimed = (1.0, 1e-5) if case == "group_by_post_threshold" else (0.5, 0.5e-5)
    assert (r.claimed_epsilon, r.delta) == claimed
    assert not r.refuted and 0.0 <= r.epsilon_lower_bound <= r.claimed_epsilon


def test_audit_sees_the_truncated_geometric_ratio():
    # max_groups 1: p(n+1)/p(n) ~ e^0.5 in the geometric phase; at 3000 runs the audit finds a bound > 0
    from dpsql.tools import audit

    r = audit.audit("group_by_truncated_geometric", epsilon=1.0, delta=1e-5, runs=3000, confidence=0.95, seed=6)
    assert 0.0 < r.epsilon_lower_bound <= 0.5
