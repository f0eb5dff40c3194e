"""Keys by identity (sql/00_core/15_checks.sql, dp__user_item_rows in sql/00_core/20_contribution_bounding.sql).

A GROUP BY keeps one row's spelling for a group of equal values. On D (users holding a common
spelling) and D' = D + one user holding an equal but differently spelled value, stored first, the
readers must either keep the two spellings apart (the spelling of a group is a function of the group)
or refuse the column by its type before any row is read. Also the public/private and value-column
type checks, whose errors must never quote a value.
"""
from __future__ import annotations

import re

import duckdb
import pytest

import dpsql
from conftest import seeded

N = 40  # users holding the common spelling


def neighbours(con, typ, common, variant, user_type="VARCHAR", user_variant=None):
    """Tables d (N users holding `common`) and d1 (d plus user 'target' holding `variant`, stored first).

    With `user_variant`, the added user's id is that spelling of user 'u0' (e.g. 'U0' under NOCASE).
    """
    con.execute(f"CREATE OR REPLACE TABLE d (user_id {user_type}, item {typ})")
    con.execute(f"INSERT INTO d SELECT 'u' || i, {common} FROM range({N}) r(i)")
    con.execute(f"CREATE OR REPLACE TABLE d1 (user_id {user_type}, item {typ})")
    con.execute(f"INSERT INTO d1 SELECT {user_variant or repr('target')}, {variant}")
    con.execute("INSERT INTO d1 SELECT * FROM d")


def spellings(con, source):
    """{spelling: rows} of the item groups a reader yields (grouped downstream, as the mechanisms do)."""
    return dict(con.execute(f"SELECT item::VARCHAR, count(*) FROM (SELECT item FROM {source}) GROUP BY item").fetchall())


READERS = ["dp__user_item_rows('{t}')", "dp__user_items('{t}')", "dp__capped_user_items('{t}', max_items := 3)",
           "dp__capped_user_items_window('{t}', max_items := 3)"]

# (column type, common spelling, variant spelling, session setting): equal under the column's (or the
# session's) collation, printed differently.
CANONICALISED = [
    ("VARCHAR COLLATE NOCASE", "'secret'", "'SECRET'", None),
    ("VARCHAR COLLATE NOACCENT", "'cafe'", "'café'", None),
    ("VARCHAR COLLATE NOCASE.NOACCENT", "'cafe'", "'Café'", None),
    ("VARCHAR COLLATE NFC", "'\u00e9'", "'e\u0301'", None),
    ("VARCHAR", "'secret'", "'Secret'", "nocase"),
    ("JSON", "'\"secret\"'", "'\"SECRET\"'", "nocase"),
]


@pytest.fixture(scope="module")
def _shared():
    c = dpsql.connect()  # registration takes most of a second: one connection for the module's tests
    yield c
    c.close()


# The objects tests create (in the in-memory database, not dpsql's own), dropped after each test.
_CREATED = {"VIEW": "SELECT view_name FROM duckdb_views() WHERE NOT internal AND database_name = 'memory'",
            "TABLE": "SELECT table_name FROM duckdb_tables() WHERE database_name = 'memory'",
            "TYPE": "SELECT type_name FROM duckdb_types() WHERE NOT internal AND database_name = 'memory'"}


@pytest.fixture
def con(_shared):
    """The module's connection; each test's tables, views, types and collation setting are removed after it."""
    yield _shared
    _shared.execute("RESET default_collation")
    for kind, query in _CREATED.items():
        for (name,) in _shared.execute(query).fetchall():
            _shared.execute(f'DROP {kind} "{name}"')


