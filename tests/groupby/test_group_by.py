"""Private GROUP BY (dp_group_by, dp_group_by_public): calibration, sensitivity, statistics, release path."""
from __future__ import annotations

import math
import random
import re
import sys

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql import groupby as gb
from dpsql.core.calibration import default_granularity
from dpsql.core.validation import DPParameterError

from conftest import seeded


def load(con, rows, name="t"):
    """Create table ``name`` (user_id BIGINT, item VARCHAR, v DOUBLE) from (user, item, value) tuples."""
    staged = pa.table({"u": pa.array([r[0] for r in rows], pa.int64()),  # noqa: F841 (replacement scan)
                       "i": pa.array([str(r[1]) for r in rows], pa.string()),
                       "x": pa.array([float(r[2]) for r in rows], pa.float64())})
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT u AS user_id, i AS item, x AS v FROM staged")


def items_table(con, items, name="pub"):
    staged = pa.table({"i": pa.array([str(i) for i in items], pa.string())})  # noqa: F841
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT i AS item FROM staged")


def n_releases(con) -> int:
    return con.execute("SELECT count(*) FROM dp_releases()").fetchall()[0][0]


# -- calibration: exact numbers ------------------------------------------------------------------


def test_count_only_split_and_scale():
    # Laplace (noise := 'laplace'): pure DP, the selection keeps the whole delta
    # (tests/groupby/test_group_by_calibration.py has the Gaussian default's numbers)
    cal = gb.group_by_calibration(1.0, 1e-5, 10, noise="laplace")
    assert (cal.selection, cal.selection_epsilon, cal.selection_delta) == ("sips_cumulative", 0.5, 1e-5)
    assert cal.aggregate_epsilon == 0.5 and cal.count_epsilon == 0.5
    # continuous scale 10/0.5 = 20; grid 2^floor(log2 20) / 2^16 = 2^-12 (<= 1: counts stay on it)
    assert cal.count_granularity == 2.0 ** -12
    assert cal.count_scale == 20.0  # floor(10 / 2^-12) steps * 2^-12 / 0.5, exact
    assert cal.sum_scale is None and cal.mean_count_ci is None
    assert cal.count_ci == 59.91455078125  # 245410 grid steps: ceil(81920 ln(2 / (0.05 (1 + a)))) - 1, a = exp(-1/81920)
    assert cal.count_ci / cal.count_granularity == 245410


def test_count_sum_mean_share_the_aggregate_budget():
    cal = gb.group_by_calibration(1.0, 1e-5, 10, ["mean", "count", "sum"], "v", 0, 6, "weighted_gaussian", 0.5, 0.95,
                                  noise="laplace")
    assert cal.aggregates == ("count", "sum", "mean")
    assert cal.count_epsilon == cal.sum_epsilon == 0.25
    assert cal.count_scale == 40.0
    # sum: M = 6, l1 = 10 * 6 = 60, continuous 240, grid 2^7 / 2^16 = 2^-9; rounded l1 = 60 + 10 * 2^-9
    assert cal.sum_bound == 6.0 and cal.sum_granularity == 2.0 ** -9 == default_granularity(240.0)
    assert cal.sum_scale == (60.0 + 10 * 2.0 ** -9) / 0.25 == 240.078125
    assert cal.sum_ci == 719.208984375
    # the mean's intervals: each at (1 + 0.95) / 2 = 0.975
    assert cal.mean_count_ci == gb.laplace_ci(40.0, 2.0 ** -11, 0.975)
    assert cal.mean_sum_ci == gb.laplace_ci(cal.sum_scale, 2.0 ** -9, 0.975)


def test_sum_alone_uses_the_whole_aggregate_share_and_the_larger_bound():
    cal = gb.group_by_calibration(2.0, 1e-6, 4, ["sum"], "v", -3, 1, split=0.25, noise="laplace")
    assert cal.selection_epsilon == 0.5 and cal.aggregate_epsilon == 1.5 and cal.sum_epsilon == 1.5
    assert cal.count_scale is None and cal.sum_bound == 3.0
    g = default_granularity(12.0 / 1.5)
    assert cal.sum_scale == g * (math.floor(12.0 / g) + 4) / 1.5


def test_public_domain_spends_no_selection_and_no_delta():
    # without a delta the public list is measured with Laplace noise at (epsilon, 0)
    cal = gb.group_by_calibration(1.0, None, 10, ["count"], selection=None)
    assert (cal.selection, cal.selection_epsilon, cal.selection_delta, cal.aggregate_epsilon) == (None, 0.0, 0.0, 1.0)
    assert cal.noise == "laplace" and cal.count_scale == 10.0 and cal.aggregate_delta == 0.0


