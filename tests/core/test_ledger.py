"""The privacy-budget ledger: exact charges, refusals, scopes, persistence, processes."""
from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.core import ledger as L
from dpsql.core.ledger import BudgetExceededError, Ledger


# -- pure ledger ---------------------------------------------------------------------------------

def test_charge_records_and_status_sums():
    led = Ledger()
    led.charge("m1", "user", "T", 0.5, 1e-6, "a")
    led.charge("m2", "element", "main.u", 0.25, 0.0)
    rel = led.releases()
    assert [(r.mechanism, r.unit, r.table, r.epsilon, r.delta) for r in rel] == [
        ("m1", "user", "memory.main.t", 0.5, 1e-6), ("m2", "element", "memory.main.u", 0.25, 0.0)]
    status = {s.scope: s for s in led.status()}
    assert status["database"].epsilon_spent == 0.75 and status["database"].releases == 2
    assert status["memory.main.t"].epsilon_spent == 0.5 and status["memory.main.u"].delta_spent == 0.0
    assert status["database"].epsilon_remaining is None  # no budget set
    assert L.basic_composition(rel) == (0.75, 1e-6)


def test_budget_refuses_and_records_nothing():
    led = Ledger()
    led.set_budget(1.0, 1e-5)
    led.charge("m", "user", "t", 0.6, 4e-6)
    with pytest.raises(BudgetExceededError, match="scope 'database' exceeded.*nothing was released"):
        led.charge("m", "user", "t", 0.5, 1e-6)
    with pytest.raises(BudgetExceededError, match="delta"):
        led.charge("m", "user", "t", 0.1, 7e-6)  # epsilon fits, delta does not
    assert len(led.releases()) == 1
    led.charge("m", "user", "t", 0.4, 6e-6)  # exactly the rest fits
    (db,) = [s for s in led.status() if s.scope == "database"]
    assert db.epsilon_remaining == pytest.approx(0.0, abs=1e-12)


def test_many_small_charges_fit_their_sum():
    # 10 x 0.1 sums to 0.9999999999999999 or 1.0000000000000002 depending on order; both must fit 1.0.
    led = Ledger()
    led.set_budget(1.0, 1e-5)
    for _ in range(10):
        led.charge("m", "user", "t", 0.1, 1e-6)
    with pytest.raises(BudgetExceededError):
        led.charge("m", "user", "t", 1e-6, 0.0)


def test_table_scope_applies_only_to_its_table():
    led = Ledger()
    led.set_budget(1.0, 1e-5, scope='"Visits"')
    led.charge("m", "user", "visits", 1.0, 1e-5)
    with pytest.raises(BudgetExceededError, match="scope 'memory.main.visits'"):
        led.charge("m", "user", "main.VISITS", 0.1, 0.0)
    with pytest.raises(BudgetExceededError, match="scope 'memory.main.visits'"):
        led.charge("m", "user", 'MEMORY."visits"', 0.1, 0.0)
    led.charge("m", "user", "other", 5.0, 0.1)  # other tables are not limited by it
    assert [b.scope for b in led.budgets()] == ["memory.main.visits"]


def test_aliases_record_the_named_table(tmp_path):
    data = tmp_path / "events.parquet"
    led = Ledger(aliases={"dpsql_input": str(data)})
    assert led.charge("m", "user", "dpsql_input", 1.0, 0.0).table == os.path.realpath(data)
    # a ledger used without a connection names its tables as tables of its own database
    led = Ledger(tmp_path / "shop.duckdb.dpsql-ledger", aliases={"dpsql_input": "User_Items"})
    assert led.charge("m", "user", '"DPSQL_INPUT"', 1.0, 0.0).table == "shop.main.user_items"


@pytest.mark.parametrize("call, match", [
    (lambda led: led.set_budget(0, 1e-5), "epsilon"),
    (lambda led: led.set_budget(float("nan"), 1e-5), "epsilon"),
    (lambda led: led.set_budget(1.0, 1.0), "delta"),
    (lambda led: led.set_budget(1.0, -1e-9), "delta"),
    (lambda led: led.set_budget(1.0, 1e-5, scope=""), "scope"),
    (lambda led: led.charge("m", "user", "t", float("inf"), 1e-5), "epsilon"),
    (lambda led: led.charge("m", "user", "t", 1.0, float("nan")), "delta"),
    (lambda led: led.charge("m", "users", "t", 1.0, 1e-5), "unit"),
    (lambda led: led.charge("m", "user", None, 1.0, 1e-5), "scope"),
])
def test_bad_parameters_are_named(call, match):
    led = Ledger()
    with pytest.raises(dpsql.DPParameterError, match=match):
        call(led)
    assert led.releases() == []


def test_unwritable_ledger_is_a_clear_error(tmp_path):
    led = Ledger(tmp_path / "missing-folder" / "x.dpsql-ledger")
    with pytest.raises(dpsql.LedgerIOError, match="cannot use the privacy ledger"):
        led.charge("m", "user", "t", 1.0, 1e-5)


