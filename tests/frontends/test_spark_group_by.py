"""The Spark GROUP BY (dpsql.frontends.spark.group_by) for every aggregate of dp_group_by (count, rows,
sum, mean, variance, stddev, median) and several grouping columns, against DuckDB: the translated
pre-noise stages (the aggregates' cap, the measurements, the median's utility) and the post-processing
give DuckDB's numbers on the same rows, the released columns, types, order and calibration are
dpsql.group_by's, bad parameters and bad input are refused with DuckDB's text, a release is charged
once, and the median's exponential mechanism picks points within its stated utility gap. The session's
Python workers cannot import duckdb or dpsql (dpsql's tasks are shipped by value). Skips when pyspark,
sqlglot or Java is missing (CI requires them: DPSQL_REQUIRE_SPARK=1)."""
from __future__ import annotations

import math
import random

import numpy as np
import pyarrow as pa
import pytest
from duckdb.sqltypes import DOUBLE

import dpsql
from dpsql import groupby as gb
from dpsql.core.state import ledger_of
from dpsql.core.validation import DPParameterError

from conftest import seeded
from spark_testing import java_or_skip, local_session, need, python_without_dpsql
from spark_testing import quiet_spark_warnings  # noqa: F401 (autouse: imported, it applies here)

# one SparkSession (one JVM) at a time beside the other Spark tests
pytestmark = pytest.mark.xdist_group("spark")

