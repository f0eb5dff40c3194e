"""Set-union macros: contribution bounding, soundness, calibration end to end, bad input."""
from __future__ import annotations

import itertools
import math
import random
import re
import sys
from collections import Counter

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

import dpsql
from dpsql import union
from dpsql.core import release
from dpsql.core.registration import source_of
from dpsql.core.validation import DPParameterError

from conftest import LockstepPair, seeded

# The independent-update methods of dpsql.union; other families test their own macros.
METHODS = ["count_gaussian", "count_laplace", "weighted_gaussian", "weighted_laplace"]


def load(con, rows, name="t", user_type="BIGINT", item_type="VARCHAR"):
    """Create table ``name`` from (user, item) tuples (through Arrow: executemany is slow)."""
    users = pa.array([r[0] for r in rows], type=pa.int64()) if rows else pa.array([], pa.int64())
    items = pa.array([None if r[1] is None else str(r[1]) for r in rows], type=pa.string())
    staged = pa.table({"u": users, "i": items})  # noqa: F841 (read by DuckDB's replacement scan)
    con.execute(f"CREATE OR REPLACE TABLE {name} AS "
                f"SELECT u::{user_type} AS user_id, i::{item_type} AS item FROM staged")


def random_rows(rng: random.Random, n_users=60, n_items=40, max_deg=30):
    rows = []
    for u in range(n_users):
        deg = rng.randint(1, max_deg)
        items = rng.sample(range(n_items), min(deg, n_items))
        rows += [(u, f"i{i}") for i in items]
    return rows


@pytest.fixture(scope="module")
def lockstep():
    pair = LockstepPair(27182)
    yield pair
    pair.close()


def capped(con, table="t", max_items=5):
    rows = con.execute(
        f"SELECT user_id, item, d FROM dp__capped_user_items('{table}', max_items := {max_items})").fetchall()
    out: dict = {}
    for u, i, d in rows:
        out.setdefault(u, set()).add(i)
        assert d == min(d, max_items)
    return out, rows


# ---------------------------------------------------------------------------
# Contribution bounding (docs/proofs/reference_checks.md B11)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("max_items", [1, 3, 10, 100])
def test_cap_keeps_min_of_degree_and_cap_items_of_each_user(con, max_items):
    rows = random_rows(random.Random(max_items))
    rows += rows[:50]  # duplicate (user, item) rows count once
    load(con, rows)
    per_user, raw = capped(con, max_items=max_items)
    truth: dict = {}
    for u, i in rows:
        truth.setdefault(u, set()).add(i)
    assert set(per_user) == set(truth)
    for u, items in per_user.items():
        assert len(items) == min(len(truth[u]), max_items)
        assert items <= truth[u]
    for u, i, d in raw:
        assert d == len(per_user[u])


def test_cap_of_a_user_depends_only_on_that_users_rows():
    rng = random.Random(5)
    base = random_rows(rng)
    extra = [(999, f"i{i}") for i in range(25)] + [(998, "new")]
    a, b = seeded(42), seeded(42)  # same seed -> same per-query salt
    try:
        load(a, base)
        load(b, base + extra)
        cap_a, _ = capped(a)
        cap_b, _ = capped(b)
    finally:
        a.close()
        b.close()
    assert all(cap_a[u] == cap_b[u] for u in cap_a)


@pytest.mark.slow
def test_cap_is_a_uniform_sample_and_independent_across_users(seeded_con):
    # Two users with the same six items, cap 2: each of the 15 subsets is equally likely,
    # for each user, and the two users' samples are independent (the hash is keyed by user).
    items = [f"x{k}" for k in range(6)]
    load(seeded_con, [(u, i) for u in (1, 2) for i in items])
    runs = 1500
    first, joint_same = Counter(), 0
    for _ in range(runs):
        per_user, _ = capped(seeded_con, max_items=2)
        first[frozenset(per_user[1])] += 1
        joint_same += per_user[1] == per_user[2]
    subsets = [frozenset(c) for c in itertools.combinations(items, 2)]
    assert set(first) == set(subsets)
    observed = [first[s] for s in subsets]
    assert stats.chisquare(observed).pvalue > 1e-3
    # P[same subset] = 1/15 if independent.
    assert abs(joint_same / runs - 1 / 15) < 4 * math.sqrt((1 / 15) * (14 / 15) / runs)