def test_threads_never_overspend():
    led = Ledger()
    led.set_budget(1.0, 1e-3)
    ok = []

    def spend():
        for _ in range(10):
            try:
                led.charge("m", "user", "t", 0.05, 0.0)
                ok.append(1)
            except BudgetExceededError:
                pass

    threads = [threading.Thread(target=spend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ok) == 20 == len(led.releases())


# -- through SQL ---------------------------------------------------------------------------------

@pytest.fixture()
def con():
    c = dpsql.connect(seed=5)
    c.execute("CREATE TABLE t AS SELECT (i % 200) AS user_id, (i * 7919 % 40) AS item FROM range(2000) r(i)")
    return c


def _new_releases(con, before):
    return [(r.mechanism, r.unit, r.table, r.epsilon, r.delta) for r in dpsql.releases(con)[before:]]


@pytest.mark.parametrize("method", sorted(dpsql.METHODS))
def test_each_set_union_method_charges_once(con, method):
    before = len(dpsql.releases(con))
    con.sql(f"SELECT count(*) FROM dp_set_union('t', method := '{method}', epsilon := 0.7, delta := 1e-6)").fetchall()
    assert _new_releases(con, before) == [(f"dp_set_union_{method}", "user", "memory.main.t", 0.7, 1e-6)]


# A release of several steps (top-k's domain and selection) is one body and one charge of its total
# (dpsql/core/release.py).
@pytest.mark.parametrize("sql, expected", [
    ("FROM dp_top_k('t', 3, epsilon := 0.8, delta := 2e-6)", {("dp_top_k", 0.8, 2e-6)}),
    ("FROM dp_hitting_set('t', 2, epsilon := 0.8, delta := 2e-6)", {("dp_hitting_set", 0.8, 2e-6)}),
    ("FROM dp_top_k_limited_domain('t', 2, 5, epsilon := 0.8, delta := 2e-6)",
     {("dp_top_k_limited_domain", 0.8, 2e-6)}),
])
def test_top_k_family_charges_its_total(con, sql, expected):
    before = len(dpsql.releases(con))
    con.sql(sql).fetchall()
    got = {(m, e, d) for m, _, _, e, d in _new_releases(con, before)}
    assert got == expected
    assert math.fsum(e for _, e, _ in got) == pytest.approx(0.8)


def test_pws_and_optimize_charge_with_their_units(con):
    con.execute("CREATE TABLE ev AS SELECT (i % 30) AS key FROM range(600) r(i)")
    con.execute("CREATE TABLE sets AS SELECT i % 5 AS set_id, i AS element FROM range(50) r(i)")
    con.execute("CREATE TABLE cands AS SELECT DISTINCT set_id FROM sets")
    before = len(dpsql.releases(con))
    con.sql("FROM dp_weighted_sample('ev', 1.0, 1e-4)").fetchall()
    con.sql("FROM dp_sbh_histogram('ev', 0.5, 1e-4)").fetchall()
    con.sql("FROM dp_max_coverage('sets', 'cands', 2, epsilon := 0.3)").fetchall()
    assert _new_releases(con, before) == [("dp_weighted_sample", "element", "memory.main.ev", 1.0, 1e-4),
                                          ("dp_sbh_histogram", "element", "memory.main.ev", 0.5, 1e-4),
                                          ("dp_max_coverage", "record", "memory.main.sets", 0.3, 0.0)]


def test_post_processing_and_planning_are_free(con):
    con.execute("CREATE TABLE s AS SELECT 1 AS key, 1 AS token")
    before = len(dpsql.releases(con))
    con.sql("FROM dp_weighted_sample_estimate('s', 1.0, 1e-4)").fetchall()
    con.execute("EXPLAIN FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert _new_releases(con, before) == []


@pytest.mark.parametrize("sql", [
    "FROM dp_set_union('t', method := 'nope', epsilon := 1.0, delta := 1e-5)",
    "FROM dp_set_union('t', epsilon := -1, delta := 1e-5)",
    "FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1.5)",
    *[f"FROM dp_set_union('t', method := '{m}', epsilon := 1.0, delta := 1e-5, max_items := 0)"
      for m in sorted(dpsql.METHODS) if m != "greedy_update"],
    "FROM dp_set_union('t', method := 'greedy_update', epsilon := 0, delta := 1e-5)",
    "FROM dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5, split := [0.5, 0.6])",
    "FROM dp_set_union_sips('t', epsilon := 1.0, delta := 1e-5, split := [])",
    "FROM dp_set_union_policy_laplace('t', epsilon := 1.0, delta := 1e-5, passes := 0)",
    "FROM dp_top_k('t', 0, epsilon := 1.0, delta := 1e-5)",
    "FROM dp_hitting_set('t', 2.5, epsilon := 1.0, delta := 1e-5)",
    "FROM dp_top_k_limited_domain('t', 3, 2, epsilon := 1.0, delta := 1e-5)",
    "FROM dp_weighted_sample('t', 1.0, 1e-4, key_col := 'nope')",
    "FROM dp_weighted_sample('t', 1.0, 1.0, key_col := 'item')",
    "FROM dp_sbh_histogram('t', 0.0, 1e-4, key_col := 'item')",
    "FROM dp_max_coverage('t', 't', 2, epsilon := -1, set_col := 'user_id', element_col := 'item')",
    "FROM dp_set_cover('t', 't', epsilon := 'nan'::DOUBLE, set_col := 'user_id', element_col := 'item')",
])
def test_invalid_calls_charge_nothing(con, sql):
    before = len(dpsql.releases(con))
    with pytest.raises(duckdb.Error):
        con.sql(sql).fetchall()
    assert _new_releases(con, before) == []


def test_over_budget_release_fails_whole_and_charges_nothing(con):
    dpsql.set_budget(con, 1.0, 1e-4)
    con.sql("FROM dp_set_union('t', epsilon := 0.75, delta := 1e-5)").fetchall()
    before = len(dpsql.releases(con))
    with pytest.raises(duckdb.Error, match="privacy budget of scope 'database' exceeded"):
        con.sql("FROM dp_set_union('t', epsilon := 0.5, delta := 1e-5)").fetchall()
    assert _new_releases(con, before) == []
    (row,) = con.sql("SELECT epsilon_spent, epsilon_remaining, releases FROM dp_budget() "
                     "WHERE scope = 'database'").fetchall()
    assert row == (0.75, 0.25, 1)
    con.sql("FROM dp_set_union('t', epsilon := 0.25, delta := 1e-5)").fetchall()  # the rest still fits


def test_table_budget_through_sql(con):
    con.execute("CREATE VIEW v AS FROM t")
    dpsql.set_budget(con, 0.5, 1e-5, scope="t")
    for name in ("t", "v"):  # a view is charged to the table it reads (tests/core/test_scopes.py)
        with pytest.raises(duckdb.Error, match="scope 'memory.main.t'"):
            con.sql(f"FROM dp_set_union_weighted_gaussian('{name}', epsilon := 0.6, delta := 1e-5)").fetchall()
    con.sql("FROM dp_set_union_weighted_gaussian('v', epsilon := 0.5, delta := 1e-5)").fetchall()
    (row,) = con.sql("SELECT count(*) FROM dp_releases() WHERE table_name = 'memory.main.t'").fetchall()
    assert row == (1,)


def test_cursors_charge_the_connection_ledger(con):
    cur = con.cursor()
    dpsql.register_macros(cur)
    before = len(dpsql.releases(con))
    cur.sql("FROM dp_set_union_count_laplace('t', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert len(_new_releases(con, before)) == 1


def test_dp_releases_columns(con):
    con.sql("FROM dp_set_union_weighted_laplace('t', epsilon := 1.0, delta := 1e-5, max_items := 3)").fetchall()
    rel = con.sql("FROM dp_releases()")
    assert rel.columns == ["release_id", "released_at", "mechanism", "unit", "table_name", "epsilon", "delta",
                           "parameters", "calibration", "seeded"]
    (row,) = rel.fetchall()[-1:]
    cal = dpsql.calibrate("weighted_laplace", epsilon=1.0, delta=1e-5, max_items=3)
    assert row[2] == "dp_set_union_weighted_laplace" and row[4] == "memory.main.t"
    assert json.loads(row[7])["max_items"] == 3 and json.loads(row[8])["threshold"] == cal.threshold


# -- persistence and processes -------------------------------------------------------------------

def test_file_database_ledger_persists(tmp_path):
    db = tmp_path / "d.duckdb"
    con = dpsql.connect(db)
    con.execute("CREATE TABLE t AS SELECT i % 10 AS user_id, i % 7 AS item FROM range(100) r(i)")
    dpsql.set_budget(con, 2.0, 1e-5)
    con.sql("FROM dp_set_union('t', epsilon := 1.5, delta := 1e-5)").fetchall()
    con.close()
    assert (tmp_path / "d.duckdb.dpsql-ledger").is_file()
    con = dpsql.connect(db, read_only=True)
    with pytest.raises(duckdb.Error, match="exceeded"):
        con.sql("FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert [r.epsilon for r in dpsql.releases(con)] == [1.5]


def test_in_memory_database_with_explicit_ledger_file(tmp_path):
    path = tmp_path / "mem.dpsql-ledger"
    con = dpsql.connect(ledger=path)
    con.execute("CREATE TABLE t AS SELECT 1 AS user_id, 2 AS item")
    con.sql("FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert len(Ledger(path).releases()) == 1


_WORKER = textwrap.dedent("""
    import sys, time, warnings
    from pathlib import Path
    import duckdb, dpsql
    db, go = sys.argv[1], Path(sys.argv[2])
    con = dpsql.connect(db, read_only=True)
    while not go.exists():
        time.sleep(0.005)
    ok = 0
    for _ in range(6):
        try:
            con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.25, delta := 1e-5, max_items := 5)").fetchall()
            ok += 1
        except duckdb.Error as exc:
            assert "exceeded" in str(exc), exc
    print(ok)
""")


def test_two_processes_never_both_spend_the_last_budget(tmp_path):
    db = tmp_path / "shared.duckdb"
    con = dpsql.connect(db)
    con.execute("CREATE TABLE t AS SELECT i % 50 AS user_id, i % 13 AS item FROM range(500) r(i)")
    dpsql.set_budget(con, 1.0, 1e-3)  # room for exactly 4 releases of 0.25
    con.close()
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(db), str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    successes = [int(o[0].strip()) for o in outs]
    assert sum(successes) == 4
    led = Ledger(L.sidecar_path(db))
    assert len(led.releases()) == 4
    assert led.status()[0].epsilon_spent == pytest.approx(1.0)


# -- CLI -----------------------------------------------------------------------------------------

def test_cli_budget_set_show_and_release(tmp_path, capsys):
    from dpsql.frontends.cli import main
    data = tmp_path / "events.parquet"
    duckdb.sql(f"COPY (SELECT i % 40 AS user_id, i % 9 AS item FROM range(400) r(i)) TO '{data}'")
    assert main(["budget", "set", str(data), "--epsilon", "1.0", "--delta", "1e-5"]) == 0
    args = ["set-union", str(data), "--epsilon", "0.6", "--delta", "1e-6", "--max-items", "3"]
    assert main(args) == 0
    assert main(args) == 1  # 0.6 + 0.6 > 1.0
    assert "exceeded" in capsys.readouterr().err
    assert main(["budget", "releases", str(data), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["table"], r["epsilon"]) for r in doc["releases"]] == [(os.path.realpath(data), 0.6)]
    assert doc["scopes"][0]["epsilon_remaining"] == pytest.approx(0.4)
    assert main(["budget", "show", str(tmp_path / "nope.duckdb")]) == 2


# -- scopes: every spelling of one table is one scope --------------------------------------------

def _identity_tables(con, tmp_path):
    """Tables whose one row is the scope they should charge, in every place a name can resolve to."""
    con.execute("ATTACH ':memory:' AS m2")
    con.execute(f"ATTACH '{tmp_path / 'shop.duckdb'}' AS prod")
    for sql in [
        "CREATE TABLE t AS SELECT 'memory.main.t' AS w",
        "CREATE TABLE \"My T\" AS SELECT 'memory.main.\"my t\"' AS w",
        "CREATE TABLE \"d.e\" AS SELECT 'memory.main.\"d.e\"' AS w",
        "CREATE TABLE \"a\"\"b\" AS SELECT 'memory.main.\"a\"\"b\"' AS w",
        "CREATE SCHEMA s", "CREATE TABLE s.t AS SELECT 'memory.s.t' AS w",
        "CREATE TABLE u AS SELECT 'memory.main.u' AS w",
        "CREATE TEMP TABLE u AS SELECT 'temp.main.u' AS w",   # shadows memory.main.u, as in DuckDB
        "CREATE VIEW v AS SELECT 'memory.main.v' AS w",
        "CREATE TABLE m2.t AS SELECT 'm2.main.t' AS w",
        # an attached database file is named by its file (shop), whatever it is attached as
        "CREATE TABLE prod.user_items AS SELECT 'shop.main.user_items' AS w",
        "CREATE SCHEMA prod.s2", "CREATE TABLE prod.s2.w AS SELECT 'shop.s2.w' AS w",
    ]:
        con.execute(sql)


SPELLINGS = ['t', 'T', '"t"', '"T"', 'main.t', 'MAIN.T', 'memory.t', 'MEMORY.T', 'memory.main.t',
             '"memory"."main"."t"', 'memory.main.t.', '"My T"', 'my t', 'MY T', 'main."my t"', '"d.e"',
             'memory.main."d.e"', '"a""b"', 's.t', 'S.T', 'memory.s.t', 'u', 'main.u', 'temp.u', 'temp.main.u',
             'memory.u', 'memory.main.u', 'v', 'main.V', 'm2.t', 'M2.main.t', 'prod.user_items',
             'PROD.MAIN.USER_ITEMS', '"prod"."main"."user_items"', 'prod.s2.w']


def test_scope_is_the_table_duckdb_reads(tmp_path):
    # For every spelling, the scope the ledger resolves equals the identity of the table DuckDB reads.
    con = dpsql.connect()
    _identity_tables(con, tmp_path)
    for name in SPELLINGS:
        ((read,),) = con.execute("FROM query_table(?)", [name]).fetchall()
        assert L.resolve_scope(con, name) == read, name
    # the search path moves with USE and SET search_path, and so does the scope
    con.execute("USE memory.s")
    for name, expected in [("t", "memory.s.t"), ("memory.t", "memory.s.t"), ("u", "temp.main.u")]:
        assert con.execute("FROM query_table(?)", [name]).fetchall() == [(expected,)]
        assert L.resolve_scope(con, name) == expected, name
    con.execute("SET search_path = 'prod.s2,prod.main'")
    for name, expected in [("w", "shop.s2.w"), ("user_items", "shop.main.user_items"), ("prod.w", "shop.s2.w")]:
        assert con.execute("FROM query_table(?)", [name]).fetchall() == [(expected,)]
        assert L.resolve_scope(con, name) == expected, name
    # a key is itself a spelling of its table (the file name shop stands for the database prod)
    con.execute("RESET search_path")
    con.execute("USE memory")
    for name in SPELLINGS:
        key = L.resolve_scope(con, name)
        assert L.resolve_scope(con, key) == key
        assert Ledger().scope(key) == key
    con.close()


def test_every_spelling_charges_one_scope(tmp_path):
    # The attack of the issue: with scope t spent, 'memory.main.t' and 'memory.t' still released.
    con = dpsql.connect()
    con.execute("CREATE TABLE t AS SELECT i AS user_id, unnest(['A', 'B']) AS item FROM range(300) r(i)")
    dpsql.set_budget(con, epsilon=1.0, delta=1e-5, scope="t")
    con.sql("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5)").fetchall()
    for name in ["t", "T", '"t"', "main.t", "memory.main.t", "MEMORY.MAIN.T", "memory.t", '"memory"."main"."t"']:
        with pytest.raises(duckdb.Error, match="privacy budget of scope 'memory.main.t' exceeded"):
            con.sql(f"SELECT * FROM dp_set_union_weighted_gaussian('{name}', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert [(s.scope, s.epsilon_spent, s.releases) for s in dpsql.budget(con)] == [
        ("database", 1.0, 1), ("memory.main.t", 1.0, 1)]
    # a budget set with any spelling is the budget of that one scope
    dpsql.set_budget(con, epsilon=3.0, delta=1e-4, scope='"MEMORY".main.T')
    assert [(b.scope, b.epsilon) for b in dpsql.core.state.ledger_of(con).budgets()] == [("memory.main.t", 3.0)]
    con.sql("SELECT * FROM dp_set_union_weighted_gaussian('memory.t', epsilon := 2.0, delta := 1e-5)").fetchall()
    assert [r.table for r in dpsql.releases(con)] == ["memory.main.t", "memory.main.t"]
    con.close()


def test_budget_set_before_the_table_exists_applies_to_it():
    con = dpsql.connect()
    # kept, and said: the scope names no table yet (a typo would otherwise guard nothing, silently)
    with pytest.warns(UserWarning, match=r"dpsql: scope 'Later' names no table or view.*'memory.main.later'"):
        dpsql.set_budget(con, epsilon=0.5, delta=1e-5, scope="Later")
    con.execute("CREATE TABLE later AS SELECT i AS user_id, 'x' AS item FROM range(100) r(i)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an existing table: nothing to say
        dpsql.set_budget(con, epsilon=0.5, delta=1e-5, scope="later")
    with pytest.raises(duckdb.Error, match="scope 'memory.main.later' exceeded"):
        con.sql("FROM dp_set_union_weighted_gaussian('main.later', epsilon := 0.6, delta := 1e-5)").fetchall()
    con.close()


def test_dbt_relation_cli_scope_and_attached_file_are_one_scope(tmp_path):
    # dbt names a model "shop"."main"."user_items"; 'dpsql budget set shop.duckdb --scope user_items' and a
    # session that ATTACHes the file under another name must charge and read that same scope.
    db = tmp_path / "shop.duckdb"
    con = dpsql.connect(db)
    con.execute("CREATE TABLE user_items AS SELECT i % 100 AS user_id, 'w' || (i % 3) AS item FROM range(1000) r(i)")
    con.close()
    from dpsql.frontends.cli import main
    assert main(["budget", "set", str(db), "--epsilon", "1.0", "--delta", "1e-4", "--scope", "user_items"]) == 0
    con = dpsql.connect(db)
    con.sql("""FROM dp_set_union_weighted_gaussian('"shop"."main"."user_items"', epsilon := 0.75, delta := 1e-5)""").fetchall()
    with pytest.raises(duckdb.Error, match="scope 'shop.main.user_items' exceeded"):
        con.sql("FROM dp_set_union_weighted_gaussian('user_items', epsilon := 0.5, delta := 1e-5)").fetchall()
    con.close()
    other = dpsql.connect(ledger=L.sidecar_path(db))
    other.execute(f"ATTACH '{db}' AS prod (READ_ONLY)")
    with pytest.raises(duckdb.Error, match="scope 'shop.main.user_items' exceeded"):
        other.sql("FROM dp_set_union_weighted_gaussian('prod.user_items', epsilon := 0.5, delta := 1e-5)").fetchall()
    other.sql("FROM dp_set_union_weighted_gaussian('prod.user_items', epsilon := 0.25, delta := 1e-5)").fetchall()  # the rest
    other.close()
    assert [(r.table, r.epsilon) for r in Ledger(L.sidecar_path(db)).releases()] == [
        ("shop.main.user_items", 0.75), ("shop.main.user_items", 0.25)]


def test_file_scopes_are_resolved_paths(tmp_path, monkeypatch):
    data = tmp_path / "events.parquet"
    duckdb.sql(f"COPY (SELECT i % 50 AS user_id, 'x' AS item FROM range(500) r(i)) TO '{data}'")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.parquet").symlink_to(data)
    monkeypatch.chdir(tmp_path)
    con = dpsql.connect()
    dpsql.set_budget(con, epsilon=1.0, delta=1e-5, scope="events.parquet")
    assert [b.scope for b in dpsql.core.state.ledger_of(con).budgets()] == [os.path.realpath(data)]
    con.sql("FROM dp_set_union_weighted_gaussian('./events.parquet', epsilon := 1.0, delta := 1e-5)").fetchall()
    for name in ["events.parquet", str(data), "sub/../events.parquet", '"events.parquet"', "link.parquet"]:
        assert con.execute("SELECT count(*) FROM query_table(?)", [name]).fetchall() == [(500,)]
        with pytest.raises(duckdb.Error, match="exceeded"):
            con.sql(f"FROM dp_set_union_weighted_gaussian('{name}', epsilon := 0.1, delta := 1e-5)").fetchall()
    assert [r.table for r in dpsql.releases(con)] == [os.path.realpath(data)]
    con.close()


@pytest.mark.parametrize("name", ['"unterminated', 'a"b', "a..b", ".a"])
def test_unparsable_scope_is_named(name):
    with pytest.raises(dpsql.DPParameterError, match="scope .* is not a table name"):
        Ledger().set_budget(1.0, 1e-5, scope=name)


def test_split_name_parses_as_duckdb():
    assert L.split_name('"memory"."main"."a""b"') == ["memory", "main", 'a"b']
    assert L.split_name("my t") == ["my t"]  # nothing is trimmed
    assert L.split_name('"d.e"') == ["d.e"]
    assert L.split_name("t.") == ["t"]
    assert L.database_alias("/x/y/events.v2.duckdb") == "events"
    assert L.database_alias("main.duckdb") == "main_db"


# -- seeded releases -----------------------------------------------------------------------------

def test_seeded_releases_are_marked():
    con = dpsql.connect()
    con.execute("CREATE TABLE t AS SELECT i % 100 AS user_id, 'x' AS item FROM range(1000) r(i)")
    con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.5, delta := 1e-5)").fetchall()
    with pytest.warns(UserWarning):
        dpsql.register(con, seed=3)  # same connection, same ledger, now NOT private
    con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.25, delta := 1e-5)").fetchall()
    assert [(r.epsilon, r.seeded) for r in dpsql.releases(con)] == [(0.5, False), (0.25, True)]
    assert con.sql("SELECT epsilon, seeded FROM dp_releases() ORDER BY release_id").fetchall() == [
        (0.5, False), (0.25, True)]
    assert con.sql("SELECT scope, epsilon_spent, releases, seeded_releases FROM dp_budget()").fetchall() == [
        ("database", 0.75, 2, 1), ("memory.main.t", 0.75, 2, 1)]
    dpsql.register(con)  # private again
    con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.125, delta := 1e-5)").fetchall()
    assert dpsql.releases(con)[-1].seeded is False
    con.close()


# -- ledger consistency --------------------------------------------------------------------------

class _FailingDb:
    """A SQLite connection whose writes fail like a full or broken disk."""

    def __init__(self, db, fail_on):
        self._db, self._fail_on = db, fail_on

    def execute(self, sql, *args):
        if sql.lstrip().upper().startswith(self._fail_on):
            raise sqlite3.OperationalError("disk I/O error")
        return self._db.execute(sql, *args)

    def executescript(self, sql):
        return self._db.executescript(sql)

    def close(self):
        self._db.close()


@pytest.mark.parametrize("fail_on", ["INSERT", "COMMIT", "BEGIN"])
def test_failing_charge_is_a_clear_error_and_records_nothing(tmp_path, monkeypatch, fail_on):
    path = tmp_path / "l.dpsql-ledger"
    con = dpsql.connect(ledger=path)
    con.execute("CREATE TABLE t AS SELECT i % 100 AS user_id, 'x' AS item FROM range(1000) r(i)")
    con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.5, delta := 1e-5)").fetchall()
    opener = Ledger._open
    monkeypatch.setattr(Ledger, "_open", lambda self: _FailingDb(opener(self), fail_on))
    with pytest.raises(duckdb.Error, match=r"dpsql: cannot use the privacy ledger .*disk I/O error.*nothing "
                                           r"was released"):
        con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.25, delta := 1e-5)").fetchall()
    monkeypatch.setattr(Ledger, "_open", opener)
    assert [r.epsilon for r in Ledger(path).releases()] == [0.5]
    con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.125, delta := 1e-5)").fetchall()  # the ledger still works
    assert [r.epsilon for r in dpsql.releases(con)] == [0.5, 0.125]
    con.close()


