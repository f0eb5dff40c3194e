"""The Python API: what it accepts as a table, its checks before running, bounds, weak-parameter warnings."""
from __future__ import annotations

import math
import warnings

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql.union import adaptive
from dpsql import topk, union
from dpsql.core.validation import (DELTA_MIN, EPSILON_MIN, WEAK_DELTA, WEAK_EPSILON, DPParameterError,
                              WeakPrivacyWarning, check_delta, check_epsilon, warn_weak_parameters)


@pytest.fixture
def con():
    c = dpsql.connect()
    rows = [(u, f"w{u % 3}") for u in range(300)] + [(u, "common") for u in range(300)]
    c.register("src", pa.table({"user_id": [r[0] for r in rows], "item": [r[1] for r in rows]}))
    c.execute("CREATE TABLE t AS FROM src")
    c.unregister("src")
    yield c
    c.close()


def _charged(con) -> int:
    return len(dpsql.releases(con))


# -- item 2: a file path is a table, in Python as in SQL ------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_file_path_is_accepted_as_the_table(con, tmp_path, fmt):
    path = str(tmp_path / f"events.{fmt}")
    con.execute(f"COPY t TO '{path}' (FORMAT {fmt})")
    out = dpsql.set_union(con, path, "weighted_gaussian", epsilon=2.0, delta=1e-5)
    assert "common" in out.column("item").to_pylist()
    ranked = dpsql.top_k(con, path, 1, epsilon=2.0, delta=1e-5)
    assert ranked.column("item").to_pylist() == ["common"]
    assert dpsql.hitting_set(con, path, 1, epsilon=2.0, delta=1e-5).num_rows == 1
    assert dpsql.top_k_limited_domain(con, path, 1, 2, epsilon=2.0, delta=1e-5).column("item").to_pylist() == ["common"]
    # the SQL macro accepts the same string
    assert con.sql(f"FROM dp_set_union_weighted_gaussian('{path}', epsilon := 2.0, delta := 1e-5)").fetchall()


def test_a_missing_file_or_table_is_refused_before_any_charge(con, tmp_path):
    with pytest.raises(DPParameterError, match=r"table '.*nope.parquet': DuckDB cannot read this file"):
        dpsql.set_union(con, str(tmp_path / "nope.parquet"), epsilon=1.0, delta=1e-5)
    with pytest.raises(DPParameterError, match=r"table 'nope' does not exist.*file path"):
        dpsql.top_k(con, "nope", 3, epsilon=1.0, delta=1e-5)
    assert _charged(con) == 0


def test_a_wrong_column_names_the_parameter_and_the_columns(con, tmp_path):
    path = str(tmp_path / "events.parquet")
    con.execute(f"COPY t TO '{path}' (FORMAT parquet)")
    for table in ("t", path):
        with pytest.raises(DPParameterError, match=r"user_col := 'uid' is not a column of .*its columns are "
                                                   r"user_id, item\. Pass user_col"):
            dpsql.set_union(con, table, epsilon=1.0, delta=1e-5, user_col="uid")
        with pytest.raises(DPParameterError, match=r"item_col := 'itm' is not a column"):
            dpsql.top_k(con, table, 2, epsilon=1.0, delta=1e-5, item_col="itm")
    assert _charged(con) == 0


def test_a_string_epsilon_is_named_as_a_string(con):
    with pytest.raises(DPParameterError, match=r"epsilon must be a finite number > 0 \(got '1', a string"):
        dpsql.set_union(con, "t", epsilon="1", delta=1e-5)
    with pytest.raises(DPParameterError, match=r"delta must be .*got '1e-5', a string"):
        dpsql.top_k(con, "t", 2, epsilon=1.0, delta="1e-5")


