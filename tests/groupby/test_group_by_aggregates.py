"""Private GROUP BY: the aggregates (rows, variance, stddev, median), the post-processing, several grouping
columns, and the sensitivity of every measurement on random neighbouring datasets."""
from __future__ import annotations

import math
import random

import duckdb
import numpy as np
from duckdb.sqltypes import DOUBLE
import pyarrow as pa
import pytest

import dpsql
from dpsql import groupby as gb
from dpsql.core.validation import DPParameterError
from dpsql.frontends import portable

from conftest import seeded
from test_group_by import items_table, load, n_releases, zero_noise

ROWS_SQL = ("CREATE TABLE t AS SELECT u AS user_id, 'i' || j AS item, (u % 7)::DOUBLE AS v, j % 2 AS a, "
            "'x' || (j % 3) AS b FROM range(3000) a(u), range(17) b(j) WHERE j <= u % 17")
EVERY = ["count", "rows", "sum", "mean", "variance", "stddev", "median"]


# -- the released columns and their post-processing --------------------------------------------


def test_every_aggregate_is_a_column_with_its_scale_and_interval():
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    out = con.sql(f"SELECT * FROM dp_group_by('t', epsilon := 1.0, delta := 1e-5, max_items := 10, "
                  f"aggregates := {EVERY!r}, value_col := 'v', lower := 0, upper := 6)").to_arrow_table()
    assert out.column_names == ["item", "count", "count_scale", "count_ci", "rows", "rows_scale", "rows_ci", "sum",
                                "sum_scale", "sum_ci", "mean", "mean_ci", "variance", "variance_ci", "stddev",
                                "stddev_ci", "median", "median_scale", "median_ci"]
    types = {f.name: str(f.type) for f in out.schema}
    assert types["count"] == types["rows"] == "int64"  # integer counts (post-processing)
    rows = out.to_pylist()
    assert len(rows) >= 10
    for r in rows:
        assert r["count"] >= 0 and r["rows"] >= 0 and r["sum"] >= 0  # lower >= 0: a sum is never negative
        assert 0 <= r["mean"] <= 6 and 0 <= r["variance"] <= 9 and 0 <= r["stddev"] <= 3
        assert r["stddev"] == pytest.approx(math.sqrt(r["variance"]), rel=1e-12)
        assert r["stddev_ci"] == pytest.approx(min(3.0, math.sqrt(r["variance_ci"])), rel=1e-12)
        assert 0 <= r["median"] <= 6 and (r["median"] / (6 / 256)) == pytest.approx(round(r["median"] / (6 / 256)))
    cal = gb.group_by_calibration(1.0, 1e-5, 10, EVERY, "v", 0, 6)
    assert {r["count_scale"] for r in rows} == {cal.count_scale}
    assert {r["median_ci"] for r in rows} == {cal.measure("median").ci}
    con.close()


def test_true_values_are_recovered_without_noise():
    # 200 users in 2 of 5 groups each, with 1..3 rows of values; zero noise: count, rows, sum, mean, variance
    # and the median are the exact ones of the users' clamped totals (the median: a best grid point)
    rnd = random.Random(3)
    rows = []
    for u in range(200):
        for g in rnd.sample(range(5), 2):
            for _ in range(rnd.randint(1, 3)):
                rows.append((u, f"g{g}", rnd.choice([0.5, 1.0, 2.5, 4.0, 7.0])))
    con = seeded(8)
    zero_noise(con)
    con.remove_function("dp_gumbel_noise")  # the median: the exponential mechanism's argmax without noise
    con.create_function("dp_gumbel_noise", lambda s: pa.array(np.zeros(len(s))), [DOUBLE], DOUBLE, type="arrow",
                        side_effects=True)
    load(con, rows)
    items_table(con, [f"g{g}" for g in range(5)])
    out = con.sql(f"SELECT * FROM dp_group_by('t', epsilon := 1.0, delta := 1e-5, items_tbl := 'pub', "
                  f"max_items := 2, max_rows := 2, aggregates := {EVERY!r}, value_col := 'v', lower := 0, "
                  f"upper := 6)").to_arrow_table().to_pylist()
    con.close()
    for r in out:
        cells: dict = {}
        for u, g, v in rows:
            if g == r["item"]:
                n, s = cells.get(u, (0, 0.0))
                cells[u] = (n + 1, s + v)
        x = np.array([min(6.0, s) for _, s in cells.values()])
        assert r["count"] == len(cells) and r["rows"] == sum(min(2, n) for n, _ in cells.values())
        assert r["sum"] == pytest.approx(x.sum(), abs=1e-9) and r["mean"] == pytest.approx(x.mean(), rel=1e-12)
        assert r["variance"] == pytest.approx(x.var(), rel=1e-9, abs=1e-9)
        # the median: a grid point of the largest utility -|below - above| of the values snapped to the grid
        snapped = np.round(x / (6 / 256))
        utility = [-abs(np.sum(snapped < j) - np.sum(snapped > j)) for j in range(257)]
        assert utility[round(r["median"] / (6 / 256))] == max(utility)