@pytest.mark.parametrize("scale,g,conf", [(20.0, 2.0 ** -12, 0.95), (3.0, 0.5, 0.9), (1.0, 1.0, 0.5),
                                          (240.078125, 2.0 ** -9, 0.99)])
def test_laplace_ci_is_the_smallest_grid_half_width_with_the_coverage(scale, g, conf):
    w = gb.laplace_ci(scale, g, conf)
    m = round(w / g)
    assert w == m * g
    alpha = math.exp(-g / scale)

    def outside(k):  # P[|Z| > k] for Z ~ DLap(scale/g), pmf (1-a)/(1+a) a^|z|
        return 2 * alpha ** (k + 1) / (1 + alpha)

    assert outside(m) <= 1 - conf + 1e-12
    assert m == 0 or outside(m - 1) > 1 - conf
    # and it tends to the continuous scale ln(1/(1 - conf))
    assert abs(w - scale * math.log(1 / (1 - conf))) <= 2 * g + 1e-9 * scale


@pytest.mark.parametrize("kwargs,match", [
    ({"aggregates": []}, "aggregates must be a non-empty list"),
    ({"aggregates": "count"}, "aggregates must be a non-empty list"),
    ({"aggregates": ["count", "mode"]}, "'mode' is not one of"),
    ({"aggregates": ["count", "count"]}, "must not repeat"),
    ({"aggregates": ["sum"]}, "need value_col"),
    ({"aggregates": ["median"]}, "need value_col"),
    ({"aggregates": ["sum"], "value_col": "v", "upper": 1}, "lower must be a finite number"),
    ({"aggregates": ["mean"], "value_col": "v", "lower": 2, "upper": 1}, "lower must be <= upper"),
    ({"aggregates": ["sum"], "value_col": "v", "lower": 0, "upper": 0}, "must not both be 0"),
    ({"value_col": "v"}, "value_col is used only by the sum, mean, variance, stddev and median"),
    ({"split": 1.0}, "split must be a number strictly between 0 and 1"),
    ({"confidence": 0}, "confidence must be a number strictly between 0 and 1"),
    ({"selection": "nope"}, "method must be one of"),
    ({"max_items": 0}, "max_items"),
])
def test_invalid_parameters_are_refused(kwargs, match):
    with pytest.raises(DPParameterError, match=match):
        gb.group_by_calibration(1.0, kwargs.pop("delta", 1e-5), **kwargs)


# -- SQL: the release path -----------------------------------------------------------------------

ROWS_SQL = ("CREATE TABLE t AS SELECT u AS user_id, 'i' || j AS item, (u % 7)::DOUBLE AS v "
            "FROM range(3000) a(u), range(17) b(j) WHERE j <= u % 17")


def test_selection_and_aggregates_are_one_release_charged_once_for_the_total():
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    out = con.sql("SELECT * FROM dp_group_by('t', epsilon := 1.0, delta := 1e-5, max_items := 10, "
                  "aggregates := ['count', 'sum', 'mean'], value_col := 'v', lower := 0, upper := 6, "
                  "selection := 'weighted_gaussian', split := 0.4)").to_arrow_table()
    assert out.column_names == ["item", "count", "count_scale", "count_ci", "sum", "sum_scale", "sum_ci", "mean",
                                "mean_ci"]
    items = out.column("item").to_pylist()
    assert items == sorted(items) and set(items) <= {f"i{j}" for j in range(17)} and len(items) >= 10
    rel = con.execute("SELECT mechanism, unit, epsilon, delta FROM dp_releases() ORDER BY release_id").fetchall()
    # the selection (0.4, 1e-5) and the aggregates (0.6, 0): one release, one charge of the total
    assert rel == [("dp_group_by", "user", 1.0, 1e-5)]
    means = [m for m in out.column("mean").to_pylist() if m is not None]
    assert all(0.0 <= m <= 6.0 for m in means)
    con.close()


def test_only_the_requested_aggregates_are_columns():
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    out = con.sql("SELECT * FROM dp_group_by('t', epsilon := 1.0, delta := 1e-5, max_items := 10, "
                  "aggregates := ['mean'], value_col := 'v', lower := 0, upper := 6)").to_arrow_table()
    assert out.column_names == ["item", "mean", "mean_ci"]
    con.close()