def test_sql_column_check_macro(con):
    assert con.sql("SELECT dp__check_columns('t', 'USER_ID', 'item'), dp__check_column('t', 'key_col', 'Item')"
                   ).fetchall() == [(True, True)]
    with pytest.raises(duckdb.Error, match=r"dpsql: item_col := 'x' is not a column of 't'; its columns are "
                                           r"user_id, item"):
        con.sql("SELECT dp__check_columns('t', 'user_id', 'x')").fetchall()
    with pytest.raises(duckdb.Error, match=r"dpsql: user_col := 'uid' is not a column"):
        con.sql("SELECT dp__check_columns('t', 'uid', 'item')").fetchall()
    # a bind-safe column selection (the change proposed for dp__user_items) with this check: a missing
    # column fails with the dpsql message, even on an empty table, instead of a binder error
    con.execute("CREATE TABLE empty_t (user_id INT, item VARCHAR)")
    safe = ("SELECT coalesce(*COLUMNS(lambda c: lower(c) = lower('{col}') OR c = 'dp__absent')) AS u "
            "FROM (SELECT *, NULL AS dp__absent FROM query_table('{tbl}') "
            "WHERE dp__check_column('{tbl}', 'user_col', '{col}'))")
    assert {r[0] for r in con.sql(safe.format(col="USER_ID", tbl="t")).fetchall()} == set(range(300))
    for tbl in ("t", "empty_t"):
        with pytest.raises(duckdb.Error, match=r"dpsql: user_col := 'uid' is not a column"):
            con.sql(safe.format(col="uid", tbl=tbl)).fetchall()


def test_a_connection_without_macros_gets_a_dpsql_message():
    plain = duckdb.connect()
    try:
        plain.execute("CREATE TABLE t AS SELECT 1 AS user_id, 'a' AS item")
        with pytest.raises(DPParameterError, match=r"no dpsql macros.*dpsql.register\(con\).*cursor"):
            dpsql.set_union(plain, "t", epsilon=1.0, delta=1e-5)
        with pytest.raises(DPParameterError, match=r"no dpsql macros \(dp_top_k is missing\)"):
            dpsql.top_k(plain, "t", 1, epsilon=1.0, delta=1e-5)
    finally:
        plain.close()


# -- item 4: the user's own values against the documented bounds ------------------------------------------

def test_the_documented_minima_are_accepted_everywhere(con):
    # README "Bad input and edge cases": 1e-200 <= epsilon, 1e-15 <= delta; shares below them are internal.
    for method in union.METHODS:
        cal = union.calibrate(method, epsilon=EPSILON_MIN, delta=DELTA_MIN, max_items=100)
        assert math.isfinite(cal.scale) and math.isfinite(cal.threshold), method
    assert con.sql(f"FROM dp_set_union('t', epsilon := {EPSILON_MIN!r}, delta := {DELTA_MIN!r})").fetchall() == []
    assert dpsql.set_union(con, "t", "weighted_gaussian", epsilon=1.0, delta=DELTA_MIN).num_rows >= 0
    # top-k gives half to its domain step: its documented minima are twice as large
    assert dpsql.top_k(con, "t", 1, epsilon=2 * EPSILON_MIN, delta=2 * DELTA_MIN).num_rows == 0


def test_the_smallest_split_keeps_every_calibration_finite():
    lo = adaptive.SPLIT_MIN
    c = adaptive.mad2r_calibration(EPSILON_MIN, DELTA_MIN, 100, [lo, 1 - lo])
    for value in (c.round1.sigma, c.round1.rho, c.round2.sigma, c.round2.rho, c.lower_offset, c.upper_offset):
        assert math.isfinite(value) and value > 0
    for r in adaptive.sips_calibration(EPSILON_MIN, DELTA_MIN, 100, [lo, lo, 1 - 2 * lo]):
        assert math.isfinite(r.scale) and math.isfinite(r.threshold)
    for method in union.METHODS:
        cal = topk.top_k_calibration(10, 2 * EPSILON_MIN, 2 * DELTA_MIN, 100, method)
        assert math.isfinite(cal.gumbel_scale), method
    lim = topk.limited_domain_calibration(10, math.inf, EPSILON_MIN, DELTA_MIN, 100)
    assert math.isfinite(lim.offset) and math.isfinite(lim.gumbel_scale)