EVERY = list(gb.AGGREGATES)
LOWER, UPPER = -1.0, 5.0
MAX_ITEMS = 8  # no user below holds more than 8 groups: no cap, so both engines keep the same cells


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A local session whose Python workers cannot import duckdb or dpsql (as test_spark.py's)."""
    need("pyspark")
    need("sqlglot")
    java_or_skip()
    with local_session("dpsql-group-by-tests",
                       worker_python=python_without_dpsql(tmp_path_factory.mktemp("worker"))) as session:
        yield session


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

def group_rows(seed: int, n_users: int = 60, n_items: int = 6, max_rows: int = 6):
    """(user, item, value, a, b): skewed items, 1..max_rows rows per user, some (user, item) with several rows,
    values partly outside [LOWER, UPPER] and some NULL; a (0/1) and b ('x0'..'x2') two more grouping columns."""
    rng = random.Random(seed)
    rows = []
    for u in range(n_users):
        for _ in range(rng.randint(1, max_rows)):
            k = min(int(rng.expovariate(0.5)), n_items - 1)
            v = None if rng.random() < 0.05 else round(rng.uniform(-3.0, 8.0), 3)
            rows.append((u, f"g{k}", v, (u + k) % 2, f"x{k % 3}"))
    return rows


def table(rows) -> pa.Table:
    return pa.table({"user_id": pa.array([r[0] for r in rows], pa.int64()),
                     "item": pa.array([r[1] for r in rows], pa.string()),
                     "v": pa.array([r[2] for r in rows], pa.float64()),
                     "a": pa.array([r[3] for r in rows], pa.int64()),
                     "b": pa.array([r[4] for r in rows], pa.string())})


def _zero_noise(con):
    """The connection's granular samplers and Gumbel noise as zeros: a release shows its exact measurements
    (the median: the argmax of its utility)."""
    for name in ("dp_granular_laplace_noise", "dp_granular_gaussian_noise"):
        con.remove_function(name)
        con.create_function(name, lambda s, g: pa.array(np.zeros(len(s))), [DOUBLE, DOUBLE], DOUBLE, type="arrow",
                            side_effects=True)
    con.remove_function("dp_gumbel_noise")
    con.create_function("dp_gumbel_noise", lambda s: pa.array(np.zeros(len(s))), [DOUBLE], DOUBLE, type="arrow",
                        side_effects=True)


def _duck(data: pa.Table, listed: pa.Table, seed: int = 5, zero: bool = False, **kwargs) -> pa.Table:
    """dpsql.group_by over the public list ``listed`` (table pub) on a fresh seeded connection."""
    con = seeded(seed)
    try:
        if zero:
            _zero_noise(con)
        con.execute("CREATE TABLE t AS FROM data")
        con.execute("CREATE TABLE pub AS FROM listed")
        return dpsql.group_by(con, "t", items_tbl="pub", **kwargs)
    finally:
        con.close()


# the grouping of a test: one item column, or two group columns given in another order than the table's
GROUPINGS = {"item": dict(), "group_cols": dict(group_cols=["b", "A"])}


def _listed(grouping: str) -> pa.Table:
    if grouping == "item":  # one listed item nobody holds
        return pa.table({"item": pa.array(["g0", "g1", "g2", "g4", "nobody"])})
    return pa.table({"a": pa.array([0, 1, 0, 1, 7], pa.int64()), "b": pa.array(["x0", "x0", "x1", "x2", "x9"])})


def _keys(rows_out, grouping: str) -> list:
    return [r["item"] if grouping == "item" else (r["a"], r["b"]) for r in rows_out]


# ---------------------------------------------------------------------------
# The pre-noise stages and the post-processing: DuckDB's numbers
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_pre_noise_stages_and_post_processing_are_dp_group_by_s(spark, grouping):
    """On the same rows (no user above the cap, so both engines keep every cell), the translated dp__kept,
    dp__stats and dp__median_utility on Spark, then dp__group_by_output on the exact measurements, give
    the rows of DuckDB's dp_group_by with its noise replaced by zeros: every aggregate (to 1e-12)."""
    from dpsql.frontends import spark as dspark

    rows = group_rows(11)
    assert max(len({r[1] for r in rows if r[0] == u}) for u in range(60)) <= MAX_ITEMS
    data, listed = table(rows), _listed(grouping)
    kwargs = dict(epsilon=1.0, delta=1e-5, aggregates=EVERY, value_col="v", lower=LOWER, upper=UPPER,
                  max_items=MAX_ITEMS, max_rows=3, **GROUPINGS[grouping])
    duck = _duck(data, listed, zero=True, **kwargs).to_pylist()
    cal = gb.group_by_calibration(1.0, 1e-5, MAX_ITEMS, EVERY, "v", LOWER, UPPER, None, max_rows=3,
                                  groups=listed.num_rows)
    # Spark: the checked rows and the public groups as group_by reads them, then the stages
    frame = spark.createDataFrame(data)
    keyed = dspark._checked_rows(frame, "user_id", "item", "v", GROUPINGS[grouping].get("group_cols"))
    selected = dspark._public_items(spark.createDataFrame(listed), "item", keyed.schema["item"].dataType,
                                    GROUPINGS[grouping].get("group_cols"))
    kept = dspark.group_by_kept(keyed, selected, MAX_ITEMS, 12345).cache()
    stats = dspark._kept_stats(kept, cal)  # dp__stats of these cells (group_by_stats: of the rows, capped again)
    utility = dspark.median_utility(kept, selected, cal)

    def key(item):
        return item if grouping == "item" else (item["a"], item["b"])

    # the kept cells: every (user, listed group) with its total (NULL when every value is NULL) and rows
    cells: dict = {}
    for u, i, v, a, b in rows:
        k = i if grouping == "item" else (a, b)
        n, s = cells.get((u, k), (0, None))
        cells[(u, k)] = (n + 1, s if v is None else (s or 0.0) + v)
    wanted = set(_keys(listed.to_pylist(), grouping))
    got_kept = {(r["user_id"], key(r["item"])): (r["r"], r["v"]) for r in kept.collect()}
    assert got_kept.keys() == {c for c in cells if c[1] in wanted}
    assert all(got_kept[c][0] == cells[c][0] and got_kept[c][1] == pytest.approx(cells[c][1], abs=1e-9)
               for c in got_kept)
    # the utility over the 257 grid points of every listed group
    u_of: dict = {}
    for r in utility.collect():
        u_of.setdefault(key(r["item"]), {})[r["j"]] = r["u"]
    assert u_of.keys() == wanted and all(sorted(u) == list(range(gb.MEDIAN_BINS + 1)) for u in u_of.values())

    # DuckDB's zero-noise release, row by row: its median is a point of Spark's largest utility, and the
    # exact measurements (median_j: DuckDB's point) through the translated post-processing give its row
    step = (UPPER - LOWER) / gb.MEDIAN_BINS
    by_key = {k: r for k, r in zip(_keys(duck, grouping), duck)}
    assert set(by_key) == wanted
    g_s, g_q = cal.measure("sum").granularity, cal.measure("sumsq").granularity
    exact = {key(r["item"]): r for r in stats.collect()}
    measured = []
    for k, r in by_key.items():
        j = round((r["median"] - LOWER) / step)
        assert u_of[k][j] == max(u_of[k].values()), k
        s = exact.get(k)
        measured.append({"item": k, "n_noisy": float(s["n"]) if s else 0.0,
                         "r_noisy": float(s["n_rows"]) if s else 0.0,
                         "s_noisy": (s["s_steps"] or 0) * g_s if s else 0.0,
                         "q_noisy": (s["q_steps"] or 0) * g_q if s else 0.0, "median_j": j})
    item_type = selected.schema["item"].dataType.simpleString()
    frame = spark.createDataFrame([(m["item"] if grouping == "item" else tuple(m["item"]),
                                    m["n_noisy"], m["r_noisy"], m["s_noisy"], m["q_noisy"], m["median_j"])
                                   for m in measured],
                                  f"item {item_type}, n_noisy double, r_noisy double, s_noisy double, "
                                  f"q_noisy double, median_j bigint")
    out = {key(r["item"]): r.asDict() for r in dspark.group_by_output(frame, cal).collect()}
    columns = dspark._released_columns(dspark.group_by_output(frame, cal).columns, EVERY)
    assert columns == [c for c in duck[0] if c not in ("item", "a", "b")]
    for k, want in by_key.items():
        for c in columns:
            assert out[k][c] == pytest.approx(want[c], rel=1e-12, abs=1e-12) if want[c] is not None \
                else out[k][c] is None, (k, c)
    assert by_key["nobody" if grouping == "item" else (7, "x9")]["count"] == 0  # a listed group nobody holds
    kept.unpersist()


# ---------------------------------------------------------------------------
# Releases: columns, types, order, calibration, one charge
# ---------------------------------------------------------------------------

# a public list without a delta (dp_group_by_public: Laplace at (epsilon, 0)) and with one (dp_group_by with
# items_tbl: Gaussian at (epsilon, delta))
@pytest.mark.parametrize("grouping,delta", [("group_cols", None), ("item", 1e-5)])
def test_release_columns_order_and_calibration_are_dpsql_group_by_s(spark, grouping, delta):
    from dpsql.frontends import spark as dspark

    rows = group_rows(3)
    data, listed = table(rows), _listed(grouping)
    kwargs = dict(epsilon=1.0, delta=delta, aggregates=["median", "rows", "stddev", "count", "variance"],
                  value_col="v", lower=LOWER, upper=UPPER, max_items=MAX_ITEMS, max_rows=2, confidence=0.9,
                  **GROUPINGS[grouping])
    duck = _duck(data, listed, **kwargs)
    before = len(dspark.session_ledger(spark).releases())
    out = dspark.group_by(spark.createDataFrame(data), items=spark.createDataFrame(listed), seed=5, scope="t",
                          **kwargs)
    new = dspark.session_ledger(spark).releases()[before:]
    charged = ("dp_group_by_public", 1.0, 0.0) if delta is None else ("dp_group_by", 1.0, delta)
    assert [(r.mechanism, r.epsilon, r.delta) for r in new] == [charged]  # once
    assert out.columns == duck.column_names
    assert [f.dataType.simpleString() for f in out.schema.fields] == [
        {"int64": "bigint", "string": "string", "double": "double"}[str(f.type)] for f in duck.schema]
    got = [r.asDict() for r in out.collect()]
    assert _keys(got, grouping) == _keys(duck.to_pylist(), grouping) == sorted(_keys(listed.to_pylist(), grouping))
    cal = gb.group_by_calibration(1.0, delta, MAX_ITEMS, kwargs["aggregates"], "v", LOWER, UPPER, None,
                                  confidence=0.9, max_rows=2, groups=listed.num_rows)
    assert cal.noise == ("laplace" if delta is None else "gaussian")
    # every measured aggregate's scale and half-width: the calibration's, on both engines
    for m in (m for m in cal.measures if m.name in kwargs["aggregates"]):
        assert {r[f"{m.name}_scale"] for r in got} == set(duck.column(f"{m.name}_scale").to_pylist()) == {m.scale}
        assert {r[f"{m.name}_ci"] for r in got} == set(duck.column(f"{m.name}_ci").to_pylist()) == {m.ci}
    step = (UPPER - LOWER) / gb.MEDIAN_BINS
    for r in got:  # the post-processing's guarantees
        assert r["count"] >= 0 and r["rows"] >= 0
        assert LOWER <= r["median"] <= UPPER and ((r["median"] - LOWER) / step) == pytest.approx(
            round((r["median"] - LOWER) / step), abs=1e-9)
        if r["variance"] is None:
            assert r["stddev"] is None and r["count"] == 0
        else:
            assert 0.0 <= r["variance"] <= 9.0 and r["stddev"] == pytest.approx(math.sqrt(r["variance"]), rel=1e-12)


def test_selected_groups_of_several_columns_with_gaussian_noise_are_one_charge(spark):
    """A selection of group-column keys (a one-shot Gaussian method: zCDP accounting) and Gaussian aggregates:
    the released groups are tuples of the table, the scales the calibration's for the groups released."""
    from dpsql.frontends import spark as dspark

    rows = [(u, f"g{u % 3}", float(u % 5), u % 2, f"x{u % 3}") for u in range(600)]
    kwargs = dict(epsilon=2.0, delta=1e-5, aggregates=["count", "rows", "mean", "median"], value_col="v",
                  lower=0.0, upper=4.0, max_items=2, max_rows=1, group_cols=["b", "a"],
                  selection="weighted_gaussian")
    before = len(dspark.session_ledger(spark).releases())
    out = dspark.group_by(spark.createDataFrame(table(rows)), seed=9, scope="t", **kwargs)
    new = dspark.session_ledger(spark).releases()[before:]
    assert [(r.mechanism, r.epsilon, r.delta) for r in new] == [("dp_group_by", 2.0, 1e-5)]
    assert out.columns[:2] == ["a", "b"] and "rows_ci" in out.columns and "median_ci" in out.columns
    got = out.collect()
    keys = [(r["a"], r["b"]) for r in got]
    # 6 groups of 100 users each: every one is released (its weight is ~100 against a threshold of ~20)
    assert keys == sorted({(u % 2, f"x{u % 3}") for u in range(600)})
    cal = gb.group_by_calibration(2.0, 1e-5, 2, kwargs["aggregates"], "v", 0.0, 4.0, "weighted_gaussian",
                                  max_rows=1, groups=len(keys))
    assert cal.accounting.accountant == "zcdp"
    assert {r["count_scale"] for r in got} == {cal.count_scale} and {r["median_ci"] for r in got} == {
        cal.measure("median").ci}
    assert all(abs(r["count"] - 100) <= cal.count_ci * 2 for r in got)  # two half-widths: a loose check


# ---------------------------------------------------------------------------
# The median's exponential mechanism
# ---------------------------------------------------------------------------

def test_the_medians_utility_gap_is_within_its_half_width(spark):
    """The released median's utility is within median_ci of the best grid point's in at least `confidence`
    of the groups (binomial tolerance), and not always the best point (the Gumbel noise is drawn)."""
    from dpsql.frontends import spark as dspark

    n_groups, conf = 40, 0.8
    rnd = random.Random(7)
    rows = [(g * 1000 + u, f"m{g:02d}", round(rnd.uniform(0.0, 10.0), 3), 0, "x")
            for g in range(n_groups) for u in range(60)]
    listed = spark.createDataFrame([(f"m{g:02d}",) for g in range(n_groups)], "item string")
    out = dspark.group_by(spark.createDataFrame(table(rows)), epsilon=1.0, items=listed, aggregates=["median"],
                          value_col="v", lower=0.0, upper=10.0, max_items=1, confidence=conf, seed=20261128,
                          scope="t").collect()
    cal = gb.group_by_calibration(1.0, None, 1, ["median"], "v", 0.0, 10.0, None, confidence=conf,
                                  groups=n_groups)
    m = cal.measure("median")
    assert m.epsilon0 == 1.0 and {r["median_ci"] for r in out} == {m.ci} and {r["median_scale"] for r in out} == {2.0}
    step = 10.0 / gb.MEDIAN_BINS
    gaps = []
    for r in out:
        snapped = np.array([round(v / step) for _, i, v, _, _ in rows if i == r["item"]])
        utility = np.array([-abs(np.sum(snapped < j) - np.sum(snapped > j)) for j in range(gb.MEDIAN_BINS + 1)])
        gaps.append(utility.max() - utility[round(r["median"] / step)])
    gaps = np.array(gaps)
    print(f"median gaps: mean {gaps.mean():.2f}, max {gaps.max()}, half-width {m.ci:.2f}")
    # P[gap > ci] <= 1 - conf per group; over 40 groups, > 16 such (binomial(40, 0.2) mean 8, sd 2.5) is > 3 sd
    assert np.sum(gaps > m.ci) <= 16
    assert np.any(gaps > 0)  # the chosen point is not always the best: noise was drawn


# ---------------------------------------------------------------------------
# Refusals: DuckDB's, before anything is read or drawn
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(aggregates=["rows"], max_rows=0),
    dict(aggregates=["count"], max_rows=3),
    dict(aggregates=["median"]),
    dict(aggregates=["variance"], value_col="v", lower=0),
    dict(aggregates=["stddev"], value_col="v", lower=0, upper=0),
    dict(aggregates=["count", "median", "median"], value_col="v", lower=0, upper=1),
    dict(group_cols="a"),
    dict(group_cols=["a", "A"]),
    dict(group_cols=["median_ci"]),
    dict(group_cols=["user_id", "a"]),
    dict(aggregates=["rows"], noise="uniform"),
])
def test_bad_parameters_fail_like_dpsql_group_by(spark, kwargs):
    from dpsql.frontends import spark as dspark

    con = dpsql.connect()
    try:
        con.execute("CREATE TABLE t AS SELECT 1::BIGINT AS user_id, 'a' AS item, 1.0::DOUBLE AS v, 0 AS a")
        with pytest.raises(DPParameterError) as duck_err:
            dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, **kwargs)
    finally:
        con.close()
    with pytest.raises(DPParameterError) as spark_err:
        dspark.group_by(None, epsilon=1.0, delta=1e-5, **kwargs)  # refused before the DataFrame is touched
    assert str(spark_err.value) == str(duck_err.value)


