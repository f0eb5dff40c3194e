"""dpsql.core.sqltext: DuckDB's tokens of any SQL, and the shipped macro files (bodies under generated headers)."""
from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql.core import registry, release, sqltext
from dpsql.core.sqltext import Parameter, SqlTextError, is_complete, parameters, parse, split_statements, tokens

BODY = "dp__body_set_union_weighted_gaussian"


# -- tokens of any SQL -------------------------------------------------------------------------------

def test_tokens_are_positioned_in_characters():
    sql = "SELECT 'é;' AS \"ü\", x FROM t; SELECT 2"
    found = tokens(sql)
    assert [t.text for t in found] == ["SELECT", "'é;'", "AS", '"ü"', ",", "x", "FROM", "t", ";", "SELECT", "2"]
    assert all(sql[t.start:t.end] == t.text for t in found)
    assert [t.kind for t in found][:4] == ["keyword", "string_const", "keyword", "identifier"]
    # a lone surrogate (undecodable input) is one character, as for DuckDB '?'
    assert [t.text for t in tokens("SELECT '\udcff'; x")][-2:] == [";", "x"]


@pytest.mark.parametrize("sql, expected", [
    ("select 'é;'; select \"ü;\"", ["select 'é;'", 'select "ü;"']),
    ("select 1; /* open", ["select 1", "/* open"]),
    ("select 1; /* a /* b */ still open; */ ; select 2", ["select 1", "select 2"]),
    ("select x$y$; select 2", ["select x$y$", "select 2"]),
])
def test_split_statements(sql, expected):
    assert split_statements(sql) == expected


@pytest.mark.parametrize("sql, complete", [
    ("select 1; /* a /* b */", False),  # the outer comment is still open
    ("select 1; /* a /* b */ */", True),
    ("select 1; -- done", True),
    ("select 'é';", True),
    ("", False),
])
def test_is_complete(sql, complete):
    assert is_complete(sql) is complete


def test_parameters_of_a_header():
    sig = "tbl VARCHAR, split DOUBLE[] := [0.1, 0.9], \"odd name\" DECIMAL(10, 2) := NULL, x, s VARCHAR := 'a,b'"
    assert parameters(sig) == [Parameter("tbl", "VARCHAR", None), Parameter("split", "DOUBLE[]", "[0.1, 0.9]"),
                               Parameter("odd name", "DECIMAL(10, 2)", "NULL"), Parameter("x", "", None),
                               Parameter("s", "VARCHAR", "'a,b'")]


# -- the macro files -------------------------------------------------------------------------------------

def test_a_marked_body_gets_the_header_generated_from_its_declaration():
    mech = registry.by_macro()["dp_set_union_weighted_gaussian"]
    text = ("CREATE OR REPLACE TEMP MACRO dp__helper(tbl VARCHAR, n DOUBLE := 2) AS TABLE\nSELECT n;\n\n"
            f"-- what it does\n-- dpsql:portable {BODY}\n-- dpsql:body {BODY}\n"
            "-- dpsql:portable dp__w\nWITH dp__w AS MATERIALIZED (SELECT 1 AS item)\nSELECT item FROM dp__w;\n")
    f = parse(text, "x.sql")
    helper, body = f.macros
    assert (helper.name, helper.params, helper.generated, helper.line, helper.body) == \
        ("dp__helper", ("tbl", "n"), False, 1, "SELECT n")
    assert body.name == BODY and body.generated and body.line == 6 and body.body_line == 7
    assert body.params == mech.param_names
    assert body.header == f"CREATE OR REPLACE TEMP MACRO {BODY}({release.signature(mech.params)}) AS TABLE"
    assert body.body.startswith("-- dpsql:portable dp__w\nWITH dp__w")
    assert [(m.line, m.name, m.macro, m.cte) for m in f.marks] == [(5, BODY, BODY, None), (7, "dp__w", BODY, "dp__w")]
    # what DuckDB runs: each statement, the body under its generated header
    statements = duckdb.extract_statements(f.sql)
    assert [s.query.split("(")[0].split()[-1] for s in statements] == ["dp__helper", BODY]


@pytest.mark.parametrize("text, error", [
    (f"CREATE OR REPLACE TEMP MACRO {BODY}(tbl VARCHAR) AS TABLE SELECT 1;",
     f"x.sql:1: {BODY} is a declared mechanism's body: its header is generated"),
    ("-- dpsql:body dp__body_nothing\nSELECT 1;", "x.sql:1: -- dpsql:body dp__body_nothing names no declared"),
    (f"-- dpsql:body  {BODY}\nSELECT 1;", r"x.sql:1: a body marker is the line"),
    (f"SELECT 1\n-- dpsql:body {BODY}\n, 2;", "must be the only body marker of its statement, above its query"),
    (f"-- dpsql:body {BODY}\nCREATE OR REPLACE TEMP MACRO m(a) AS TABLE SELECT 1;", "is written with a header"),
    ("CREATE MACRO m(a) AS a;", "every statement of a macro file is CREATE OR REPLACE TEMP MACRO"),
    ("CREATE OR REPLACE TEMP MACRO m(a) AS a;\n/* open", "x.sql:2: a comment is not closed"),
])
def test_malformed_files_are_refused(text, error):
    with pytest.raises(SqlTextError, match=error):
        parse(text, "x.sql")


