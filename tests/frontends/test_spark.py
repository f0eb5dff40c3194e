"""The Spark backend (dpsql.frontends.spark) against the DuckDB macros: the translated stages give the same
pre-noise weights on the same capped data, the translated cap is uniform and per-user (its two
forms give the same rows), releases have the distribution the calibration predicts on both
engines, and bad input fails with the same errors. The session's Python workers cannot import
duckdb or dpsql (dpsql's tasks are shipped by value), and a plain local session runs dpsql's tasks
with the driver's interpreter whatever python3 PATH finds. Skips when pyspark or Java is missing;
the translation itself is tested without them (tests/frontends/test_portable.py)."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

import dpsql
from dpsql.union import adaptive
from dpsql.union import basic
from dpsql import union
from dpsql.core.validation import DPParameterError

from conftest import seeded
from spark_testing import BLOCK, java_or_skip, local_session, need, python_without_dpsql
from spark_testing import quiet_spark_warnings  # noqa: F401 (autouse: imported, it applies here)

# one SparkSession (one JVM) for the file: its tests stay on one xdist worker
pytestmark = pytest.mark.xdist_group('spark')

MAX_ITEMS = 8
def test_spark_extra_installs_a_pandas_pyspark_supports():
    # The spark extra once installed pandas 3, for which PySpark 4 warns "does not yet fully support".
    need("pyspark")
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_minimum_pandas_version()


# ---------------------------------------------------------------------------
# Spark session and data
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A local session whose Python workers cannot import duckdb or dpsql: every Spark test below
    also checks that dpsql's tasks need neither (they are shipped by value)."""
    need("pyspark")
    need("sqlglot")
    java_or_skip()
    with local_session("dpsql-tests", worker_python=python_without_dpsql(tmp_path_factory.mktemp("worker"))) as session:
        yield session


def zipf_rows(seed: int, n_users=70, n_items=40, max_deg=14, s=1.1):
    """Zipf-like item popularity, degrees 1..max_deg, distinct (user, item) pairs."""
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) ** s for k in range(n_items)]
    rows = []
    for u in range(n_users):
        deg = rng.randint(1, max_deg)
        items = list(dict.fromkeys(rng.choices(range(n_items), weights=weights, k=3 * deg)))[:deg]
        rows += [(u, f"i{k}") for k in sorted(items)]
    return rows


def arrow(rows, bias=None) -> pa.Table:
    cols = {"user_id": pa.array([r[0] for r in rows], pa.int64()), "item": pa.array([r[1] for r in rows], pa.string())}
    if bias is not None:
        cols["b"] = pa.array([bias.get(r[1], 1.0) for r in rows], pa.float64())
    return pa.table(cols)


@pytest.fixture(scope="module")
def capped(spark):
    """The same capped rows in DuckDB (table ``c``) and Spark: capped once, by DuckDB."""
    con = seeded(7)
    raw = arrow(zipf_rows(7))  # noqa: F841 (read by DuckDB's replacement scan)
    con.execute("CREATE TABLE t AS FROM raw")
    con.execute(f"CREATE TABLE c AS SELECT user_id, item, d FROM dp__capped_user_items('t', max_items := {MAX_ITEMS})")
    frame = spark.createDataFrame(con.sql("FROM c").to_arrow_table())
    yield con, frame
    con.close()


def as_dict(rows) -> dict:
    return {r[0]: r[1] for r in rows}


def assert_same_weights(spark_rows, duck_rows):
    got, want = as_dict(spark_rows), as_dict(duck_rows)
    assert set(got) == set(want) and want
    for item, w in want.items():
        assert got[item] == pytest.approx(w, rel=1e-9, abs=1e-12), item


# ---------------------------------------------------------------------------
# Pre-noise weights: Spark translation == DuckDB macro, on the same capped data
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("weighting", ["count", "inverse", "inverse_sqrt"])
def test_independent_weights_agree(capped, weighting):
    from dpsql.frontends import spark as dspark

    con, frame = capped
    duck = con.execute(f"SELECT item, w FROM dp__set_union_weights('c', '{weighting}', "
                       f"max_items := {MAX_ITEMS})").fetchall()
    assert_same_weights(dspark.set_union_weights(frame, weighting).collect(), duck)


@pytest.mark.parametrize("tau,d_max", [(3.0, 4), (1.0, 50)])
def test_mad_weights_agree(capped, tau, d_max):
    from dpsql.frontends import spark as dspark

    con, frame = capped
    duck = con.execute(f"SELECT item, w, w_init, w_trunc, w_reroute FROM dp__mad_weights('c', {tau}, "
                       f"max_adaptive_degree := {d_max}, max_items := {MAX_ITEMS})").fetchall()
    got = {r[0]: r[1:] for r in dspark.mad_weights(frame, tau, d_max, MAX_ITEMS)
           .select("item", "w", "w_init", "w_trunc", "w_reroute").collect()}
    assert any(r[1] > tau for r in duck), "the data must make MAD truncate some item"
    assert set(got) == {r[0] for r in duck}
    for item, *want in duck:
        assert got[item] == pytest.approx(tuple(want), rel=1e-9, abs=1e-12), item


@pytest.mark.parametrize("b_min,b_max", [(0.5, 2.0), (0.8, 1.0)])  # closed form; Alg. 2's loop (pandas)
def test_biased_mad_weights_agree(spark, capped, b_min, b_max):
    from dpsql.frontends import spark as dspark

    con, _ = capped
    rng = random.Random(11)
    items = sorted({r[0] for r in con.execute("SELECT DISTINCT item FROM c").fetchall()})
    bias = {i: rng.random() for i in items if rng.random() < 0.6}
    rows = con.execute("SELECT user_id, item FROM c").fetchall()
    tb = arrow(rows, bias)  # noqa: F841
    con.execute("CREATE OR REPLACE TABLE tb AS FROM tb")
    duck = con.execute(f"SELECT item, w FROM dp__mad_biased_weights('tb', 2.0, 5, {b_min}, {b_max})").fetchall()
    got = dspark.mad_biased_weights(spark.createDataFrame(arrow(rows, bias)), 2.0, 5, b_min, b_max)
    assert_same_weights(got.select("item", "w").collect(), duck)


def test_sips_round_weights_agree(spark, capped):
    from dpsql.frontends import spark as dspark

    con, frame = capped
    removed = ["i0", "i3", "i5"]
    con.execute(f"CREATE OR REPLACE TABLE kept AS SELECT user_id, item FROM c WHERE item NOT IN {tuple(removed)}")
    duck = con.execute(f"SELECT item, w FROM dp__set_union_weights('kept', 'inverse_sqrt', "
                       f"max_items := {MAX_ITEMS})").fetchall()
    removed_frame = spark.createDataFrame(pa.table({"item": pa.array(removed, pa.string())}))
    assert_same_weights(dspark.sips_round_weights(frame, removed_frame).collect(), duck)