def test_salt_is_fresh_per_query(con):
    load(con, [(1, f"x{k}") for k in range(50)])
    samples = {frozenset(capped(con, max_items=3)[0][1]) for _ in range(10)}
    assert len(samples) > 5
    src = source_of(con)
    before = src.samples_drawn
    capped(con, max_items=3)
    assert src.samples_drawn - before == 1  # one salt per query, not per row


# The CTEs each release stores (DuckDB materialises a CTE that is MATERIALIZED or read more than
# once). On a table larger than memory every stored copy of the (user, item) rows spills to disk
# (benchmarks/README.md, "Out-of-core"). Besides what the generated wrapper stores (the bound
# parameters and their check, one row each; the released items; the one-row charge) and the salt:
# - count/weighted read the capped rows once; dp__capped_user_items stores the distinct pairs and
#   the per-user degrees, which its join reads three times (faster than a window over all pairs);
#   the item weights (one row per item) are stored as well;
# - MAD, DP-SIPS and MAD2R re-read the capped rows, so they store them once, capped by the window
#   (no pairs, no degrees); DP-SIPS adds each round's released items; MAD2R adds round one's noisy
#   weights and the candidates' biases (one row per item) and round two's rows;
# - cumulative DP-SIPS stores each round's running sums (one row per item not yet released), the
#   rows of the items no round has released yet (they shrink from round to round) and its size check
#   (its calibration is written into its rounds as literals);
# - the multi-round methods (DP-SIPS, cumulative DP-SIPS, MAD2R) store their progress reports, one row
#   per round (dpsql.core.progress).
_WRAPPER = {"dp__bound", "dp__checked", "dp__released", "dp__paid"}
_BASIC = _WRAPPER | {"dp__salt", "dp__pairs", "dp__degrees", "dp__weights"}
STORED = {
    "count_gaussian": _BASIC,
    "count_laplace": _BASIC,
    "weighted_gaussian": _BASIC,
    "weighted_laplace": _BASIC,
    "mad": _WRAPPER | {"dp__salt", "dp__mad_rows"},
    "sips": _WRAPPER | {"dp__salt", "dp__s_rows", "dp__s_r1", "dp__s_r2", "dp__s_r3", "dp__s_r4", "dp__s_r5",
                        "dp__s_progress"},
    # the default seven rounds store the rows kept for rounds 2..7 (by the users' ids, dp__sc_uid); the
    # chain's eighth round reads nothing (its rows are pruned, its filter is false) and stores an empty table
    "sips_cumulative": _WRAPPER | {"dp__salt", "dp__sc_rows", "dp__sc_uid", "dp__sc_size",
                                  "dp__sc_progress"}
    | {f"dp__sc_z{r}" for r in range(1, 9)} | {f"dp__sc_k{r}" for r in range(1, 7)},
    "mad2r": _WRAPPER | {"dp__salt", "dp__m2_rows", "dp__m2_noisy1", "dp__m2_items2", "dp__m2_rows2",
                         "dp__m2_progress"},
}


@pytest.mark.parametrize("method", sorted(STORED))
def test_release_stores_only_what_it_rereads(con, method):
    load(con, random_rows(random.Random(3)))
    plan = "\n".join(r[1] for r in con.execute(
        f"EXPLAIN SELECT count(*) FROM dp_set_union('t', method := '{method}', epsilon := 1.0, delta := 1e-5)").fetchall())
    assert set(re.findall(r"CTE Name: (\w+)", plan)) == STORED[method]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), max_items=st.integers(1, 12))