@pytest.mark.parametrize("bad,match", [
    ("lower := 7, upper := 6", "lower must be <= upper"),
    ("lower := 0, upper := 6, split := 1.5", "split must be a number"),
    ("lower := 0, upper := 6, selection := 'nope'", "method must be one of"),
])
def test_a_bad_parameter_charges_neither_step(bad, match):
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    with pytest.raises(duckdb.Error, match=match):
        con.execute("SELECT * FROM dp_group_by('t', epsilon := 1.0, delta := 1e-5, aggregates := ['sum'], "
                    f"value_col := 'v', {bad})").fetchall()
    assert n_releases(con) == 0
    con.close()


def test_a_non_numeric_value_column_fails_before_the_charge_without_quoting_a_value():
    con = dpsql.connect()
    con.execute("CREATE TABLE s AS SELECT u AS user_id, 'i' || (u % 3) AS item, "
                "CASE WHEN u = 7 THEN 'secret-value' ELSE u::VARCHAR END AS v FROM range(50) r(u)")
    con.execute("CREATE TABLE pub AS SELECT 'i' || j AS item FROM range(3) r(j)")
    for sql in ("SELECT * FROM dp_group_by_public('s', 'pub', epsilon := 1.0, aggregates := ['sum'], "
                "value_col := 'v', lower := 0, upper := 10)",
                "SELECT * FROM dp_group_by('s', epsilon := 1.0, delta := 1e-5, aggregates := ['sum'], "
                "value_col := 'v', lower := 0, upper := 10)"):
        with pytest.raises(duckdb.BinderException) as err:  # a VARCHAR column: the binder, before anything runs
            con.execute(sql).fetchall()
        assert "secret" not in str(err.value)
    with pytest.raises(DPParameterError, match=r"value_col := 'v' has type VARCHAR, not a number") as err:
        dpsql.group_by(con, "s", epsilon=1.0, delta=1e-5, aggregates=["sum"], value_col="v", lower=0, upper=10)
    assert "secret" not in str(err.value)
    assert n_releases(con) == 0
    con.close()


@pytest.mark.parametrize("expr, kind", [("[u]", "BIGINT[]"), ("{'x': u}", "STRUCT")])
def test_a_nested_value_column_is_not_a_number(expr, kind):
    # a list of numbers is not a number: refused by name and type before anything is read or charged
    con = dpsql.connect()
    con.execute(f"CREATE TABLE s AS SELECT u AS user_id, 'i' || (u % 3) AS item, {expr} AS v FROM range(50) r(u)")
    with pytest.raises(DPParameterError, match=rf"value_col := 'v' has type {re.escape(kind)}"):
        dpsql.group_by(con, "s", epsilon=1.0, delta=1e-5, aggregates=["sum"], value_col="v", lower=0, upper=10)
    assert n_releases(con) == 0
    con.close()


def test_null_values_are_skipped_by_the_sum_and_never_raise_after_the_selection():
    # A NULL value raising an error while the aggregates read the selected items' rows (after the
    # selection's charge) would tell whether a selected item holds a NULL: NULLs are skipped instead,
    # as SQL's SUM skips them, and the user still counts.
    con = dpsql.connect(seed=5)
    con.execute("CREATE TABLE n AS SELECT u AS user_id, 'i' || (u % 3) AS item, "
                "CASE WHEN u % 2 = 0 THEN NULL ELSE 1.0 END AS v FROM range(30000) r(u)")
    out = con.execute("SELECT item, count, sum FROM dp_group_by('n', epsilon := 1.0, delta := 1e-5, "
                      "aggregates := ['count', 'sum'], value_col := 'v', lower := 0, upper := 10, max_items := 1)").fetchall()
    assert [r[0] for r in out] == ["i0", "i1", "i2"]
    cal = con.execute("SELECT count_scale, sum_scale FROM dp_group_by('n', epsilon := 1.0, delta := 1e-5, "
                      "aggregates := ['count', 'sum'], value_col := 'v', lower := 0, upper := 10, max_items := 1) LIMIT 1"
                      ).fetchall()
    count_scale, sum_scale = cal[0]
    # Gaussian: count and sum share the aggregates' zCDP budget; the sum's scale is 10 times the count's (the
    # bound 10 against 1, on the sum's grid)
    assert sum_scale == pytest.approx(10 * count_scale, rel=1e-4)
    # 10,000 users per item, half with value 1.0 and half with NULL (a NULL read as upper would give 55,000)
    for _, count, total in out:
        assert abs(count - 10_000) < 12 * count_scale and abs(total - 5_000) < 12 * sum_scale
    con.close()