def _old_ledger(tmp_path, extra_columns: str, rows: str):
    """The sidecar of shop.duckdb as an older dpsql wrote it: its two tables (releases with
    ``extra_columns``), then the SQL ``rows``."""
    path = L.sidecar_path(tmp_path / "shop.duckdb")
    db = sqlite3.connect(path)
    db.executescript(f"""
        CREATE TABLE budgets (scope TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL);
        CREATE TABLE releases (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, mechanism TEXT NOT NULL,
            unit TEXT NOT NULL, tbl TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL,
            parameters TEXT NOT NULL, calibration TEXT NOT NULL{extra_columns});""" + rows)
    db.commit()
    db.close()
    return path


def test_ledger_of_an_older_version_keeps_its_budgets(tmp_path):
    # Ledgers written before scopes were catalog identities: their scopes are re-keyed, not orphaned.
    path = _old_ledger(tmp_path, "", """
        INSERT INTO budgets VALUES ('user_items', 1.0, 1e-5), ('database', 5.0, 1e-4);
        INSERT INTO releases VALUES (1, 0, 'm', 'user', 'user_items', 0.75, 0, '', '');""")
    led = Ledger(path)
    assert [(s.scope, s.epsilon_budget, s.epsilon_spent, s.seeded_releases) for s in led.status()] == [
        ("database", 5.0, 0.75, 0), ("shop.main.user_items", 1.0, 0.75, 0)]
    with pytest.raises(BudgetExceededError, match="scope 'shop.main.user_items'"):
        led.charge("m", "user", "shop.main.user_items", 0.5, 0.0)
    assert [r.seeded for r in led.releases()] == [False]


