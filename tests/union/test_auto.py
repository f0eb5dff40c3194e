"""auto: a private choice between sips_cumulative and greedy_update (dpsql/union/auto.py, docs/proofs/auto.md).

The calibration's exact numbers, the statistic's sensitivity on random neighbouring tables through the
real SQL, the choice's frequency against the exact discrete Laplace tail (fixed seeds, explicit
tolerances), the gate (the chosen body releases, the other draws no noise) and the validation before
anything is read or charged.
"""
from __future__ import annotations

import json
import math
import random

import pytest

import dpsql
from dpsql.core.errors import DpsqlError
from dpsql.core.registration import source_of
from dpsql.union import auto
from dpsql.union.cumulative import sips_cumulative_set_union_calibration
from dpsql.union.policy import greedy_update_calibration, policy_cutoff

from conftest import seeded
from test_union import load


def _n_releases(con) -> int:
    return con.execute("SELECT count(*) FROM dp_releases()").fetchall()[0][0]


# -- calibration -------------------------------------------------------------------------------------

def test_the_candidates_are_found_by_their_declarations():
    # the default (the most preferred set-union method) and the one method declaring the role few_items;
    # the SQL body asks dp__auto_candidate for the same names while DuckDB binds
    from dpsql import union

    default, few = auto.candidates()
    assert default == union.DEFAULT_METHOD
    assert [m.name for m in union.METHODS.values() if auto.FEW_ITEMS in m.roles] == [few]
    assert (default, few) == ("sips_cumulative", "greedy_update")
    con = dpsql.connect()
    try:
        assert con.execute("SELECT dp__auto_candidate(false), dp__auto_candidate(true)").fetchall() == [(default, few)]
    finally:
        con.close()


def test_calibration_numbers_at_the_defaults():
    c = auto.auto_calibration(1.0, 1e-5, 100)
    assert (c.choice_epsilon, c.scale, c.threshold, c.noise) == (0.01, 100.0, 0.0, "discrete_laplace")
    assert (c.rest_epsilon, c.delta, c.degree_bound) == (0.99, 1e-5, 5)
    assert c.default == sips_cumulative_set_union_calibration(0.99, 1e-5, 100)
    assert c.greedy == greedy_update_calibration(0.99, 1e-5)
    # greedy_update's threshold from its formula, rho = max(1, ln((e^eps - 1) / (2 delta)) / eps)
    assert c.greedy is not None and c.default is not None
    assert c.greedy.threshold == pytest.approx(math.log(math.expm1(0.99) / 2e-5) / 0.99, rel=1e-12)
    assert c.greedy.threshold == pytest.approx(11.4598, abs=1e-4)
    assert c.greedy.scale == pytest.approx(1 / 0.99, rel=1e-15)
    assert c.default.accounting is not None and c.default.accounting.epsilon <= 0.99
    assert c.accounting is None  # not one Gaussian mechanism: dp_group_by / dp_top_k compose it by basic composition


def test_calibration_numbers_with_options():
    c = auto.auto_calibration(2.0, 1e-6, 10, choice_share=0.25, degree_bound=10)
    assert (c.choice_epsilon, c.scale, c.rest_epsilon, c.degree_bound) == (0.5, 2.0, 1.5, 10)
    assert c.default == sips_cumulative_set_union_calibration(1.5, 1e-6, 10)
    assert c.greedy == greedy_update_calibration(1.5, 1e-6)


@pytest.mark.parametrize("epsilon,share", [(1.0, 0.02), (0.7, 0.03), (3.3, 0.5), (1e-3, 0.011), (9.99, 0.123)])
def test_the_macro_runs_the_candidates_at_the_calibrated_budget(mcon, epsilon, share):
    # the body passes `epsilon - choice_share * epsilon` to the candidates: the calibration's value, bit for bit
    [(rest,)] = mcon.execute(f"SELECT CAST('{epsilon!r}' AS DOUBLE) - CAST('{share!r}' AS DOUBLE) "
                             f"* CAST('{epsilon!r}' AS DOUBLE)").fetchall()
    assert rest == auto.auto_calibration(epsilon, 1e-5, 100, share).rest_epsilon


