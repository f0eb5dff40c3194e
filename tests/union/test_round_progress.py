"""The rounds the multi-round set-union methods report while they run (dpsql.core.progress).

DuckDB's own query progress stays at 0 % for a whole release, so a progress callback saw nothing
until 100 % (cumulative DP-SIPS, MAD2R). The macros now report each round done, ``r / R``, from
inside the statement: exactly once a round, in order, whatever the data (a round with nothing left
to measure is reported too), and nothing else.
"""
from __future__ import annotations

import random
from fractions import Fraction

import pytest

import dpsql
from dpsql.core import progress
from dpsql.core.registration import source_of

from conftest import seeded

SEED = 20261128


def _table(con, n_users: int, n_items: int, seed: int, name: str = "t") -> None:
    rng = random.Random(seed)
    rows = [(u, f"i{j}") for u in range(n_users) for j in rng.sample(range(n_items), rng.randint(1, 4))]
    con.execute(f"CREATE OR REPLACE TABLE {name}(user_id INTEGER, item VARCHAR)")
    con.executemany(f"INSERT INTO {name} VALUES (?, ?)", rows)


def _reports(con, call: str) -> list[float]:
    """The fractions the release ``call`` reports, in the order they came."""
    seen: list[float] = []
    with progress.reporting(source_of(con), seen.append):
        con.execute(f"SELECT count(*) FROM {call}").fetchall()
    return seen


def _rounds(n: int) -> list[float]:
    return [r / n for r in range(1, n + 1)]


@pytest.fixture(scope="module")
def con():
    c = seeded(SEED)
    _table(c, 300, 40, 1)
    # every item held by every user: round one releases all of them, the later rounds have nothing left
    c.execute("CREATE TABLE everyone AS SELECT u AS user_id, 'i' || j AS item FROM range(400) a(u), range(3) b(j)")
    yield c
    c.close()


@pytest.mark.parametrize("call, expected", [
    ("dp_set_union_sips_cumulative('t', 1.0, 1e-5)", _rounds(7)),  # the default split: seven rounds
    ("dp_set_union_sips_cumulative('t', 1.0, 1e-5, split := [0.2, 0.3, 0.5])", _rounds(3)),
    ("dp_set_union_sips_cumulative('t', 1.0, 1e-5, split := [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.2])", _rounds(8)),
    ("dp_set_union_sips_cumulative('t', 1.0, 1e-5, drop_margin := NULL)", _rounds(7)),
    ("dp_set_union_mad2r('t', 1.0, 1e-5)", [0.5]),  # round one of two; the end is the release's
    ("dp_set_union_sips('t', 1.0, 1e-5)", _rounds(2)),
    ("dp_set_union_sips('t', 1.0, 1e-5, split := [0.2, 0.2, 0.2, 0.2, 0.2])", _rounds(5)),
    ("dp_set_union('t', 1.0, 1e-5)", _rounds(7)),  # the dispatcher runs the default method's body
])
def test_each_round_is_reported_once_in_order(con, call, expected):
    assert _reports(con, call) == expected


@pytest.mark.parametrize("method, rounds", [("sips_cumulative", 7), ("sips", 2), ("mad2r", 1)])
def test_the_reports_do_not_depend_on_the_data(con, method, rounds):
    # On 'everyone' round one releases every item (weight 400/sqrt(3) each): the later rounds measure nothing,
    # and are reported all the same (whether a round was reported tells nothing about the data).
    call = f"dp_set_union('everyone', 8.0, 1e-5, method := '{method}')"
    released = con.execute(f"SELECT count(*) FROM {call}").fetchall()[0][0]
    assert released == 3
    expected = [0.5] if method == "mad2r" else _rounds(rounds)
    assert _reports(con, call) == expected
    assert _reports(con, call.replace("everyone", "t")) == expected


def test_single_round_methods_report_nothing(con):
    assert _reports(con, "dp_set_union_weighted_gaussian('t', 1.0, 1e-5)") == []
    assert _reports(con, "dp_set_union_mad('t', 1.0, 1e-5)") == []


def test_the_reports_reach_only_the_listening_source(con):
    other = seeded(SEED + 1)
    try:
        _table(other, 50, 10, 2)
        seen: list[float] = []
        with progress.reporting(source_of(con), seen.append):
            other.execute("SELECT count(*) FROM dp_set_union_sips('t', 1.0, 1e-5)").fetchall()
        assert seen == []  # another connection's release: not this listener's
    finally:
        other.close()
    # and after the block, nobody listens: the release runs and reports to no one
    assert progress.listener(source_of(con)) is None
    con.execute("SELECT count(*) FROM dp_set_union_sips('t', 1.0, 1e-5)").fetchall()


def test_a_listener_that_raises_does_not_fail_the_release(con):
    def broken(fraction):
        raise RuntimeError("listener down")

    with progress.reporting(source_of(con), broken):
        rows = con.execute("SELECT count(*) FROM dp_set_union_sips_cumulative('t', 1.0, 1e-5)").fetchall()
    assert rows[0][0] >= 0


def test_the_udf_reports_only_its_constant_arguments(con):
    # dp__progress(step, steps) reports step/steps once per vector it filters, and nothing for a step
    # outside 1..steps (e.g. a pruned eighth round of seven); it is always true.
    seen: list[float] = []
    with progress.reporting(source_of(con), seen.append):
        rows = con.execute("SELECT count(*) FROM range(10) WHERE dp__progress(2, 3)").fetchall()
        none = con.execute("SELECT count(*) FROM range(10) WHERE dp__progress(8, 7) AND dp__progress(0, 7)"
                           ).fetchall()
    assert rows == [(10,)] and none == [(10,)]
    assert seen and {Fraction(x).limit_denominator(10) for x in seen} == {Fraction(2, 3)}


def test_shares_pass_on_only_whole_twentieths(con):
    # The policy kernels know the share of their entries processed, a ratio of counts of the data: only
    # whole twentieths are passed on, every one up to the share reached, each once and in order.
    source = source_of(con)
    assert progress.shares(source) is None  # nobody listens: the kernel reports nothing
    seen: list[float] = []
    with progress.reporting(source, seen.append):
        share = progress.shares(source)
        for value in (0.013, 0.06, 0.061, 0.0999, 0.5, 0.5, 0.97, 1.0):
            share(value)
        release = _reports(con, "dp_set_union_policy_laplace('t', 1.0, 1e-5)")
    assert seen == [k / progress.SHARE_STEPS for k in range(1, progress.SHARE_STEPS + 1)]
    assert release and all(Fraction(v).limit_denominator(1000) * progress.SHARE_STEPS % 1 == 0 for v in release)


@pytest.mark.parametrize("rows", ["SELECT 1 AS user_id, 'a' AS item WHERE false",
                                  "SELECT u AS user_id, 'i' || (u % 7) AS item FROM range(3000) r(u)"])
def test_a_policy_kernel_reports_the_same_twentieths_whatever_its_work(rows):
    # The same twenty values, in order, from a kernel given no rows (auto's unchosen few-items body) and
    # from one given thousands: which values arrive says nothing about the data.
    c = dpsql.connect(seed=3)
    try:
        c.execute(f"CREATE TABLE t AS {rows}")
        seen: list[float] = []
        with progress.reporting(source_of(c), seen.append):
            c.execute("SELECT count(*) FROM dp_set_union_greedy_update('t', 1.0, 1e-5)").fetchall()
    finally:
        c.close()
    assert seen == [k / progress.SHARE_STEPS for k in range(1, progress.SHARE_STEPS + 1)]