def test_ledger_of_version_1_reads_its_table_as_the_one_scope(tmp_path):
    # A ledger written before release_scopes existed: its releases keep their tbl as their scope, and
    # releases of several scopes are added beside them.
    path = _old_ledger(tmp_path, ", seeded INTEGER NOT NULL DEFAULT 0", """
        INSERT INTO budgets VALUES ('shop.main.orders', 1.0, 1e-5);
        INSERT INTO releases VALUES (1, 0, 'm', 'user', 'shop.main.orders', 0.75, 0, '', '', 0);
        PRAGMA user_version = 1;""")
    led = Ledger(path)
    assert [(r.table, r.scopes) for r in led.releases()] == [("shop.main.orders", ("shop.main.orders",))]
    both = L.ScopeSet([("shop.main.orders", None), ("shop.main.refunds", None)])
    with pytest.raises(BudgetExceededError, match="scope 'shop.main.orders'"):
        led.charge("m", "user", "v", 0.5, 0.0, scope=both)
    led.charge("m", "user", "v", 0.25, 0.0, scope=both)
    assert [(s.scope, s.epsilon_spent, s.releases) for s in led.status()] == [
        ("database", 1.0, 2), ("shop.main.orders", 1.0, 2), ("shop.main.refunds", 0.25, 1)]
    assert led.releases()[-1].table == "shop.main.orders, shop.main.refunds"
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchall() == [(2,)]