def test_public_domain_gives_every_listed_item_a_row():
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    items_table(con, ["i0", "i3", "absent_a", "absent_b", "i3"])
    out = dpsql.group_by(con, "t", epsilon=1.0, items_tbl="pub", max_items=10)
    assert out.column("item").to_pylist() == ["absent_a", "absent_b", "i0", "i3"]
    # with a delta: dp_group_by(..., items_tbl := ...), Gaussian noise at (epsilon, delta), no selection
    gauss = dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, items_tbl="pub", max_items=10)
    assert gauss.column("item").to_pylist() == ["absent_a", "absent_b", "i0", "i3"]
    # 4 listed groups: no user contributes to more than 4 (the noise's L0 = min(max_groups, 4))
    want = gb.group_by_calibration(1.0, 1e-5, 10, selection=None, groups=4)
    assert want.max_groups == 4 and gauss.column("count_scale")[0].as_py() == want.count_scale
    assert con.execute("SELECT mechanism, epsilon, delta FROM dp_releases() ORDER BY release_id").fetchall() == [
        ("dp_group_by_public", 1.0, 0.0), ("dp_group_by", 1.0, 1e-5)]
    with pytest.raises(DPParameterError, match="noise := 'gaussian' needs delta"):
        dpsql.group_by(con, "t", epsilon=1.0, items_tbl="pub", noise="gaussian")
    assert n_releases(con) == 2
    con.close()


def test_python_runs_the_macro_once():
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    out = dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, aggregates=("count", "sum"), value_col="v", lower=0,
                         upper=6, max_items=10, selection="weighted_laplace")
    assert isinstance(out, pa.Table) and out.column_names[:2] == ["item", "count"]
    assert con.execute("SELECT sum(epsilon), sum(delta) FROM dp_releases()").fetchall() == [(1.0, 1e-5)]
    with pytest.raises(DPParameterError, match="sum, mean, variance, stddev and median need value_col"):
        dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, aggregates=["sum"])
    con.close()


def test_python_validates_by_the_declaration_and_calibrates_only_in_the_macro(monkeypatch):
    # dpsql.group_by checks its parameters by the declaration and runs the macro, whose checks calibrate
    # (the SQL raises a calibration error as dpsql's ParameterError): Python does not calibrate a second time
    con = dpsql.connect()
    con.execute(ROWS_SQL)
    callers = []
    original = gb.group_by_calibration

    def spy(*args, **kwargs):
        callers.append(sys._getframe(1).f_code.co_name)
        return original(*args, **kwargs)

    monkeypatch.setattr(gb, "group_by_calibration", spy)
    dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, selection="weighted_laplace", max_items=10)
    dpsql.group_by(con, "t", epsilon=1.0, items_tbl="t", max_items=10)
    assert len(dpsql.releases(con)) == 2
    assert callers and not {"group_by", "check_call"} & set(callers), callers
    con.close()


# -- sensitivity on random neighbouring datasets ------------------------------------------------


def zero_noise(con):
    """Replace the connection's granular samplers by zeros: a release then shows its exact bounded aggregates."""
    from duckdb.sqltypes import DOUBLE

    for name in ("dp_granular_laplace_noise", "dp_granular_gaussian_noise"):
        con.remove_function(name)
        con.create_function(name, lambda s, g: pa.array(np.zeros(len(s))), [DOUBLE, DOUBLE], DOUBLE, type="arrow",
                            side_effects=True)


def _release(rows, items, seed, aggregates, max_items, lower, upper):
    """dp_group_by_public with its granular noise replaced by zeros: the exact bounded aggregates."""
    con = seeded(seed)
    zero_noise(con)
    load(con, rows)
    items_table(con, items)
    out = con.sql(f"SELECT * FROM dp_group_by_public('t', 'pub', epsilon := 1.0, max_items := {max_items}, "
                  f"aggregates := {aggregates!r}, value_col := 'v', lower := {lower}, upper := {upper})"
                  ).to_arrow_table()
    cal = con.execute("SELECT calibration FROM dp_releases()").fetchall()[0][0]
    con.close()
    return out, cal


