"""Registration: packaged SQL files, TEMP-only macros, cursors, re-registration."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.core import sqltext
from dpsql.core.registration import source_of, sql_dir, sql_files

EXPECTED_MACROS = {
    "dp_gaussian_sigma", "dp_gaussian_threshold", "dp_laplace_threshold",
    "dp_set_union_noise_scale", "dp_set_union_threshold",
    "dp_set_union", "dp_set_union_count_laplace", "dp_set_union_count_gaussian",
    "dp_set_union_weighted_laplace", "dp_set_union_weighted_gaussian",
}
EXPECTED_UDFS = {"dp_gaussian_noise", "dp_laplace_noise", "dp_gumbel_noise", "dp_exponential_noise"}


def _package_dir() -> Path:
    return Path(dpsql.__file__).resolve().parent


def test_sql_files_ship_inside_the_installed_package():
    pkg = _package_dir()
    if not (pkg / "sql").is_dir() and (pkg.parent / "pyproject.toml").is_file():
        pytest.skip("dpsql is imported from a source checkout; CI runs this against the installed wheel")
    assert sql_dir() == pkg / "sql"
    names = {p.relative_to(sql_dir()).as_posix() for p in sql_files()}
    assert {"00_core/10_calibration.sql", "00_core/20_contribution_bounding.sql", "30_union/10_basic.sql", "30_union/90_dispatch.sql"} <= names


def test_every_statement_creates_a_temp_macro():
    # Each file is read as CREATE OR REPLACE TEMP MACRO statements and marked bodies (dpsql.core.sqltext
    # refuses anything else); what registration runs, generated headers included, is one TEMP macro each.
    for f in sqltext.files():
        # (00_core/00_release.sql only documents the generated releasing macros, dpsql.core.release.wrapper_sql)
        assert f.macros or f.name == "00_core/00_release.sql"
    statements = [stmt.query.strip() for stmt in duckdb.extract_statements(sqltext.script())]
    assert len(statements) == len(sqltext.macros())
    for sql, name in zip(statements, sqltext.macros()):
        assert sql.startswith(f"CREATE OR REPLACE TEMP MACRO {name}("), sql[:80]


def _functions(con):
    rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_name LIKE 'dp%'").fetchall()
    return {r[0] for r in rows}


def test_connect_registers_everything(con):
    assert EXPECTED_MACROS | EXPECTED_UDFS <= _functions(con)


def test_database_file_does_not_depend_on_dpsql(tmp_path):
    path = tmp_path / "events.duckdb"
    con = dpsql.connect(path)
    con.execute("CREATE TABLE user_items AS SELECT i % 10 AS user_id, 'w' || (i % 3) AS item FROM range(100) r(i)")
    con.execute("CREATE TABLE out AS SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 2.0, delta := 1e-5)")
    con.close()
    plain = duckdb.connect(str(path))
    try:
        assert _functions(plain) == set()  # nothing persisted: the file opens without dpsql
        assert plain.execute("SELECT count(*) FROM user_items").fetchall() == [(100,)]
        assert plain.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'out'").fetchall() == [(1,)]
    finally:
        plain.close()


def test_register_on_an_existing_connection_and_twice():
    con = duckdb.connect()
    try:
        assert dpsql.register(con) is con
        dpsql.register(con)  # idempotent
        assert EXPECTED_MACROS | EXPECTED_UDFS <= _functions(con)
        assert con.execute("SELECT dp_gaussian_threshold(1.0, 1e-5, 100) > 20").fetchall() == [(True,)]
    finally:
        con.close()


def test_cursors_share_udfs_but_need_their_own_macros(con):
    cur = con.cursor()
    try:
        assert cur.execute("SELECT dp_gaussian_noise(1.0) IS NOT NULL").fetchall() == [(True,)]
        with pytest.raises(duckdb.CatalogException):
            cur.execute("SELECT dp_gaussian_threshold(1.0, 1e-5, 10)").fetchall()
        dpsql.register_macros(cur)
        assert cur.execute("SELECT dp_gaussian_threshold(1.0, 1e-5, 10) > 0").fetchall() == [(True,)]
    finally:
        cur.close()


def test_reregistering_with_a_seed_switches_the_source():
    with pytest.warns(UserWarning):
        con = dpsql.connect(seed=5)
    try:
        assert source_of(con).seeded
        dpsql.register(con)
        assert not source_of(con).seeded
    finally:
        con.close()


def test_read_only_connection(tmp_path):
    path = tmp_path / "ro.duckdb"
    c = duckdb.connect(str(path))
    c.execute("CREATE TABLE t AS SELECT i AS user_id, 'common' AS item FROM range(200) r(i)")
    c.close()
    ro = dpsql.connect(path, read_only=True)
    try:
        assert ro.execute("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5)").fetchall() == [("common",)]
    finally:
        ro.close()


def _spend(con, epsilon):
    con.sql(f"FROM dp_set_union_weighted_gaussian('t', epsilon := {epsilon}, delta := 1e-5)").fetchall()


@pytest.fixture
def spent():
    """An in-memory connection whose ledger has a budget of (1, 1e-4) and one release of 0.75."""
    c = dpsql.connect()
    c.execute("CREATE TABLE t AS SELECT i % 100 AS user_id, 'x' AS item FROM range(1000) r(i)")
    dpsql.set_budget(c, epsilon=1.0, delta=1e-4)
    _spend(c, 0.75)
    yield c
    c.close()


def test_reregistering_keeps_the_ledger(spent):
    # A re-run notebook cell calls register again: the spent budget must stay spent.
    ledger = dpsql.core.state.ledger_of(spent)
    dpsql.register(spent)
    with pytest.warns(UserWarning):
        dpsql.register(spent, seed=1)
    dpsql.register(spent, ledger=ledger)  # the same ledger, named explicitly
    assert dpsql.core.state.ledger_of(spent) is ledger
    with pytest.raises(duckdb.Error, match="scope 'database' exceeded"):
        _spend(spent, 0.5)
    assert [(s.scope, s.epsilon_spent, s.releases) for s in dpsql.budget(spent)][0] == ("database", 0.75, 1)


def test_reregistering_with_another_ledger_is_refused_while_it_holds_releases(spent, tmp_path):
    ledger = dpsql.core.state.ledger_of(spent)
    for other in (dpsql.core.ledger.Ledger(), tmp_path / "other.dpsql-ledger"):
        with pytest.raises(dpsql.DPParameterError, match="already charges its releases.*restart its spending"):
            dpsql.register(spent, ledger=other)
    threads = spent.execute("SELECT current_setting('threads')").fetchall()
    with pytest.raises(dpsql.DPParameterError, match="already charges"):
        dpsql.register(spent, seed=2, ledger=dpsql.core.ledger.Ledger())
    assert not source_of(spent).seeded  # a refused registration changed nothing
    assert spent.execute("SELECT current_setting('threads')").fetchall() == threads
    assert dpsql.core.state.ledger_of(spent) is ledger and not (tmp_path / "other.dpsql-ledger").exists()
    _spend(spent, 0.25)  # still charged to the first ledger, whose budget it exhausts
    assert ledger.status()[0].epsilon_spent == pytest.approx(1.0)


def test_an_empty_ledger_may_be_replaced(tmp_path):
    con = dpsql.connect()
    try:
        con.execute("CREATE TABLE t AS SELECT i % 100 AS user_id, 'x' AS item FROM range(1000) r(i)")
        path = tmp_path / "chosen.dpsql-ledger"
        dpsql.register(con, ledger=path)
        dpsql.register(con, ledger=str(path))  # the same file: the same ledger object
        assert dpsql.core.state.ledger_of(con).path == path
        _spend(con, 0.5)
        assert [r.epsilon for r in dpsql.core.ledger.Ledger(path).releases()] == [0.5]
    finally:
        con.close()


def test_a_ledger_that_was_never_written_may_be_replaced(tmp_path):
    # A first ledger in a missing folder fails every charge; registering a usable one must be possible.
    con = dpsql.connect(ledger=tmp_path / "missing" / "x.dpsql-ledger")
    try:
        con.execute("CREATE TABLE t AS SELECT i % 100 AS user_id, 'x' AS item FROM range(1000) r(i)")
        with pytest.raises(duckdb.Error, match="cannot use the privacy ledger"):
            _spend(con, 0.5)
        dpsql.register(con, ledger=tmp_path / "good.dpsql-ledger")
        _spend(con, 0.5)
        assert [r.epsilon for r in dpsql.core.ledger.Ledger(tmp_path / "good.dpsql-ledger").releases()] == [0.5]
        assert not (tmp_path / "missing").exists()
    finally:
        con.close()


# -- cursors and threads (issue: register(con.cursor()) raised "No function by the name ...") --------------

def _table(c):
    c.execute("CREATE TABLE IF NOT EXISTS t AS SELECT i % 100 AS user_id, 'x' AS item FROM range(1000) r(i)")


def test_register_works_on_a_cursor_of_a_registered_connection(con):
    _table(con)
    cur = con.cursor()
    try:
        assert dpsql.register(cur) is cur  # only its macros: the UDFs are the connection's
        assert cur.execute("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5)").fetchall() == [("x",)]
        assert dpsql.core.state.ledger_of(cur) is dpsql.core.state.ledger_of(con)
        assert source_of(cur) is source_of(con)
        dpsql.register(con)  # the parent again, afterwards
        dpsql.register(cur)
        assert cur.execute("SELECT * FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall() == [("x",)]
        assert con.execute("SELECT * FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall() == [("x",)]
        assert [r.mechanism for r in dpsql.releases(con)].count(dpsql.METHODS[dpsql.DEFAULT_METHOD].macro) == 2
    finally:
        cur.close()
    assert con.execute("SELECT * FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall() == [("x",)]  # a closed cursor harms nothing


def test_a_cursor_registered_first_then_its_connection():
    con = duckdb.connect()
    try:
        _table(con)
        cur = con.cursor()
        dpsql.register(cur)
        dpsql.register(con)  # used to raise "No function by the name of 'dp__check_constant'"
        assert con.execute("SELECT * FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall() == [("x",)]
        assert dpsql.core.state.ledger_of(con) is dpsql.core.state.ledger_of(cur)
        assert len(dpsql.releases(cur)) == 1
        cur.close()
        # DuckDB dropped the closed cursor's references to the UDFs; dpsql keeps its own (this crashed)
        assert con.execute("SELECT * FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5)").fetchall() == [("x",)]
        dpsql.register(con)
        assert len(dpsql.releases(con)) == 2
        with pytest.raises(dpsql.DPParameterError, match="seed applies to the whole database"):
            dpsql.register(con, seed=1)  # only the owner could replace the UDFs, and it is closed
    finally:
        con.close()


def test_two_connections_to_one_file_share_the_functions_and_the_ledger(tmp_path):
    path = tmp_path / "two.duckdb"
    a = dpsql.connect(path)
    a.execute("CREATE TABLE t AS SELECT i % 100 AS user_id, 'x' AS item FROM range(1000) r(i)")
    b = dpsql.connect(path)  # the same instance in this process: used to fail with "No function by the name"
    try:
        assert dpsql.core.state.ledger_of(a) is dpsql.core.state.ledger_of(b)
        a.close()  # the owner of the UDFs; b calls them afterwards (this crashed the process)
        assert b.execute("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5)").fetchall() == [("x",)]
        assert [r.epsilon for r in dpsql.releases(b)] == [1.0]
    finally:
        b.close()


def test_a_seed_or_ledger_on_a_cursor_is_refused(con, tmp_path):
    cur = con.cursor()
    try:
        with pytest.raises(dpsql.DPParameterError, match="seed applies to the whole database"):
            dpsql.register(cur, seed=1)
        with pytest.raises(dpsql.DPParameterError, match="ledger applies to the whole database"):
            dpsql.register(cur, ledger=tmp_path / "other.dpsql-ledger")
        dpsql.register(cur, ledger=dpsql.core.state.ledger_of(con))  # the same ledger is fine
        assert not source_of(con).seeded and not (tmp_path / "other.dpsql-ledger").exists()
    finally:
        cur.close()


def test_reregistering_the_owner_with_a_seed_reaches_its_cursors():
    con = dpsql.connect()
    cur = con.cursor()
    try:
        dpsql.register(cur)
        with pytest.warns(UserWarning):
            dpsql.register(con, seed=3)
        assert source_of(cur) is source_of(con) and source_of(cur).seeded
    finally:
        cur.close()
        con.close()


def test_a_cursor_per_thread_charges_the_one_ledger(con):
    import threading

    _table(con)
    dpsql.set_budget(con, epsilon=3.0, delta=1e-3)
    results, errors = [], []

    def work():
        cur = con.cursor()
        try:
            dpsql.register(cur)
            results.append(cur.execute("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5)").fetchall())
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            cur.close()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    # budget 3: three releases of epsilon 1 pass, the fourth is refused by the shared ledger
    assert len(results) == 3 and all(r == [("x",)] for r in results)
    assert len(errors) == 1 and "exceeded" in str(errors[0])
    assert dpsql.budget(con)[0].epsilon_spent == pytest.approx(3.0)


def test_closed_in_memory_databases_leave_no_registration_behind():
    """A registration holds its database's UDFs, noise source and ledger: once every connection of that
    database is gone, registering the next one forgets it (in-memory connections skip the catalog lookup
    that used to do it)."""
    import gc

    from dpsql.core import registration

    gc.collect()
    before = len(registration._REGISTRATIONS)
    for _ in range(5):
        dpsql.connect().close()
    gc.collect()
    last = dpsql.connect()
    try:
        assert len(registration._REGISTRATIONS) <= before + 1
    finally:
        last.close()