def test_a_mark_not_directly_above_its_definition_is_reported():
    text = "CREATE OR REPLACE TEMP MACRO dp__x(rel VARCHAR) AS TABLE\n-- dpsql:portable dp__y\nWITH dp__z AS (SELECT 1)\n" \
           "-- dpsql:portable  dp__z\nFROM dp__z;\n"
    assert [(m.line, m.name, m.macro) for m in parse(text, "x.sql").marks] == [(2, "dp__y", None), (4, "dp__z", None)]


def test_shipped_files():
    shipped = sqltext.macros()
    # every declared body, from its family's file, under its generated header
    for mech in registry.all_mechanisms().values():
        body = sqltext.macro(release.body_macro(mech))
        assert body.generated and body.params == mech.param_names and body.table
    assert sqltext.macro("dp__capped_user_items").file == "00_core/20_contribution_bounding.sql"
    with pytest.raises(SqlTextError, match="no macro named dp__nothing"):
        sqltext.macro("dp__nothing")
    # load order: the files in path order, each file's macros in its order (a body follows what it calls)
    names = list(shipped)
    assert names.index("dp__capped_user_items") < names.index(BODY) < names.index("dp__body_set_union") \
        < names.index("dp__body_top_k")
    assert sqltext.script() == "".join(m.sql for m in shipped.values())


def test_a_declared_body_missing_from_the_files_is_an_error(monkeypatch, tmp_path):
    lone = tmp_path / "x.sql"
    lone.write_text("CREATE OR REPLACE TEMP MACRO dp__x(a) AS a;\n")
    monkeypatch.setattr(sqltext, "sql_files", lambda: [lone])
    assert list(sqltext.macros()) == ["dp__x"]
    with pytest.raises(SqlTextError, match=f"no body in the shipped SQL files for .*{BODY}"):
        sqltext.script()


def test_registration_runs_the_script():
    con = dpsql.connect()
    try:
        rows = con.execute("SELECT function_name FROM duckdb_functions() WHERE function_type IN ('macro', "
                           "'table_macro') AND function_name LIKE 'dp%'").fetchall()
    finally:
        con.close()
    assert set(sqltext.macros()) <= {r[0] for r in rows}


@pytest.mark.parametrize("sql, found", [
    ("SELECT * FROM dp_top_k('t', 3, epsilon := 1)", "dp_top_k"),
    ('SELECT * FROM "DP_Top_K" (\'t\', 3)', "dp_top_k"),  # quoted, any case, space before the parenthesis
    ("SELECT * FROM query('SELECT * FROM dp_top_k(''t'', 3)')", "dp_top_k"),  # SQL in a string runs
    ("SELECT * FROM query(E'SELECT * FROM dp_top_k(\\'t\\', 3)')", "dp_top_k"),  # an E'' string too
    # a string is read as SQL whatever it is for: a call written in it counts (the safe side)
    ("SELECT 'dp_top_k(' AS s FROM t", "dp_top_k"),
    ("SELECT 'dp_top_k' AS s, dp_top_k AS c FROM t", None),  # a name that is not called
    ("SELECT 1 -- dp_top_k('t')\n", None),  # a comment
    ("SELECT my_dp_top_k('t')", None),  # another name
])
def test_called_finds_a_call_by_name(sql, found):
    assert sqltext.called(sql, frozenset({"dp_top_k"})) == found


def test_release_macros_are_the_macros_that_reach_the_charge():
    con = duckdb.connect()
    con.execute("CREATE TEMP MACRO dp__charge(x) AS x")
    con.execute("CREATE TEMP MACRO direct(x) AS TABLE SELECT \"DP__CHARGE\"(x) AS y")
    con.execute("CREATE TEMP MACRO indirect(x) AS TABLE SELECT * FROM direct(x)")
    con.execute("CREATE TEMP MACRO in_string(x) AS TABLE SELECT * FROM query('SELECT * FROM indirect(1)')")
    con.execute("CREATE TEMP MACRO unrelated(x) AS TABLE SELECT 'direct' AS y, direct FROM (SELECT 1 AS direct)")
    assert sqltext.release_macros(con) == {"dp__charge", "direct", "indirect", "in_string"}