def test_messages_quote_the_value_the_user_passed(con):
    # delta below the minimum: the user's delta, not a share of it (was "got 5e-306")
    with pytest.raises(duckdb.Error, match=r"delta must be >= 1e-15 \(got 1e-16\)"):
        con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-16)").fetchall()
    with pytest.raises(DPParameterError, match=r"delta must be >= 1e-15 \(got 1e-16\)"):
        dpsql.set_union(con, "t", epsilon=1.0, delta=1e-16)
    # a tiny split fraction blames split (was: epsilon)
    with pytest.raises(duckdb.Error, match=r"every fraction of split must be >= 1e-06 \(got \[1e-300, 1.0\]\)"):
        con.sql("FROM dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, split := [1e-300, 1])").fetchall()
    with pytest.raises(DPParameterError, match=r"every fraction of split must be >= 1e-06"):
        adaptive.sips_calibration(1.0, 1e-5, 10, [1e-9, 1 - 1e-9])
    # top-k names its own doubled minimum and the user's value
    with pytest.raises(DPParameterError, match=r"epsilon must be >= 2e-200 for top-k .*got 1e-200"):
        dpsql.top_k(con, "t", 2, epsilon=1e-200, delta=1e-5)
    with pytest.raises(DPParameterError, match=r"delta must be >= 2e-15 for top-k .*got 1e-15"):
        dpsql.hitting_set(con, "t", 2, epsilon=1.0, delta=1e-15)
    # the SQL helper through which dp_top_k / dp_hitting_set hand each half to their domain step
    with pytest.raises(duckdb.Error, match=r"delta must be >= 2e-15 for top-k .*got 1e-15"):
        con.sql("SELECT dp__top_k_share('delta', 1e-15)").fetchall()
    assert con.sql("SELECT dp__top_k_share('epsilon', 3.0)").fetchall() == [(1.5,)]
    assert _charged(con) == 0


def test_direct_calibration_functions_check_the_given_values():
    with pytest.raises(DPParameterError, match=r"epsilon must be >= 1e-200 \(got 1e-201\)"):
        check_epsilon(1e-201)
    with pytest.raises(DPParameterError, match=r"delta must be >= 1e-15"):
        adaptive.mad_round(1.0, 1e-16, 10)
    assert math.isfinite(adaptive.mad_round(1.0, DELTA_MIN, 10).rho)  # its delta/2 is a share, not refused
    assert check_delta(DELTA_MIN) == DELTA_MIN


# -- item 5: weak parameters warn, never refuse -------------------------------------------------------------

def test_weak_parameters_warn_and_still_release(con):
    with pytest.warns(WeakPrivacyWarning, match=r"epsilon = 1e\+06 > 10.*delta = 0.5 > 0.001"):
        out = dpsql.set_union(con, "t", "weighted_gaussian", epsilon=1e6, delta=0.5)
    assert "common" in out.column("item").to_pylist()
    with pytest.warns(WeakPrivacyWarning, match=r"epsilon = 50 > 10"):
        con.sql("FROM dp_set_union_mad2r('t', epsilon := 50, delta := 1e-5)").fetchall()
    with pytest.warns(WeakPrivacyWarning) as record:
        dpsql.top_k(con, "t", 1, epsilon=1.0, delta=0.01)
    # the release's own delta, named with its macro; not its domain step's half of it
    assert [str(w.message) for w in record] == [
        "dpsql: weak privacy parameters of dp_top_k: delta = 0.01 > 0.001 (delta should be well below 1/number of "
        "users). The release runs; choose smaller values for a meaningful guarantee"]


WEAK_RELEASES = {
    "set_union": (lambda con: dpsql.set_union(con, "t", epsilon=20.0, delta=1e-5), "dp_set_union_sips_cumulative"),
    "set_union_mad2r": (lambda con: dpsql.set_union(con, "t", "mad2r", epsilon=20.0, delta=1e-5),
                        "dp_set_union_mad2r"),
    "set_union_progress": (lambda con: dpsql.set_union(con, "t", epsilon=20.0, delta=1e-5, progress=lambda pct: None),
                           "dp_set_union_sips_cumulative"),
    "top_k": (lambda con: dpsql.top_k(con, "t", 2, epsilon=20.0, delta=1e-5), "dp_top_k"),
    "hitting_set": (lambda con: dpsql.hitting_set(con, "t", 2, epsilon=1.0, delta=0.01), "dp_hitting_set"),
    "group_by": (lambda con: dpsql.group_by(con, "t", epsilon=20.0, delta=1e-5), "dp_group_by"),
    "weighted_sample": (lambda con: dpsql.weighted_sample(con, "t", epsilon=20.0, delta=1e-5, key_col="item"),
                        "dp_weighted_sample"),
    "sql": (lambda con: con.sql("FROM dp_set_union('t', epsilon := 20, delta := 1e-5)").fetchall(),
            "dp_set_union_sips_cumulative"),
    "sql_method": (lambda con: con.execute("FROM dp_set_union_mad('t', epsilon := 20, delta := 1e-5)").fetchall(),
                   "dp_set_union_mad"),
}