def test_sums_and_counts_are_clamped_to_what_the_bounds_allow():
    # 30 users, values in [0, 1] around 0.01: noisy sums near 0 would often be negative; with lower >= 0 they are
    # not; with upper <= 0 (the negated values) they are never positive. Counts are integers >= 0.
    rows = [(u, f"g{u % 3}", 0.01) for u in range(30)] + [(u, f"g{u % 3}", -0.01) for u in range(30, 60)]
    con = dpsql.connect()
    load(con, rows)
    con.execute("CREATE VIEW pos AS SELECT * FROM t WHERE v > 0")
    con.execute("CREATE VIEW neg AS SELECT * FROM t WHERE v < 0")
    items_table(con, ["g0", "g1", "g2", "empty"])
    pos = con.sql("SELECT count, sum FROM dp_group_by('pos', epsilon := 0.1, delta := 1e-5, items_tbl := 'pub', "
                  "aggregates := ['count', 'sum'], value_col := 'v', lower := 0, upper := 1000)").fetchall()
    neg = con.sql("SELECT sum FROM dp_group_by('neg', epsilon := 0.1, delta := 1e-5, items_tbl := 'pub', "
                  "aggregates := ['sum'], value_col := 'v', lower := -1000, upper := 0)").fetchall()
    assert all(c >= 0 and isinstance(c, int) and s >= 0 for c, s in pos)
    assert all(s <= 0 for (s,) in neg)
    con.close()


# -- several grouping columns -------------------------------------------------------------------


def test_group_cols_give_one_column_each_named_and_typed_as_in_the_table():
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    out = dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, max_items=10, group_cols=["b", "A"],
                         aggregates=["count", "sum"], value_col="v", lower=0, upper=6)
    # the table's column order, the group first (the rows sorted by it)
    assert out.column_names == ["a", "b", "count", "count_scale", "count_ci", "sum", "sum_scale", "sum_ci"]
    assert (str(out.schema.field("a").type), str(out.schema.field("b").type)) == ("int64", "string")
    keys = list(zip(out.column("a").to_pylist(), out.column("b").to_pylist()))
    assert keys == sorted(keys) and set(keys) <= {(a, f"x{b}") for a in (0, 1) for b in range(3)} and len(keys) >= 5
    assert con.execute("SELECT mechanism, epsilon, delta FROM dp_releases()").fetchall() == [("dp_group_by", 1.0, 1e-5)]
    con.close()


def test_a_group_column_may_be_named_item_and_the_noise_counts_only_the_released_groups():
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    con.execute("CREATE TABLE pub AS SELECT DISTINCT j % 2 AS a, 'i' || j AS item FROM range(3) r(j)")
    out = dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, max_items=10, items_tbl="pub", group_cols=["a", "item"])
    assert out.column_names == ["a", "item", "count", "count_scale", "count_ci"]
    assert list(zip(out.column("a").to_pylist(), out.column("item").to_pylist())) == [(0, "i0"), (0, "i2"), (1, "i1")]
    # 3 groups: no user contributes to more than 3, so the noise is that of L0 = min(10, 3)
    want = gb.group_by_calibration(1.0, 1e-5, 10, selection=None, groups=3)
    assert want.max_groups == 3 and set(out.column("count_scale").to_pylist()) == {want.count_scale}
    con.close()