def _zero_gaussian_noise(con):
    """Replace the connection's dp_gaussian_noise by zeros: the macros' noisy sums are then their sums."""
    from duckdb.sqltypes import DOUBLE

    con.remove_function("dp_gaussian_noise")
    con.create_function("dp_gaussian_noise", lambda s: pa.array(np.zeros(len(s))), [DOUBLE], DOUBLE, type="arrow",
                        side_effects=True)


# (epsilon, options): the default (dropping, cap, tilt); another split, margin and tilt without a cap; no
# dropping (plain: no cap, no tilt). epsilon 3 puts the last threshold inside the data's weights, so items
# pass in several rounds and, with dropping, some are dropped and some tilted.
CUMULATIVE_CASES = [
    (3.0, {}),
    (3.0, dict(split=[0.1, 0.2, 0.3, 0.4], drop_margin=1.0, max_boost=None, tilt=2.0)),
    (3.0, dict(split=[0.2, 0.3, 0.5], drop_margin=None)),
]


@pytest.mark.parametrize("epsilon,options", CUMULATIVE_CASES)
def test_sips_cumulative_rounds_agree(spark, capped, epsilon, options):
    """Round by round, from DuckDB's state (noise zeroed), the translated stages give DuckDB's sums, state and
    next rows with their FLOAT tilts; and the whole Spark release with noise of sigma 1e-300 (nothing at
    these weights) releases DuckDB's noiseless release."""
    import dataclasses

    from dpsql.frontends import spark as dspark
    from dpsql.union import cumulative

    shared, frame = capped
    capped_rows = shared.sql("FROM c").to_arrow_table()  # noqa: F841 (read by DuckDB's replacement scan)
    con = seeded(7)  # its own connection: the noise is zeroed on it
    con.execute("CREATE TABLE c AS FROM capped_rows")
    opts = {"split": cumulative.DEFAULT_SPLIT, "drop_margin": cumulative.DEFAULT_DROP_MARGIN,
            "max_boost": cumulative.DEFAULT_MAX_BOOST, "tilt": cumulative.DEFAULT_TILT, **options}
    c = cumulative.sips_cumulative_parameters(epsilon, DELTA, MAX_ITEMS, **opts)
    _zero_gaussian_noise(con)
    # each round's calibration as DuckDB's body writes it into its rounds (dpsql.union.cumulative.rounds_sql)
    lit = cumulative._double

    def round_args(r):  # share, cumulative_share, sigma, rho, drop_below of round r, max_boost
        return ", ".join(lit(v) for v in (c.share[r - 1], c.cumulative_share[r - 1], c.sigma[r - 1], c.rho[r - 1],
                                          c.drop_below[r - 1], c.max_boost))

    def tilt_args(r):  # cumulative_share, mean_sigma of round r, the last round's rho, the tilt
        return ", ".join(lit(v) for v in (c.cumulative_share[r - 1], c.mean_sigma[r - 1], c.rho[-1], c.tilt))

    # DuckDB's chain, as its body runs it (round two's rows and later under 32-bit ids)
    con.execute("CREATE OR REPLACE TABLE k0 AS SELECT user_id, item, 1.0::FLOAT AS p FROM c")
    con.execute("CREATE OR REPLACE TABLE z0 AS SELECT item, 0.0::DOUBLE AS z, false AS passed, false AS dropped "
                "FROM c LIMIT 0")
    con.execute("CREATE OR REPLACE TABLE z1 AS SELECT *, (row_number() OVER ())::UINTEGER AS id "
                f"FROM dp__sips_cumulative_round('k0', 'z0', {round_args(1)})")
    con.execute("CREATE OR REPLACE TABLE uid AS SELECT user_id, (row_number() OVER ())::UINTEGER AS uid "
                "FROM (SELECT DISTINCT user_id FROM c)")
    names = dict(con.execute("SELECT id, item FROM z1").fetchall())
    users = dict(con.execute("SELECT uid, user_id FROM uid").fetchall())
    for r in range(1, c.rounds):
        if r == 1:
            con.execute(f"CREATE OR REPLACE TABLE k1 AS FROM dp__sips_cumulative_next_first('c', 'uid', 'z1', "
                        f"{tilt_args(1)})")
            con.execute("CREATE OR REPLACE TABLE zid1 AS SELECT id AS item, z, passed, dropped FROM z1")
        elif c.plain:
            con.execute(f"CREATE OR REPLACE TABLE k{r} AS FROM dp__sips_cumulative_next_plain('k{r - 1}', 'z{r}')")
        else:
            con.execute(f"CREATE OR REPLACE TABLE k{r} AS FROM dp__sips_cumulative_next('k{r - 1}', 'z{r}', "
                        f"{tilt_args(r)})")
        prev = "zid1" if r == 1 else f"z{r}"
        con.execute(f"CREATE OR REPLACE TABLE z{r + 1} AS FROM dp__sips_cumulative_round('k{r}', '{prev}', "
                    f"{round_args(r + 1)})")

    def state(r):  # DuckDB's state of round r, by item name
        return {(names[i] if r > 1 else i): (z, passed, dropped)
                for i, z, passed, dropped in con.execute(f"SELECT item, z, passed, dropped FROM z{r}").fetchall()}

    def rows(r):  # DuckDB's rows of round r + 1, by user and item name
        got = con.execute(f"SELECT user_id, item, p FROM k{r}").fetchall()
        return {((users[u], names[i]) if r > 0 else (u, i)): p for u, i, p in got}

    def state_frame(st):
        return spark.createDataFrame([(i, float(z), bool(pa_), bool(d)) for i, (z, pa_, d) in st.items()],
                                     "item string, z double, passed boolean, dropped boolean")

    def rows_frame(rs):
        return spark.createDataFrame([(u, i, float(p)) for (u, i), p in rs.items()],
                                     "user_id long, item string, p float")

    tilted = dropped = 0
    passing_rounds = set()
    for r in range(1, c.rounds + 1):
        live = rows(r - 1)
        prev = state(r - 1) if r > 1 else {}
        prev_frame = state_frame(prev) if prev else state_frame({"none": (0.0, False, False)}).limit(0)
        sums = {i: y for i, y in dspark.sips_cumulative_sums(rows_frame(live), prev_frame, c, r).collect()}
        want = state(r)
        assert set(sums) == set(want), r
        for item, y in sums.items():  # DuckDB's z = share * (y + 0)
            assert c.share[r - 1] * y == pytest.approx(want[item][0], rel=1e-12, abs=1e-12), (r, item)
        noisy = spark.createDataFrame([(i, float(y)) for i, y in sums.items()], "item string, noisy double")
        got_state = {i: (z, p_, d) for i, z, p_, d in dspark.sips_cumulative_state(noisy, c, r).collect()}
        assert {i: v[1:] for i, v in got_state.items()} == {i: v[1:] for i, v in want.items()}, r
        passing_rounds |= {r} if any(v[1] for v in want.values()) else set()
        dropped += sum(v[2] for v in want.values())
        if r < c.rounds:
            nxt = {(u, i): p for u, i, p in
                   dspark.sips_cumulative_next_rows(rows_frame(live), state_frame(want), c, r).collect()}
            duck_next = rows(r)
            assert set(nxt) == set(duck_next), r
            for key, p in duck_next.items():  # FLOAT on both engines: within one FLOAT ulp
                assert nxt[key] == pytest.approx(p, rel=1.2e-7, abs=0.0), (r, key)
            tilted += sum(0.0 < p < 1.0 for p in duck_next.values())
    # the data exercises what the stages do
    assert len(passing_rounds) >= 2, passing_rounds
    if c.plain:
        assert dropped == 0 and tilted == 0
    else:
        assert dropped > 0 and tilted > 0, (dropped, tilted)

    # the whole release: Spark's chain against DuckDB's body (c has at most MAX_ITEMS items a user: no cap)
    con.execute("CREATE OR REPLACE TABLE c0 AS SELECT user_id, item FROM c")
    duck = sorted(dpsql.set_union(con, "c0", "sips_cumulative", epsilon=epsilon, delta=DELTA, max_items=MAX_ITEMS,
                                  **options).column("item").to_pylist())
    con.close()
    quiet = dataclasses.replace(c, sigma=(1e-300,) * c.rounds)
    got = sorted(r[0] for r in dspark._release_cumulative_rounds(frame, quiet, 1, "sips_cumulative").collect())
    assert got == duck and 0 < len(duck) < len(names)