def test_release_of_several_scopes_must_fit_each_and_is_recorded_once():
    led = Ledger()
    led.set_budget(1.0, 1e-4, scope="b")
    two = L.ScopeSet([("memory.main.a", None), ("memory.main.b", None)])
    rel = led.charge("m", "user", "joined", 0.75, 1e-6, scope=two)
    assert rel.scopes == ("memory.main.a", "memory.main.b") and len(led.releases()) == 1
    with pytest.raises(BudgetExceededError, match="scope 'memory.main.b'"):
        led.charge("m", "user", "joined", 0.5, 1e-6, scope=two)
    led.charge("m", "user", "a", 0.5, 1e-6, scope=L.ScopeSet([("memory.main.a", None)]))
    assert [(s.scope, s.epsilon_spent, s.releases) for s in led.status()] == [
        ("database", 1.25, 2), ("memory.main.a", 1.25, 2), ("memory.main.b", 0.75, 1)]
    # a release that reads no table or file is charged to 'database' alone
    assert led.charge("m", "user", "constants", 0.125, 0.0, scope=L.ScopeSet([])).scopes == ()
    assert [s.releases for s in led.status()] == [3, 2, 1]


def test_scopes_of_another_database_go_to_its_sidecar_all_or_nothing(tmp_path):
    data = tmp_path / "hr.duckdb"
    sidecar = Ledger(L.sidecar_path(data))
    sidecar.set_budget(1.0, 1e-4)
    led = Ledger(tmp_path / "session.dpsql-ledger")
    mixed = L.ScopeSet([("memory.main.local", None), ("hr.main.staff", str(data))])
    led.charge("m", "user", "v", 0.75, 0.0, scope=mixed)
    assert [r.scopes for r in led.releases()] == [("memory.main.local",)]
    assert [r.scopes for r in sidecar.releases()] == [("hr.main.staff",)]
    with pytest.raises(BudgetExceededError, match=r"scope 'database' exceeded.*in the ledger .*hr\.duckdb\.dpsql"):
        led.charge("m", "user", "v", 0.5, 0.0, scope=mixed)
    assert len(led.releases()) == 1 and len(sidecar.releases()) == 1  # neither recorded the refused one
    led.homes.add(os.path.realpath(data))  # a connection opened on hr.duckdb charges its tables here
    led.charge("m", "user", "v", 0.5, 0.0, scope=mixed)
    assert len(led.releases()) == 2 and len(sidecar.releases()) == 1