@pytest.mark.parametrize("method", ["weighted_gaussian", "sips_cumulative", "policy_gaussian", "greedy_update"])
def test_every_kind_of_selection_reads_the_group_keys(method):
    # one-shot, adaptive and sequential methods read the keys through the CTE of their SQL text: they release
    # groups of the 6 (of 2000 to 3000 users each), as tuples of the two columns
    con = seeded(11)
    con.execute(ROWS_SQL)
    out = con.sql(f"SELECT a, b, count FROM dp_group_by('t', epsilon := 2.0, delta := 1e-5, max_items := 10, "
                  f"group_cols := ['a', 'b'], selection := '{method}')").fetchall()
    released = {(a, b) for a, b, _ in out}
    assert released <= {(a, f"x{b}") for a in (0, 1) for b in range(3)} and len(released) >= 4
    assert all(c > 1000 for _, _, c in out)
    con.close()


def test_group_keys_are_values_by_identity():
    # 'A' and 'a' compare equal under NOCASE: as separate groups they keep their own spelling; a DATE and a
    # DECIMAL group column come back with their types
    con = dpsql.connect()
    con.execute("CREATE TABLE s AS SELECT u AS user_id, CASE WHEN u % 2 = 0 THEN 'A' ELSE 'a' END AS k, "
                "DATE '2024-01-01' + (u % 3)::INT AS d, ((u % 2) / 4)::DECIMAL(9,2) AS p FROM range(4000) r(u)")
    con.execute("CREATE VIEW s_nocase AS SELECT user_id, k COLLATE NOCASE AS k, d, p FROM s")
    out = con.sql("SELECT * FROM dp_group_by('s_nocase', epsilon := 1.0, delta := 1e-5, max_items := 3, "
                  "group_cols := ['k', 'd', 'p'])").to_arrow_table()
    assert [f.name for f in out.schema][:3] == ["k", "d", "p"]
    assert (str(out.schema.field("d").type), str(out.schema.field("p").type)) == ("date32[day]", "decimal128(9, 2)")
    groups = {(r["k"], str(r["d"]), str(r["p"])) for r in out.to_pylist()}
    # u even: 'A' and p = 0.00, odd: 'a' and p = 0.25 (u % 2 / 4 = 0.25); d by u % 3: 6 groups of ~667 users
    assert groups == {(k, f"2024-01-0{1 + d}", p) for k, p in (("A", "0.00"), ("a", "0.25")) for d in range(3)}
    con.close()


@pytest.mark.parametrize("setup,call,match", [
    ("CREATE TABLE f AS SELECT u AS user_id, (u % 3)::DOUBLE AS x, 'a' AS k FROM range(50) r(u)",
     "group_cols := ['k', 'x']", r"group_cols := 'x' of 'f' has type DOUBLE, which cannot be a grouping key"),
    ("CREATE TABLE f AS SELECT u AS user_id, CASE WHEN u = 7 THEN NULL ELSE 'a' END AS k FROM range(50) r(u)",
     "group_cols := ['k']", r"a column of group_cols \(k\) contains NULL"),
    ("CREATE TABLE f AS SELECT u AS user_id, 'a' AS k FROM range(50) r(u)",
     "group_cols := ['k', 'nope']", r"group_cols := 'nope' is not a column of 'f'"),
    ("CREATE TABLE f AS SELECT u AS user_id, 'a' AS k FROM range(50) r(u)",
     "group_cols := ['user_id']", r"user_col must not be one of group_cols"),
])
def test_bad_group_columns_fail_before_the_charge(setup, call, match):
    con = dpsql.connect()
    con.execute(setup)
    with pytest.raises(duckdb.Error, match=match) as err:
        con.execute(f"SELECT * FROM dp_group_by('f', epsilon := 1.0, delta := 1e-5, {call})").fetchall()
    assert "secret" not in str(err.value)
    assert n_releases(con) == 0
    con.close()