@pytest.mark.parametrize("name", list(WEAK_RELEASES))
def test_weak_parameters_warn_once_per_release(con, name):
    """DuckDB calls a calibration several times while it plans a statement (a default set-union warned 11
    times, a group-by 23): a release warns once, for its own parameters, and names no line of dpsql's source."""
    release, macro = WEAK_RELEASES[name]
    for _ in range(2):  # each release warns, also when an identical one did before
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            release(con)
        weak = [w for w in caught if issubclass(w.category, WeakPrivacyWarning)]
        assert [str(w.message).split(":")[1] for w in weak] == [f" weak privacy parameters of {macro}"]
        assert "\n" not in str(weak[0].message)
        assert weak[0].filename in (__file__, "<dpsql>")  # this test's line, or none when DuckDB's thread ran it


def test_ordinary_parameters_do_not_warn(con):
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeakPrivacyWarning)
        dpsql.set_union(con, "t", epsilon=WEAK_EPSILON, delta=WEAK_DELTA)
        con.sql("FROM dp_set_union_sips('t', epsilon := 1.0, delta := 1e-6)").fetchall()
        warn_weak_parameters("1", None)  # non-numbers are left to the checks


def test_warning_is_a_user_warning():
    assert issubclass(WeakPrivacyWarning, UserWarning)
    with pytest.warns(UserWarning):
        warn_weak_parameters(11.0, 1e-5)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM dp_weighted_sample('ev', 20.0, 1e-5, key_col := 'item')",
    "SELECT * FROM dp_sbh_histogram('ev', 0.5, 0.01, key_col := 'item')",
    "SELECT * FROM dp_max_coverage('sets', 'cands', 1, epsilon := 20.0)",
    "SELECT * FROM dp_set_cover('sets', 'cands', epsilon := 20.0)",
])
def test_weak_parameters_warn_in_every_family(sql):
    import warnings as _warnings

    from dpsql.core.validation import WeakPrivacyWarning

    con = dpsql.connect()
    con.execute("CREATE TABLE ev AS SELECT 'k' || (i % 5) AS item FROM range(100) r(i)")
    con.execute("CREATE TABLE sets AS SELECT * FROM (VALUES (1, 10), (2, 11)) v(set_id, element)")
    con.execute("CREATE TABLE cands AS SELECT * FROM (VALUES (1), (2)) v(set_id)")
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        con.execute(sql).fetchall()
    assert any(issubclass(w.category, WeakPrivacyWarning) for w in caught), sql
    con.close()


# -- dpsql's own exceptions, not DuckDB's wrapper (dpsql.core.errors.engine_errors) -------------------------------

OVER_BUDGET = {
    "set_union": lambda con: dpsql.set_union(con, "t", "weighted_gaussian", epsilon=1.0, delta=1e-5),
    "set_union_default": lambda con: dpsql.set_union(con, "t", epsilon=1.0, delta=1e-5),
    "set_union_progress": lambda con: dpsql.set_union(con, "t", "weighted_gaussian", epsilon=1.0, delta=1e-5,
                                                      progress=lambda pct: None),
    "top_k": lambda con: dpsql.top_k(con, "t", 2, epsilon=1.0, delta=1e-5),
    "hitting_set": lambda con: dpsql.hitting_set(con, "t", 2, epsilon=1.0, delta=1e-5),
    "top_k_limited_domain": lambda con: dpsql.top_k_limited_domain(con, "t", 1, 2, epsilon=1.0, delta=1e-5),
    "group_by": lambda con: dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5),
    "weighted_sample": lambda con: dpsql.weighted_sample(con, "t", epsilon=1.0, delta=1e-5, key_col="item"),
    "max_coverage": lambda con: dpsql.optimize.max_coverage(con, "sets", "cands", 1, epsilon=1.0),
}


@pytest.mark.parametrize("name", list(OVER_BUDGET))
def test_over_budget_raises_dpsql_budget_exceeded_error(con, name):
    con.execute("CREATE TABLE sets AS SELECT * FROM (VALUES (1, 10), (2, 11)) v(set_id, element)")
    con.execute("CREATE TABLE cands AS SELECT * FROM (VALUES (1), (2)) v(set_id)")
    dpsql.set_budget(con, epsilon=0.1, delta=1e-3)  # less than any first step of these releases
    with pytest.raises(dpsql.BudgetExceededError) as info:
        OVER_BUDGET[name](con)
    exc = info.value
    assert isinstance(exc, dpsql.BudgetError) and isinstance(exc, dpsql.DpsqlError)
    assert not isinstance(exc, duckdb.Error)
    assert str(exc).startswith("dpsql: privacy budget of scope 'database' exceeded") and "Error:" not in str(exc)
    assert isinstance(exc.__cause__, duckdb.Error) and "BudgetExceededError: dpsql:" in str(exc.__cause__)
    assert _charged(con) == 0