def test_a_null_group_column_fails_like_duckdb_before_anything_is_drawn(spark, monkeypatch):
    from dpsql.frontends import spark as dspark

    rows = pa.table({"user_id": pa.array([1, 2], pa.int64()), "k": pa.array(["a", None]),
                     "d": pa.array([1, 2], pa.int64())})
    con = dpsql.connect()
    try:
        con.execute("CREATE TABLE t AS FROM rows")
        with pytest.raises(Exception) as duck_err:
            dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, group_cols=["d", "k"], selection="count_laplace")
    finally:
        con.close()
    message = "dpsql: " + str(duck_err.value).split("dpsql: ", 1)[1].splitlines()[0]
    assert message.startswith("dpsql: a column of group_cols (d, k) contains NULL")
    drawn = []
    monkeypatch.setattr(dspark, "secure_source", lambda: drawn.append("salt"))
    monkeypatch.setattr(dspark, "_noise_task", lambda *a: drawn.append("noise"))
    monkeypatch.setattr(dspark, "_group_by_task", lambda *a: drawn.append("noise"))
    before = len(dspark.session_ledger(spark).releases())
    with pytest.raises(DPParameterError) as spark_err:
        dspark.group_by(spark.createDataFrame(rows), epsilon=1.0, delta=1e-5, group_cols=["d", "k"],
                        selection="count_laplace", scope="t")
    assert str(spark_err.value) == message and drawn == []
    assert len(dspark.session_ledger(spark).releases()) == before  # nothing charged