def test_dpsql_calibrate_and_the_ledger_record_the_choice_and_both_candidates():
    assert dpsql.calibrate("auto", epsilon=1.0, delta=1e-5, max_items=100) == auto.auto_calibration(1.0, 1e-5, 100)
    con = seeded(5)
    con.execute(EXAMPLE)
    con.execute("SELECT * FROM dp_set_union_auto('t', 1.0, 1e-5, degree_bound := 3)").fetchall()
    [(mech, eps, delta, params, cal)] = con.execute(
        "SELECT mechanism, epsilon, delta, parameters, calibration FROM dp_releases()").fetchall()
    assert (mech, eps, delta) == ("dp_set_union_auto", 1.0, 1e-5)  # one charge of the whole budget
    cal = json.loads(cal)
    assert (cal["choice_epsilon"], cal["scale"], cal["rest_epsilon"], cal["degree_bound"]) == (0.01, 100.0, 0.99, 3)
    assert cal["greedy"]["threshold"] == greedy_update_calibration(0.99, 1e-5).threshold
    assert cal["default"]["threshold"] == sips_cumulative_set_union_calibration(0.99, 1e-5, 100).threshold
    assert json.loads(params)["choice_share"] == 0.01
    con.close()


# -- the statistic: sensitivity 1, through the real SQL ----------------------------------------------

EXAMPLE = ("CREATE TABLE t AS SELECT u AS user_id, 'i' || j AS item FROM range(300) a(u), range(17) b(j) "
           "WHERE j <= u % 17")


@pytest.fixture(scope="module")
def mcon():
    c = dpsql.connect()
    yield c
    c.close()


def _statistic(con, table: str, bound: int) -> tuple[int, int, int]:
    [row] = con.execute(f"FROM dp__auto_statistic('{table}', {bound})").fetchall()
    return row


def _reference(rows, bound: int) -> int:
    degrees: dict[int, set] = {}
    for u, i in rows:
        degrees.setdefault(u, set()).add(i)
    return sum(1 if len(items) <= bound else -1 for items in degrees.values())


def test_statistic_moves_by_one_on_random_neighbouring_tables(mcon):
    rng = random.Random(33)
    for trial in range(25):
        bound = rng.randint(1, 8)
        rows = []
        for u in range(rng.randint(0, 40)):
            for _ in range(rng.randint(1, 14)):  # repeated rows of an item count once
                rows.append((u, f"i{rng.randint(0, 25)}"))
        extra = [(1000, f"i{rng.randint(0, 40)}") for _ in range(rng.randint(1, 14))]  # the added user
        load(mcon, rows, "dp_auto_d")
        load(mcon, rows + extra, "dp_auto_d2")
        f, users, pairs = _statistic(mcon, "dp_auto_d", bound)
        f2, users2, _ = _statistic(mcon, "dp_auto_d2", bound)
        assert f == _reference(rows, bound) and users == len({u for u, _ in rows}), trial
        assert pairs == len(set(rows))
        assert abs(f2 - f) == 1 and users2 == users + 1, trial  # one user's own term, +-1, nothing else moves
        assert f2 - f == (1 if len({i for _, i in extra}) <= bound else -1)


def test_statistic_of_an_empty_table_is_zero(mcon):
    load(mcon, [], "dp_auto_empty")
    assert _statistic(mcon, "dp_auto_empty", 5) == (0, 0, 0)


# -- the choice's frequency against the exact discrete Laplace tail ----------------------------------

def _p_greedy(f: int, eps0: float) -> float:
    """P[f + Z >= 0], Z ~ DLap with P[Z = z] = (1 - a)/(1 + a) a^|z|, a = e^-eps0."""
    a = math.exp(-eps0)
    return 1 - a ** (f + 1) / (1 + a) if f >= 0 else a ** (-f) / (1 + a)


@pytest.mark.parametrize("light,heavy,seed", [(50, 52, 71), (51, 50, 72)])
def test_choice_frequency_matches_the_discrete_laplace_tail(light, heavy, seed):
    # f = light - heavy (users of 1 item, users of 8 items; degree_bound 5); eps0 = 0.5 * 1.0
    con = seeded(seed)
    load(con, [(u, "a") for u in range(light)] + [(light + u, f"b{j}") for u in range(heavy) for j in range(8)])
    f = light - heavy
    assert _statistic(con, "t", 5)[0] == f
    n = 1500
    picks = sum(con.execute("SELECT greedy FROM dp__auto_choice('t', 1.0, 1e-5, 100, 0.5, 5)").fetchall()[0][0]
                for _ in range(n))
    p = _p_greedy(f, 0.5)
    assert 0.05 < p < 0.95
    # 4.5 binomial standard deviations: a false failure has probability < 1e-5
    assert abs(picks / n - p) <= 4.5 * math.sqrt(p * (1 - p) / n), (picks / n, p)


def test_choice_draws_once_per_query():
    con = seeded(3)
    con.execute(EXAMPLE)
    src = source_of(con)
    before = src.samples_drawn
    con.execute("SELECT * FROM dp__auto_choice('t', 1.0, 1e-5, 100, 0.02, 5)").fetchall()
    assert src.samples_drawn - before == 1