@pytest.mark.parametrize("typ, common, variant, collation", CANONICALISED)
def test_the_hazard_is_real(con, typ, common, variant, collation):
    # Without dp__canonical DuckDB merges the two spellings into one group (so each case below tests
    # something): the group's spelling is whichever row the engine met first.
    if collation:
        con.execute(f"SET default_collation = '{collation}'")
    neighbours(con, typ, common, variant)
    assert len(spellings(con, "d1")) == 1


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("typ, common, variant, collation", CANONICALISED)
def test_equal_spellings_stay_apart_in_every_reader(con, reader, typ, common, variant, collation):
    if collation:
        con.execute(f"SET default_collation = '{collation}'")
    neighbours(con, typ, common, variant)
    c, v = (con.execute(f"SELECT {x}::{typ.split()[0]}::VARCHAR").fetchone()[0] for x in (common, variant))
    assert spellings(con, reader.format(t="d")) == {c: N}
    # D': the N users' group keeps D's spelling; the added user is a group of its own.
    assert spellings(con, reader.format(t="d1")) == {c: N, v: 1}


def test_a_view_collation_and_an_enum_are_exact(con):
    con.execute("CREATE TABLE raw AS SELECT 'u' || i AS user_id, 'secret' AS item FROM range(10) r(i)")
    con.execute("INSERT INTO raw VALUES ('target', 'SECRET')")
    con.execute("CREATE VIEW v AS SELECT user_id, item COLLATE NOCASE AS item FROM raw")
    assert len(spellings(con, "v")) == 1  # the hazard
    assert spellings(con, "dp__user_items('v')") == {"secret": 10, "SECRET": 1}
    # An ENUM (captured by dp__canonical's VARCHAR overload: same text, type VARCHAR) stays exact.
    con.execute("CREATE TABLE e AS SELECT user_id, item::ENUM('secret', 'SECRET') AS item FROM raw")
    con.execute("SET default_collation = 'nocase'")
    assert spellings(con, "dp__user_items('e')") == {"secret": 10, "SECRET": 1}


@pytest.mark.parametrize("user_type, collation", [("VARCHAR COLLATE NOCASE", None), ("VARCHAR", "nocase"),
                                                  ("VARCHAR COLLATE NOACCENT", None)])
def test_user_ids_by_identity(con, user_type, collation):
    # 'U0' (or 'ú0') is another person than 'u0': merged, the capped degree of 'u0' would be 2, and two
    # people's items would share one cap.
    if collation:
        con.execute(f"SET default_collation = '{collation}'")
    variant = "'ú0'" if "NOACCENT" in user_type else "'U0'"
    neighbours(con, "BIGINT", "7", "8", user_type=user_type, user_variant=variant)
    for reader in ("dp__capped_user_items('d1', max_items := 5)", "dp__capped_user_items_window('d1', max_items := 5)"):
        rows = con.execute(f"SELECT user_id, list(item ORDER BY item), max(d) FROM {reader} GROUP BY user_id").fetchall()
        assert len(rows) == N + 1
        assert {u: (items, d) for u, items, d in rows if u.lower() in ("u0", "ú0")} == \
            {"u0": ([7], 1), variant.strip("'"): ([8], 1)}


# Equal values printed differently, of the types refused below (TIME WITH TIME ZONE is refused although
# DuckDB 2.0.1 keeps '12:00:00+01' and '11:00:00+00' apart: dpsql does not rely on how offsets compare).
HAZARDS = [("DOUBLE", "0.0", "'-0.0'"), ("FLOAT", "0.0", "'-0.0'"), ("DOUBLE", "'nan'", "-('nan'::DOUBLE)"),
           ("INTERVAL", "INTERVAL '1 day'", "INTERVAL '24 hours'"), ("INTERVAL", "INTERVAL '30 days'", "INTERVAL '1 month'"),
           ("DOUBLE[]", "[0.0]", "['-0.0'::DOUBLE]"),
           ("STRUCT(i INTERVAL)", "{'i': INTERVAL '1 day'}", "{'i': INTERVAL '24 hours'}")]


@pytest.mark.parametrize("typ, common, variant", HAZARDS)
def test_the_refused_hazards_are_real(con, typ, common, variant):
    neighbours(con, typ, common, variant)
    assert len(spellings(con, "d1")) == 1
    assert len({r[0] for r in con.execute("SELECT item::VARCHAR FROM d1").fetchall()}) == 2