def test_window_cap_keeps_the_same_rows_as_the_join_cap(lockstep, seed, max_items):
    # Two connections in step draw the same salt for their next query.
    rows = random_rows(random.Random(seed), n_users=25, n_items=30, max_deg=20)
    kept = []
    for con, macro in zip(lockstep.get(), ("dp__capped_user_items", "dp__capped_user_items_window")):
        load(con, rows)
        kept.append(con.execute(f"SELECT user_id, item, d FROM {macro}('t', max_items := {max_items}) "
                                "ORDER BY ALL").fetchall())
    assert kept[0] == kept[1]
    assert len(kept[0]) == sum(min(d, max_items) for d in Counter(u for u, _ in set(rows)).values())


# ---------------------------------------------------------------------------
# Pre-noise weights: sensitivity on random neighbouring datasets (docs/proofs/reference_checks.md B1)
# ---------------------------------------------------------------------------

def weights(con, weighting, max_items, table="t"):
    return dict(con.execute(
        f"SELECT item, w FROM dp__set_union_weights('{table}', '{weighting}', max_items := {max_items})").fetchall())


def diff(w1, w2):
    keys = set(w1) | set(w2)
    return np.array([w2.get(k, 0.0) - w1.get(k, 0.0) for k in keys])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10 ** 6), new_deg=st.integers(1, 40), max_items=st.integers(1, 20),
       novel=st.integers(0, 10))
def test_neighbour_sensitivity_of_weights(lockstep, seed, new_deg, max_items, novel):
    rng = random.Random(seed)
    base = random_rows(rng, n_users=rng.randint(1, 30))
    items = [f"i{i}" for i in rng.sample(range(40), min(new_deg, 40))] + [f"novel{k}" for k in range(novel)]
    extra = [(10 ** 6, i) for i in items]
    a, b = lockstep.get()  # each query on a draws the same salt as the matching query on b
    load(a, base)
    load(b, base + extra)
    k = min(len(items), max_items)
    for weighting in ("count", "inverse", "inverse_sqrt"):
        d = diff(weights(a, weighting, max_items), weights(b, weighting, max_items))
        assert np.all(d >= -1e-12)  # adding a user never lowers a weight
        assert np.count_nonzero(np.abs(d) > 1e-12) == k
        if weighting == "count":
            assert np.abs(d).sum() == pytest.approx(k)            # l1 = cap (Count baselines)
        elif weighting == "inverse":
            assert np.abs(d).sum() == pytest.approx(1.0)          # l1 = 1 (Weighted Laplace)
        else:
            assert np.sqrt((d ** 2).sum()) == pytest.approx(1.0)  # l2 = 1 (Weighted Gaussian)
    # Novel items get at most h(t) with t the number of novel items kept.
    wb = weights(b, "inverse_sqrt", max_items)
    kept_novel = [v for kk, v in wb.items() if kk.startswith("novel")]
    for v in kept_novel:
        assert v <= 1 / math.sqrt(len(kept_novel)) + 1e-12


# ---------------------------------------------------------------------------
# Releases
# ---------------------------------------------------------------------------

def released(con, method, table="t", **params):
    params = {"epsilon": 1.0, "delta": 1e-5, **params}
    args = "".join(f", {k} := {v!r}" for k, v in params.items())
    return [r[0] for r in con.execute(f"SELECT * FROM dp_set_union_{method}('{table}'{args})").fetchall()]


@pytest.mark.parametrize("method", METHODS)
def test_soundness_released_items_are_in_the_capped_input(method):
    rng = random.Random(11)
    rows = random_rows(rng, n_users=400, n_items=30, max_deg=25)
    rows += [(u, f"rare{u}") for u in range(400)]  # singletons: never in the released set w.h.p.
    a, b = seeded(3), seeded(3)
    try:
        load(a, rows)
        load(b, rows)
        cap_items = {i for items in capped(a, max_items=5)[0].values() for i in items}
        out = released(b, method, epsilon=50.0, max_items=5)
    finally:
        a.close()
        b.close()
    assert len(out) == len(set(out)) > 0
    assert set(out) <= cap_items
    assert set(out) <= {i for _, i in rows}


