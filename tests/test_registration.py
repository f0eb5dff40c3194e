"""Registration: packaged SQL files, TEMP-only macros, cursors, re-registration."""
from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.registration import source_of, sql_dir, sql_files

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
    names = {p.name for p in sql_files()}
    assert {"10_calibration.sql", "20_contribution_bounding.sql", "30_set_union.sql", "90_dispatch.sql"} <= names


def test_every_statement_creates_a_temp_macro():
    for path in sql_files():
        text = re.sub(r"--[^\n]*", "", path.read_text(encoding="utf-8"))
        statements = [stmt.query.strip().rstrip(";").strip() for stmt in duckdb.extract_statements(text)]
        assert statements
        for sql in statements:
            assert re.match(r"CREATE OR REPLACE TEMP MACRO \w+\(", sql), (path.name, sql[:80])


def _functions(con):
    rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_name LIKE 'dp%'").fetchall()
    return {r[0] for r in rows}


def test_connect_registers_everything(con):
    assert EXPECTED_MACROS | EXPECTED_UDFS <= _functions(con)


def test_database_file_does_not_depend_on_dpsql(tmp_path):
    path = tmp_path / "events.duckdb"
    con = dpsql.connect(path)
    con.execute("CREATE TABLE user_items AS SELECT i % 10 AS user_id, 'w' || (i % 3) AS item FROM range(100) r(i)")
    con.execute("CREATE TABLE out AS SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 2.0)")
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
        assert ro.execute("SELECT * FROM dp_set_union_weighted_gaussian('t')").fetchall() == [("common",)]
    finally:
        ro.close()