def test_a_public_list_of_several_columns_gets_a_row_per_listed_group():
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    con.execute("CREATE TABLE pub AS SELECT * FROM (VALUES (0, 'x0'), (1, 'x2'), (7, 'nobody'), (0, 'x0')) v(a, b)")
    for delta in (None, 1e-5):
        out = dpsql.group_by(con, "t", epsilon=1.0, delta=delta, items_tbl="pub", group_cols=["a", "b"],
                             max_items=10)
        assert list(zip(out.column("a").to_pylist(), out.column("b").to_pylist())) == [
            (0, "x0"), (1, "x2"), (7, "nobody")]
    con.execute("CREATE TABLE pub2 AS SELECT a::VARCHAR AS a, b FROM pub")  # another type than t's column a
    with pytest.raises(DPParameterError, match="column a of items_tbl := 'pub2' has type VARCHAR but group_cols"):
        dpsql.group_by(con, "t", epsilon=1.0, items_tbl="pub2", group_cols=["a", "b"])
    assert n_releases(con) == 2
    con.close()


# -- sensitivity on random neighbouring datasets ------------------------------------------------


def _stats(con, rows, groups, cal, salt: int) -> dict:
    """The measurement vectors (n, n_rows, s_steps, q_steps) of the shipped stage dp__stats of dp_group_by (its
    aggregate step dp__group_by_aggregates, which dp_group_by_public shares) on
    ``rows`` (user, group, value) for the public ``groups``, with the cap's salt fixed: the stage's SQL
    (translated to DuckDB's dialect, DuckDB's 64-bit hash for the cap). The translation needs sqlglot (the spark
    extra): without it the full install's run covers this test."""
    pytest.importorskip("sqlglot")
    con.register("r_arrow", pa.table({"user_id": pa.array([r[0] for r in rows], pa.int64()),
                                      "item": pa.array([r[1] for r in rows], pa.string()),
                                      "v": pa.array([r[2] for r in rows], pa.float64())}))
    con.execute("CREATE OR REPLACE TABLE r_rows AS FROM r_arrow")
    con.unregister("r_arrow")
    con.execute("CREATE OR REPLACE TABLE r_sel AS SELECT unnest($1::VARCHAR[]) AS item", [groups])
    con.execute(f"CREATE OR REPLACE TABLE r_salt AS SELECT hash({salt}::BIGINT) AS s")
    row = gb._cal_row(cal)
    con.execute("CREATE OR REPLACE TABLE r_cal AS SELECT " + ", ".join(
        f"{'NULL' if row[k] is None else repr(float(row[k]))}::DOUBLE AS {k}"
        for k in ("lower", "upper", "centre", "max_rows", "sum_granularity", "sumsq_granularity")))
    sql = portable.stage_sql("dp__group_by_aggregates", {"value_rows": "r_rows", "groups": "r_sel",
                                                        "salt": "r_salt", "cal": "r_cal"},
                             {"max_items": cal.max_groups, "max_groups": cal.max_groups}, output="dp__stats",
                             dialect="duckdb").replace("XXHASH64(", "hash(")
    got = {r[0]: r[1:] for r in con.execute(sql).fetchall()}
    return {g: np.array([0 if v is None else v for v in got.get(g, (0, 0, 0, 0))], dtype=np.int64) for g in groups}


