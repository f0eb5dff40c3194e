"""BigQuery's SELECT WITH DIFFERENTIAL_PRIVACY (dpsql/groupby/bigquery.py): translation, refusals, the release
it runs (equal to the dpsql.group_by call it stands for, charged once to the base tables), the shell, and the
blocks of docs/bigquery_syntax.md."""
from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

import dpsql
from conftest import seeded
from dpsql.core.errors import BudgetExceededError, ParameterError
from dpsql.groupby.bigquery import SUPPORTED, DpSyntaxError, is_dp_query, translate
from dpsql.frontends.shell import run_shell

DOC = Path(__file__).resolve().parents[2] / "docs" / "bigquery_syntax.md"
SEED = 20261122
OPTIONS = "OPTIONS (epsilon = 1, delta = 1e-5, max_groups_contributed = 3, privacy_unit_column = uid)"
COUNT = "COUNT(*, contribution_bounds_per_group => (0, 1))"
SUM = "SUM(q, contribution_bounds_per_group => (0, 10))"

# 400 users; user u holds rows in the 3 groups w(u % 7 + j), j = 0..2, one row each; q = u % 13.
T = ("CREATE TABLE t AS SELECT 'u' || u AS uid, 'w' || (u % 7 + j) AS word, (u % 13)::INTEGER AS q "
     "FROM range(400) a(u), range(3) b(j)")


def q(select: str, tail: str = "FROM t GROUP BY word", options: str = OPTIONS) -> str:
    return f"SELECT WITH DIFFERENTIAL_PRIVACY {options} {select} {tail}"


def views(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]


def n_releases(con) -> int:
    return con.execute("SELECT count(*) FROM dp_releases()").fetchall()[0][0]


# ---------------------------------------------------------------- translation (pure)

def test_translation_maps_options_aggregates_and_names():
    plan = translate(q(f"word AS w, {COUNT} AS users, SUM(q, contribution_bounds_per_group => (0, 10)) total"))
    assert plan.params == {"epsilon": 1.0, "delta": 1e-5, "max_items": 3, "user_col": "uid", "item_col": "word",
                           "aggregates": ["count", "sum"], "value_col": "q", "lower": 0.0, "upper": 10.0}
    assert plan.columns == (("item", "w"), ("count", "users"), ("sum", "total"))
    assert plan.source == 'SELECT uid AS "uid", word AS "word", q AS "q"\nFROM t'
    assert plan.value_check is None


def test_unnamed_aggregates_are_named_as_bigquery_names_anonymous_columns():
    plan = translate(q(f"{COUNT}, AVG(q, contribution_bounds_per_group => (0, 10)), word"))
    assert plan.columns == (("count", "f0_"), ("mean", "f1_"), ("item", "word"))
    plan = translate(q(f"{COUNT} AS n, AVG(q, contribution_bounds_per_group => (0, 10))"))
    assert plan.columns == (("count", "n"), ("mean", "f0_"))  # the GROUP BY column need not be selected


def test_case_comments_whitespace_option_order_and_semicolon_do_not_matter():
    plain = translate(q(f"word, {COUNT} AS n"))
    odd = translate("""select /* a */ with -- b
        Differential_Privacy options(
            privacy_unit_column=uid, MAX_GROUPS_CONTRIBUTED=3,
            delta=.00001, epsilon=+1.0)   -- the options in another order
        word, count ( * , CONTRIBUTION_BOUNDS_PER_GROUP=>(0,1) ) as n
        from t group by word ;  """)
    assert odd.params == plain.params and odd.columns == plain.columns
    assert odd.source == plain.source


def test_bounds_of_the_unit_count_may_start_anywhere_in_0_to_1():
    for bounds in ("(0, 1)", "(1, 1)", "(0.5, 1.0)"):
        plan = translate(q(f"word, COUNT(*, contribution_bounds_per_group => {bounds}) AS n"))
        assert plan.params["aggregates"] == ["count"] and "lower" not in plan.params and "max_rows" not in plan.params


def test_a_row_count_up_to_k_is_rows_with_max_rows_k():
    """COUNT(*) clamps each unit's row count n >= 1 to [lo, k]: min(n, k) for lo in [0, 1], dpsql's rows."""
    for bounds, k in (("(0, 2)", 2), ("(1, 7)", 7), ("(0.5, 3.0)", 3), ("(0, 100000)", 100000)):
        plan = translate(q(f"word, COUNT(*, contribution_bounds_per_group => {bounds}) AS r"))
        assert plan.params == {"epsilon": 1.0, "delta": 1e-5, "max_items": 3, "user_col": "uid", "item_col": "word",
                               "aggregates": ["rows"], "max_rows": k}
        assert plan.columns == (("item", "word"), ("rows", "r"))
    both = translate(q(f"{COUNT} AS n, COUNT(*, contribution_bounds_per_group => (0, 4)), word, {SUM}"))
    assert both.params["aggregates"] == ["count", "rows", "sum"] and both.params["max_rows"] == 4
    assert both.columns == (("count", "n"), ("rows", "f0_"), ("item", "word"), ("sum", "f1_"))