@pytest.mark.parametrize("item_type, value", [("BIGINT", 7), ("VARCHAR", "seven"), ("DATE", "2024-01-02"),
                                               ("DECIMAL(18,6)", 1.5)])
def test_output_is_one_item_column_of_the_input_type(con, item_type, value):
    load(con, [(u, value) for u in range(200)], item_type=item_type)
    rel = con.sql("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := 5.0, delta := 1e-5)")
    assert rel.columns == ["item"]
    assert str(rel.types[0]) == item_type
    assert len(rel.fetchall()) == 1


def test_custom_column_names_and_identifier_forms(con):
    con.execute("CREATE TABLE ev AS SELECT (i % 300) AS \"Person\", 'w' || (i % 3) AS word, i AS other "
                "FROM range(3000) r(i)")
    for tbl in ("'ev'", "'EV'", """'"memory"."main"."ev"'""", "'main.ev'"):
        out = con.execute(f"SELECT item FROM dp_set_union_weighted_gaussian({tbl}, epsilon := 5.0, "
                          "delta := 1e-5, user_col := 'person', item_col := 'WORD')").fetchall()
        assert sorted(r[0] for r in out) == ["w0", "w1", "w2"]
    # The table is named by a string: the ledger records that name. A bare identifier is refused by
    # the binder (it would be a column reference), before anything is read or charged.
    for tbl in ("ev", '"memory"."main"."ev"'):
        with pytest.raises(duckdb.BinderException):
            con.execute(f"SELECT item FROM dp_set_union_weighted_gaussian({tbl}, epsilon := 1.0, delta := 1e-5)").fetchall()


@pytest.mark.parametrize("method", METHODS)
def test_empty_input_returns_empty_result(con, method):
    load(con, [])
    assert released(con, method) == []
    assert con.execute(f"SELECT * FROM dp_set_union('t', method := '{method}', epsilon := 1.0, delta := 1e-5)").fetchall() == []


def test_views_work_and_python_api_matches_sql():
    rows = random_rows(random.Random(2), n_users=300, n_items=20)
    a, b = seeded(9), seeded(9)
    try:
        for c in (a, b):
            load(c, rows, name="raw")
            c.execute("CREATE VIEW v AS SELECT user_id AS uid, item AS thing FROM raw")
        sql = sorted(r[0] for r in a.execute(
            "SELECT * FROM dp_set_union_weighted_laplace('v', epsilon := 4.0, delta := 1e-5, user_col := 'uid', "
            "item_col := 'thing')").fetchall())
        py = dpsql.set_union(b, "v", "weighted_laplace", epsilon=4.0, delta=1e-5, user_col="uid", item_col="thing")
    finally:
        a.close()
        b.close()
    assert isinstance(py, pa.Table) and py.column_names == ["item"]
    assert sorted(py.column("item").to_pylist()) == sql
    assert sql  # something was released