# ---------------------------------------------------------------------------
# Contribution bounding
# ---------------------------------------------------------------------------

def test_spark_cap_is_per_user_and_uniform(spark):
    from dpsql.frontends import spark as dspark

    # 2,000 users with the same 10 items and one small user, capped to 3 items.
    n_users, n_items, cap = 2000, 10, 3
    rows = [(u, f"i{k}") for u in range(n_users) for k in range(n_items)] + [(-1, "i0"), (-1, "i1")]
    frame = spark.createDataFrame(arrow(rows))
    got = dspark.capped_user_items(frame, cap, salt=12345).collect()
    sets: dict = {}
    for user, item, d in got:
        sets.setdefault(user, set()).add(item)
        assert d == (2 if user == -1 else cap)
    assert sets.pop(-1) == {"i0", "i1"}  # under the cap: untouched
    assert all(len(s) == cap for s in sets.values()) and len(sets) == n_users
    # Uniform: each item is kept by Binomial(n_users, cap/n_items) users; 4.5 sd.
    counts = np.array([sum(f"i{k}" in s for s in sets.values()) for k in range(n_items)])
    p = cap / n_items
    assert np.all(np.abs(counts - n_users * p) <= 4.5 * math.sqrt(n_users * p * (1 - p))), counts
    # Per-user: other users' rows do not change a user's sample (same salt).
    alone = dspark.capped_user_items(frame.where("user_id = 17"), cap, salt=12345).collect()
    assert {r[1] for r in alone} == sets[17]
    other_salt = dspark.capped_user_items(frame.where("user_id < 50"), cap, salt=999).collect()
    assert any({r[1] for r in other_salt if r[0] == u} != sets[u] for u in range(50))
    # The macros' two forms (join for one read, window for the adaptive methods) cap alike for one salt.
    window = dspark.capped_user_items(frame, cap, salt=12345, window=True).collect()
    assert sorted(window) == sorted(got)


# ---------------------------------------------------------------------------
# Release distribution: both engines against the calibration's prediction
# ---------------------------------------------------------------------------

N_ITEMS, EPS, DELTA = 400, 1.0, 1e-5


def _gauss_pass(k: float, sigma: float, rho: float) -> float:
    return float(stats.norm.sf((rho - k) / sigma))


def _release_probability(method: str, k: int) -> float:
    """P(an item held by k single-item users is released), max_items = 1.

    With one item per user every weighting gives the item weight k (MAD: no item reaches
    tau; MAD2R round two: UserWeights of a single item is 1; sips_cumulative: a user's one weight
    min(1, max_boost, p/p) is 1 in every round), so each item is an independent experiment with
    this probability.
    """
    if method == "sips_cumulative":
        return _cumulative_release_probability(k)
    if method == "mad2r":
        c = adaptive.mad2r_calibration(EPS, DELTA, 1)
        r1, r2 = c.round1, c.round2
        p1 = _gauss_pass(k, r1.sigma, r1.rho)
        candidate = stats.norm.cdf((r1.rho - k) / r1.sigma) - stats.norm.cdf((r2.rho - c.upper_offset - k) / r1.sigma)
        return p1 + max(0.0, candidate) * _gauss_pass(k, r2.sigma, r2.rho)
    if method == "sips":
        miss = 1.0
        for r in adaptive.sips_calibration(EPS, DELTA, 1):
            miss *= 1.0 - _gauss_pass(k, r.scale, r.threshold)
        return 1.0 - miss
    cal = union.calibrate(method, EPS, DELTA, 1)
    if cal.noise == "laplace":
        x = (cal.threshold - k) / cal.scale
        return 0.5 * math.exp(-x) if x >= 0 else 1.0 - 0.5 * math.exp(x)
    return _gauss_pass(k, cal.scale, cal.threshold)


def _cumulative_release_probability(k: float, n: int = 400_000) -> float:
    """P(released) of an item of weight k in every round of sips_cumulative: its running sum z_r adds
    share_r (k + N(0, sigma_r^2)); released when z_r >= F_r rho_r, dropped (never released) when below
    F_r drop_below_r. Simulated with n draws (fixed generator: a model, s.e. below 0.001)."""
    from dpsql.union import cumulative

    c = cumulative.sips_cumulative_parameters(EPS, DELTA, 1)
    rng = np.random.default_rng(0)
    z, alive, released = np.zeros(n), np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
    for r in range(c.rounds):
        z = np.where(alive, z + c.share[r] * (k + c.sigma[r] * rng.standard_normal(n)), z)
        passed = alive & (z >= c.cumulative_share[r] * c.rho[r])
        dropped = alive & ~passed & (z < c.cumulative_share[r] * c.drop_below[r])
        released |= passed
        alive &= ~passed & ~dropped
    return float(released.mean())


def _threshold(method: str) -> float:
    if method == "mad2r":
        return adaptive.mad2r_calibration(EPS, DELTA, 1).round2.rho
    return union.calibrate(method, EPS, DELTA, 1).threshold