def test_default_collation_reaches_inside_lists(con):
    con.execute("SET default_collation = 'nocase'")
    neighbours(con, "VARCHAR[]", "['secret']", "['SECRET']")
    assert len(spellings(con, "d1")) == 1
    with pytest.raises(duckdb.Error, match=r"item_col := 'item' of 'd1' has type VARCHAR\[\]"):
        con.execute("SELECT * FROM dp__user_items('d1')").fetchall()


# (column, type, a value, the type as refused or None if accepted): refused by type before a row is read.
REFUSED = [
    ("item", "DOUBLE", "'-0.0'::DOUBLE", "DOUBLE"),
    ("item", "FLOAT", "'-0.0'::FLOAT", "FLOAT"),
    ("item", "DOUBLE", "-('nan'::DOUBLE)", "DOUBLE"),
    ("item", "INTERVAL", "INTERVAL '24 hours'", "INTERVAL"),
    ("item", "INTERVAL", "INTERVAL '1 month'", "INTERVAL"),
    ("item", "TIMETZ", "'12:00:00+01'::TIMETZ", "TIME WITH TIME ZONE"),
    ("item", "DOUBLE[]", "['-0.0'::DOUBLE]", "DOUBLE[]"),
    ("item", "DECIMAL(4,1)[2]", "[1.5, 2.5]::DECIMAL(4,1)[2]", None),  # accepted: control
    ("item", "STRUCT(a INTEGER, i INTERVAL)", "{'a': 1, 'i': INTERVAL '1 day'}", "STRUCT(a INTEGER, i INTERVAL)"),
    ("item", "VARCHAR[]", "['SECRET']", "VARCHAR[]"),
    ("item", "STRUCT(\"double\" VARCHAR)", "{'double': 'x'}", "STRUCT(\"double\" VARCHAR)"),
    ("item", "MAP(VARCHAR, INTEGER)", "MAP {'SECRET': 1}", "MAP(VARCHAR, INTEGER)"),
    ("item", "UNION(a INTEGER, b INTEGER)", "union_value(a := 1)", "UNION(a INTEGER, b INTEGER)"),
    ("item", "VARIANT", "1::VARIANT", "VARIANT"),
    ("user_id", "DOUBLE", "'-0.0'::DOUBLE", "DOUBLE"),
    ("user_id", "INTERVAL", "INTERVAL '24 hours'", "INTERVAL"),
    ("user_id", "VARCHAR[]", "['U0']", "VARCHAR[]"),
]


@pytest.mark.parametrize("col, typ, value, shown", REFUSED)
def test_refused_by_type_before_any_row_is_read(con, col, typ, value, shown):
    # A view whose every row raises when read: the refusal must come from the schema alone.
    other = "'u' || i" if col == "item" else "'x'"
    item, user = (f"CASE WHEN error('a row was read') THEN {value} END::{typ}", other) if col == "item" else \
        (other, f"CASE WHEN error('a row was read') THEN {value} END::{typ}")
    con.execute(f"CREATE VIEW v AS SELECT {user} AS user_id, {item} AS item FROM range(5) r(i)")
    param = "item_col" if col == "item" else "user_col"
    for reader in READERS + ["dp_set_union_weighted_gaussian('{t}', epsilon := 1, delta := 1e-5)"]:
        q = f"SELECT * FROM {reader.format(t='v')}"
        if shown is None:
            with pytest.raises(duckdb.Error, match="a row was read"):
                con.execute(q).fetchall()
            continue
        with pytest.raises(duckdb.Error) as e:
            con.execute(q).fetchall()
        msg = str(e.value)
        assert f"dpsql: {param} := '{col}' of 'v' has type {shown}," in msg, msg
        assert "Cast it in a view" in msg and "a row was read" not in msg


def test_nested_strings_are_refused_because_describe_hides_their_collation(con):
    # The premise of refusing VARCHAR inside nested values even without default_collation: a view's
    # [x COLLATE NOCASE] describes as VARCHAR[] and merges ['SECRET'] with ['secret'].
    con.execute("CREATE TABLE raw AS SELECT * FROM (VALUES ('u1', 'secret'), ('target', 'SECRET')) v(user_id, s)")
    con.execute("CREATE VIEW v AS SELECT user_id, [s COLLATE NOCASE] AS item FROM raw")
    assert con.execute("SELECT column_type FROM (DESCRIBE v) WHERE column_name = 'item'").fetchall() == [("VARCHAR[]",)]
    assert con.execute("SELECT count(DISTINCT item) FROM v").fetchall() == [(1,)]
    with pytest.raises(duckdb.Error, match=r"item_col := 'item' of 'v' has type VARCHAR\[\]"):
        con.execute("SELECT * FROM dp__user_items('v')").fetchall()