@pytest.mark.parametrize("content, problem", [
    (b"", "is empty"),
    (b"item,count\nw1,3\n", "is not a SQLite file"),
    (b"SQLite format 3\x00" + b"\x10\x00" + b"\x00" * 30, "is truncated"),
])
def test_broken_ledger_file_is_an_error_not_a_new_ledger(tmp_path, content, problem):
    path = tmp_path / "d.duckdb.dpsql-ledger"
    path.write_bytes(content)
    led = Ledger(path)
    for use in (led.budgets, led.releases, lambda: led.set_budget(1.0, 1e-5),
                lambda: led.charge("m", "user", "t", 1.0, 1e-5)):
        with pytest.raises(dpsql.LedgerIOError, match=rf"dpsql: the privacy ledger {path} {problem}.*nothing was "
                                                       rf"released or charged.*restore it.*delete it.*forgets"):
            use()
    assert path.read_bytes() == content  # untouched


def test_sqlite_file_without_the_ledger_tables_is_refused(tmp_path):
    path = tmp_path / "foreign.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (x)")
    db.commit()
    db.close()
    with pytest.raises(dpsql.LedgerIOError, match="without dpsql's tables"):
        Ledger(path).budgets()
    assert [r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")] == ["notes"]


def test_missing_ledger_file_is_created_whole(tmp_path):
    path = tmp_path / "new.dpsql-ledger"
    assert Ledger(path).budgets() == []
    assert path.read_bytes().startswith(b"SQLite format 3\x00")
    assert sorted(os.listdir(tmp_path)) == ["new.dpsql-ledger"]  # no temporary file left behind


# -- setting a budget: never below what is spent --------------------------------------------------

def test_budget_below_what_is_spent_is_refused_and_changes_nothing():
    led = Ledger()
    led.charge("m", "user", "t", 0.5, 1e-6)
    led.set_budget(2.0, 1e-4)
    led.set_budget(1.0, 1e-4, scope="t")
    with pytest.raises(dpsql.ParameterError, match=r"scope 'database'.*epsilon=0\.4 is below the epsilon already "
                                                   r"spent \(0\.5\).*Set at least what is spent \(epsilon >= 0\.5"):
        led.set_budget(0.4, 1e-4)
    with pytest.raises(dpsql.ParameterError, match=r"scope 'memory\.main\.t'.*delta=1e-07 is below the delta "
                                                   r"already spent \(1e-06\).*delta >= 1e-06.*remove the budget"):
        led.set_budget(1.0, 1e-7, scope="t")
    with pytest.raises(dpsql.ParameterError, match="below"):
        led.check_budget(0.4, 1e-4)
    assert [(b.scope, b.epsilon, b.delta) for b in led.budgets()] == [("database", 2.0, 1e-4),
                                                                       ("memory.main.t", 1.0, 1e-4)]
    # a scope without a budget cannot get one below its spending either
    led.remove_budget("t")
    with pytest.raises(dpsql.ParameterError, match="below"):
        led.set_budget(0.25, 1e-4, scope="t")
    assert [b.scope for b in led.budgets()] == ["database"]


def test_budget_equal_to_what_is_spent_closes_the_scope():
    led = Ledger()
    for _ in range(10):  # 0.1 ten times sums to 0.9999999999999999 or so: the budget 1.0 is not below it
        led.charge("m", "user", "t", 0.1, 1e-7)
    assert led.set_budget(1.0, 1e-6, scope="t").epsilon == 1.0
    assert led.check_budget(1.0, 1e-6).epsilon == 1.0  # only checks: 'database' keeps no budget
    assert [b.scope for b in led.budgets()] == ["memory.main.t"]
    with pytest.raises(BudgetExceededError, match="scope 'memory.main.t' exceeded"):
        led.charge("m", "user", "t", 0.01, 0.0)
    led.charge("m", "user", "u", 0.01, 0.0)  # another table is not closed


def test_setting_a_budget_again_unchanged_is_allowed_whatever_was_spent(tmp_path):
    # A ledger whose budget was lowered below its spending before that was refused: setting the same budget
    # again (dbt does at every connection) changes nothing and is not refused; any other value below is.
    path = _old_ledger(tmp_path, ", seeded INTEGER NOT NULL DEFAULT 0", """
        INSERT INTO budgets VALUES ('database', 1.0, 1e-5);
        INSERT INTO releases VALUES (1, 0, 'm', 'user', 'shop.main.t', 1.5, 0, '', '', 0);
        PRAGMA user_version = 1;""")
    led = Ledger(path)
    led.set_budget(1.0, 1e-5)
    with pytest.raises(dpsql.ParameterError, match=r"epsilon=1\.2 is below the epsilon already spent \(1\.5\)"):
        led.set_budget(1.2, 1e-5)
    assert [(b.epsilon, b.delta) for b in led.budgets()] == [(1.0, 1e-5)]


def test_python_set_budget_below_spent_is_refused(con):
    con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.5, delta := 1e-5)").fetchall()
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope="t")
    with pytest.raises(dpsql.ParameterError, match=r"scope 'memory\.main\.t'.*epsilon=0\.25 is below"):
        dpsql.set_budget(con, epsilon=0.25, delta=1e-4, scope="T")
    assert con.sql("SELECT scope, epsilon_budget FROM dp_budget() WHERE epsilon_budget IS NOT NULL").fetchall() == [
        ("memory.main.t", 1.0)]


# -- releases as JSON with UTC times ----------------------------------------------------------------

def test_dp_releases_parameters_are_json_and_released_at_a_utc_timestamp(con):
    import datetime

    con.sql("FROM dp_set_union_weighted_laplace('t', epsilon := 1.0, delta := 1e-5, max_items := 3)").fetchall()
    types = dict(con.sql("SELECT column_name, column_type FROM (DESCRIBE FROM dp_releases())").fetchall())
    assert (types["parameters"], types["calibration"], types["released_at"]) == ("JSON", "JSON", "TIMESTAMP")
    ((max_items, noise, at),) = con.sql("SELECT parameters->>'max_items', calibration->>'noise', released_at "
                                        "FROM dp_releases()").fetchall()
    assert (max_items, noise) == ("3", "laplace")
    (release,) = dpsql.releases(con)
    utc = datetime.datetime.fromtimestamp(release.time, datetime.timezone.utc).replace(tzinfo=None)
    assert abs(at - utc) <= datetime.timedelta(microseconds=1)
    doc = release.to_json()
    assert doc["parameters"]["max_items"] == 3 and doc["calibration"]["noise"] == "laplace"
    iso = datetime.datetime.fromisoformat(doc["released_at"].replace("Z", "+00:00"))
    assert iso.tzinfo == datetime.timezone.utc and abs(iso.replace(tzinfo=None) - utc) <= datetime.timedelta(
        microseconds=1)
    assert doc["released_at"].endswith("Z") and json.loads(json.dumps(doc)) == doc