def test_a_parameter_the_engine_refuses_raises_dpsql_parameter_error(con):
    # order_col without order_tbl is refused by the macro's SQL check (an SQL error(), no class name).
    with pytest.raises(dpsql.ParameterError, match=r"^dpsql: order_col := 'item' needs order_tbl") as info:
        dpsql.set_union(con, "t", "greedy_update", epsilon=1.0, delta=1e-5, order_col="item")
    assert isinstance(info.value, DPParameterError) and isinstance(info.value, ValueError)
    assert isinstance(info.value.__cause__, duckdb.InvalidInputException)
    assert _charged(con) == 0


def test_a_null_user_raises_dpsql_input_error(con):
    con.execute("INSERT INTO t VALUES (NULL, 'common')")
    with pytest.raises(dpsql.InputError, match=r"^dpsql: column user_id \(user_col\) contains NULL") as info:
        dpsql.set_union(con, "t", "weighted_gaussian", epsilon=1.0, delta=1e-5)
    assert not isinstance(info.value, dpsql.ParameterError)
    assert isinstance(info.value.__cause__, duckdb.Error)
    assert _charged(con) == 0


# -- an engine error that quotes the data never reaches the user -----------------------------------------

SECRET = "s3cr3t-value"


def _quoting_view(con, column: str) -> None:
    """A view whose ``column`` casts a VARCHAR to INTEGER, failing on one row whose value is SECRET."""
    con.execute(f"CREATE TABLE raw AS SELECT i::VARCHAR AS u, (i % 5)::VARCHAR AS it, i::VARCHAR AS w "
                f"FROM range(400) r(i)")
    con.execute(f"UPDATE raw SET {dict(user_id='u', item='it', weight='w')[column]} = '{SECRET}' WHERE u = '321'")
    cast = {"user_id": "u::INTEGER AS user_id, it AS item, w::DOUBLE AS weight",
            "item": "u AS user_id, it::INTEGER AS item, w::DOUBLE AS weight",
            "weight": "u AS user_id, it AS item, w::DOUBLE AS weight"}[column]
    con.execute(f"CREATE VIEW v AS SELECT {cast}, it AS key FROM raw")


CALLS = {
    "set_union": lambda con: dpsql.set_union(con, "v", epsilon=1.0, delta=1e-5),
    "set_union mad2r": lambda con: dpsql.set_union(con, "v", "mad2r", epsilon=1.0, delta=1e-5),
    "group_by": lambda con: dpsql.group_by(con, "v", epsilon=1.0, delta=1e-5),
    "top_k": lambda con: dpsql.top_k(con, "v", 2, epsilon=1.0, delta=1e-5),
    "hitting_set": lambda con: dpsql.hitting_set(con, "v", 2, epsilon=1.0, delta=1e-5),
    "top_k_limited_domain": lambda con: dpsql.top_k_limited_domain(con, "v", 2, 3, epsilon=1.0, delta=1e-5),
}


@pytest.mark.parametrize("column", ["user_id", "item"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_engine_error_quoting_a_value_is_shown_by_its_kind_only(con, call, column):
    # DuckDB's ConversionException names the value it could not cast; the release's error, its traceback
    # included (a traceback prints the causes and contexts of an exception), must not.
    import traceback

    _quoting_view(con, column)
    with pytest.raises(dpsql.InputError, match=r"^dpsql: DuckDB could not read or convert a value of the input "
                                                r"\(ConversionException\)") as info:
        CALLS[call](con)
    shown = "".join(traceback.format_exception(info.value))
    assert SECRET not in shown and "Conversion Error" not in shown
    assert _charged(con) == 0


@pytest.mark.parametrize("call", ["weighted_sample", "group_by"])
def test_a_value_column_that_does_not_convert_is_shown_by_its_kind_only(con, call):
    import traceback

    _quoting_view(con, "weight")
    with pytest.raises(dpsql.InputError, match=r"\(ConversionException\)") as info:
        if call == "weighted_sample":
            dpsql.weighted_sample(con, "v", epsilon=1.0, delta=1e-5, freq_col="weight")
        else:
            dpsql.group_by(con, "v", epsilon=1.0, delta=1e-5, aggregates=["count", "sum"], value_col="weight",
                           lower=0.0, upper=10.0)
    assert SECRET not in "".join(traceback.format_exception(info.value))
    assert _charged(con) == 0