ACCEPTED = ["BOOLEAN", "TINYINT", "INTEGER", "BIGINT", "HUGEINT", "UBIGINT", "UHUGEINT", "DECIMAL(38,10)", "BIGNUM",
            "VARCHAR", "BLOB", "BIT", "UUID", "DATE", "TIME", "TIMESTAMP", "TIMESTAMP_NS", "TIMESTAMPTZ",
            "INTEGER[]", "INTEGER[3]", "STRUCT(a INTEGER, \"interval\" DATE, timetz BIGINT)",
            "MAP(INTEGER, TIMESTAMPTZ)", "ENUM('x', 'DOUBLE')[]"]


@pytest.mark.parametrize("typ", ACCEPTED)
def test_exact_types_are_accepted_and_keep_their_type(con, typ):
    con.execute(f"CREATE TABLE t (user_id BIGINT, item {typ})")
    assert con.execute("SELECT dp__check_key_columns('t', ['user_col', 'item_col'], ['user_id', 'item'])").fetchall() == [(True,)]
    described = con.execute("SELECT column_type FROM (DESCRIBE t) WHERE column_name = 'item'").fetchone()[0]
    assert con.execute("SELECT column_type FROM (DESCRIBE SELECT item FROM dp__user_item_rows('t'))").fetchall() == \
        [(described,)]


@pytest.mark.parametrize("typ", ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                                 "UINTEGER", "UBIGINT", "UHUGEINT", "DECIMAL(4,1)", "DECIMAL(38,10)", "BIGNUM",
                                 "DOUBLE", "FLOAT", "DATE", "UUID", "BLOB", "INTERVAL", "BOOLEAN", "VARCHAR[]",
                                 "STRUCT(a VARCHAR)", "UNION(a INTEGER, b VARCHAR)", "GEOMETRY", "ENUM('x')[]"])
def test_canonical_changes_no_other_type(con, typ):
    # Only VARCHAR has an overload; a typed overload also captures implicit casts, so check none happen
    # (ENUM, JSON and VARIANT are: test_canonical_strings).
    assert con.execute(f"SELECT typeof(dp__canonical(NULL::{typ})) = typeof(NULL::{typ})").fetchall() == [(True,)]


def test_canonical_strings(con):
    con.execute("CREATE TYPE mood AS ENUM ('a', 'A')")
    assert con.execute("SELECT typeof(dp__canonical('a'::mood)), typeof(dp__canonical('{}'::JSON)), "
                       "dp__canonical('SECRET' COLLATE NOCASE) = 'secret'").fetchall() == [("VARCHAR", "VARCHAR", False)]
    # VARIANT is cast too, but dp__check_key_columns refuses it before the reader's projection sees a row.
    assert con.execute("SELECT typeof(dp__canonical(NULL::VARIANT))").fetchall() == [("VARCHAR",)]


def _plan_ops(con, sql):
    # Stats-based compressed keys and casts: what decides the GROUP BY's hashing.
    plan = con.execute("EXPLAIN " + sql).fetchall()[0][1]
    return sorted(set(re.findall(r"__internal_\w+|CAST\(#\d+ AS \w+\)", plan)))


@pytest.mark.parametrize("user, item", [("i % 1000", "i % 5000"), ("(i % 1000)::VARCHAR", "'w' || (i % 500)"),
                                        ("i % 1000", "DATE '2020-01-01' + (i % 500)::INTEGER")])
