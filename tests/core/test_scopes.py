"""Scopes follow the data read: views, CTEs, files, attached databases; broken ledgers; the shell's .output."""
from __future__ import annotations

import io
import os
import shutil
import sqlite3

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.core import scopes
from dpsql.core.ledger import Ledger, sidecar_path
from dpsql.frontends.shell import run_shell

MACRO = "dp_set_union_weighted_gaussian"


def _rows(users: int, salt: str) -> pa.Table:
    return pa.table({"user_id": [f"{salt}{u}" for u in range(users) for _ in range(3)],
                     "item": [f"w{(u + k) % 4}" for u in range(users) for k in range(3)]})


def _load(con: duckdb.DuckDBPyConnection, name: str, users: int = 120, salt: str = "p") -> None:
    data = _rows(users, salt)
    con.execute(f"CREATE TABLE {name} AS SELECT * FROM data")


def _release(con: duckdb.DuckDBPyConnection, tbl: str, epsilon: float = 1.0, prefix: str = "") -> list:
    return con.sql(f"{prefix} SELECT * FROM {MACRO}('{tbl}', epsilon := {epsilon}, delta := 1e-5)").fetchall()


def _charged(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    return dpsql.releases(con)[-1].scopes


def _refused(con: duckdb.DuckDBPyConnection, tbl: str, match: str, prefix: str = "") -> str:
    before = len(dpsql.releases(con))
    with pytest.raises(duckdb.Error, match=match) as caught:
        _release(con, tbl, prefix=prefix)
    assert len(dpsql.releases(con)) == before
    return str(caught.value)


# -- views ---------------------------------------------------------------------------------------------

def test_view_over_a_view_in_another_schema_charges_the_base_table():
    con = dpsql.connect()
    _load(con, "visits")
    con.execute("CREATE SCHEMA reporting")
    con.execute("CREATE VIEW reporting.recent AS SELECT * FROM main.visits WHERE user_id <> 'p7'")
    con.execute("CREATE VIEW headline AS SELECT user_id, item FROM reporting.recent")
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope="visits")
    _release(con, "headline", epsilon=0.75)
    assert _charged(con) == ("memory.main.visits",)
    for name in ("reporting.recent", "headline", "visits"):
        _refused(con, name, "privacy budget of scope 'memory.main.visits' exceeded")
    (row,) = con.sql("SELECT epsilon_spent, releases FROM dp_budget() WHERE scope = 'memory.main.visits'").fetchall()
    assert row == (0.75, 1)
    # a budget on a view would never apply: it is refused, naming the table to budget instead
    with pytest.raises(dpsql.DPParameterError, match=r"scope 'headline' is a view.*memory\.main\.visits"):
        dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope="headline")
    con.close()


def test_view_with_a_non_ascii_name_charges_the_table_it_reads():
    # DuckDB's tokenizer counts bytes: read as characters, the view's text was cut in the wrong place and
    # its query could not be parsed (the release was refused instead of charged to the table)
    con = dpsql.connect()
    _load(con, "visits")
    con.execute('CREATE VIEW "récent_ü" AS SELECT * FROM visits')
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope="visits")
    _release(con, '"récent_ü"', epsilon=0.75)
    assert _charged(con) == ("memory.main.visits",)
    _refused(con, '"récent_ü"', "privacy budget of scope 'memory.main.visits' exceeded")
    con.close()


def test_dbt_style_staging_view_charges_the_raw_table_in_its_database(tmp_path):
    db = tmp_path / "warehouse.duckdb"
    con = dpsql.connect(db)
    con.execute("CREATE SCHEMA raw")
    _load(con, "raw.app_events")
    # dbt's staging model: a view in the model schema over a source, named by dbt as "db"."schema"."name"
    con.execute('CREATE VIEW "warehouse"."main"."stg_app_events" AS SELECT lower(user_id) AS user_id, item '
                'FROM "warehouse"."raw"."app_events" WHERE item IS NOT NULL')
    con.close()
    Ledger(sidecar_path(db)).set_budget(1.0, 1e-4, scope="raw.app_events")
    con = dpsql.connect(db)
    _release(con, '"warehouse"."main"."stg_app_events"', epsilon=0.5)
    _refused(con, "stg_app_events", "scope 'warehouse.raw.app_events' exceeded", prefix="")  # 0.5 + 1.0 > 1.0
    con.close()
    assert [(r.scopes, r.epsilon) for r in Ledger(sidecar_path(db)).releases()] == [
        (("warehouse.raw.app_events",), 0.5)]