def test_python_api_reports_progress(con):
    load(con, random_rows(random.Random(1)))
    seen = []
    dpsql.set_union(con, "t", epsilon=1.0, delta=1e-5, progress=seen.append)
    assert seen and seen[-1] == 100.0


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_release_probability_matches_calibration(method):
    # Every user holds exactly 4 items and max_items = 4, so an item held by c users has the
    # known weight c * f(4) (f = 1, 1/4 or 1/2). Its release probability must equal
    # Pr[w + noise > threshold] for the method's noise and threshold.
    eps, delta, cap = 1.0, 1e-5, 4
    c_cal = union.calibrate(method, epsilon=eps, delta=delta, max_items=cap)
    per_user = {"count_laplace": 1.0, "count_gaussian": 1.0, "weighted_laplace": 0.25, "weighted_gaussian": 0.5}[method]
    # Choose user counts so the weights sweep the threshold region.
    noise_sd = c_cal.scale * (math.sqrt(2) if c_cal.noise == "laplace" else 1.0)
    targets = [c_cal.threshold + k * noise_sd for k in (-1.5, -0.5, 0.0, 0.5, 1.5)]
    counts = [max(1, round(t / per_user)) for t in targets]
    rows = degree_four_rows(counts)
    # 300 independent trials: one release over 300 disjoint copies of the data (users and items renamed per
    # copy). Every item's noise is its own draw and no user is capped (degree 4 = max_items), so the copies
    # are independent trials, as the audit's replicas (dpsql.tools.audit).
    runs = 300
    n_users = max(u for u, _ in rows) + 1
    copies = [(u + k * n_users, f"{i}_c{k}") for k in range(runs) for u, i in rows]
    con = seeded(1000 + METHODS.index(method))
    try:
        load(con, copies)
        hits = Counter(x.split("_")[0] for x in released(con, method, epsilon=eps, delta=delta, max_items=cap)
                       if x.startswith("item"))
    finally:
        con.close()
    for idx, c in enumerate(counts):
        gap = c_cal.threshold - c * per_user
        if c_cal.noise == "gaussian":
            p = stats.norm.sf(gap / c_cal.scale)
        else:
            p = stats.laplace.sf(gap / c_cal.scale)
        observed = hits[f"item{idx}"] / runs
        assert abs(observed - p) <= 4.5 * math.sqrt(p * (1 - p) / runs) + 1e-9, (idx, c, p, observed)


# ---------------------------------------------------------------------------
# The dispatcher
# ---------------------------------------------------------------------------

def degree_four_rows(counts):
    """Users of degree exactly 4: item k is held by counts[k] users, the rest are fillers."""
    rows, uid = [], 0
    for k, c in enumerate(counts):
        for _ in range(c):
            rows += [(uid, f"item{k}")] + [(uid, f"filler{uid}_{j}") for j in range(3)]
            uid += 1
    return rows


@pytest.mark.parametrize("method", METHODS)
def test_dispatcher_runs_only_the_chosen_method(seeded_con, method):
    # At a huge epsilon the noise is negligible next to the gaps between weights and
    # thresholds (all >= 0.25 here), so each method's release is deterministic and the
    # methods differ: count releases c >= 2, 1/sqrt(d) c >= 3, 1/d c >= 5.
    load(seeded_con, degree_four_rows(range(1, 9)))
    n_items = seeded_con.execute(
        "SELECT count(*) FROM dp__set_union_weights('t', 'count', max_items := 10)").fetchall()[0][0]
    src = source_of(seeded_con)
    before = src.samples_drawn
    via_dispatch = sorted(r[0] for r in seeded_con.execute(
        f"SELECT * FROM dp_set_union('t', method := '{method}', epsilon := 1e4, delta := 1e-5, max_items := 10)").fetchall())
    draws = src.samples_drawn - before
    # One salt for the cap plus one noise value per distinct item: the other branches drew nothing.
    assert draws == n_items + 1
    direct = sorted(released(seeded_con, method, epsilon=1e4, max_items=10))
    smallest = {"count_laplace": 2, "count_gaussian": 2, "weighted_gaussian": 3, "weighted_laplace": 5}[method]
    assert via_dispatch == direct == [f"item{k}" for k in range(smallest - 1, 8)]


@pytest.mark.parametrize("value", [1.0, 0.1, 1 / 3, 1e-5, 2.0 ** -1074, 1.7976931348623157e308, -0.0,
                                   math.inf, -math.inf, 123456789.12345679, None])