@pytest.mark.parametrize("trial", range(8))
def test_adding_one_user_moves_every_measurement_within_its_l2_sensitivity(trial):
    # D' = D + one user (any number of rows, groups and values, some NULL); the same salt: every other user
    # keeps its groups. Each measurement vector moves in at most L0 coordinates, each by at most its bound B
    # in grid steps, so by at most sqrt(L0) B in l2, and the zCDP the calibration spends, sum_m |D_m|^2 /
    # (2 s_m^2) over the Gaussian measurements, is at most the aggregates' rho.
    rnd = random.Random(trial)
    groups = [f"x{k}" for k in range(25)]
    lower, upper = rnd.choice([(0.0, 5.0), (-2.0, 3.0), (1.0, 4.0), (-6.0, -1.0)])
    l0, max_rows = rnd.randint(1, 6), rnd.randint(1, 4)
    rows = [(u, rnd.choice(groups), rnd.choice([None, round(rnd.uniform(-8, 9), 3)]))
            for u in range(rnd.randint(20, 60)) for _ in range(rnd.randint(1, 15))]
    newcomer = [(999, rnd.choice(groups + ["not_listed"]), rnd.choice([None, round(rnd.uniform(-30, 30), 3)]))
                for _ in range(rnd.randint(1, 40))]
    cal = gb.group_by_calibration(1.0, 1e-5, 10, ["rows", "variance"], "v", lower, upper, selection=None,
                                  max_groups=l0, max_rows=max_rows)
    con = duckdb.connect()
    dpsql.register(con)
    salt = rnd.getrandbits(62)
    a, b = _stats(con, rows, groups, cal, salt), _stats(con, rows + newcomer, groups, cal, salt)
    con.close()
    diff = np.array([b[g] - a[g] for g in groups])  # columns: n, n_rows, s_steps, q_steps
    changed = diff[:, 0] != 0
    assert set(diff[:, 0].tolist()) <= {0, 1}
    held = {g for _, g, _ in newcomer if g in groups}
    assert changed.sum() == min(l0, len(held))  # the newcomer counts in min(L0, its groups) groups, once each
    assert np.all(diff[~changed] == 0)  # nothing moves where the newcomer is not kept
    by = {m.name: m for m in cal.measures}
    rho = 0.0
    for col, name in enumerate(("count", "rows", "sum", "sumsq")):
        d = diff[:, col]
        assert np.all(np.abs(d) <= by[name].steps), name
        assert math.sqrt(float(np.sum(d * d))) <= math.sqrt(l0) * by[name].steps, name
        s = by[name].scale / by[name].granularity
        rho += float(np.sum(d * d)) / (2 * s * s)
    assert rho <= cal.aggregate_rho * (1 + 1e-12)  # the four measurements share rho_a


def _utility(con, cells, groups, lower, upper):
    """u(j) of dp__median_utility for ``cells`` (group, value): {group: array over j}."""
    con.register("c_arrow", pa.table({"item": pa.array([c[0] for c in cells], pa.string()),
                                      "v": pa.array([c[1] for c in cells], pa.float64())}))
    con.execute("CREATE OR REPLACE TABLE m_kept AS FROM c_arrow")
    con.unregister("c_arrow")
    con.execute("CREATE OR REPLACE TABLE m_sel AS SELECT unnest($1::VARCHAR[]) AS item", [groups])
    con.execute(f"CREATE OR REPLACE TABLE m_cal AS SELECT {float(lower)}::DOUBLE AS lower, {float(upper)}::DOUBLE "
                f"AS upper, 256.0::DOUBLE AS median_bins, {(upper - lower) / 256}::DOUBLE AS median_step, "
                f"1.0::DOUBLE AS median_scale")
    out: dict = {g: np.zeros(257) for g in groups}
    for g, j, u in con.execute("SELECT item, j, u FROM dp__median_utility('m_kept', 'm_sel', 'm_cal')").fetchall():
        out[g][j] = u
    return out


@pytest.mark.parametrize("trial", range(6))
def test_adding_one_user_moves_the_medians_utility_by_at_most_one_in_each_of_its_groups(trial):
    rnd = random.Random(50 + trial)
    groups = [f"x{k}" for k in range(8)]
    lower, upper = rnd.choice([(0.0, 10.0), (-3.0, 2.0)])
    # the kept cells (one per user and group): D, and D' with the added user's cells in L0 groups
    cells = [(g, rnd.choice([None, round(rnd.uniform(-5, 12), 2)])) for g in groups for _ in range(rnd.randint(0, 30))]
    l0 = rnd.randint(1, 4)
    added = [(g, rnd.choice([None, round(rnd.uniform(-20, 20), 2)])) for g in rnd.sample(groups, l0)]
    con = duckdb.connect()
    dpsql.register(con)
    a, b = _utility(con, cells, groups, lower, upper), _utility(con, cells + added, groups, lower, upper)
    con.close()
    for g in groups:
        d = np.abs(b[g] - a[g])
        assert d.max() <= 1.0
        if g not in {c[0] for c in added}:
            assert d.max() == 0.0
    # and the utility is -|below - above| of the values (NULL as 0) clamped and snapped to the grid
    step = (upper - lower) / 256
    for g in groups:
        snapped = np.array([round((min(upper, max(lower, v or 0.0)) - lower) / step) for h, v in cells if h == g])
        assert list(a[g]) == [-abs(np.sum(snapped < j) - np.sum(snapped > j)) for j in range(257)]