@pytest.mark.slow
@pytest.mark.parametrize("method", ["count_laplace", "count_gaussian", "weighted_laplace", "weighted_gaussian",
                                    "mad", "mad2r", "sips", "sips_cumulative"])
def test_release_distribution_matches_duckdb(spark, method):
    from dpsql.frontends import spark as dspark

    k = max(1, round(_threshold(method)))  # items near the (last round's) threshold
    p = _release_probability(method, k)
    rows = [(i * k + j, f"x{i}") for i in range(N_ITEMS) for j in range(k)]
    data = arrow(rows)
    spark_n = dspark.set_union(spark.createDataFrame(data), method, epsilon=EPS, delta=DELTA, max_items=1,
                               seed=20261122, scope="t").count()
    con = seeded(20261122)
    try:
        con.execute("CREATE TABLE t AS FROM data")
        duck_n = len(dpsql.set_union(con, "t", method, epsilon=EPS, delta=DELTA, max_items=1))
    finally:
        con.close()
    sd = math.sqrt(N_ITEMS * p * (1 - p))
    print(f"{method}: k={k} p={p:.4f} expected={N_ITEMS * p:.1f} spark={spark_n} duckdb={duck_n} sd={sd:.2f}")
    assert 0.05 < p < 0.95
    assert abs(spark_n - N_ITEMS * p) <= 4 * sd, (spark_n, N_ITEMS * p)
    assert abs(duck_n - N_ITEMS * p) <= 4 * sd, (duck_n, N_ITEMS * p)
    assert abs(spark_n - duck_n) <= 4 * math.sqrt(2) * sd


def test_top_k_domain_is_the_set_union_at_half_budget(spark):
    from dpsql.frontends import spark as dspark
    from dpsql import topk

    half = basic.weighted_gaussian_calibration(EPS / 2, DELTA / 2, 1)
    k = round(half.threshold)
    p = _gauss_pass(k, half.scale, half.threshold)
    frame = spark.createDataFrame(arrow([(i * k + j, f"x{i}") for i in range(N_ITEMS) for j in range(k)]))
    n = dspark.top_k_domain(frame, 10, epsilon=EPS, delta=DELTA, max_items=1, scope="t").count()
    assert topk.DEFAULT_DOMAIN_METHOD == "weighted_gaussian"
    assert abs(n - N_ITEMS * p) <= 4 * math.sqrt(N_ITEMS * p * (1 - p)), (n, N_ITEMS * p)
    with pytest.raises(DPParameterError, match="k must be a whole number"):
        dspark.top_k_domain(frame, 2.5, epsilon=EPS, delta=DELTA, scope="t")


def test_release_is_drawn_once(spark):
    """Reading the returned DataFrame twice gives the same items: Spark does not redraw the noise."""
    from dpsql.frontends import spark as dspark

    cal = basic.weighted_gaussian_calibration(EPS, DELTA, 1)
    k = round(cal.threshold)
    frame = spark.createDataFrame(arrow([(i * k + j, f"x{i}") for i in range(N_ITEMS) for j in range(k)]))
    out = dspark.set_union(frame, "weighted_gaussian", epsilon=EPS, delta=DELTA, max_items=1, scope="t")  # OS-keyed noise
    first = [r[0] for r in out.collect()]
    assert 0 < len(first) < N_ITEMS  # each item passes with probability ~1/2: a redraw would differ
    assert first == sorted(first)  # released in sorted order, not the partitions' (data-dependent) order
    assert [r[0] for r in out.collect()] == first
    assert out.count() == len(first)


# ---------------------------------------------------------------------------
# Bad input: the same errors as DuckDB
# ---------------------------------------------------------------------------

BUDGET = dict(epsilon=EPS, delta=DELTA)
BAD = [
    ("weighted_gaussian", dict(BUDGET, epsilon=0.0), {}),
    ("weighted_gaussian", dict(BUDGET, delta=1.0), {}),
    ("count_laplace", dict(BUDGET, max_items=2.5), {}),
    ("mad", BUDGET, dict(beta=-1.0)),
    ("mad2r", BUDGET, dict(split=[0.5, 0.6])),
    ("mad2r", BUDGET, dict(b_min=0.2)),
    ("sips", BUDGET, dict(split=[0.2, 0.2, 0.2, 0.2, 0.1, 0.1])),
    ("mad", BUDGET, dict(max_adaptive_degree=1.5)),
    ("sips_cumulative", BUDGET, dict(tilt=20.0)),
    ("sips_cumulative", BUDGET, dict(max_boost=0.5)),
    ("sips_cumulative", BUDGET, dict(split=[0.1] * 10)),
]


def _sql_value(v) -> str:
    return f"[{', '.join(repr(float(x)) for x in v)}]" if isinstance(v, list) else repr(v)


@pytest.mark.parametrize("method,common,options", BAD)
def test_bad_parameters_fail_like_duckdb(spark, method, common, options):
    from dpsql.frontends import spark as dspark

    frame = spark.createDataFrame(arrow([(1, "a")]))
    with pytest.raises(DPParameterError) as spark_err:
        dspark.set_union(frame, method, **common, **options, scope="t")
    con = dpsql.connect()
    try:
        con.execute("CREATE TABLE t (user_id BIGINT, item VARCHAR)")
        args = "".join(f", {k} := {_sql_value(v)}" for k, v in {**common, **options}.items())
        with pytest.raises(Exception) as duck_err:
            con.execute(f"SELECT * FROM {union.METHODS[method].macro}('t'{args})").fetchall()
    finally:
        con.close()
    assert str(spark_err.value) in str(duck_err.value)


def test_bad_columns_and_methods(spark):
    from dpsql.frontends import spark as dspark

    frame = spark.createDataFrame(arrow([(1, "a")]))
    with pytest.raises(DPParameterError, match=r"user_col := 'uid' is not a column of the DataFrame; "
                                               r"its columns are user_id, item"):
        dspark.set_union(frame, "mad2r", user_col="uid", **BUDGET, scope="t")
    with pytest.raises(DPParameterError, match="two different columns"):
        dspark.set_union(frame, "mad2r", user_col="item", **BUDGET, scope="t")
    with pytest.raises(DPParameterError, match="method must be one of"):
        dspark.set_union(frame, "nope", **BUDGET, scope="t")
    # a method without a Spark form is refused by name, naming the ones Spark runs and DuckDB
    without = [m for m in union.METHODS if m not in dspark.PARALLEL_METHODS]
    assert "policy_gaussian" in without
    for method in without:
        with pytest.raises(DPParameterError, match=rf"^dpsql: method '{method}' has no Spark form; the Spark backend "
                                                   rf"runs .*sips_cumulative.* \(run {method} with DuckDB\)$"):
            dspark.set_union(frame, method, **BUDGET, scope="t")
    with pytest.raises(DPParameterError, match="does not apply to method 'weighted_gaussian'"):
        dspark.set_union(frame, "weighted_gaussian", beta=2.0, **BUDGET, scope="t")