# -- the gate: the chosen body releases, the other reads nothing --------------------------------------

def _light_rows(items: int, per_item: int, start: int = 0):
    """``items`` items each held by ``per_item`` users of one item each."""
    return [(start + k * per_item + u, f"light{k}") for k in range(items) for u in range(per_item)]


def _greedy_light_probability(epsilon: float, delta: float, weight: float) -> float:
    """greedy_update's release probability of an item of weight w: P[rho - w < L <= rho], L ~ Lap(1/eps)."""
    rho = greedy_update_calibration(epsilon, delta).threshold

    def cdf(x: float) -> float:
        return 0.5 * math.exp(epsilon * x) if x < 0 else 1 - 0.5 * math.exp(-epsilon * x)
    return cdf(rho) - cdf(rho - weight)


def test_one_item_users_pick_greedy_update_and_release_as_it_does():
    # 100 items held by 12 one-item users each: f = 1200, P[sips_cumulative] = a^1201/(1+a) < 4e-6 at eps0 = 0.01.
    # Each user fills its one item by 1 (12 < Gamma), so every weight is 12 and greedy_update at 0.99 releases
    # each item independently with probability q = P[rho - 12 < L <= rho] (~0.67); sips_cumulative at 0.99
    # would release almost none (its last running-mean threshold is 21.3, its noise 3.9).
    assert policy_cutoff("greedy_update", 0.99, 1e-5, 1, 3.0) > 12
    q = _greedy_light_probability(0.99, 1e-5, 12.0)
    assert 0.5 < q < 0.8
    released = trials = 0
    for seed in (11, 12, 13):
        con = seeded(seed)
        load(con, _light_rows(100, 12))
        items = [r[0] for r in con.execute("SELECT item FROM dp_set_union_auto('t', 1.0, 1e-5)").fetchall()]
        assert all(i.startswith("light") for i in items)
        released, trials = released + len(items), trials + 100
        con.close()
    assert abs(released / trials - q) <= 4.5 * math.sqrt(q * (1 - q) / trials), (released / trials, q)


def test_many_item_users_pick_sips_cumulative():
    # The same light items plus 2000 users of 8 items each: f = 1200 - 2000 = -800, P[greedy_update] < 2e-4.
    # greedy_update would release each light item with probability q ~ 0.67 (the heavy users hold other items);
    # sips_cumulative gives a weight-12 item at most a few percent.
    q = _greedy_light_probability(0.99, 1e-5, 12.0)
    light = released = 0
    for seed in (21, 22):
        con = seeded(seed)
        load(con, _light_rows(100, 12) + [(10_000 + u, f"heavy{(u * 8 + j) % 400}") for u in range(2000)
                                         for j in range(8)])
        assert _statistic(con, "t", 5)[0] == -800
        items = [r[0] for r in con.execute("SELECT item FROM dp_set_union_auto('t', 1.0, 1e-5)").fetchall()]
        released += sum(i.startswith("light") for i in items)
        light += 100
        con.close()
    assert released / light <= 0.15 < q - 4.5 * math.sqrt(q * (1 - q) / light)


def test_progress_reports_the_same_values_whichever_candidate_runs():
    # A caller listening to the release hears both candidates' steps in either case: the default's rounds
    # (each reported once, whatever the rows) and the few-items kernel's twentieths (reported by a kernel
    # given no rows too), so which values arrive does not show the pick; only their times can.
    from dpsql.core import progress

    heard = {}
    for name, rows in (("few items", _light_rows(100, 12)),
                       ("many items", _light_rows(100, 12) + [(10_000 + u, f"heavy{(u * 8 + j) % 400}")
                                                              for u in range(2000) for j in range(8)])):
        con = seeded(31)
        load(con, rows)
        seen: list[float] = []
        with progress.reporting(source_of(con), seen.append):
            con.execute("SELECT count(*) FROM dp_set_union_auto('t', 1.0, 1e-5)").fetchall()
        con.close()
        heard[name] = sorted(seen)
    twentieths = [k / progress.SHARE_STEPS for k in range(1, progress.SHARE_STEPS + 1)]
    assert all(x in heard["few items"] for x in twentieths)
    assert heard["few items"] == heard["many items"]