def test_view_over_read_parquet_charges_the_file(tmp_path):
    part = tmp_path / "exports"
    part.mkdir()
    pq.write_table(_rows(100, "q"), part / "day1.parquet")
    con = dpsql.connect()
    con.execute(f"CREATE VIEW exported AS SELECT * FROM read_parquet('{part / 'day1.parquet'}')")
    con.execute(f"CREATE VIEW all_days AS FROM read_parquet(['{part / 'day1.parquet'}'])")
    con.execute(f"CREATE VIEW globbed AS FROM read_parquet('{part}/*.parquet')")
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope=str(part / "day1.parquet"))
    _release(con, "exported", epsilon=0.75)
    assert _charged(con) == (os.path.realpath(part / "day1.parquet"),)
    _refused(con, "all_days", "exceeded")
    _refused(con, str(part / "day1.parquet"), "exceeded")
    _release(con, "globbed", epsilon=0.75)  # a glob is its own scope
    assert _charged(con) == (os.path.realpath(part) + "/*.parquet",)
    con.close()


def test_view_joining_two_tables_charges_both():
    con = dpsql.connect()
    _load(con, "accounts", salt="a")
    con.execute("CREATE TABLE purchases AS SELECT user_id, 'sku' || item AS sku FROM accounts")
    con.execute("CREATE VIEW joined AS SELECT a.user_id, p.sku AS item "
                "FROM accounts a JOIN purchases p USING (user_id)")
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope="purchases")
    _release(con, "joined", epsilon=0.5)
    assert _charged(con) == ("memory.main.accounts", "memory.main.purchases")
    (row,) = con.sql("SELECT table_name FROM dp_releases()").fetchall()
    assert row == ("memory.main.accounts, memory.main.purchases",)
    spent = {s: (e, n) for s, e, n in con.sql("SELECT scope, epsilon_spent, releases FROM dp_budget()").fetchall()}
    assert spent == {"database": (0.5, 1), "memory.main.accounts": (0.5, 1), "memory.main.purchases": (0.5, 1)}
    _refused(con, "joined", "scope 'memory.main.purchases' exceeded")  # purchases' budget bounds the join
    _release(con, "accounts", epsilon=2.0)  # accounts has no budget of its own
    con.close()


def test_scalar_macro_that_reads_a_table_charges_it():
    con = dpsql.connect()
    _load(con, "sessions")
    con.execute("CREATE TABLE quotas AS SELECT 'p3' AS user_id")
    con.execute("CREATE MACRO quota_user() AS (SELECT min(user_id) FROM quotas)")
    con.execute("CREATE VIEW capped AS SELECT * FROM sessions WHERE user_id <> quota_user()")
    _release(con, "capped")
    assert _charged(con) == ("memory.main.sessions", "memory.main.quotas")
    con.close()


# -- CTEs of the running statement ---------------------------------------------------------------------

def test_cte_chain_charges_the_table_it_reads():
    con = dpsql.connect()
    _load(con, "clicks")
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope="clicks")
    chain = "WITH first_pass AS (FROM clicks), second_pass AS (FROM first_pass WHERE user_id <> 'p1')"
    _release(con, "second_pass", epsilon=0.75, prefix=chain)
    assert _charged(con) == ("memory.main.clicks",)
    _refused(con, "second_pass", "scope 'memory.main.clicks' exceeded", prefix=chain)
    # inside CREATE TABLE ... AS, too
    with pytest.raises(duckdb.Error, match="scope 'memory.main.clicks' exceeded"):
        con.execute(f"CREATE TABLE released AS {chain} SELECT * FROM {MACRO}('second_pass', epsilon := 0.5, "
                    f"delta := 1e-5)")
    con.close()