@pytest.mark.parametrize("column", ["user_id", "item"])
def test_null_users_and_items_fail_like_duckdb(spark, column, monkeypatch):
    from dpsql.frontends import spark as dspark

    rows = pa.table({"user_id": pa.array([1, 2], pa.int64()), "item": pa.array(["a", "b"], pa.string())})
    idx = rows.schema.get_field_index(column)
    rows = rows.set_column(idx, column, pa.array([None, rows[column][1].as_py()], rows.schema.field(column).type))
    con = dpsql.connect()
    try:
        con.execute("CREATE TABLE t AS FROM rows")
        with pytest.raises(Exception) as duck_err:
            dpsql.set_union(con, "t", "weighted_gaussian", **BUDGET)
    finally:
        con.close()
    message = "dpsql: " + str(duck_err.value).split("dpsql: ", 1)[1].splitlines()[0]
    param = "user_col" if column == "user_id" else "item_col"
    assert message.startswith(f"dpsql: column {column} ({param}) contains NULL; filter NULL ")
    drawn = []  # nothing is drawn: no salt, no noise task is built
    monkeypatch.setattr(dspark, "secure_source", lambda: drawn.append("salt"))
    monkeypatch.setattr(dspark, "_noise_task", lambda *a: drawn.append("noise"))
    frame = spark.createDataFrame(rows)
    for method in ("weighted_gaussian", "mad2r"):
        with pytest.raises(DPParameterError) as spark_err:  # a Python exception, not a Java stack trace
            dspark.set_union(frame, method, **BUDGET, scope="t")
        assert str(spark_err.value) == message
    assert drawn == []
    # both columns NULL: the user column is named, as DuckDB names it first
    both = spark.createDataFrame([(None, None), (1, "a")], "uid long, query string")
    with pytest.raises(DPParameterError, match=r"^dpsql: column uid \(user_col\) contains NULL"):
        dspark.set_union(both, user_col="uid", item_col="query", **BUDGET, scope="t")


# ---------------------------------------------------------------------------
# Executors: dpsql's tasks import neither duckdb nor dpsql and run with the driver's interpreter
# ---------------------------------------------------------------------------

_TASKS = """
import json, pickle, sys
import pandas as pd
import pyarrow as pa
noise, user_weights = pickle.loads(sys.stdin.buffer.read())
batch = pa.RecordBatch.from_arrays([pa.array(["a", "b", "c"]), pa.array([50.0, -50.0, 50.0])], ["item", "w"])
items = [i for out in noise(iter([batch])) for i in out.column(0).to_pylist()]
frame = user_weights(pd.DataFrame({"user_id": [1, 1, 1], "item": ["a", "b", "c"], "b": [0.25, 1.0, 3.0]}))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("dpsql", "duckdb") and sys.modules[m] is not None)
print(json.dumps({"items": items, "uw": frame["uw"].tolist(), "d": frame["d"].tolist(), "loaded": loaded}))
"""


def test_task_functions_import_neither_duckdb_nor_dpsql(tmp_path):
    """The functions dpsql ships to Spark tasks, unpickled and run where duckdb and dpsql cannot be imported."""
    need("pyspark")
    from pyspark import cloudpickle
    from dpsql.frontends import spark as dspark

    noise = dspark._noise_task(dspark._Noise("gaussian", 1.0, 0.0, strict=True), seed=7, stage=1, keep_all=False)
    with dspark._by_value():
        blob = cloudpickle.dumps((noise, dspark._user_weights_task(0.5, 1.5)))
    assert "dpsql" not in cloudpickle.list_registry_pickle_by_value()  # registered only while shipping
    by_reference = cloudpickle.dumps(dspark._user_weights_task(0.5, 1.5))  # outside: dpsql is imported
    code = BLOCK + _TASKS
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    got = json.loads(done.stdout)
    assert got["loaded"] == [] and got["items"] == ["a", "c"] and got["d"] == [3, 3, 3]
    expected = adaptive.user_weights_batch(np.array([0.25, 1.0, 3.0]), np.array([0, 3]), 0.5, 1.5)
    np.testing.assert_allclose(got["uw"], expected, rtol=0, atol=0)
    # the control: pickled the default way, the same function needs dpsql on the worker
    load = BLOCK + "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"
    refused = subprocess.run([sys.executable, "-c", load], input=by_reference, capture_output=True, cwd=tmp_path,
                             timeout=120)
    assert refused.returncode != 0 and b"dpsql" in refused.stderr


def test_spark_workers_cannot_import_duckdb_here(spark):
    """The module's session really blocks duckdb on its workers (so the releases above prove they need none)."""
    def probe(batches):
        for batch in batches:
            try:
                import duckdb  # noqa: F401
                found = True
            except ImportError:
                found = False
            yield pa.RecordBatch.from_arrays([pa.array([found] * batch.num_rows)], ["found"])

    assert {r.found for r in spark.range(2).mapInArrow(probe, "found boolean").collect()} == {False}


_PATH_RELEASE = """
import json, sys, warnings
warnings.simplefilter("ignore")
from pyspark.sql import SparkSession
from dpsql.frontends import spark as dspark
session = (SparkSession.builder.master("local[1]").appName("dpsql-path-python")
           .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
           .config("spark.sql.shuffle.partitions", "1").getOrCreate())
session.sparkContext.setLogLevel("ERROR")
# SQL rows, as a read of Parquet gives (createDataFrame of a list would run the user's own Python tasks)
rows = session.sql("SELECT id AS user_id, 'common' AS item FROM range(400) UNION ALL SELECT 1, 'rare'")
released = dspark.set_union(rows, "weighted_gaussian", epsilon=1.0, delta=1e-5, max_items=4, scope="t")
print(json.dumps({"items": [r.item for r in released.collect()], "python": session.sparkContext.pythonExec}))
session.stop()
"""