def test_group_columns_must_be_keys_by_identity_and_public_lists_of_their_types(spark):
    from dpsql.frontends import spark as dspark

    frame = spark.createDataFrame(pa.table({"user_id": pa.array([1, 2], pa.int64()), "x": pa.array([0.5, 1.5]),
                                            "k": pa.array(["a", "b"]), "n": pa.array([1, 2], pa.int64())}))
    with pytest.raises(DPParameterError, match=r"^dpsql: group_cols := 'x' has type double, which cannot be a "
                                               r"grouping key: equal floating-point"):
        dspark.group_by(frame, epsilon=1.0, delta=1e-5, group_cols=["k", "x"], scope="t")
    with pytest.raises(DPParameterError, match=r"^dpsql: group_cols := 'nope' is not a column of the DataFrame"):
        dspark.group_by(frame, epsilon=1.0, delta=1e-5, group_cols=["k", "nope"], scope="t")
    wrong = spark.createDataFrame([("a", "1")], "k string, n string")
    with pytest.raises(DPParameterError, match=r"^dpsql: column n of items has type string but group_cols := 'n' "
                                               r"of the DataFrame has type bigint"):
        dspark.group_by(frame, epsilon=1.0, items=wrong, group_cols=["k", "n"], scope="t")
    nulls = spark.createDataFrame([("a", 1), (None, 2)], "k string, n bigint")
    with pytest.raises(DPParameterError, match=r"^dpsql: a column of group_cols of items contains NULL"):
        dspark.group_by(frame, epsilon=1.0, items=nulls, group_cols=["k", "n"], scope="t")