@pytest.mark.parametrize("trial", range(6))
def test_adding_one_user_moves_counts_and_sums_within_the_calibrated_sensitivity(trial):
    # Same seed: the same salt, so every other user keeps the same items; the noise is zero (_release),
    # so the differences are those of the aggregates the noise is calibrated to (noise rows may meet
    # the sampler in a different order on the two tables, so equal seeds alone would not cancel it).
    rnd = random.Random(trial)
    items = [f"x{k}" for k in range(30)]
    lower, upper, max_items = rnd.choice([(0, 5), (-2, 3), (1, 4)]) + (rnd.randint(1, 6),)
    rows = []
    for u in range(rnd.randint(20, 60)):
        for _ in range(rnd.randint(1, 15)):
            rows.append((u, rnd.choice(items), rnd.uniform(-4, 8)))
    newcomer = [(999, rnd.choice(items + ["not_listed"]), rnd.uniform(-10, 10)) for _ in range(rnd.randint(1, 40))]
    seed = 1000 + trial
    a, cal = _release(rows, items, seed, ["count", "sum"], max_items, lower, upper)
    b, _ = _release(rows + newcomer, items, seed, ["count", "sum"], max_items, lower, upper)
    assert a.column("item").to_pylist() == b.column("item").to_pylist() == sorted(items)
    dc = np.array(b.column("count").to_pylist()) - np.array(a.column("count").to_pylist())
    ds = np.array(b.column("sum").to_pylist()) - np.array(a.column("sum").to_pylist())
    # counts: each moves by 0 or 1, at most max_items of them (on the grid: exact)
    assert set(dc.tolist()) <= {0.0, 1.0} and dc.sum() <= max_items
    # and the newcomer is counted once in each of min(max_items, its listed items) items
    assert dc.sum() == min(max_items, len({i for _, i, _ in newcomer if i in items}))
    # sums: only where the count moved, each by <= M (+ g for the rounding), l1 <= the rounded sensitivity
    m_bound = max(abs(lower), abs(upper))
    sum_scale = a.column("sum_scale")[0].as_py()
    g = default_granularity(max_items * m_bound / 0.5)
    assert np.all(ds[dc == 0] == 0.0)
    assert np.all(np.abs(ds) <= m_bound + g)
    assert np.abs(ds).sum() <= sum_scale * 0.5 + 1e-9  # rounded l1 sensitivity = scale * epsilon
    assert "sum_granularity" in cal


def test_same_data_same_seed_same_release():
    # the premise of the neighbour test: the release is a function of (data, seed) only
    rows = [(u, f"x{u % 5}", u) for u in range(40)]
    a, _ = _release(rows, [f"x{k}" for k in range(5)], 3, ["count", "sum"], 2, 0, 10)
    b, _ = _release(list(reversed(rows)), [f"x{k}" for k in range(5)], 3, ["count", "sum"], 2, 0, 10)
    assert a.equals(b)


# -- statistics (fixed seeds, explicit tolerances) ----------------------------------------------


@pytest.mark.slow
def test_count_noise_has_the_calibrated_scale_and_the_intervals_cover():
    # 3000 public items, item k held by k % 50 users (values 1..4 each), max_items large enough that no
    # user is capped: released - true is the noise.
    n_items, conf = 3000, 0.9
    rows = []
    for k in range(n_items):
        for u in range(k % 50):
            rows.append((k * 100 + u, f"x{k}", 1 + (u % 4)))
    con = seeded(20261124)
    load(con, rows)
    items_table(con, [f"x{k}" for k in range(n_items)])
    out = con.sql(f"SELECT * FROM dp_group_by_public('t', 'pub', epsilon := 2.0, max_items := 1, "
                  f"aggregates := ['count', 'sum', 'mean'], value_col := 'v', lower := 0, upper := 5, "
                  f"confidence := {conf}) ORDER BY item").to_arrow_table().to_pydict()
    con.close()
    truth = {f"x{k}": (k % 50, sum(1 + (u % 4) for u in range(k % 50))) for k in range(n_items)}
    zc = np.array([c - truth[i][0] for i, c in zip(out["item"], out["count"])])
    zs = np.array([s - truth[i][1] for i, s in zip(out["item"], out["sum"])])
    b_c, b_s = out["count_scale"][0], out["sum_scale"][0]
    assert b_c == 1.0  # max_items 1; two measurements (count, sum) at epsilon 1 each
    # The count is released as an integer (post-processing): Z = round(g DLap(b/g)) where no count is clamped
    # at 0 (true counts >= 5): E|Z| = sum_k k P[round(|Z|) = k] ~ e^-0.5 / (1 - e^-1) = 0.9595 b at b = 1.
    # s.e. ~ b / sqrt(3000) ~ 1.8 %
    far = np.array([truth[i][0] >= 5 for i in out["item"]])
    assert abs(np.abs(zc[far]).mean() / (math.exp(-0.5) / (1 - math.exp(-1))) - 1) < 0.06
    # E|Z| = b for the sum (Laplace; the discrete one differs by < 1e-9 relative at 2^16 steps); sums >= 5 are
    # never clamped at 0 by the noise of scale ~ 5 often enough to matter: only the large ones are used
    big = np.array([truth[i][1] >= 50 for i in out["item"]])
    assert abs(np.abs(zs[big]).mean() / b_s - 1) < 0.06
    assert abs(zc[far].mean()) < 4 * b_c * math.sqrt(2) / math.sqrt(far.sum())
    # interval coverage (the half-widths are before post-processing; rounding moves an integer count by at
    # most floor(ci + 1/2) from the truth): binomial s.e. sqrt(0.09 / 3000) ~ 0.55 %
    assert np.mean(np.abs(zc[far]) <= math.floor(out["count_ci"][0] + 0.5)) >= conf - 0.02
    assert abs(np.mean(np.abs(zs[big]) <= out["sum_ci"][0]) - conf) < 0.02
    # the mean's interval is conservative (union bound): covers at least conf of the items with users
    covered = [abs(m - truth[i][1] / truth[i][0]) <= w for i, m, w in zip(out["item"], out["mean"], out["mean_ci"])
               if truth[i][0] >= 1 and m is not None]
    assert len(covered) > 0.9 * n_items * 49 / 50 and np.mean(covered) >= conf - 0.01