def test_dispatcher_renders_each_double_as_a_literal_that_reads_back_exactly(con, value):
    # dp__body_set_union runs the chosen body from SQL text (query()): every bound value must reach the body
    # bit for bit, as the wrapper's check and the ledger saw it
    (back,), = con.execute("SELECT " + release.sql_value("epsilon", value, "DOUBLE")).fetchall()
    if value is None:
        assert back is None
    else:
        assert math.copysign(1.0, back) == math.copysign(1.0, value) and back == value
    nan = con.execute("SELECT " + release.sql_value("epsilon", math.nan, "DOUBLE")).fetchall()[0][0]
    assert math.isnan(nan)


@pytest.mark.parametrize("text", ["t", "it's", "x'); DROP TABLE t; --", "a\\'b", "nul\x00byte", "ítem☃", "''", " "])
def test_dispatcher_renders_each_string_as_a_literal_that_reads_back_exactly(con, text):
    (back,), = con.execute("SELECT " + release.sql_value("tbl", text, "VARCHAR")).fetchall()
    assert back == text


@pytest.mark.parametrize("param", ["tbl", "user_col", "item_col"])
def test_dispatcher_keeps_names_as_data_never_sql(con, param):
    # a name that would end the literal and run SQL is one (missing) table or column name, named in the error
    load(con, [(u, "a") for u in range(50)])
    hostile = "x'); DROP TABLE t; --"
    args = {"tbl": "'t'", "user_col": "'user_id'", "item_col": "'item'"}
    args[param] = "'" + hostile.replace("'", "''") + "'"
    for call in (f"dp_set_union({args['tbl']}, epsilon := 1.0, delta := 1e-5, method := 'weighted_gaussian', "
                 f"user_col := {args['user_col']}, item_col := {args['item_col']})",
                 f"dp_top_k({args['tbl']}, 2, epsilon := 1.0, delta := 1e-5, user_col := {args['user_col']}, "
                 f"item_col := {args['item_col']})"):
        with pytest.raises(duckdb.Error, match=re.escape(hostile)):
            con.execute(f"SELECT * FROM {call}").fetchall()
    assert con.execute("SELECT count(*) FROM t").fetchall() == [(50,)]
    assert con.execute("SELECT count(*) FROM dp_releases()").fetchall() == [(0,)]


def test_dispatcher_refuses_an_unknown_method_while_binding(con):
    # the error names the parameter and the valid choices; no row is read (a table that fails when read)
    con.execute("CREATE TABLE t AS SELECT 1 AS user_id, 'a' AS item")
    con.execute("CREATE VIEW boom AS SELECT user_id, CASE WHEN user_id > 0 THEN error('read') END AS item FROM t")
    for call in ("dp_set_union('boom', epsilon := 1.0, delta := 1e-5, method := 'nope')",
                 "dp_top_k('boom', 2, epsilon := 1.0, delta := 1e-5, domain_method := 'nope')",
                 "dp_group_by('boom', epsilon := 1.0, delta := 1e-5, selection := 'nope')",
                 "dp__body_set_union('boom', 1.0, 1e-5, method := 'nope')"):
        with pytest.raises(duckdb.Error, match="method must be one of .*weighted_gaussian"):
            con.execute(f"SELECT * FROM {call}").fetchall()