# ---------------------------------------------------------------------------
# The per-setting default selection: the truncated geometric coin in Spark
# ---------------------------------------------------------------------------

def _one_group_per_user(groups: dict) -> list:
    """Rows (user, group, value, a, b): ``groups[n]`` groups of n users each, every user in one group only."""
    rows, uid = [], 0
    for n, g in groups.items():
        for j in range(g):
            rows += [(uid + u, f"n{n}_{j:03d}", 0.0, 0, "x") for u in range(n)]
            uid += n
    return rows


def test_the_default_selection_at_one_group_per_user_is_the_coin_with_its_tabled_probability(spark):
    """max_items 1 and no selection: Spark resolves dp_group_by's default (the truncated geometric coin), records
    it in the ledger as DuckDB does, and keeps each group of n users with probability p(n) (binomial tolerance)."""
    import json

    from dpsql.frontends import spark as dspark
    from dpsql.groupby import selection as rules

    groups = {18: 150, 21: 150, 24: 150}
    data = table(_one_group_per_user(groups))
    before = len(dspark.session_ledger(spark).releases())
    out = dspark.group_by(spark.createDataFrame(data), epsilon=1.0, delta=1e-5, max_items=1, seed=20261128,
                          scope="t")
    new = dspark.session_ledger(spark).releases()[before:]
    assert [(r.mechanism, r.epsilon, r.delta) for r in new] == [("dp_group_by", 1.0, 1e-5)]
    recorded = json.loads(new[0].calibration)
    assert recorded["selection"] == "truncated_geometric"
    con = seeded(3)
    try:
        con.execute("CREATE TABLE t AS FROM data")
        dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, max_items=1)
        duck_cal = json.loads(ledger_of(con).releases()[-1].calibration)
    finally:
        con.close()
    assert duck_cal == recorded  # the same resolved rule and calibration, recorded by both engines
    released = [r["item"] for r in out.collect()]
    p = rules.keep_probabilities(0.5, 0.5e-5)  # (epsilon, delta) * split / max_groups per group
    for n, g in groups.items():
        k = sum(1 for x in released if x.startswith(f"n{n}_"))
        assert abs(k / g - p[n]) <= 5 * math.sqrt(p[n] * (1 - p[n]) / g), (n, k)


def test_truncated_geometric_counts_cap_each_user(spark):
    """(item, n) of the coin: each user counted in at most max_groups of its groups, all of them when it holds
    fewer (the translated dp__capped_user_items)."""
    from dpsql.frontends import spark as dspark

    rows = group_rows(5)
    frame = spark.createDataFrame(table(rows))
    pairs = dspark._user_items(frame, "user_id", "item")
    held = {}
    for u, item, *_ in rows:
        held.setdefault(u, set()).add(item)
    for cap in (1, 2):
        counts = {r["item"]: r["n"] for r in dspark.truncated_geometric_counts(pairs, cap, 777).collect()}
        assert sum(counts.values()) == sum(min(len(s), cap) for s in held.values())
        for item, n in counts.items():
            assert n <= sum(1 for s in held.values() if item in s)
    everyone = {r["item"]: r["n"] for r in dspark.truncated_geometric_counts(pairs, MAX_ITEMS, 777).collect()}
    assert everyone == {i: sum(1 for s in held.values() if i in s) for i in {r[1] for r in rows}}