def test_local_session_runs_tasks_with_the_driver_interpreter(tmp_path):
    """A plain local session, PYSPARK_PYTHON unset, and a ``python3`` on PATH without the packages
    (a virtualenv that is not activated): dpsql's tasks run with the driver's interpreter instead."""
    need("pyspark")
    need("sqlglot")
    java_or_skip()
    if os.name != "posix":
        pytest.skip("the python3 shim is a POSIX shell script")
    bin_dir, marker = tmp_path / "bin", tmp_path / "python3-was-run"
    bin_dir.mkdir()
    shim = bin_dir / "python3"
    shim.write_text(f'#!/bin/sh\necho "$*" >> "{marker}"\necho "No module named \'duckdb\'" >&2\nexit 1\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run([sys.executable, "-c", _PATH_RELEASE], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["items"] == ["common"]
    assert got["python"] == "python3"  # the user's session is unchanged
    assert not marker.exists(), marker.read_text()


# ---------------------------------------------------------------------------
# Private GROUP BY (dspark.group_by) against dp_group_by / dpsql.group_by
# ---------------------------------------------------------------------------

GB_MAX = 8  # no user below holds more than 8 distinct items: no cap, so both engines bound identically


def gb_rows(seed: int, n_users=50, n_items=12, max_rows=8):
    """(user, item, value): skewed items, several rows per (user, item), values partly outside [-1, 5]."""
    rng = random.Random(seed)
    rows = []
    for u in range(n_users):
        for _ in range(rng.randint(1, max_rows)):
            rows.append((u, f"g{min(int(rng.expovariate(0.35)), n_items - 1)}", round(rng.uniform(-3.0, 9.0), 3)))
    return rows


def gb_arrow(rows) -> pa.Table:
    return pa.table({"user_id": pa.array([r[0] for r in rows], pa.int64()),
                     "item": pa.array([r[1] for r in rows], pa.string()),
                     "v": pa.array([r[2] for r in rows], pa.float64())})


def gb_truth(rows, items, lower, upper, g):
    """(n, sum) per listed item without a cap: users holding it, their totals clamped and rounded to the grid."""
    totals: dict = {}
    for u, i, v in rows:
        totals[(u, i)] = totals.get((u, i), 0.0) + v
    out = {i: [0, 0.0] for i in items}
    for (u, i), t in totals.items():
        if i in out:
            out[i][0] += 1
            out[i][1] += round(min(upper, max(lower, t)) / g) * g  # ties do not occur: 3-decimal values, g = 2^-k
    return {i: tuple(v) for i, v in out.items()}


def _zero_granular_noise(con):
    """Replace the connection's granular Laplace by zeros: the macro's output is then its pre-noise stages."""
    from duckdb.sqltypes import DOUBLE

    con.remove_function("dp_granular_laplace_noise")
    con.create_function("dp_granular_laplace_noise", lambda s, g: pa.array(np.zeros(len(s))), [DOUBLE, DOUBLE],
                        DOUBLE, type="arrow", side_effects=True)


GB_ARGS = dict(aggregates=["count", "sum"], value_col="v", lower=-1.0, upper=5.0, max_items=GB_MAX)


def test_group_by_stats_are_dp_group_by_pre_noise(spark):
    """The translated dp__stats on Spark gives DuckDB's dp_group_by counts and bounded sums, exactly."""
    from dpsql import groupby as gb
    from dpsql.frontends import spark as dspark

    rows = gb_rows(21)
    assert max(len({i for u2, i, _ in rows if u2 == u}) for u in range(50)) <= GB_MAX
    gb_table = gb_arrow(rows)  # noqa: F841 (read by DuckDB's replacement scan)
    con = seeded(21)
    try:
        _zero_granular_noise(con)
        con.execute("CREATE TABLE t AS FROM gb_table")
        duck = dpsql.group_by(con, "t", epsilon=8.0, delta=1e-5, selection="weighted_gaussian", noise="laplace",
                              **GB_ARGS)
    finally:
        con.close()
    selected = duck.column("item").to_pylist()
    assert len(selected) >= 3  # the test compares something (selection ran at epsilon 4)
    # the release's calibration: its noise (and the sum's grid) for L0 = min(max_groups, the groups released)
    cal = gb.group_by_calibration(8.0, 1e-5, GB_MAX, ["count", "sum"], "v", -1.0, 5.0, "weighted_gaussian",
                                  noise="laplace", groups=len(selected))
    g = cal.sum_granularity
    stats = dspark.group_by_stats(spark.createDataFrame(gb_table), spark.createDataFrame(duck.select(["item"])),
                                  GB_MAX, 12345, cal).collect()
    got = {r["item"]: (r["n"], r["s_steps"] * g) for r in stats}
    want = {i: (c, s) for i, c, s in zip(selected, duck.column("count").to_pylist(), duck.column("sum").to_pylist())}
    assert {i: got.get(i, (0, 0.0)) for i in selected} == want == gb_truth(rows, selected, -1.0, 5.0, g)
    assert set(got) <= set(selected)


def _gb_duck(gb_table, items=None, **kwargs):
    con = seeded(5)
    try:
        con.execute("CREATE TABLE t AS FROM gb_table")
        if items is not None:
            con.execute("CREATE TABLE pub AS FROM items")
        return dpsql.group_by(con, "t", items_tbl=None if items is None else "pub", **kwargs)
    finally:
        con.close()


@pytest.mark.parametrize("aggregates", [["count"], ["sum", "mean"], ["mean", "count", "sum"]])
def test_group_by_columns_order_and_calibration_are_dpsql_group_by_s(spark, aggregates):
    from dpsql import groupby as gb
    from dpsql.frontends import spark as dspark

    rows = gb_rows(3)
    listed = ["g9", "g0", "g3", "zz_nobody", "g1"]
    items = pa.table({"item": pa.array(listed)})
    values = {} if aggregates == ["count"] else dict(value_col="v", lower=-1.0, upper=5.0)
    kwargs = dict(epsilon=1.0, aggregates=aggregates, max_items=GB_MAX, confidence=0.9, **values)
    duck = _gb_duck(gb_arrow(rows), items, **kwargs)
    out = dspark.group_by(spark.createDataFrame(gb_arrow(rows)), items=spark.createDataFrame(items), seed=5, **kwargs, scope="t")
    assert out.columns == duck.column_names
    # integer counts (post-processing, as DuckDB's BIGINT), the rest doubles
    assert [f.dataType.simpleString() for f in out.schema.fields[1:]] == [
        "bigint" if c == "count" else "double" for c in out.columns[1:]]
    got = out.collect()
    assert [r["item"] for r in got] == sorted(listed) == duck.column("item").to_pylist()  # every listed item, sorted
    # 5 listed items: the noise's L0 is min(max_groups, 5) (no user holds more of them), on both engines
    cal = gb.group_by_calibration(1.0, None, GB_MAX, aggregates, values.get("value_col"), values.get("lower"),
                                  values.get("upper"), None, confidence=0.9, groups=len(listed))
    for name in ("count_scale", "count_ci", "sum_scale", "sum_ci"):
        if name in out.columns:
            assert {r[name] for r in got} == set(duck.column(name).to_pylist()) == {getattr(cal, name)}
    if "count" in aggregates:
        assert cal.count_scale == len(listed) / (1.0 / (1 + ("sum" in aggregates or "mean" in aggregates)))
        truth = gb_truth(rows, listed, -1.0, 5.0, 1.0)
        # granular noise: released - true count is on the count's grid
        assert all(((r["count"] - truth[r["item"]][0]) / cal.count_granularity).is_integer() for r in got)
    if "mean" in aggregates:
        assert all(r["mean"] is None or -1.0 <= r["mean"] <= 5.0 for r in got)
    if {"count", "sum", "mean"} <= set(aggregates):
        # the macro's post-processing of the noisy count n and sum: count = max(0, round(n)), mean =
        # clamp(sum / n), mean_ci = min(6, ci / n), NULL when n <= 0 (so n is within 1/2 of the released count)
        ci = cal.mean_sum_ci + 5.0 * cal.mean_count_ci
        for r in got:
            if r["mean"] is not None:
                n = ci / r["mean_ci"] if r["mean_ci"] < 6.0 else None
                assert n is None or abs(n - r["count"]) <= 0.5 + 1e-9
                assert -1.0 <= r["mean"] <= 5.0
            else:
                assert r["mean_ci"] is None and r["count"] == 0


def test_group_by_count_noise_has_the_calibrated_scale(spark):
    """Released - true count over 400 public items (no cap): on the grid, E|Z| = b, the interval covers."""
    from dpsql import groupby as gb
    from dpsql.frontends import spark as dspark

    n_items, conf = 400, 0.8
    # 20 .. 26 users per item: the released counts (integers >= 0, post-processing) are never clamped at 0
    rows = [(k * 100 + u, f"x{k:03d}", 1.0) for k in range(n_items) for u in range(20 + k % 7)]
    items = spark.createDataFrame([(f"x{k:03d}",) for k in range(n_items)], "item string")
    out = dspark.group_by(spark.createDataFrame(gb_arrow(rows)), epsilon=1.0, items=items, max_items=2,
                          confidence=conf, seed=20261124, scope="t").collect()
    z = np.array([r["count"] - (20 + int(r["item"][1:]) % 7) for r in out])
    cal = gb.group_by_calibration(1.0, None, 2, ["count"], selection=None, confidence=conf)
    b, g = out[0]["count_scale"], cal.count_granularity
    assert b == cal.count_scale == 2.0 and len(z) == n_items  # max_items / epsilon
    assert all((zi / g).is_integer() for zi in z)  # granular: on the count's grid
    # E|Z| = b for the Laplace (the discrete one on this grid differs by < 1e-8), e^-1/4 / (1 - e^-1/2) = 0.99 b
    # once rounded to an integer: s.e. b / sqrt(400) = 5 %
    print(f"E|Z|/b = {np.abs(z).mean() / b:.4f}, coverage = {np.mean(np.abs(z) <= out[0]['count_ci']):.4f}")
    assert abs(np.abs(z).mean() / b - 1) < 0.2
    # coverage of the interval: binomial s.e. sqrt(0.16 / 400) = 2 %
    assert abs(np.mean(np.abs(z) <= out[0]["count_ci"]) - conf) < 0.08


def test_group_by_count_only_calibration_numbers(spark):
    from dpsql.frontends import spark as dspark

    frame = spark.createDataFrame(gb_arrow(gb_rows(4)))
    out = dspark.group_by(frame, epsilon=1.0, delta=1e-5, max_items=10, selection="count_laplace", noise="laplace",
                          seed=4, scope="t")
    assert out.columns == ["item", "count", "count_scale", "count_ci"]
    got = out.collect()
    # the numbers of tests/groupby/test_group_by.py::test_count_only_split_and_scale
    assert all(r["count_scale"] == 20.0 and r["count_ci"] == 59.91455078125 for r in got)
    assert [r["item"] for r in got] == sorted(r["item"] for r in got)


@pytest.mark.parametrize("trial", range(3))
def test_group_by_stats_of_neighbours_move_within_the_calibrated_sensitivity(spark, trial):
    """Adding one user (same salt: every other user keeps its items) moves the bounded aggregates by at
    most the sensitivity the noise is calibrated to."""
    from dpsql import groupby as gb
    from dpsql.frontends import spark as dspark

    rnd = random.Random(100 + trial)
    items = [f"x{k}" for k in range(20)]
    lower, upper = rnd.choice([(0.0, 5.0), (-2.0, 3.0), (1.0, 4.0)])
    max_items = rnd.randint(1, 5)
    rows = [(u, rnd.choice(items), round(rnd.uniform(-4, 8), 3)) for u in range(30) for _ in range(rnd.randint(1, 9))]
    newcomer = [(999, rnd.choice(items + ["not_listed"]), round(rnd.uniform(-10, 10), 3))
                for _ in range(rnd.randint(1, 30))]
    cal = gb.group_by_calibration(1.0, None, max_items, ["count", "sum"], "v", lower, upper, None)
    selected = spark.createDataFrame([(i,) for i in items], "item string")
    salt = rnd.getrandbits(63)

    def stats(data):
        frame = spark.createDataFrame(gb_arrow(data))
        out = {r["item"]: (r["n"], r["s_steps"]) for r in dspark.group_by_stats(frame, selected, max_items, salt,
                                                                                 cal).collect()}
        return np.array([out.get(i, (0, 0)) for i in items])

    a, b = stats(rows), stats(rows + newcomer)
    dc, ds = b[:, 0] - a[:, 0], b[:, 1] - a[:, 1]
    assert set(dc.tolist()) <= {0, 1}
    assert dc.sum() == min(max_items, len({i for _, i, _ in newcomer if i in items}))
    m_steps = round(cal.sum_bound / cal.sum_granularity)
    assert np.all(ds[dc == 0] == 0) and np.all(np.abs(ds) <= m_steps)
    assert np.abs(ds).sum() * cal.sum_granularity <= cal.sum_scale * cal.sum_epsilon + 1e-9  # rounded l1


@pytest.mark.parametrize("weighting", ["count", "inverse_sqrt"])
def test_pre_selection_weights_are_the_set_union_weights_with_user_counts(capped, weighting):
    """dp_group_by's pre-thresholded selection weighs as dp__set_union_weights (DuckDB) on the same capped rows."""
    from dpsql.frontends import spark as dspark

    con, frame = capped
    got = {r["item"]: (r["n"], r["w"]) for r in dspark.pre_selection_weights(frame, weighting).collect()}
    duck = as_dict(con.execute(f"SELECT item, w FROM dp__set_union_weights('c', '{weighting}', "
                               f"max_items := {MAX_ITEMS})").fetchall())
    users = as_dict(con.sql("SELECT item, count(*) FROM c GROUP BY item").fetchall())
    assert set(got) == set(duck) == set(users)
    for item, (n, w) in got.items():
        assert n == users[item] and w == pytest.approx(duck[item], rel=1e-9, abs=1e-12), item


def test_group_by_pre_threshold_selects_only_items_with_enough_users(spark):
    from dpsql.frontends import spark as dspark

    rows = gb_rows(8, n_users=60)
    users = {}
    for u, i, _ in rows:
        users.setdefault(i, set()).add(u)
    out = dspark.group_by(spark.createDataFrame(gb_arrow(rows)), epsilon=8.0, delta=1e-5, selection="count_laplace",
                          pre_threshold=12, max_items=GB_MAX, seed=8, scope="t")
    released = [r["item"] for r in out.collect()]
    assert released and all(len(users[i]) >= 12 for i in released)
    assert released == sorted(released)


def test_group_by_refuses_selections_without_a_spark_form_before_reading(spark, monkeypatch):
    from dpsql.frontends import spark as dspark

    drawn = []
    monkeypatch.setattr(dspark, "secure_source", lambda: drawn.append("salt"))
    monkeypatch.setattr(dspark, "_checked_rows", lambda *a: drawn.append("read"))
    others = [m for m in union.METHODS if m not in dspark.PARALLEL_METHODS]
    assert others
    for method in others:
        with pytest.raises(DPParameterError, match=rf"^dpsql: selection '{method}' has no Spark "
                                                   rf"form; .*selection := '{method}' with DuckDB"):
            dspark.group_by(None, epsilon=1.0, delta=1e-5, selection=method)
    assert drawn == []


@pytest.mark.parametrize("kwargs", [
    dict(epsilon=1.0, delta=1e-5, split=1.0),
    dict(epsilon=1.0, delta=1e-5, aggregates=["sum"], value_col="v", lower=3, upper=1),
    dict(epsilon=1.0, delta=1e-5, aggregates="count"),
    dict(epsilon=1.0, delta=1e-5, selection="mad2r", pre_threshold=3),
    dict(epsilon=1.0, delta=1e-5, value_col="v"),
    dict(epsilon=-1.0, delta=1e-5),
])
def test_group_by_bad_parameters_fail_like_dpsql_group_by(spark, kwargs):
    from dpsql.frontends import spark as dspark

    con = dpsql.connect()
    try:
        con.execute("CREATE TABLE t AS SELECT 1::BIGINT AS user_id, 'a' AS item, 1.0::DOUBLE AS v")
        with pytest.raises(DPParameterError) as duck_err:
            dpsql.group_by(con, "t", **kwargs)
    finally:
        con.close()
    with pytest.raises(DPParameterError) as spark_err:
        dspark.group_by(None, **kwargs)  # refused before the DataFrame is touched
    assert str(spark_err.value) == str(duck_err.value)


def test_group_by_null_user_fails_like_duckdb(spark, monkeypatch):
    from dpsql.frontends import spark as dspark

    rows = pa.table({"user_id": pa.array([1, None], pa.int64()), "item": pa.array(["a", "b"]),
                     "v": pa.array([1.0, 2.0], pa.float64())})
    args = dict(epsilon=1.0, aggregates=["sum"], value_col="v", lower=0, upper=2)
    con = dpsql.connect()
    try:
        con.execute("CREATE TABLE t AS FROM rows")
        with pytest.raises(Exception) as duck_err:
            dpsql.group_by(con, "t", delta=1e-5, selection="count_laplace", **args)
    finally:
        con.close()
    message = "dpsql: " + str(duck_err.value).split("dpsql: ", 1)[1].splitlines()[0]
    assert message.startswith("dpsql: column user_id (")
    drawn = []
    monkeypatch.setattr(dspark, "secure_source", lambda: drawn.append("salt"))
    monkeypatch.setattr(dspark, "_noise_task", lambda *a: drawn.append("noise"))
    monkeypatch.setattr(dspark, "_group_by_task", lambda *a: drawn.append("noise"))
    with pytest.raises(DPParameterError) as spark_err:
        dspark.group_by(spark.createDataFrame(rows), delta=1e-5, selection="count_laplace", **args, scope="t")
    assert str(spark_err.value) == message and drawn == []


def test_group_by_value_column_is_numeric_and_its_nulls_are_skipped_like_duckdb(spark):
    from dpsql import groupby as gb
    from dpsql.frontends import spark as dspark

    text = pa.table({"user_id": pa.array([1, 2], pa.int64()), "item": pa.array(["a", "b"]),
                     "v": pa.array(["1", "secret"])})
    args = dict(epsilon=1.0, aggregates=["sum"], value_col="v", lower=0, upper=2)
    with pytest.raises(DPParameterError, match=r"^dpsql: value_col := 'v' has type string, not a number") as err:
        dspark.group_by(spark.createDataFrame(text), delta=1e-5, selection="count_laplace", **args, scope="t")
    assert "secret" not in str(err.value)
    # NULL values: the translated stage skips them in the sum (the user still counts), as DuckDB does.
    rows = pa.table({"user_id": pa.array([1, 2, 3, 4], pa.int64()), "item": pa.array(["a", "a", "a", "b"]),
                     "v": pa.array([1.5, None, 2.0, None], pa.float64())})
    cal = gb.group_by_calibration(1.0, None, 5, ["count", "sum"], "v", 0.0, 10.0, None)  # public domain
    selected = spark.createDataFrame(pa.table({"item": pa.array(["a", "b"])}))
    frame = dspark._checked_rows(spark.createDataFrame(rows), "user_id", "item", "v")
    got = {r["item"]: (r["n"], r["s_steps"]) for r in dspark.group_by_stats(frame, selected, 5, 7, cal).collect()}
    g = cal.sum_granularity
    assert got == {"a": (3, round(1.5 / g) + round(2.0 / g)), "b": (1, None)}


def test_the_spark_defaults_are_duckdbs():
    """The Spark functions default to DuckDB's default method (the most preferred declaration, which has a
    Spark form) and group_by to dpsql.group_by's default selection. No session needed."""
    import inspect

    need("pyspark")
    from dpsql import groupby as gb
    from dpsql.frontends import spark as dspark

    assert dspark.DEFAULT_METHOD == union.DEFAULT_METHOD == "sips_cumulative"
    assert dspark.DEFAULT_METHOD in dspark.PARALLEL_METHODS
    assert inspect.signature(dspark.set_union).parameters["method"].default == dspark.DEFAULT_METHOD
    duck_selection = inspect.signature(dpsql.group_by).parameters["selection"].default
    assert inspect.signature(dspark.group_by).parameters["selection"].default == dspark.DEFAULT_SELECTION
    # NULL: per setting, resolved by the calibration both engines share; every rule it names runs on Spark
    assert dspark.DEFAULT_SELECTION is duck_selection is None
    named = {gb.default_selection(mi, mg) for mi in (1, 2, 100) for mg in (None, 1, 2)}
    assert named == {gb.TRUNCATED_GEOMETRIC, union.DEFAULT_METHOD} and named <= set(dspark.SPARK_SELECTIONS)