def test_the_unchosen_body_draws_no_noise():
    # One-item users (greedy_update is picked): auto draws the choice's one value, greedy_update's draws, and
    # the salts of the empty sips_cumulative body -- no noise of it (it would draw per item and round).
    def drawn(sql: str, setup) -> int:
        con = seeded(40)
        setup(con)
        src = source_of(con)
        before = src.samples_drawn
        con.execute(sql).fetchall()
        out = src.samples_drawn - before
        con.close()
        return out

    def light(con):
        load(con, _light_rows(100, 12))

    def empty(con):
        load(con, [])

    salts_of_empty_default = drawn("SELECT * FROM dp_set_union_sips_cumulative('t', 0.99, 1e-5)", empty)
    greedy = drawn("SELECT * FROM dp_set_union_greedy_update('t', 0.99, 1e-5)", light)
    assert greedy >= 100  # one Laplace draw per item of positive weight
    assert drawn("SELECT * FROM dp_set_union_auto('t', 1.0, 1e-5)", light) == 1 + greedy + salts_of_empty_default


# -- every front end, and validation before anything is read or charged --------------------------------

def test_reachable_from_every_entry_point():
    con = seeded(9)
    con.execute(EXAMPLE)
    for sql in ("SELECT item FROM dp_set_union_auto('t', 1.0, 1e-5)",
                "SELECT item FROM dp_set_union('t', 1.0, 1e-5, method := 'auto')"):
        assert len(con.execute(sql).fetchall()) > 0
    assert dpsql.set_union(con, "t", "auto", epsilon=1.0, delta=1e-5, degree_bound=3).num_rows > 0
    assert _n_releases(con) == 3
    assert "auto" in dpsql.METHODS and dpsql.DEFAULT_METHOD == "sips_cumulative"
    con.close()


@pytest.mark.parametrize("option,value,message", [
    ("choice_share", "0", "choice_share must be a number with 0 < choice_share <= 0.5"),
    ("choice_share", "-0.1", "choice_share must be a number with 0 < choice_share <= 0.5"),
    ("choice_share", "0.51", "choice_share must be a number with 0 < choice_share <= 0.5"),
    ("choice_share", "'inf'::DOUBLE", "choice_share must be a number with 0 < choice_share <= 0.5"),
    ("choice_share", "NULL", "choice_share must not be NULL"),
    ("degree_bound", "0", "degree_bound must be a whole number >= 1"),
    ("degree_bound", "2.5", "degree_bound must be a whole number >= 1"),
    ("degree_bound", "NULL", "degree_bound must not be NULL"),
    ("degree_bound", "101", "degree_bound must be <= max_items"),
])
def test_bad_options_are_refused_before_anything_is_read_or_charged(option, value, message):
    con = seeded(1)
    con.execute(EXAMPLE)
    src = source_of(con)
    before = src.samples_drawn
    with pytest.raises(Exception, match="dpsql: " + message):
        con.execute(f"SELECT * FROM dp_set_union_auto('t', 1.0, 1e-5, {option} := {value})").fetchall()
    assert _n_releases(con) == 0 and src.samples_drawn == before  # nothing charged, nothing drawn
    if value != "NULL" and "inf" not in value:
        with pytest.raises(DpsqlError, match=message):
            dpsql.set_union(con, "t", "auto", epsilon=1.0, delta=1e-5, **{option: float(value)})
    assert _n_releases(con) == 0 and src.samples_drawn == before
    con.close()


def test_a_choice_budget_beyond_the_sampler_picks_the_default_without_reading_the_data():
    # 1/eps0 > 2^32 steps: the sampler cannot draw it, so the pick is sips_cumulative whatever the data (0-DP)
    c = auto.auto_calibration(1e-9, 1e-5, 100, choice_share=0.1)
    assert not c.choice_from_data and c.scale == 1 / (0.1 * 1e-9) > 2.0 ** 32
    assert auto.auto_calibration(1e-8, 1e-5, 100, choice_share=0.5).choice_from_data  # 2e8 steps: drawn
    assert not auto.auto_calibration(1e-200, 1e-15, 100).choice_from_data  # the documented minima
    con = seeded(2)
    load(con, _light_rows(10, 12))  # f = 120: P[greedy_update] ~ 1 if the choice read the data
    src = source_of(con)
    before = src.samples_drawn
    assert con.execute("SELECT greedy FROM dp__auto_choice('t', 1e-9, 1e-5, 100, 0.1, 5)").fetchall() == [(False,)]
    assert src.samples_drawn == before
    con.close()


def test_degree_bound_above_max_items_is_refused_naming_both():
    with pytest.raises(DpsqlError, match="degree_bound must be <= max_items .*degree_bound 6, max_items 5"):
        auto.auto_calibration(1.0, 1e-5, 5, degree_bound=6)
    assert auto.auto_calibration(1.0, 1e-5, 5, degree_bound=5).degree_bound == 5