def test_cte_shadowing_a_table_charges_what_the_cte_reads():
    con = dpsql.connect()
    _load(con, "salaries", salt="s")
    _load(con, "payments", users=60, salt="x")
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope="salaries")
    shadow = "WITH payments AS (SELECT * FROM salaries)"
    _release(con, "payments", epsilon=0.75, prefix=shadow)
    assert _charged(con) == ("memory.main.salaries",)
    _refused(con, "payments", "scope 'memory.main.salaries' exceeded", prefix=shadow)
    # a CTE the release cannot see (another subquery's) shadows nothing: the table is read and charged
    con.sql(f"SELECT * FROM (WITH payments AS (FROM salaries) SELECT 1) s, {MACRO}('payments', epsilon := 1.0, "
            f"delta := 1e-5)").fetchall()
    assert _charged(con) == ("memory.main.payments",)
    # tbl as a prepared parameter: the macro still sees the CTE
    with pytest.raises(duckdb.Error, match="scope 'memory.main.salaries' exceeded"):
        con.execute(f"{shadow} SELECT * FROM {MACRO}(?, epsilon := 0.5, delta := 1e-5)", ["payments"]).fetchall()
    # a release written in a view does not see the statement's CTEs, and one in the statement does: which
    # one read the name cannot be told from outside, so both are charged
    con.execute(f"CREATE VIEW release_view AS SELECT * FROM {MACRO}('payments', epsilon := 0.5, delta := 1e-5)")
    dpsql.set_budget(con, epsilon=5.0, delta=1e-4, scope="salaries")
    con.sql(f"{shadow} SELECT count(*) FROM release_view, query_table('payments')").fetchall()
    assert _charged(con) == ("memory.main.salaries", "memory.main.payments")
    con.close()


# -- attached databases: the ledger of the database that holds the data ---------------------------------

def _attached_file(tmp_path, name: str = "shop.duckdb", table: str = "orders"):
    db = tmp_path / name
    con = duckdb.connect(str(db))
    data = _rows(120, "o")
    con.execute(f"CREATE TABLE {table} AS SELECT * FROM data")
    con.close()
    return db


def test_attached_database_is_charged_to_its_own_ledger(tmp_path):
    db = _attached_file(tmp_path)
    Ledger(sidecar_path(db)).set_budget(1.0, 1e-4, scope="orders")
    con = dpsql.connect()  # in memory: its own ledger is forgotten at exit
    con.execute(f"ATTACH '{db}' AS sales_archive (READ_ONLY)")
    _release(con, "sales_archive.main.orders", epsilon=0.75)
    assert dpsql.releases(con) == []  # the session's ledger holds none of it
    with pytest.raises(duckdb.Error, match=r"scope 'shop.main.orders' exceeded.*in the ledger .*shop\.duckdb\."
                                           r"dpsql-ledger"):
        _release(con, "sales_archive.orders", epsilon=0.5)
    # a budget set through the session goes to that ledger too
    dpsql.set_budget(con, epsilon=2.0, delta=1e-4, scope="sales_archive.orders")
    _release(con, "sales_archive.orders", epsilon=0.5)
    con.close()
    led = Ledger(sidecar_path(db))
    assert [(r.scopes, r.epsilon) for r in led.releases()] == [(("shop.main.orders",), 0.75),
                                                             (("shop.main.orders",), 0.5)]
    assert [(b.scope, b.epsilon) for b in led.budgets()] == [("shop.main.orders", 2.0)]


def test_attached_through_a_symbolic_link_is_charged_to_the_target_ledger(tmp_path):
    db = _attached_file(tmp_path, "fleet.duckdb", "trips")
    Ledger(sidecar_path(db)).set_budget(1.0, 1e-4, scope="trips")
    os.symlink(db, tmp_path / "copy_of_fleet.duckdb")
    con = dpsql.connect()
    con.execute(f"ATTACH '{tmp_path / 'copy_of_fleet.duckdb'}' AS fleet2 (READ_ONLY)")
    with pytest.raises(duckdb.Error, match=r"scope 'fleet.main.trips' exceeded.*fleet\.duckdb\.dpsql-ledger"):
        _release(con, "fleet2.trips", epsilon=1.5)
    con.close()
    assert not (tmp_path / "copy_of_fleet.duckdb.dpsql-ledger").exists()


def test_release_over_two_databases_is_all_or_nothing(tmp_path):
    db = _attached_file(tmp_path, "crm.duckdb", "contacts")
    con = dpsql.connect(ledger=tmp_path / "session.dpsql-ledger")
    con.execute(f"ATTACH '{db}' AS crm")
    _load(con, "local_tags", salt="o")
    con.execute("CREATE VIEW tagged AS SELECT c.user_id, t.item FROM crm.contacts c JOIN local_tags t USING (user_id)")
    Ledger(sidecar_path(db)).set_budget(0.5, 1e-4)  # the crm database's whole budget
    with pytest.raises(duckdb.Error, match=r"scope 'database' exceeded.*crm\.duckdb\.dpsql-ledger"):
        _release(con, "tagged", epsilon=0.75)
    assert dpsql.releases(con) == [] and Ledger(sidecar_path(db)).releases() == []  # nothing in either
    _release(con, "tagged", epsilon=0.5)
    assert _charged(con) == ("memory.main.local_tags",)
    assert [r.scopes for r in Ledger(sidecar_path(db)).releases()] == [("crm.main.contacts",)]
    con.close()