def test_the_reader_hashes_as_the_bare_table(con, user, item):
    # The hot path: dp__canonical adds no cast, and the columns' statistics survive, so DuckDB hashes the
    # same compressed keys as for the bare table (a BIGINT id below 2^15 as a SMALLINT, a short VARCHAR
    # as an integer).
    con.execute(f"CREATE TABLE t AS SELECT {user} AS user_id, {item} AS item FROM range(20000) r(i)")
    user_type, item_type = (r[0] for r in con.execute("SELECT column_type FROM (DESCRIBE t)").fetchall())
    bare = _plan_ops(con, "SELECT DISTINCT user_id, item FROM t")
    assert bare  # compressed keys exist, so the comparison means something
    assert _plan_ops(con, "SELECT DISTINCT user_id, item FROM dp__user_item_rows('t')") == bare
    assert con.execute("SELECT typeof(user_id), typeof(item) FROM dp__user_item_rows('t') LIMIT 1").fetchall() == \
        [(user_type, item_type)]


# Public against private types ---------------------------------------------------------------------

def test_same_type_refuses_a_mismatch_naming_both_parameters_and_types(con):
    con.execute("CREATE TABLE t AS SELECT 'u' || i AS user_id, (i % 7)::VARCHAR AS item FROM range(60) r(i)")
    con.execute("INSERT INTO t VALUES ('alice', 'alice_has_hiv')")
    con.execute("CREATE TABLE public_items AS SELECT i AS item FROM range(7) r(i)")
    with pytest.raises(duckdb.Error) as e:
        con.execute("SELECT dp__check_same_type('public_items', 'item', 'order_tbl', 't', 'item', 'item_col')").fetchall()
    msg = str(e.value)
    assert "dpsql: column item of order_tbl := 'public_items' has type BIGINT but item_col := 'item' of 't' " \
           "has type VARCHAR" in msg
    assert "alice" not in msg and "CAST(item AS VARCHAR)" in msg


@pytest.mark.parametrize("public, private, ok", [
    ("VARCHAR", "VARCHAR", True), ("DATE", "DATE", True), ("INTEGER", "BIGINT", True), ("UBIGINT", "BIGINT", True),
    ("UTINYINT", "HUGEINT", True), ("UHUGEINT", "UHUGEINT", True), ("UHUGEINT", "BIGINT", False),
    ("HUGEINT", "UHUGEINT", False), ("BIGINT", "VARCHAR", False), ("DOUBLE", "BIGINT", False),
    ("DECIMAL(4,1)", "DECIMAL(5,1)", False), ("ENUM('a')", "VARCHAR", False), ("DATE", "TIMESTAMP", False)])
def test_same_type_rule(con, public, private, ok):
    con.execute(f"CREATE TABLE pub (k {public})")
    con.execute(f"CREATE TABLE priv (item {private})")
    q = "SELECT dp__check_same_type('pub', 'K', 'items_tbl', 'priv', 'item', 'item_col')"
    if ok:
        assert con.execute(q).fetchall() == [(True,)]
    else:
        with pytest.raises(duckdb.Error, match="items_tbl"):
            con.execute(q).fetchall()


INTS = {"TINYINT": (-2**7, 2**7 - 1), "SMALLINT": (-2**15, 2**15 - 1), "INTEGER": (-2**31, 2**31 - 1),
        "BIGINT": (-2**63, 2**63 - 1), "HUGEINT": (-2**127, 2**127 - 1), "UTINYINT": (0, 2**8 - 1),
        "USMALLINT": (0, 2**16 - 1), "UINTEGER": (0, 2**32 - 1), "UBIGINT": (0, 2**64 - 1), "UHUGEINT": (0, 2**128 - 1)}