@pytest.mark.parametrize("cap", ["max_items := 3", "max_items := 50, max_groups := 3"])
def test_capping_keeps_at_most_max_groups_per_user_among_released_items(cap):
    # One user holds 40 listed items and nobody else exists: with a cap of 3 groups exactly 3 counts are 1
    # (max_groups, when given, caps the aggregates whatever max_items, the selection's cap, is).
    con = seeded(5)
    zero_noise(con)
    load(con, [(1, f"x{k}", 1.0) for k in range(40)])
    items_table(con, [f"x{k}" for k in range(40)])
    out = con.sql(f"SELECT item, count FROM dp_group_by_public('t', 'pub', epsilon := 1.0, {cap})").fetchall()
    con.close()
    assert sorted(r[1] for r in out) == [0] * 37 + [1] * 3


# -- command line --------------------------------------------------------------------------------


def _cli(*argv):
    import io
    import json

    from dpsql.frontends import cli

    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    text = out.getvalue()
    return code, (json.loads(text) if "--json" in argv and code == 0 else text), err.getvalue()


def test_cli_group_by_selection_and_public_list(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    con = duckdb.connect()
    con.execute(f"COPY ({ROWS_SQL.split(' AS ', 1)[1]}) TO 'data.parquet'")
    con.execute("COPY (SELECT 'i' || j AS item FROM range(3) r(j) UNION ALL SELECT 'nobody') TO 'items.csv'")
    con.close()
    code, doc, err = _cli("group-by", "data.parquet", "--epsilon", "1", "--delta", "1e-5", "--max-items", "10",
                          "--aggregates", "count,mean", "--value-col", "v", "--lower", "0", "--upper", "6",
                          "--selection", "weighted_gaussian", "--noise", "laplace", "--json")
    assert code == 0, err
    assert doc["mechanism"] == "dp_group_by" and doc["calibration"]["count_scale"] == 40.0
    assert list(doc["rows"][0]) == ["item", "count", "count_scale", "count_ci", "mean", "mean_ci"]
    code, doc, err = _cli("group-by", "data.parquet", "--epsilon", "1", "--delta", "1e-5", "--max-items", "10",
                          "--max-groups", "4", "--aggregates", "count,rows", "--max-rows", "2", "--json")
    assert code == 0, err
    want = gb.group_by_calibration(1.0, 1e-5, 10, ["count", "rows"], max_groups=4, max_rows=2)
    assert doc["calibration"]["noise"] == "gaussian" and doc["calibration"]["count_scale"] == want.count_scale
    assert list(doc["rows"][0]) == ["item", "count", "count_scale", "count_ci", "rows", "rows_scale", "rows_ci"]
    code, doc, err = _cli("group-by", "data.parquet", "--epsilon", "1", "--items", "items.csv", "--max-items", "10",
                          "--json")
    assert code == 0, err
    assert [r["item"] for r in doc["rows"]] == ["i0", "i1", "i2", "nobody"]
    assert doc["delta"] == 0.0 and doc["calibration"]["noise"] == "laplace"
    # with --items, --delta selects Gaussian noise at (epsilon, delta)
    code, doc, err = _cli("group-by", "data.parquet", "--epsilon", "1", "--items", "items.csv", "--delta", "1e-5",
                          "--max-items", "10", "--json")
    assert code == 0, err
    assert doc["mechanism"] == "dp_group_by" and doc["delta"] == 1e-5 and doc["calibration"]["noise"] == "gaussian"
    code, _, err = _cli("group-by", "data.parquet", "--epsilon", "1", "--delta", "1e-5", "--aggregates", "sum")
    assert code == 2 and "value_col" in err
    code, _, err = _cli("group-by", "data.parquet", "--epsilon", "1")
    assert code == 2 and "--delta" in err
    code, text, err = _cli("budget", "releases", "data.parquet")
    # one ledger row per release: dp_group_by (its selection and aggregates, one charge) twice, the public list
    # without a delta (dp_group_by_public), then with one (dp_group_by's aggregates over the list)
    assert code == 0 and [line.split()[-1] for line in text.splitlines()[1:]] == [
        "dp_group_by", "dp_group_by", "dp_group_by_public", "dp_group_by"]


# -- empirical audit -----------------------------------------------------------------------------


def test_audit_of_the_aggregate_step_is_tight_and_does_not_refute():
    from dpsql.tools import audit

    # 3 users vs 4 on 2 public items, max_items 2: P["both noisy counts >= 4"] is e^epsilon times
    # likelier with the added user, so a correct calibration gives a bound near, never above, epsilon;
    # twice the sensitivity (or half the noise) would give about 2 epsilon.
    r = audit.audit("group_by_count", epsilon=1.0, delta=1e-5, runs=5000, confidence=0.95, seed=5)
    assert (r.claimed_epsilon, r.delta) == (1.0, 0.0)
    assert not r.refuted and 0.6 < r.epsilon_lower_bound <= 1.0


def test_audit_of_the_row_count_is_tight_and_does_not_refute():
    # max_rows 3, the added user has 3 rows of each of 2 groups: "both noisy row counts >= 3 + 3" is e^epsilon
    # times likelier with it (l1 = max_groups * max_rows = 6, scale 6 / epsilon): a bound near epsilon
    from dpsql.tools import audit

    r = audit.audit("group_by_rows", epsilon=1.0, delta=1e-5, runs=5000, confidence=0.95, seed=5)
    assert (r.claimed_epsilon, r.delta) == (1.0, 0.0)
    assert not r.refuted and 0.6 < r.epsilon_lower_bound <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("case,claimed_delta,least", [("group_by_count_gaussian", 1e-5, 0.0),
                                                      ("group_by_median", 0.0, 0.2)])
def test_audit_of_the_gaussian_count_and_the_median_does_not_refute(case, claimed_delta, least):
    # Gaussian count at (1, 1e-5): no threshold event is tight for a Gaussian, so only "not refuted" is asked.
    # Median: 20 users at 0 and the added one at 10, "median = 0" in both groups: P ~ 0.137 against ~ 0.068
    # (docs/proofs/group_by.md §6), a bound of about ln 2 at most.
    from dpsql.tools import audit

    r = audit.audit(case, epsilon=1.0, delta=1e-5, runs=5000, confidence=0.95, seed=5)
    assert (r.claimed_epsilon, r.delta) == (1.0, claimed_delta)
    assert not r.refuted and least <= r.epsilon_lower_bound <= 1.0


# -- pre_threshold -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,match", [
    ({"pre_threshold": 5}, "needs selection := one of count_laplace"),  # the default sips_cumulative: no proof
    ({"pre_threshold": 5, "selection": "policy_laplace"}, "needs selection := one of"),
    ({"pre_threshold": 2.5, "selection": "weighted_gaussian"}, "pre_threshold must be a whole number"),
    ({"pre_threshold": 0, "selection": "weighted_gaussian"}, "pre_threshold must be a whole number"),
])
def test_pre_threshold_is_refused_where_it_has_no_proof(kwargs, match):
    with pytest.raises(DPParameterError, match=match):
        gb.group_by_calibration(1.0, 1e-5, 10, **kwargs)
    with pytest.raises(DPParameterError, match="needs selection"):
        gb.group_by_calibration(1.0, None, 10, selection=None, pre_threshold=3)  # public domain