# -- what cannot be traced is refused -----------------------------------------------------------------

def test_python_objects_unknown_functions_and_macros_are_refused():
    con = dpsql.connect()
    _load(con, "ledger_src")
    in_python = _rows(50, "v")  # noqa: F841 (DuckDB reads it by its name, from the frame that runs the query)
    with pytest.raises(duckdb.Error, match=r"dpsql: tbl 'in_python': it is a Python object.*con\.register.*"
                                           r"temp\.main\.name") as caught:
        con.sql(f"SELECT * FROM {MACRO}('in_python', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert "nothing was released or charged" in str(caught.value) and dpsql.releases(con) == []
    con.execute("CREATE VIEW settings_view AS SELECT name AS user_id, name AS item FROM duckdb_settings()")
    _refused(con, "settings_view", r"table function duckdb_settings\(\).*through view memory\.main\.settings_view")
    con.execute("CREATE MACRO pick() AS TABLE SELECT * FROM ledger_src WHERE user_id <> 'secret-value-41'")
    con.execute("CREATE VIEW via_macro AS FROM pick()")
    message = _refused(con, "via_macro", r"table macro pick\(\)")
    assert "secret-value-41" not in message  # no value of a definition is quoted
    # a registered object is its own scope, the name it was registered under
    con.register("staged", _rows(50, "r"))
    _release(con, "staged")
    assert _charged(con) == ("temp.main.staged",)
    con.close()


def test_unparsable_statement_with_the_name_is_refused():
    catalog = scopes.Catalog(query="PIVOT cohort ON item USING count(*)")
    with pytest.raises(dpsql.DPParameterError, match=r"tbl 'cohort': the running statement cannot be parsed"):
        scopes.trace("cohort", catalog)
    # a name that is no identifier of the statement cannot be one of its CTEs
    names = dpsql.core.ledger.NameContext(relations=frozenset({("memory", "main", "kept")}))
    assert scopes.trace("kept", scopes.Catalog(names, query=catalog.query)) == (scopes.Source("memory.main.kept"),)


# -- broken ledger files are errors, never new ledgers ----------------------------------------------------

def test_truncated_and_foreign_ledger_files_are_errors_and_keep_budgets(tmp_path):
    db = tmp_path / "books.duckdb"
    con = dpsql.connect(db)
    _load(con, "loans")
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4, scope="loans")
    _release(con, "loans", epsilon=0.75)
    con.close()
    path = sidecar_path(db)
    good = path.read_bytes()
    damaged = {
        "truncated": good[: len(good) // 2],
        "not a SQLite file": b"user_id,item\nu1,w1\n" * 20,
        "empty": b"",
    }
    for problem, content in damaged.items():
        path.write_bytes(content)
        con = dpsql.connect(db)
        with pytest.raises(duckdb.Error, match=rf"dpsql: the privacy ledger .*books\.duckdb\.dpsql-ledger is "
                                               rf"{problem}.*restore it.*delete it"):
            _release(con, "loans", epsilon=0.1)
        con.close()
        assert path.read_bytes() == content, problem  # left as it was for the user to restore
    # restored, its budget still holds
    path.write_bytes(good)
    con = dpsql.connect(db)
    _refused(con, "loans", "scope 'books.main.loans' exceeded")
    con.close()


# -- the shell -----------------------------------------------------------------------------------------

def test_shell_refuses_output_to_a_ledger(tmp_path):
    db = tmp_path / "notes.duckdb"
    con = dpsql.connect(db)
    dpsql.set_budget(con, epsilon=1.0, delta=1e-4)
    con.close()
    sidecar = sidecar_path(db)
    before = sidecar.read_bytes()
    custom = tmp_path / "kept.sqlite"
    shutil.copy(sidecar, custom)
    os.symlink(sidecar, tmp_path / "alias.txt")
    os.link(custom, tmp_path / "hard.csv")  # another name of a ledger (not this session's)
    for target, ledger in [(sidecar, None), (str(sidecar).upper(), None), (tmp_path / "alias.txt", None),
                           (tmp_path / "other.dpsql-ledger", None), (custom, str(custom)),
                           (tmp_path / "hard.csv", None)]:
        out, err = io.StringIO(), io.StringIO()
        code = run_shell(str(db), stdin=io.StringIO(f".output '{target}'\nSELECT 42 AS answer;\n"), out=out, err=err,
                         ledger=ledger)
        assert code == 1 and "is a privacy ledger" in err.getvalue() and "results still go to stdout" in err.getvalue()
        assert "42" in out.getvalue(), target  # the output stayed where it was
    assert sidecar.read_bytes() == before and not (tmp_path / "other.dpsql-ledger").exists()
    assert Ledger(sidecar).budgets()[0].epsilon == 1.0
    assert sqlite3.connect(custom).execute("SELECT count(*) FROM budgets").fetchall() == [(1,)]


# -- the macro listing a release skips ---------------------------------------------------------------------

def test_a_table_replaced_by_a_view_since_the_last_charge_is_refused_once_then_traced():
    # A release on a name the last charge saw as a table does not list the macros (the catalog scan);
    # when the name has become a view over other data meanwhile, the charge refuses (nothing charged)
    # rather than tracing the view without them, and the next run lists them and charges the view's data.
    con = dpsql.connect()
    _load(con, "events")
    _load(con, "secret", salt="s")
    _release(con, "events", epsilon=0.25)
    assert _charged(con) == ("memory.main.events",)
    con.execute("CREATE MACRO pick() AS TABLE SELECT * FROM secret")
    con.execute("DROP TABLE events")
    con.execute("CREATE VIEW events AS SELECT * FROM pick()")
    _refused(con, "events", "tbl 'events' reads a view.*nothing was released or charged. Run the statement again")
    _refused(con, "events", "it reads the table macro pick")  # listed now: the view's macro is found
    con.execute("CREATE OR REPLACE VIEW events AS SELECT * FROM secret")
    _release(con, "events", epsilon=0.25)
    assert _charged(con) == ("memory.main.secret",)


@pytest.mark.parametrize("how", ["execute", "sql", "prepared"])
def test_a_cte_named_like_a_charged_table_is_traced_on_the_first_run(how):
    # The statement's text decides too: a CTE of the table's name lists the macros, whichever way the
    # statement reaches DuckDB (a relation binds it once without running it first).
    con = dpsql.connect()
    _load(con, "events")
    _load(con, "secret", salt="s")
    _release(con, "events", epsilon=0.25)
    shadow = "WITH events AS (SELECT * FROM secret)"
    if how == "prepared":
        con.execute(f"{shadow} SELECT * FROM {MACRO}(?, epsilon := 0.25, delta := 1e-5)", ["events"]).fetchall()
    else:
        getattr(con, how)(f"{shadow} SELECT * FROM {MACRO}('events', epsilon := 0.25, delta := 1e-5)").fetchall()
    assert _charged(con) == ("memory.main.secret",)


def test_needs_macros_lists_them_unless_the_name_was_a_table_or_a_file():
    row = {"database": "memory", "schema": "main", "search_path": "",
           "databases": [{"name": "memory", "path": None, "type": "duckdb"}],
           "relations": [{"database": "memory", "schema": "main", "name": n} for n in ("events", "recent")],
           "views": [{"database": "memory", "schema": "main", "name": "recent", "sql": "CREATE VIEW recent AS ..."}],
           "macros": None, "query": ""}
    seen = scopes.Catalog.from_row(row)
    assert not seen.macros_read
    statement = "SELECT * FROM dp_set_union('events', epsilon := 1)"
    at = lambda q: scopes.Catalog.from_row({**row, "query": q})  # noqa: E731
    assert scopes.needs_macros("events", None)  # no charge yet: nothing known
    assert not scopes.needs_macros("events", at(statement))
    assert not scopes.needs_macros("main.events", at(statement))
    assert not scopes.needs_macros("data/x.parquet", at(statement))
    assert scopes.needs_macros("recent", at(statement))  # a view
    assert scopes.needs_macros("unknown", at(statement))  # nothing the catalog knew
    assert scopes.needs_macros("events", at("WITH events AS (FROM recent) " + statement))  # a CTE may bear it
    assert scopes.needs_macros("events", at('WITH "Events" AS (FROM recent) ' + statement))
    assert not scopes.needs_macros("events", at("SELECT 'events' AS x, * FROM dp_set_union('events')"))
    assert scopes.needs_macros("events", at(statement), frozenset({"events"}))  # it needed them before