def test_integer_pairs_the_rule_accepts_compare_exactly_and_never_fail(con):
    # The premise of accepting integers of different widths: at either end of their common range, and
    # with every value of one side outside the other's range, a join neither fails nor merges neighbours.
    for a, (alo, ahi) in INTS.items():
        for b, (blo, bhi) in INTS.items():
            con.execute(f"CREATE OR REPLACE TABLE pub AS SELECT * FROM (VALUES ('{blo}'::{b}), ('{bhi}'::{b})) v(k)")
            con.execute(f"CREATE OR REPLACE TABLE priv AS SELECT * FROM (VALUES ('{alo}'::{a}), ('{ahi}'::{a})) v(item)")
            try:
                con.execute("SELECT dp__check_same_type('pub', 'k', 'p', 'priv', 'item', 'item_col')").fetchall()
            except duckdb.Error:
                continue  # refused: nothing to check
            hi, lo = min(ahi, bhi), max(alo, blo)
            got = con.execute(f"SELECT count(*) FROM (VALUES ('{hi}'::{a}), ('{lo}'::{a}), ('{alo}'::{a}), ('{ahi}'::{a})) s(x) "
                              f"JOIN (VALUES ('{hi - 1}'::{b}), ('{lo + 1}'::{b})) p(y) ON s.x = p.y").fetchall()
            assert got == [(0,)], (a, b)


def test_value_type(con):
    cols = {"i8": "TINYINT", "h": "HUGEINT", "uh": "UHUGEINT", "d": "DECIMAL(38,10)", "f": "FLOAT", "x": "DOUBLE",
            "bn": "BIGNUM", "s": "VARCHAR", "b": "BOOLEAN", "iv": "INTERVAL"}
    con.execute("CREATE TABLE t (" + ", ".join(f"{c} {t}" for c, t in cols.items()) + ")")
    for c, t in cols.items():
        q = f"SELECT dp__check_value_type('t', '{c}', 'value_col')"
        if c in ("bn", "s", "b", "iv"):
            with pytest.raises(duckdb.Error, match=rf"dpsql: value_col := '{c}' of 't' has type {t}, whose conversion"):
                con.execute(q).fetchall()
        else:
            assert con.execute(q).fetchall() == [(True,)]
    # The premise: the accepted types' extremes convert; a BIGNUM can fail, quoting its value.
    con.execute("SELECT '340282366920938463463374607431768211455'::UHUGEINT::DOUBLE, "
                "'-170141183460469231731687303715884105728'::HUGEINT::DOUBLE, "
                "99999999999999999999999999999999999999::DECIMAL(38,0)::DOUBLE, '3.4e38'::FLOAT::DOUBLE").fetchall()
    with pytest.raises(duckdb.ConversionException, match="31337"):
        con.execute("SELECT ('31337' || repeat('0', 400))::BIGNUM::DOUBLE").fetchall()


# A release ---------------------------------------------------------------------------------------

def test_a_release_never_shows_the_added_users_spelling():
    for run in range(5):
        con = seeded(100 + run)
        try:
            con.execute("CREATE TABLE d1 (user_id VARCHAR, item VARCHAR COLLATE NOCASE)")
            con.execute("INSERT INTO d1 VALUES ('target', 'SECRET')")
            con.execute("INSERT INTO d1 SELECT 'u' || i, 'secret' FROM range(300) r(i)")
            out = con.execute("SELECT item FROM dp_set_union_weighted_gaussian('d1', epsilon := 1, delta := 1e-5)").fetchall()
        finally:
            con.close()
        assert out == [("secret",)]


def test_a_release_refuses_a_float_item_uncharged(con):
    spent = lambda: con.execute("SELECT coalesce(sum(epsilon), 0) FROM dp_releases()").fetchone()[0]  # noqa: E731
    before = spent()
    con.execute("CREATE TABLE t AS SELECT 'u' || i AS user_id, 0.5::DOUBLE AS item FROM range(50) r(i)")
    with pytest.raises(duckdb.Error, match="item_col := 'item' of 't' has type DOUBLE"):
        con.execute("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := 1, delta := 1e-5)").fetchall()
    assert spent() == before


def test_a_missing_column_is_left_to_the_column_check(con):
    con.execute("CREATE TABLE t (user_id BIGINT, item DOUBLE)")
    assert con.execute("SELECT dp__check_key_columns('t', ['user_col', 'item_col'], ['user_id', 'nope'])").fetchall() == [(True,)]
    with pytest.raises(duckdb.Error, match="item_col := 'nope' is not a column of 't'"):
        con.execute("SELECT * FROM dp__user_items('t', item_col := 'nope')").fetchall()