def _shifted_weights(rows, weighting, t):
    """Reference: w'(x) = w(x) - (t - 1) for items with >= t users, absent otherwise (no cap needed here)."""
    items_of: dict = {}
    for u, x in rows:
        items_of.setdefault(u, set()).add(x)
    w: dict = {}
    n: dict = {}
    for u, xs in items_of.items():
        for x in xs:
            c = {"count": 1.0, "inverse": 1.0 / len(xs), "inverse_sqrt": 1.0 / math.sqrt(len(xs))}[weighting]
            w[x] = w.get(x, 0.0) + c
            n[x] = n.get(x, 0) + 1
    return {x: w[x] - (t - 1) for x in w if n[x] >= t}


@pytest.mark.parametrize("trial", range(40))
def test_shifted_weight_of_a_newly_eligible_item_is_at_most_the_new_users_weight(trial):
    # The lemma the pre-threshold's privacy rests on (docs/proofs/group_by.md): adding user u moves an
    # item eligible before by exactly u's weight, and gives an item that becomes eligible a shifted
    # weight <= u's weight (the novel-item case); nothing else changes.
    rnd = random.Random(trial)
    t = rnd.randint(2, 6)
    items = [f"x{k}" for k in range(12)]
    rows = [(u, rnd.choice(items)) for u in range(rnd.randint(5, 40)) for _ in range(rnd.randint(1, 5))]
    new = {rnd.choice(items) for _ in range(rnd.randint(1, 6))}
    for weighting in ("count", "inverse", "inverse_sqrt"):
        c = {"count": 1.0, "inverse": 1.0 / len(new), "inverse_sqrt": 1.0 / math.sqrt(len(new))}[weighting]
        before = _shifted_weights(rows, weighting, t)
        after = _shifted_weights(rows + [(999, x) for x in new], weighting, t)
        assert set(before) <= set(after) and set(after) - set(before) <= new
        for x, w in after.items():
            if x in before:
                assert w - before[x] == pytest.approx(c if x in new else 0.0, abs=1e-12)
            else:
                assert w <= c + 1e-12