def test_several_group_columns_are_group_cols_each_an_output_column():
    plan = translate(q(f"q AS quarter, {COUNT} AS n, t.word", "FROM t GROUP BY t.word, Q"))
    assert plan.params == {"epsilon": 1.0, "delta": 1e-5, "max_items": 3, "user_col": "uid",
                           "group_cols": ["word", "Q"], "aggregates": ["count"]}
    assert plan.source == 'SELECT uid AS "uid", t.word AS "word", Q AS "Q"\nFROM t'
    assert plan.columns == (("Q", "quarter"), ("count", "n"), ("word", "word"))
    avg = translate(q("AVG(q, contribution_bounds_per_group => (0, 10)) AS a", "FROM t GROUP BY word, day"))
    assert avg.source.startswith('SELECT "uid", "word", "day", CAST("q" AS DOUBLE) / count("q") OVER '
                                 '(PARTITION BY "uid", "word", "day") AS "q"\n')
    named = translate(q("SUM(q, contribution_bounds_per_group => (0, 10))", "FROM t GROUP BY word, q"))
    assert named.params["value_col"] == "value"  # q is a group column: the value takes another name


def test_qualified_columns_a_subquery_and_a_where_go_into_the_view():
    plan = translate(q(f"members.word, {COUNT} AS n",
                       "FROM (SELECT * FROM t WHERE q > 1) AS members WHERE members.q < 9 GROUP BY members.word",
                       OPTIONS.replace("= uid", "= members.uid")))
    assert plan.params["user_col"] == "uid" and plan.params["item_col"] == "word"
    assert plan.source == ('SELECT members.uid AS "uid", members.word AS "word"\n'
                           'FROM (SELECT * FROM t WHERE q > 1) AS members\nWHERE members.q < 9')
    assert plan.columns == (("item", "word"), ("count", "n"))


def test_files_and_table_functions_are_sources():
    assert translate(q(f"word, {COUNT}", "FROM 'data.parquet' GROUP BY word")).source.endswith("FROM 'data.parquet'")
    plan = translate(q(f"word, {COUNT}", "FROM read_parquet('d/*.parquet') AS d GROUP BY word"))
    assert plan.source.endswith("FROM read_parquet('d/*.parquet') AS d")


def test_an_expression_is_a_value_named_value():
    plan = translate(q("word, SUM(q * 2 + 1, contribution_bounds_per_group => (-5, 5.5)) AS s"))
    assert plan.params["value_col"] == "value" and (plan.params["lower"], plan.params["upper"]) == (-5.0, 5.5)
    assert plan.source == 'SELECT uid AS "uid", word AS "word", q * 2 + 1 AS "value"\nFROM t'


def test_avg_reads_each_units_average():
    plan = translate(q("word, AVG(q, contribution_bounds_per_group => (0, 10)) AS a", "FROM t WHERE q > 0 GROUP BY word"))
    inner = 'SELECT uid AS "uid", word AS "word", q AS "q"\nFROM t\nWHERE q > 0'
    assert plan.value_check == (inner, "q")
    assert plan.source == ('SELECT "uid", "word", CAST("q" AS DOUBLE) / count("q") OVER (PARTITION BY "uid", "word") '
                           f'AS "q"\nFROM ({inner})')
    assert plan.params["aggregates"] == ["mean"]


def test_detection_reads_tokens_not_text():
    assert is_dp_query(q(f"word, {COUNT}"))
    assert is_dp_query("select\n-- x\n with /* y */ differential_privacy options() x")
    assert is_dp_query("EXPLAIN SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) x FROM t")
    assert is_dp_query("SELECT WITH ANONYMIZATION OPTIONS (epsilon = 1) x FROM t")
    assert not is_dp_query("SELECT 'SELECT WITH DIFFERENTIAL_PRIVACY' AS s")
    assert not is_dp_query('SELECT "differential_privacy" FROM t')
    assert not is_dp_query("SELECT 1 -- SELECT WITH DIFFERENTIAL_PRIVACY")
    assert not is_dp_query("WITH differential_privacy AS (SELECT 1) SELECT * FROM differential_privacy")