def test_older_ledger_struct_text_reads_as_json(tmp_path):
    # An older dpsql recorded parameters and calibration as DuckDB's text of a struct.
    path = _old_ledger(tmp_path, "", """
        INSERT INTO releases VALUES (1, 0, 'dp_set_union_count_laplace', 'user', 'user_items', 0.5, 0,
            '{''max_items'': 10, ''user_col'': user_id, ''item_col'': ''a, b''}',
            '{''noise'': laplace, ''scale'': 2.5, ''threshold'': NULL, ''rounds'': [1, 2.5e-07]}');
        INSERT INTO releases VALUES (2, 1.5, 'm', 'user', 'user_items', 0.25, 0, '', 'not a struct {');""")
    led = Ledger(path)
    first, second = led.releases()
    assert json.loads(first.parameters) == {"max_items": 10, "user_col": "user_id", "item_col": "a, b"}
    assert first.to_json()["calibration"] == {"noise": "laplace", "scale": 2.5, "threshold": None,
                                              "rounds": [1, 2.5e-07]}
    assert first.to_json()["released_at"] == "1970-01-01T00:00:00.000000Z"
    assert second.to_json()["released_at"] == "1970-01-01T00:00:01.500000Z"
    assert (second.parameters, second.to_json()["parameters"]) == ("", None)
    assert second.to_json()["calibration"] == "not a struct {"  # kept whole, as a JSON string
    con = dpsql.connect(ledger=path)
    assert con.sql("SELECT release_id, parameters->>'user_col', calibration->>'scale', parameters IS NULL "
                   "FROM dp_releases()").fetchall() == [(1, "user_id", "2.5", False), (2, None, None, True)]
    con.close()


@pytest.mark.parametrize("text, expected", [
    ('{"a": NaN, "b": [Infinity, -Infinity]}', {"a": "NaN", "b": ["Infinity", "-Infinity"]}),
    ("{'q': 'it\\'s', 'n': {'x': y z}, 'e': '', 'f': inf}", {"q": "it's", "n": {"x": "y z"}, "e": "", "f": "Infinity"}),
    ("[]", []),
    ("{'unterminated': 'x}", "{'unterminated': 'x}"),
])
def test_json_text_is_strict_json(text, expected):
    made = L.json_text(text)
    assert json.loads(made, parse_constant=lambda c: pytest.fail(f"{c} is not JSON")) == expected


# -- dp_set_budget / dp_remove_budget: setting budgets from SQL ----------------------------------------

def _budgets(path_or_ledger):
    led = path_or_ledger if isinstance(path_or_ledger, Ledger) else Ledger(path_or_ledger)
    return [(b.scope, b.epsilon, b.delta) for b in led.budgets()]


def test_dp_set_budget_writes_the_ledger_the_connection_charges(tmp_path):
    path = tmp_path / "session.dpsql-ledger"
    con = dpsql.connect(ledger=path)
    con.execute("CREATE TABLE t AS SELECT i % 100 AS user_id, 'x' AS item FROM range(1000) r(i)")
    ((change,),) = con.sql("SELECT dp_set_budget('\"T\"', 1.0, 1e-4)").fetchall()
    assert (change["scope"], change["epsilon_budget"], change["epsilon_remaining"], change["ledger"], change["note"]) \
        == ("memory.main.t", 1.0, 1.0, str(path), None)
    assert _budgets(path) == [("memory.main.t", 1.0, 1e-4)]
    con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.75, delta := 1e-5)").fetchall()
    with pytest.raises(duckdb.Error, match="scope 'memory.main.t' exceeded"):
        con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.5, delta := 1e-5)").fetchall()
    # below what is spent: refused, nothing changed (as dpsql.set_budget and the CLI)
    with pytest.raises(duckdb.Error, match=r"epsilon=0\.5 is below the epsilon already spent \(0\.75\)"):
        con.sql("SELECT dp_set_budget('t', 0.5, 1e-4)").fetchall()
    assert _budgets(path) == [("memory.main.t", 1.0, 1e-4)]
    # equal closes the scope; the 'database' scope and a parameter error work as in Python
    assert con.sql("SELECT dp_set_budget('t', 0.75, 1e-5).epsilon_remaining").fetchall() == [(0.0,)]
    assert con.sql("SELECT dp_set_budget('database', 3, 1e-3).scope").fetchall() == [("database",)]
    with pytest.raises(duckdb.Error, match="delta budget must be a number with 0 <= delta < 1"):
        con.sql("SELECT dp_set_budget('t', 1.0, 1.5)").fetchall()
    with pytest.raises(duckdb.Error, match="epsilon must not be NULL"):
        con.sql("SELECT dp_set_budget('t', NULL, 1e-5)").fetchall()
    assert _budgets(path) == [("database", 3.0, 1e-3), ("memory.main.t", 0.75, 1e-5)]
    # remove: its releases stay charged; a scope without a budget is said
    ((removed,),) = con.sql("SELECT dp_remove_budget('main.t')").fetchall()
    assert (removed["scope"], removed["epsilon_budget"], removed["releases"], removed["note"]) == (
        "memory.main.t", None, 1, None)
    assert "had no budget" in con.sql("SELECT dp_remove_budget('t').note").fetchall()[0][0]
    assert _budgets(path) == [("database", 3.0, 1e-3)]
    con.close()


def test_dp_set_budget_says_when_the_scope_names_nothing_yet(tmp_path, monkeypatch):
    # A budget may precede its table (test_budget_set_before_the_table_exists_applies_to_it): accepted, and said.
    monkeypatch.chdir(tmp_path)
    con = dpsql.connect()
    con.execute("CREATE TABLE t AS SELECT 1 AS user_id, 'x' AS item")
    con.execute("CREATE VIEW v AS FROM t")
    duckdb.sql(f"COPY (SELECT 1 AS user_id, 'x' AS item) TO '{tmp_path / 'here.parquet'}'")
    notes = dict(con.sql("SELECT s, dp_set_budget(s, 1.0, 1e-5).note FROM (VALUES ('t'), ('Later'), ('here.parquet'), "
                         "('gone.parquet'), ('database')) x(s)").fetchall())
    assert notes["t"] is None and notes["here.parquet"] is None and notes["database"] is None
    assert "names no table or view of this database yet" in notes["Later"] and "'memory.main.later'" in notes["Later"]
    assert "names no existing file" in notes["gone.parquet"] and str(tmp_path / "gone.parquet") in notes["gone.parquet"]
    assert len(_budgets(dpsql.core.state.ledger_of(con))) == 5
    with pytest.raises(duckdb.Error, match="scope 'v' is a view: a release on it is charged to .*memory.main.t"):
        con.sql("SELECT dp_set_budget('v', 1.0, 1e-5)").fetchall()
    con.close()