def test_pre_threshold_releases_only_items_with_enough_users_and_charges_its_selection():
    # no user holds more than max_items items, so no cap: n(x) is the true number of users
    rnd = random.Random(7)
    # ~75 users per item (sd ~ 8.6); T = 70: shifted counts n - 69 reach the threshold (~9.9) from n ~ 79
    rows = [(u, f"x{rnd.randint(0, 59)}", 1.0) for u in range(1500) for _ in range(3)]
    users = {}
    for u, x, _ in rows:
        users.setdefault(x, set()).add(u)
    con = dpsql.connect()
    load(con, rows)
    out = dpsql.group_by(con, "t", epsilon=8.0, delta=1e-5, max_items=3, selection="count_laplace",
                         pre_threshold=70)
    released = out.column("item").to_pylist()
    assert released and all(len(users[x]) >= 70 for x in released)
    assert any(len(users[x]) < 70 for x in users)  # the filter had something to remove
    # the selection (4, 5e-6) and the Gaussian aggregates (4, 5e-6) (count_laplace has no Gaussian form:
    # basic composition): one charge of the total
    assert con.execute("SELECT mechanism, epsilon, delta FROM dp_releases() ORDER BY release_id").fetchall() == [
        ("dp_group_by", 8.0, 1e-5)]
    con.close()


def test_dbt_plugin_treats_both_macros_as_releases():
    # dbt models may only store a release as a table (the plugin refuses views over a release)
    dbt_plugin = pytest.importorskip("dpsql.frontends.dbt", reason="dbt is not installed")
    con = dpsql.connect()
    found = dbt_plugin.release_macros(con)
    assert {"dp_group_by", "dp_group_by_public"} <= found
    con.close()


def test_sql_calibration_function_gives_the_python_numbers():
    con = dpsql.connect()
    row = con.execute("SELECT dp_group_by_calibration(1.0, 1e-5, 10, aggregates := ['count', 'sum', 'mean'], "
                      "value_col := 'v', lower := 0, upper := 6, selection := 'weighted_gaussian', "
                      "noise := 'laplace')").fetchall()[0][0]
    assert (row["count_scale"], row["count_ci"]) == (40.0, gb.laplace_ci(40.0, 2.0 ** -11, 0.95))
    assert (row["sum_scale"], row["sum_ci"]) == (240.078125, 719.208984375)
    assert row["aggregate_epsilon"] == 0.5 and row["gaussian"] is False
    row = con.execute("SELECT dp_group_by_calibration(1.0, 1e-5, 10, aggregates := ['count', 'sum', 'mean'], "
                      "value_col := 'v', lower := 0, upper := 6, selection := 'weighted_gaussian')").fetchall()[0][0]
    cal = gb.group_by_calibration(1.0, 1e-5, 10, ["count", "sum", "mean"], "v", 0, 6, "weighted_gaussian")
    assert row["gaussian"] is True
    assert (row["count_scale"], row["count_ci"], row["sum_scale"]) == (cal.count_scale, cal.count_ci, cal.sum_scale)
    with pytest.raises(duckdb.Error, match="lower must be <= upper"):
        con.execute("SELECT dp_group_by_calibration(1.0, 1e-5, aggregates := ['sum'], value_col := 'v', "
                    "lower := 1, upper := 0)").fetchall()
    con.close()