REFUSED = {
    "no max_groups_contributed": (q(f"word, {COUNT}", options="OPTIONS (epsilon = 1, delta = 1e-5, "
                                    "privacy_unit_column = uid)"), "must give max_groups_contributed"),
    "no privacy_unit_column": (q(f"word, {COUNT}", options="OPTIONS (epsilon = 1, delta = 1e-5, "
                                 "max_groups_contributed = 3)"), "must give privacy_unit_column"),
    "unknown option": (q(f"word, {COUNT}", options=OPTIONS.replace(")", ", group_selection_strategy = 1)")),
                       "unknown option 'group_selection_strategy'"),
    "option twice": (q(f"word, {COUNT}", options=OPTIONS.replace(")", ", epsilon = 2)")), "epsilon is given twice"),
    "kappa": (q(f"word, {COUNT}", options=OPTIONS.replace("max_groups_contributed", "kappa")), "older syntax"),
    "epsilon expression": (q(f"word, {COUNT}", options=OPTIONS.replace("epsilon = 1", "epsilon = 1 + 1")),
                           "epsilon must be a number literal"),
    "fractional groups": (q(f"word, {COUNT}", options=OPTIONS.replace("= 3", "= 1.5")),
                          "max_groups_contributed must be a whole number >= 1"),
    "zero groups": (q(f"word, {COUNT}", options=OPTIONS.replace("= 3", "= 0")), "must be a whole number >= 1"),
    "unit as a string": (q(f"word, {COUNT}", options=OPTIONS.replace("= uid", "= 'uid'")), "not a string"),
    "no options": (q(f"word, {COUNT}", options=""), "must be followed by OPTIONS"),
    "count without bounds": (q("word, COUNT(*)"), "needs contribution_bounds_per_group"),
    "count with a fractional upper bound": (q("word, COUNT(*, contribution_bounds_per_group => (0, 2.5))"),
                                            "or (0, k) with a whole k >= 2"),
    "count with an upper bound below 1": (q("word, COUNT(*, contribution_bounds_per_group => (0, 0.5))"),
                                          "COUNT(*) takes contribution_bounds_per_group => (0, 1)"),
    "count with a lower bound above 1": (q("word, COUNT(*, contribution_bounds_per_group => (2, 5))"),
                                         "a lower bound from 0 to 1 means the same"),
    "count with a negative lower bound": (q("word, COUNT(*, contribution_bounds_per_group => (-1, 5))"),
                                          "COUNT(*) takes contribution_bounds_per_group"),
    "count of rows beyond max_rows": (q("word, COUNT(*, contribution_bounds_per_group => (0, 200000))"),
                                      "its upper bound is dpsql's max_rows, and max_rows must be a whole number"),
    "count of rows twice": (q("word, COUNT(*, contribution_bounds_per_group => (0, 2)) AS a, "
                              "COUNT(*, contribution_bounds_per_group => (0, 5)) AS b"), "'rows' appears twice"),
    "count of units twice": (q(f"word, {COUNT} AS a, {COUNT} AS b"), "'count' appears twice"),
    "count of values": (q("word, COUNT(q, contribution_bounds_per_group => (0, 1))"), "rows whose x is not NULL"),
    "count of values with a row bound": (q("word, COUNT(q, contribution_bounds_per_group => (0, 3))"),
                                         "dpsql's rows counts every row"),
    "count distinct": (q("word, COUNT(DISTINCT uid)"), "DISTINCT is not supported"),
    "sum without bounds": (q("word, SUM(q)"), "BigQuery derives missing bounds from the data"),
    "per-row bounds": (q("word, SUM(q, contribution_bounds_per_row => (0, 1))"),
                       "SUM takes contribution_bounds_per_group, not contribution_bounds_per_row"),
    "bounds twice": (q("word, SUM(q, contribution_bounds_per_group => (0, 1), contribution_bounds_per_group => (0, 2))"),
                     "gives its bounds twice"),
    "bounds not a pair": (q("word, SUM(q, contribution_bounds_per_group => (0, 1, 2))"), "takes (lower, upper)"),
    "report_format": (q(f"word, SUM(q, contribution_bounds_per_group => (0, 1), report_format => 'JSON')"),
                      "unknown argument report_format"),
    "var_pop": (q("word, VAR_POP(q, contribution_bounds_per_row => (0, 1))"), "it clamps each row"),
    "stddev_pop": (q("word, STDDEV_POP(q, contribution_bounds_per_row => (0, 1))"),
                   "dpsql's variance, stddev and median measure each user's clamped total per group"),
    "percentile_cont": (q("word, PERCENTILE_CONT(q, 0.5, contribution_bounds_per_row => (0, 1))"),
                        "measures the rows' values"),
    "var_pop with group bounds": (q("word, VAR_POP(q, contribution_bounds_per_group => (0, 1))"),
                                  "it clamps each row"),
    "anon function": (q("word, ANON_SUM(q CLAMPED BETWEEN 0 AND 1)"), "ANON_SUM belongs to the older"),
    "clamped between": (q("word, SUM(q CLAMPED BETWEEN 0 AND 1)"), "CLAMPED BETWEEN belongs to the older syntax"),
    "order by in an aggregate": (q("word, SUM(q ORDER BY q, contribution_bounds_per_group => (0, 1))"),
                                 "no ORDER BY, IGNORE or RESPECT NULLS"),
    "anonymization clause": ("SELECT WITH ANONYMIZATION OPTIONS (epsilon = 1, delta = 1e-5, kappa = 1) word, "
                             "ANON_COUNT(*) FROM t GROUP BY word", "older WITH ANONYMIZATION syntax"),
    "sum and avg": (q(f"word, {SUM}, AVG(q, contribution_bounds_per_group => (0, 10))"),
                    "a unit's total for SUM and its average for AVG"),
    "sum twice": (q(f"word, {SUM} AS a, {SUM} AS b"), "dpsql's 'sum' appears twice"),
    "not a dp aggregate": (q("word, MAX(q)"), "MAX(q) is not one of the differentially private aggregates"),
    "no aggregate": (q("word"), "no differentially private aggregate"),
    "group by an expression": (q(f"{COUNT}", "FROM t GROUP BY word, q + 1"), "GROUP BY 'q + 1' is not a column name"),
    "group column twice": (q(f"{COUNT}", "FROM t GROUP BY word, t.word"), "names the column word twice"),
    "group column named as an output": (q(f"{COUNT}", "FROM t GROUP BY word, rows"),
                                        "a group column may not be named 'rows'"),
    "group columns with the unit": (q(f"{COUNT}", "FROM t GROUP BY word, uid"), "must differ from privacy_unit_column"),
    "column outside the group columns": (q(f"word, uid, {COUNT}", "FROM t GROUP BY word, q"),
                                         "may hold the GROUP BY columns (word, q)"),
    "no group by": (q(f"{COUNT}", "FROM t"), "no GROUP BY"),
    "group by ordinal": (q(f"word, {COUNT}", "FROM t GROUP BY 1"), "is not a column name"),
    "group by the unit": (q(f"uid, {COUNT}", "FROM t GROUP BY uid"), "must differ from privacy_unit_column"),
    "having": (q(f"word, {COUNT} AS n", "FROM t GROUP BY word HAVING n > 1"), "HAVING is not supported"),
    "order by": (q(f"word, {COUNT} AS n", "FROM t GROUP BY word ORDER BY n"), "ORDER is not supported"),
    "limit": (q(f"word, {COUNT} AS n", "FROM t GROUP BY word LIMIT 3"), "LIMIT is not supported"),
    "union": (q(f"word, {COUNT}", "FROM t GROUP BY word UNION ALL SELECT 1, 2"), "UNION is not supported"),
    "join": (q(f"word, {COUNT}", "FROM t JOIN s ON t.word = s.word GROUP BY word"), "write a join inside a subquery"),
    "comma join": (q(f"word, {COUNT}", "FROM t, s GROUP BY word"), "write a join inside a subquery"),
    "subquery in where": (q(f"word, {COUNT}", "FROM t WHERE q > (SELECT avg(q) FROM t) GROUP BY word"),
                          "the WHERE holds a subquery"),
    "from-first subquery in where": (q(f"word, {COUNT}", "FROM t WHERE uid IN (FROM t SELECT uid) GROUP BY word"),
                                     "the WHERE holds a subquery"),
    "window in a value": (q("word, SUM(q - avg(q) OVER (), contribution_bounds_per_group => (0, 1))"),
                          "holds a window function"),
    "another column": (q(f"word, q, {COUNT}"), "select list holds the column q"),
    "an expression": (q(f"word, q + 1, {COUNT}"), "select list holds 'q + 1'"),
    "star": (q(f"*, {COUNT}"), "select list holds '*'"),
    "same output name": (q(f"word AS n, {COUNT} AS n"), "two output columns are named 'n'"),
    "two statements": (q(f"word, {COUNT}") + "; SELECT 1", "give one statement"),
    "plain statement": ("SELECT * FROM t", "not a SELECT WITH DIFFERENTIAL_PRIVACY query"),
    "inside a query": (f"EXPLAIN {q(f'word, {COUNT}')}", "must be the whole statement"),
    "select distinct": (q(f"DISTINCT word, {COUNT}"), "SELECT DISTINCT is not supported"),
    "unclosed parenthesis": (q("word, COUNT(*, contribution_bounds_per_group => (0, 1)"), "not closed"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_outside_the_subset_is_refused_saying_what_is_supported(name):
    text, fragment = REFUSED[name]
    with pytest.raises(DpSyntaxError) as info:
        translate(text)
    message = str(info.value)
    assert message.startswith("dpsql: ") and fragment in message, message
    assert message.endswith(SUPPORTED)
    assert isinstance(info.value, ParameterError)


# ---------------------------------------------------------------- the release

@pytest.fixture
def con():
    c = seeded(SEED)
    c.execute(T)
    yield c
    c.close()


def test_equals_the_group_by_call_it_stands_for(con):
    """COUNT and SUM with a WHERE: the same rows, noise and order as dpsql.group_by on a view of the WHERE,
    under one seed."""
    other = seeded(SEED)
    other.execute(T)
    other.execute("CREATE VIEW v AS SELECT * FROM t WHERE q > 2")
    got = dpsql.sql(con, q(f"word AS w, {COUNT} AS users, SUM(q, contribution_bounds_per_group => (0, 10)) AS total",
                           "FROM t WHERE q > 2 GROUP BY word"))
    want = dpsql.group_by(other, "v", epsilon=1.0, delta=1e-5, max_items=3, aggregates=["count", "sum"],
                          value_col="q", lower=0, upper=10, user_col="uid", item_col="word")
    other.close()
    assert isinstance(got, pa.Table) and got.column_names == ["w", "users", "total"]
    assert want.num_rows >= 5  # 9 groups of 57 to 171 users
    assert got.to_pydict() == {"w": want["item"].to_pylist(), "users": want["count"].to_pylist(),
                               "total": want["sum"].to_pylist()}


def test_avg_equals_group_by_on_each_units_average(con):
    """AVG: dpsql.group_by's mean over a view with one row per (unit, group) holding the unit's average."""
    con.execute("INSERT INTO t SELECT 'u' || u, 'w' || (u % 7), (u % 5)::INTEGER FROM range(400) a(u)")
    other = seeded(SEED)
    other.execute(T)
    other.execute("INSERT INTO t SELECT 'u' || u, 'w' || (u % 7), (u % 5)::INTEGER FROM range(400) a(u)")
    other.execute("CREATE VIEW v AS SELECT uid, word, avg(q) AS q FROM t GROUP BY uid, word")
    got = dpsql.sql(con, q("word, AVG(q, contribution_bounds_per_group => (0, 10)) AS a"))
    want = dpsql.group_by(other, "v", epsilon=1.0, delta=1e-5, max_items=3, aggregates=["mean"], value_col="q",
                          lower=0, upper=10, user_col="uid", item_col="word")
    other.close()
    assert got["word"].to_pylist() == want["item"].to_pylist() and want.num_rows >= 5
    assert got["a"].to_pylist() == pytest.approx(want["mean"].to_pylist(), rel=1e-12)


# 400 users; user u holds 1 + (u + j) % 3 rows in each of its 3 groups w(u % 7 + j), j = 0..2, as half u % 2.
ROWS = ("CREATE TABLE r AS SELECT 'u' || u AS uid, 'w' || (u % 7 + j) AS word, (u % 2)::INTEGER AS half, "
        "((u + k) % 13)::INTEGER AS q FROM range(400) a(u), range(3) b(j), range(3) c(k) WHERE k <= (u + j) % 3")


def test_row_count_and_group_columns_equal_the_group_by_call_they_stand_for():
    """COUNT(*) up to 2 rows, COUNT(*) of units and SUM grouped by two columns: dpsql.group_by with rows,
    max_rows 2 and group_cols, on a view of the same columns, under one seed (same rows, noise and order)."""
    got_con, want_con = seeded(SEED), seeded(SEED)
    for c in (got_con, want_con):
        c.execute(ROWS)
    want_con.execute("CREATE VIEW v AS SELECT uid, word, half, q FROM r WHERE q < 12")
    got = dpsql.sql(got_con, q(f"half, word AS w, {COUNT} AS users, COUNT(*, contribution_bounds_per_group => (0, 2)) "
                               f"AS purchases, {SUM} AS total", "FROM r WHERE q < 12 GROUP BY word, half"))
    want = dpsql.group_by(want_con, "v", epsilon=1.0, delta=1e-5, max_items=3, aggregates=["count", "rows", "sum"],
                          max_rows=2, value_col="q", lower=0, upper=10, user_col="uid", group_cols=["word", "half"])
    # one release, charged to the base table the view reads
    assert [(r.mechanism, r.table) for r in dpsql.releases(got_con)] == [("dp_group_by", "memory.main.r")]
    for c in (got_con, want_con):
        c.close()
    assert got.column_names == ["half", "w", "users", "purchases", "total"]
    assert want.num_rows >= 5  # 18 groups of 27 to 85 users
    assert got.to_pydict() == {"half": want["half"].to_pylist(), "w": want["word"].to_pylist(),
                               "users": want["count"].to_pylist(), "purchases": want["rows"].to_pylist(),
                               "total": want["sum"].to_pylist()}


def test_avg_over_group_columns_equals_group_by_on_each_units_average():
    got_con, want_con = seeded(SEED), seeded(SEED)
    for c in (got_con, want_con):
        c.execute(ROWS)
    want_con.execute("CREATE VIEW v AS SELECT uid, word, half, avg(q) AS q FROM r GROUP BY uid, word, half")
    got = dpsql.sql(got_con, q("word, half, AVG(q, contribution_bounds_per_group => (0, 10)) AS a",
                               "FROM r GROUP BY word, half"))
    want = dpsql.group_by(want_con, "v", epsilon=1.0, delta=1e-5, max_items=3, aggregates=["mean"], value_col="q",
                          lower=0, upper=10, user_col="uid", group_cols=["word", "half"])
    for c in (got_con, want_con):
        c.close()
    assert got["word"].to_pylist() == want["word"].to_pylist() and want.num_rows >= 5
    assert got["half"].to_pylist() == want["half"].to_pylist()
    assert got["a"].to_pylist() == pytest.approx(want["mean"].to_pylist(), rel=1e-12)


def test_aggregates_are_bigquerys_quantities_up_to_the_noise():
    """At epsilon 1e5 (counts' noise on their integer grid almost always 0, sums' standard deviation ~0.13) every
    group is released, and COUNT, SUM and AVG are BigQuery's: units per group,
    rows per group with each unit's count clamped to k, the sum of each unit's clamped total, the mean of each
    unit's clamped average (not of its total); grouped by one column or two."""
    con = dpsql.connect()
    # 300 users, each in all 4 groups with 1 to 3 rows per group: totals and averages differ, and so do
    # the row counts clamped to 2 and the units
    con.execute("CREATE TABLE t AS SELECT 'u' || u AS uid, 'g' || g AS grp, u % 2 AS par, "
                "((u * 7 + g * 3 + r) % 11)::DOUBLE AS x "
                "FROM range(300) a(u), range(4) b(g), range(3) c(r) WHERE r <= (u + g) % 3")
    per_unit = "SELECT uid, grp, par, count(*) AS rows, sum(x) AS tot, avg(x) AS av FROM t GROUP BY uid, grp, par"
    truth = {grp: (n, r2, r3, s, a, m) for grp, n, r2, r3, s, a, m in con.execute(f"""
        SELECT grp, count(*), sum(least(rows, 2)), sum(rows), sum(least(tot, 12)), avg(least(av, 12)),
               sum(least(tot, 12)) / count(*)
        FROM ({per_unit}) GROUP BY grp""").fetchall()}
    by_two = {(grp, par): (n, r2) for grp, par, n, r2 in con.execute(f"""
        SELECT grp, par, count(*), sum(least(rows, 2)) FROM ({per_unit}) GROUP BY grp, par""").fetchall()}
    assert all(r2 < r3 and n < r2 for n, r2, r3, *_ in truth.values())  # the three counts differ
    options = "OPTIONS (epsilon = 1e5, delta = 1e-5, max_groups_contributed = 4, privacy_unit_column = uid)"
    rows2 = "COUNT(*, contribution_bounds_per_group => (0, 2))"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # epsilon 1e5 is weak on purpose
        counted = dpsql.sql(con, q(f"grp, {COUNT} AS n, {rows2} AS r2, "
                                   f"SUM(x, contribution_bounds_per_group => (0, 12)) AS s",
                                   "FROM t GROUP BY grp", options))
        averaged = dpsql.sql(con, q("grp, AVG(x, contribution_bounds_per_group => (0, 12)) AS a, "
                                    "COUNT(*, contribution_bounds_per_group => (0, 3)) AS r3",
                                    "FROM t GROUP BY grp", options))
        two = dpsql.sql(con, q(f"grp, par, {COUNT} AS n, {rows2} AS r2", "FROM t GROUP BY grp, par", options))
    # the AVG release's noise: a noisy sum of the units' clamped averages over a noisy count of units
    [(cal,)] = con.execute("SELECT calibration FROM dp_releases() WHERE calibration LIKE '%\"mean\"%'").fetchall()
    con.close()
    cal = json.loads(cal)
    assert counted["grp"].to_pylist() == averaged["grp"].to_pylist() == sorted(truth)
    for row, avg in zip(counted.to_pylist(), averaged.to_pylist()):
        n, r2, r3, s, a, mean_of_totals = truth[row["grp"]]
        assert row["n"] == pytest.approx(n, abs=0.05)
        assert row["r2"] == pytest.approx(r2, abs=0.05)
        assert row["s"] == pytest.approx(s, abs=0.5)
        # standard deviation of noisy sum / noisy count at n units (first order): 6 of them
        sd = math.hypot(cal["sum_scale"], a * cal["count_scale"]) / n
        assert avg["a"] == pytest.approx(a, abs=6 * sd)
        assert avg["r3"] == pytest.approx(r3, abs=0.05)  # the AVG view keeps every row
        assert abs(a - mean_of_totals) > 1.0  # dpsql's plain mean would be another quantity
    assert sorted(zip(two["grp"].to_pylist(), two["par"].to_pylist())) == sorted(by_two)
    for row in two.to_pylist():
        n, r2 = by_two[(row["grp"], row["par"])]
        assert (row["n"], row["r2"]) == (pytest.approx(n, abs=0.05), pytest.approx(r2, abs=0.05))


def test_charged_once_to_the_base_table_and_a_budget_on_it_refuses(con):
    dpsql.sql(con, q(f"word, {COUNT}", "FROM (SELECT * FROM t WHERE q > 1) AS s WHERE q < 12 GROUP BY word"))
    (release,) = dpsql.releases(con)
    assert (release.mechanism, release.table, release.epsilon, release.delta) == ("dp_group_by", "memory.main.t",
                                                                                   1.0, 1e-5)
    dpsql.set_budget(con, 1.5, 0.5, scope="t")
    with pytest.raises(BudgetExceededError, match="scope 'memory.main.t' exceeded"):
        dpsql.sql(con, q(f"word, {COUNT}", "FROM t WHERE q > 5 GROUP BY word"))
    assert n_releases(con) == 1
    assert views(con) == []  # the TEMP view is dropped after an error too


def test_a_file_in_from_is_charged_to_the_file(con, tmp_path):
    path = tmp_path / "t.parquet"
    con.execute(f"COPY t TO '{path}' (FORMAT parquet)")
    dpsql.sql(con, q(f"word, {COUNT} AS n", f"FROM '{path}' GROUP BY word"))
    assert [r.table for r in dpsql.releases(con)] == [str(path)]


def test_nothing_is_read_or_left_behind_when_refused_or_invalid(con):
    con.execute("CREATE VIEW mine AS SELECT 1 AS one")
    for text, error in [(q("word, COUNT(*)"), DpSyntaxError),
                        (q(f"word, {COUNT}", "FROM t WHERE no_such_column > 1 GROUP BY word"), ParameterError),
                        (q(f"word, {COUNT}", "FROM no_such_table GROUP BY word"), ParameterError),
                        (q("word, AVG(word, contribution_bounds_per_group => (0, 1))"), ParameterError),
                        (q("word, SUM(word, contribution_bounds_per_group => (0, 1))"), ParameterError)]:
        with pytest.raises(error, match="^dpsql: "):
            dpsql.sql(con, text)
    assert n_releases(con) == 0 and views(con) == ["mine"]


def test_an_invalid_column_is_reported_without_the_generated_text(con):
    with pytest.raises(ParameterError) as info:
        dpsql.sql(con, q(f"word, {COUNT}", "FROM t WHERE no_such_column > 1 GROUP BY word"))
    assert "no_such_column" in str(info.value) and "dpsql_sql_" not in str(info.value)


def test_a_refused_statement_is_refused_before_the_connection_is_used():
    with pytest.raises(DpSyntaxError):
        dpsql.sql(None, q("word, COUNT(*)"))  # type: ignore[arg-type]
    with pytest.raises(DpSyntaxError, match="must be a string"):
        dpsql.sql(None, b"SELECT")  # type: ignore[arg-type]


def test_import_dpsql_imports_no_front_end():
    # dpsql.sql is the groupby room's translator (CONTRIBUTING: nothing in the package imports a front end)
    assert "sql" in dpsql.__all__
    code = "import sys, dpsql; sys.exit(any(m.startswith('dpsql.frontends') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- the shell

SHELL_DATA = ("CREATE TABLE t AS SELECT 'u' || u AS uid, 'w' || j AS word, (u % 13)::INTEGER AS q "
              "FROM range(600) a(u), range(5) b(j);")


def shell(sql: str | None = None, *, stdin: str = "", database: str | None = None, **options) -> SimpleNamespace:
    out, err = io.StringIO(), io.StringIO()
    code = run_shell(database, sql, stdin=io.StringIO(stdin), out=out, err=err, **options)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_shell_runs_the_statement_as_one_release_and_prints_it(tmp_path):
    db = str(tmp_path / "s.duckdb")
    options = OPTIONS.replace("= 3", "= 5")
    r = shell(f"{SHELL_DATA}\n{q(f'word AS w, {COUNT} AS users', options=options)};\n"
              "SELECT count(*) AS n_releases, sum(epsilon) AS spent FROM dp_releases();", database=db, mode="csv")
    assert (r.returncode, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    assert lines[0] == "w,users"
    assert [line.split(",")[0] for line in lines[1:6]] == ["w0", "w1", "w2", "w3", "w4"]  # 600 users per group
    assert all(abs(float(line.split(",")[1]) - 600) < 100 for line in lines[1:6])
    assert lines[6:] == ["n_releases,spent", "1,1.0"]


def test_shell_reads_the_statement_over_several_lines_with_comments(tmp_path):
    text = (f"{SHELL_DATA}\nselect -- a comment\n  with differential_privacy\n  {OPTIONS.replace('= 3', '= 5')}\n"
            f"  word, {COUNT}\n  /* c */ from t\n  group by word;\n")
    r = shell(stdin=text, database=str(tmp_path / "s.duckdb"))
    assert (r.returncode, r.stderr) == (0, "")
    assert re.search(r"│\s+word\s+│\s+f0_\s+│", r.stdout) and r.stdout.count("│ w") == 5


def test_shell_passes_a_plain_statement_to_duckdb_untouched():
    r = shell("SELECT 'SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS' AS s, 1 AS \"differential_privacy\";", mode="csv")
    assert (r.returncode, r.stdout, r.stderr) == (0, "s,differential_privacy\nSELECT WITH DIFFERENTIAL_PRIVACY OPTIONS,1\n", "")


def test_shell_refusal_is_one_dpsql_line_and_charges_nothing(tmp_path):
    r = shell(f"{SHELL_DATA}\n{q('word, COUNT(*)')};", database=str(tmp_path / "s.duckdb"))
    assert r.returncode == 1 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("Error: dpsql: ") and "needs contribution_bounds_per_group" in line and SUPPORTED in line
    r = shell("SELECT count(*) AS n FROM dp_releases();", database=str(tmp_path / "s.duckdb"), mode="csv")
    assert r.stdout == "n\n0\n"


def test_shell_help_names_the_syntax():
    r = shell(".help")
    assert "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...) ... GROUP BY ... runs as one dp_group_by release" in r.stdout


# ---------------------------------------------------------------- docs/bigquery_syntax.md

def _doc_blocks(language: str) -> list[str]:
    blocks, current, kind = [], None, ""
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if current is None:
                current, kind = [], line[3:].strip()
            else:
                if kind == language:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_doc_sql_blocks_run_in_the_shell_in_both_syntaxes(tmp_path):
    if not DOC.is_file():
        pytest.skip("docs/bigquery_syntax.md is not next to the tests")
    blocks = _doc_blocks("sql")
    assert len(blocks) == 4 and is_dp_query(blocks[1]) and "dp_group_by(" in blocks[2] and is_dp_query(blocks[3])
    db = str(tmp_path / "shop.duckdb")
    outputs = []
    for block in blocks:
        r = shell(block, database=db, mode="csv")
        assert (r.returncode, r.stderr) == (0, ""), block
        outputs.append(r.stdout.splitlines())
    assert outputs[0] == []
    assert outputs[1][0] == outputs[2][0] == "item,buyers,revenue"
    assert [line.split(",")[0] for line in outputs[1][1:]] == [line.split(",")[0] for line in outputs[2][1:]] \
        == [f"item{i}" for i in sorted(range(12), key=str)]
    # several group columns and a row count: every (country, item) pair holds 250 (FR) or 500 (DE) users and
    # 1 or 1.5 times as many rows, as each user buys one of its items twice; the release's noise scales at
    # these parameters are about 12 (count) and 25 (rows): every value is within 6 of them
    r = shell("SELECT country, item, count(DISTINCT user_id), count(*) FROM purchases GROUP BY ALL ORDER BY ALL;",
              database=db, mode="csv")
    truth = {(c, i): (int(n), int(rows)) for c, i, n, rows in (line.split(",") for line in r.stdout.splitlines()[1:])}
    assert outputs[3][0] == "country,item,buyers,purchases"
    released = [line.split(",") for line in outputs[3][1:]]
    assert [(c, i) for c, i, *_ in released] == sorted(truth)  # every pair released, sorted by the group
    assert all(abs(int(n) - truth[(c, i)][0]) <= 75 and abs(int(rows) - truth[(c, i)][1]) <= 150
               for c, i, n, rows in released)
    r = shell("SELECT count(*) AS n, list(DISTINCT table_name) AS scopes FROM dp_releases();", database=db, mode="csv")
    assert r.stdout.splitlines()[1] == "3,[shop.main.purchases]"  # all charged to the base table


def test_doc_python_block_runs():
    if not DOC.is_file():
        pytest.skip("docs/bigquery_syntax.md is not next to the tests")
    (block,) = _doc_blocks("python")
    namespace: dict = {}
    exec(compile(block, str(DOC), "exec"), namespace)
    assert namespace["released"].num_rows == 5