def test_dispatcher_default_method_is_the_registry_default(seeded_con):
    load(seeded_con, random_rows(random.Random(8)))
    src = source_of(seeded_con)
    before = src.samples_drawn
    seeded_con.execute("SELECT * FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert src.samples_drawn - before > 0
    assert union.DEFAULT_METHOD in dpsql.METHODS


# ---------------------------------------------------------------------------
# Bad input: a clear error, and nothing released
# ---------------------------------------------------------------------------

BAD_SQL = [
    ("dp_set_union_weighted_gaussian('t', epsilon := 0, delta := 1e-5)", "epsilon"),
    ("dp_set_union_weighted_gaussian('t', epsilon := -1, delta := 1e-5)", "epsilon"),
    ("dp_set_union_weighted_gaussian('t', epsilon := 'inf'::DOUBLE, delta := 1e-5)", "epsilon"),
    ("dp_set_union_weighted_gaussian('t', epsilon := 'nan'::DOUBLE, delta := 1e-5)", "epsilon"),
    ("dp_set_union_weighted_gaussian('t', epsilon := NULL, delta := 1e-5)", "epsilon"),
    ("dp_set_union_count_laplace('t', epsilon := 1.0, delta := 0)", "delta"),
    ("dp_set_union_count_gaussian('t', epsilon := 1.0, delta := 1)", "delta"),
    ("dp_set_union_weighted_laplace('t', epsilon := 1.0, delta := 1.5)", "delta"),
    ("dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := 0)", "max_items"),
    ("dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := 2.5)", "max_items"),
    ("dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := NULL)", "max_items"),
    ("dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, user_col := 'item')", "different columns"),
    ("dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, user_col := 'nope')", "dpsql: user_col := 'nope' is not a column of 't'"),
    ("dp_set_union_weighted_gaussian('t', epsilon := 'abc', delta := 1e-5)", "does not support the supplied arguments"),
    ("dp_set_union_weighted_gaussian(['t', 't'], epsilon := 1.0, delta := 1e-5)", "does not support the supplied arguments"),
    ("dp_set_union_weighted_gaussian('missing_table', epsilon := 1.0, delta := 1e-5)", "does not exist"),
    ("dp_set_union('t', epsilon := 1.0, delta := 1e-5, method := 'nope')", "method must be one of"),
]


@pytest.mark.parametrize("call, msg", BAD_SQL)
@pytest.mark.parametrize("empty", [False, True])
def test_bad_sql_input_fails_clearly(con, call, msg, empty):
    load(con, [] if empty else [(u, "a") for u in range(500)])
    with pytest.raises(Exception, match=msg):
        con.execute(f"SELECT * FROM {call}").fetchall()


@pytest.mark.parametrize("bad_row, col", [((None, "a"), "user_col"), ((1, None), "item_col")])
def test_null_users_and_items_are_errors(con, bad_row, col):
    load(con, [(u, "a") for u in range(500)] + [bad_row])
    for method in METHODS:
        with pytest.raises(Exception, match=f"contains NULL.*{col}|{col}.*contains NULL"):
            released(con, method)


BAD_PY = [
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=float("nan")), "epsilon"),
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(max_items=0), "max_items"),
    (dict(max_items=1.5), "max_items"),
    (dict(method="nope"), "method"),
    (dict(user_col="nope"), "user_col"),
    (dict(item_col="nope"), "item_col"),
    (dict(user_col="item"), "different columns"),
    (dict(table=["t", "t"]), "not a list"),
    (dict(table="missing"), "does not exist"),
]


def test_python_set_union_validates_by_the_declaration_and_calibrates_only_in_the_macro(con, monkeypatch):
    # dpsql.set_union checks its parameters by the declaration and runs the macro, whose checks calibrate:
    # Python does not calibrate the release a second time
    load(con, [(u, "a") for u in range(500)])
    callers = []
    original = union.calibrate

    def spy(*args, **kwargs):
        callers.append(sys._getframe(1).f_code.co_name)
        return original(*args, **kwargs)

    monkeypatch.setattr(union, "calibrate", spy)
    assert dpsql.set_union(con, "t", "weighted_gaussian", epsilon=1.0, delta=1e-5).column_names == ["item"]
    assert callers and "set_union" not in callers, callers  # the macro's calibration UDF did calibrate


@pytest.mark.parametrize("kwargs, msg", BAD_PY)
def test_bad_python_input_fails_before_any_draw(con, kwargs, msg):
    load(con, [(u, "a") for u in range(500)])
    src = source_of(con)
    before = src.samples_drawn
    args = dict(table="t", epsilon=1.0, delta=1e-5)
    args.update(kwargs)
    table = args.pop("table")
    with pytest.raises(DPParameterError, match=msg):
        dpsql.set_union(con, table, **args)
    assert src.samples_drawn == before