def test_dp_set_budget_goes_to_the_ledger_of_an_attached_database(tmp_path):
    shop = tmp_path / "shop.duckdb"
    duckdb.connect(str(shop)).execute("CREATE TABLE orders AS SELECT 1 AS user_id, 'x' AS item").close()
    con = dpsql.connect()
    con.execute(f"ATTACH '{shop}' AS archive (READ_ONLY)")
    ((change,),) = con.sql("SELECT dp_set_budget('archive.orders', 1.0, 1e-4)").fetchall()
    assert (change["scope"], change["ledger"]) == ("shop.main.orders", str(L.sidecar_path(shop)))
    assert _budgets(L.sidecar_path(shop)) == [("shop.main.orders", 1.0, 1e-4)]
    assert _budgets(dpsql.core.state.ledger_of(con)) == []
    con.close()


def test_dp_set_budget_is_never_folded_while_planning(con):
    con.sql("EXPLAIN SELECT dp_set_budget('t', 1.0, 1e-5)").fetchall()
    con.sql("PREPARE later AS SELECT dp_set_budget('t', 1.0, 1e-5)")
    assert _budgets(dpsql.core.state.ledger_of(con)) == []


def test_a_statement_never_both_changes_a_budget_and_releases(con):
    ledger = dpsql.core.state.ledger_of(con)
    dpsql.set_budget(con, 1.0, 1e-4, scope="t")
    release = "FROM dp_set_union_weighted_gaussian('t', epsilon := 0.5, delta := 1e-5)"
    # hidden in a view or a macro, a budget change would go unseen: in a release's query it would lift the
    # limit the release is checked against
    con.execute("CREATE VIEW lifted AS FROM t WHERE dp_set_budget('t', 100, 0.5).epsilon_budget > 0")
    con.execute("CREATE VIEW lift_view AS SELECT dp_set_budget('t', 100, 0.5) AS raised")
    con.execute("CREATE MACRO lift(e) AS dp_set_budget('t', e, 0.5)")
    for sql in ["FROM lift_view", "SELECT lift(100)", "SELECT count(*) FROM lifted"]:
        with pytest.raises(duckdb.Error, match="dp_set_budget must be called in the statement itself"):
            con.sql(sql).fetchall()
    with pytest.raises(duckdb.Error, match="must be called in the statement itself|cannot tell which tables"):
        con.sql("FROM dp_set_union_weighted_gaussian('lifted', epsilon := 0.5, delta := 1e-5)").fetchall()
    # in one statement with a release, whichever DuckDB runs first refuses
    for sql in [f"SELECT dp_set_budget('t', 100, 0.5), (SELECT count(*) FROM ({release}))",
                f"SELECT (SELECT count(*) FROM ({release})), dp_remove_budget('t')"]:
        with pytest.raises(duckdb.Error, match="changes a privacy budget .* and makes a release|also makes a release"):
            con.sql(sql).fetchall()
    con.execute(f"CREATE VIEW released AS {release}")
    with pytest.raises(duckdb.Error, match="changes a privacy budget .* and makes a release|also makes a release"):
        con.sql("SELECT dp_set_budget('t', 100, 0.5) FROM released").fetchall()
    # the change's own check, whichever runs first: a release named in the statement, or read through a view
    from dpsql.core import ledger_sql
    ((row,),) = con.execute("SELECT dp__catalog(NULL)").fetchall()
    for sql, named in [("SELECT dp_set_budget('t', 100, 0.5) FROM released", "released"),
                       ("SELECT dp_set_budget('t', 1, 0), (FROM dp_set_union('t', epsilon := 1, delta := 0))",
                        "dp_set_union")]:
        with pytest.raises(dpsql.ParameterError, match=f"also makes a release \\({named}\\)"):
            ledger_sql._check_budget_statement("dp_set_budget", {**row, "query": sql})
    ledger_sql._check_budget_statement("dp_set_budget", {**row, "query": "SELECT dp_set_budget('t', 1, 0) FROM t"})
    assert _budgets(ledger) == [("memory.main.t", 1.0, 1e-4)] and ledger.releases() == []
    # one statement each: fine
    con.sql("SELECT dp_set_budget('t', 2.0, 1e-4)").fetchall()
    con.sql(release).fetchall()
    assert [r.epsilon for r in ledger.releases()] == [0.5]


def test_dp_set_budget_on_several_rows_is_checked_whole(con):
    con.sql("FROM dp_set_union_weighted_gaussian('t', epsilon := 0.5, delta := 1e-5)").fetchall()
    with pytest.raises(duckdb.Error, match="scope 'memory.main.t'.*below"):
        con.sql("SELECT dp_set_budget(s, e, 1e-4) FROM (VALUES ('a', 1.0), ('t', 0.25), ('b', 1.0)) x(s, e)").fetchall()
    assert _budgets(dpsql.core.state.ledger_of(con)) == []
    con.sql("SELECT dp_set_budget(s, e, 1e-4) FROM (VALUES ('a', 1.0), ('t', 0.5)) x(s, e)").fetchall()
    assert _budgets(dpsql.core.state.ledger_of(con)) == [("memory.main.a", 1.0, 1e-4), ("memory.main.t", 0.5, 1e-4)]


def test_check_charge_refuses_what_charge_would_and_records_nothing(tmp_path):
    ledger = L.Ledger(str(tmp_path / "events.dpsql-ledger"))
    ledger.set_budget(1.0, 1e-5, "database")
    ledger.set_budget(0.7, 1e-5, str(tmp_path / "a.parquet"))
    scopes = L.ScopeSet([(L.file_scope(tmp_path / "a.parquet"), None), (L.file_scope(tmp_path / "b.parquet"), None)])
    ledger.check_charge("m", "a.parquet", 0.6, 1e-6, scope=scopes)  # fits: nothing recorded
    assert ledger.releases() == []
    ledger.charge("m", "user", "a.parquet", 0.6, 1e-6, scope=scopes)
    with pytest.raises(L.BudgetExceededError, match=r"scope '.*a.parquet' exceeded"):
        ledger.check_charge("m", "a.parquet", 0.2, 1e-6, scope=scopes)
    only_b = L.ScopeSet([(L.file_scope(tmp_path / "b.parquet"), None)])
    ledger.check_charge("m", "b.parquet", 0.2, 1e-6, scope=only_b)  # b has no budget of its own; database fits
    with pytest.raises(L.BudgetExceededError, match="scope 'database' exceeded"):
        ledger.check_charge("m", "b.parquet", 0.5, 1e-6, scope=only_b)
    assert len(ledger.releases()) == 1
    with pytest.raises(L.DPParameterError):
        ledger.check_charge("m", "b.parquet", -1.0, 1e-6, scope=only_b)
