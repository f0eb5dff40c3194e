"""dpsql's exception hierarchy (dpsql.core.errors): each kind of failure raises its own class."""
from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import duckdb
import pytest

import dpsql
import dpsql.core.errors as errors
import dpsql.core.validation
from dpsql.core.ledger import BudgetExceededError, Ledger

RELEASE = "FROM dp_set_union_weighted_gaussian('t', epsilon := {eps}, delta := 1e-5)"


def _table(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE t AS SELECT i % 50 AS user_id, 'x' AS item FROM range(500) r(i)")


# -- the hierarchy ----------------------------------------------------------------------------

def test_every_class_is_a_dpsql_error_and_exported():
    for name in ("ParameterError", "InputError", "BudgetError", "LedgerIOError"):
        cls = getattr(dpsql, name)
        assert cls is getattr(errors, name) and issubclass(cls, dpsql.DpsqlError)
    assert dpsql.DpsqlError is errors.DpsqlError
    assert dpsql.DPParameterError is dpsql.ParameterError is dpsql.core.validation.DPParameterError
    assert issubclass(dpsql.BudgetExceededError, dpsql.BudgetError)


def test_the_kinds_do_not_overlap():
    # A budget or ledger failure is not a bad argument: `except ParameterError` must not catch it.
    assert not issubclass(dpsql.BudgetError, dpsql.ParameterError)
    assert not issubclass(dpsql.LedgerIOError, dpsql.ParameterError)
    assert not issubclass(dpsql.InputError, dpsql.ParameterError)
    assert not issubclass(dpsql.ParameterError, dpsql.InputError)
    # ... and each keeps the built-in meaning callers already catch.
    assert issubclass(dpsql.ParameterError, ValueError) and issubclass(dpsql.InputError, ValueError)
    assert issubclass(dpsql.LedgerIOError, OSError)


@pytest.mark.parametrize("cls", [errors.DpsqlError, errors.ParameterError, errors.InputError, errors.BudgetError,
                                 errors.LedgerIOError, BudgetExceededError])
def test_messages_start_with_dpsql_once(cls):
    assert str(cls("epsilon must be > 0")) == "dpsql: epsilon must be > 0"
    assert str(cls("dpsql: epsilon must be > 0")) == "dpsql: epsilon must be > 0"


# -- ParameterError -----------------------------------------------------------------------------

def test_bad_parameter_is_a_parameter_error_in_python_and_named_in_sql():
    with pytest.raises(dpsql.ParameterError, match="epsilon must be a finite number > 0"):
        Ledger().charge("m", "user", "t", -1.0, 1e-5)
    con = dpsql.connect()
    _table(con)
    with pytest.raises(duckdb.Error, match=r"ParameterError: dpsql: epsilon must be a finite number > 0"):
        con.sql(RELEASE.format(eps=-1.0)).fetchall()
    assert dpsql.releases(con) == []
    con.close()


def test_shell_option_errors_are_parameter_errors(tmp_path):
    from dpsql.frontends import shell

    with pytest.raises(dpsql.ParameterError, match="is a folder"):
        shell._ledger_path(str(tmp_path))
    with pytest.raises(dpsql.ParameterError, match="unknown output mode"):
        shell.render(duckdb.sql("SELECT 1 AS a"), ["a"], "nope", max_rows=10)


# -- InputError ---------------------------------------------------------------------------------

def test_null_user_is_refused_before_the_charge_without_data_values():
    con = dpsql.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 'secret-a'), (NULL, 'secret-b')) v(user_id, item)")
    with pytest.raises(duckdb.Error, match=r"dpsql: column user_id \(user_col\) contains NULL") as info:
        con.sql(RELEASE.format(eps=1.0)).fetchall()
    assert "secret" not in str(info.value)
    assert dpsql.releases(con) == []
    con.close()


def test_null_item_list_in_a_udf_body_is_an_input_error():
    con = dpsql.connect(seed=1)
    with pytest.raises(duckdb.Error, match=r"InputError: dpsql: dp__user_peeling: a user's item list is NULL"):
        con.sql("SELECT dp__user_peeling([[0], NULL]::BIGINT[][], 2, 1, 1.0)").fetchall()
    con.close()


# -- BudgetError --------------------------------------------------------------------------------

def test_budget_exceeded_is_a_budget_error_not_a_parameter_error():
    led = Ledger()
    led.set_budget(1.0, 1e-3)
    led.charge("m", "user", "t", 0.75, 0.0)
    with pytest.raises(dpsql.BudgetError, match="scope 'database' exceeded") as info:
        led.charge("m", "user", "t", 0.5, 0.0)
    assert isinstance(info.value, BudgetExceededError) and not isinstance(info.value, ValueError)
    assert len(led.releases()) == 1


def test_budget_exceeded_through_sql_names_the_class():
    con = dpsql.connect()
    _table(con)
    dpsql.set_budget(con, 1.0, 1e-3)
    con.sql(RELEASE.format(eps=0.75)).fetchall()
    with pytest.raises(duckdb.Error, match=r"BudgetExceededError: dpsql: privacy budget of scope 'database' "
                                           r"exceeded"):
        con.sql(RELEASE.format(eps=0.5)).fetchall()
    assert [r.epsilon for r in dpsql.releases(con)] == [0.75]
    con.close()


# -- LedgerIOError ------------------------------------------------------------------------------

def test_ledger_path_that_is_a_folder_is_a_ledger_io_error(tmp_path):
    led = Ledger(tmp_path)
    with pytest.raises(dpsql.LedgerIOError, match=rf"privacy ledger {re.escape(str(tmp_path))} .*It is a folder"):
        led.set_budget(1.0, 1e-5)
    with pytest.raises(dpsql.LedgerIOError):
        led.releases()


def test_corrupt_ledger_is_a_ledger_io_error_and_nothing_is_released(tmp_path):
    path = tmp_path / "data.duckdb.dpsql-ledger"
    path.write_bytes(b"user_id,item\n" * 400)  # a data file where the ledger should be
    with pytest.raises(dpsql.LedgerIOError, match=r"not a dpsql ledger") as info:
        Ledger(path).releases()
    assert not isinstance(info.value, dpsql.ParameterError)
    con = dpsql.connect(ledger=path)
    _table(con)
    with pytest.raises(duckdb.Error, match=r"LedgerIOError: dpsql: the privacy ledger .*not a dpsql ledger.*nothing "
                                           r"was released or charged"):
        con.sql(RELEASE.format(eps=1.0)).fetchall()
    con.close()
    assert path.read_bytes() == b"user_id,item\n" * 400  # left as it was


def test_missing_folder_is_a_ledger_io_error(tmp_path):
    led = Ledger(tmp_path / "missing-folder" / "x.dpsql-ledger")
    with pytest.raises(dpsql.LedgerIOError, match=r"missing-folder.*Its folder .* does not exist: create it"):
        led.charge("m", "user", "t", 1.0, 1e-5)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="file permissions do not restrict root")
def test_unwritable_ledger_is_a_ledger_io_error(tmp_path):
    path = tmp_path / "l.dpsql-ledger"
    Ledger(path).set_budget(1.0, 1e-5)
    path.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(dpsql.LedgerIOError, match="cannot use the privacy ledger"):
            Ledger(path).charge("m", "user", "t", 0.5, 1e-6)
    finally:
        tmp_path.chmod(0o755)
        path.chmod(0o644)


# -- no bare built-in errors --------------------------------------------------------------------

_BARE = re.compile(r"\braise\s+(ValueError|RuntimeError|Exception)\b")
_PACKAGE = Path(dpsql.__file__).parent
# Modules whose owners still have to move their raises to dpsql.core.errors; strict, so a fixed group
# fails here until its mark is removed.
def _bare_raises() -> list[str]:
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        relative = path.relative_to(_PACKAGE).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _BARE.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_bare_builtin_raises():
    """dpsql raises its own classes (a caller can tell a bad argument from a broken ledger); a pure
    kernel's programmer-error check uses ParameterError too."""
    assert _bare_raises() == []


# -- errors that come back through DuckDB (dpsql.core.errors.from_engine) ------------------------------

def _engine_error(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Error:
    with pytest.raises(duckdb.Error) as info:
        con.sql(sql).fetchall()
    return info.value


@pytest.mark.parametrize("cls", [errors.ParameterError, errors.InputError, errors.BudgetError,
                                 errors.BudgetExceededError, errors.LedgerIOError, errors.DpsqlError])
def test_a_dpsql_exception_raised_in_a_udf_comes_back_as_its_class(cls):
    con = duckdb.connect()

    def boom(x: int) -> int:
        raise cls("refused, see the fix")

    con.create_function("boom", boom, ["BIGINT"], "BIGINT")
    exc = _engine_error(con, "SELECT boom(1)")
    assert f"{cls.__name__}: dpsql: refused" in str(exc)  # what DuckDB makes of it
    mapped = errors.from_engine(exc)
    assert type(mapped) is cls and str(mapped) == "dpsql: refused, see the fix"
    con.close()


def test_the_old_class_name_and_ledger_import_still_map():
    exc = duckdb.InvalidInputException("Invalid Input Error: Python exception occurred while executing the UDF: "
                                       "DPParameterError: dpsql: epsilon must be > 0")
    assert type(errors.from_engine(exc)) is dpsql.ParameterError
    assert BudgetExceededError is errors.BudgetExceededError is dpsql.BudgetExceededError


def test_an_sql_error_with_a_dpsql_message_is_an_input_or_parameter_error():
    con = duckdb.connect()
    data = errors.from_engine(_engine_error(con, "SELECT error('dpsql: column user_id (user_col) contains NULL; "
                                                 "filter NULL users out first')"))
    assert type(data) is dpsql.InputError and str(data).startswith("dpsql: column user_id (user_col) contains NULL")
    param = errors.from_engine(_engine_error(con, "SELECT error('dpsql: order_col := ''x'' needs order_tbl')"))
    assert type(param) is dpsql.ParameterError and str(param) == "dpsql: order_col := 'x' needs order_tbl"
    con.close()


def test_duckdb_refusing_a_non_constant_getvariable_is_a_parameter_error():
    con = duckdb.connect()
    exc = _engine_error(con, "SELECT getvariable(name) FROM (VALUES ('v')) t(name)")
    assert isinstance(exc, duckdb.BinderException)
    mapped = errors.from_engine(exc)
    assert type(mapped) is dpsql.ParameterError and str(mapped) == errors.NOT_CONSTANT
    for words in ("every parameter of a release must be a constant expression", "a literal, a prepared-statement "
                  "parameter or getvariable('name')", "evaluated once", "nothing was read or charged"):
        assert words in str(mapped)
    con.close()


def test_a_non_constant_release_parameter_is_a_parameter_error():
    # The release path refuses it while planning (through a UDF or DuckDB's binder): either way a dpsql error.
    con = dpsql.connect()
    _table(con)
    mapped = errors.from_engine(_engine_error(con, "FROM dp_set_union_weighted_gaussian('t', epsilon := random(), "
                                                   "delta := 1e-5)"))
    assert isinstance(mapped, dpsql.ParameterError)
    assert "constant expression" in str(mapped) and "nothing was read or charged" in str(mapped)
    assert dpsql.releases(con) == []
    con.close()


def test_other_errors_pass_unchanged():
    con = duckdb.connect()

    def other(x: int) -> int:
        raise ZeroDivisionError("dpsql: not one of dpsql's classes")

    con.create_function("other", other, ["BIGINT"], "BIGINT")
    for sql in ("SELECT other(1)", "SELECT * FROM no_such_table", "SELECT error('a message of the user')"):
        exc = _engine_error(con, sql)
        assert errors.from_engine(exc) is exc, sql
    value = ValueError("dpsql: a Python error")
    assert errors.from_engine(value) is value
    con.close()


def test_engine_errors_raises_the_dpsql_class_from_the_duckdb_error():
    con = dpsql.connect()
    _table(con)
    dpsql.set_budget(con, 1.0, 1e-3)
    with pytest.raises(dpsql.BudgetExceededError, match=r"^dpsql: privacy budget of scope 'database' exceeded") \
            as info:
        with errors.engine_errors():
            con.sql(RELEASE.format(eps=1.5)).fetchall()
    assert isinstance(info.value.__cause__, duckdb.Error)
    assert "BudgetExceededError: dpsql:" in str(info.value.__cause__)
    with pytest.raises(duckdb.CatalogException) as unchanged:
        with errors.engine_errors():
            con.sql("FROM no_such_table").fetchall()
    assert unchanged.value.__cause__ is None
    con.close()


def test_engine_errors_hide_a_message_that_quotes_the_data_and_keep_the_others():
    import traceback

    from dpsql.core.errors import InputError, engine_errors

    con = duckdb.connect()
    with pytest.raises(InputError, match=r"\(ConversionException\); DuckDB's own message is not shown") as info:
        with engine_errors():
            con.execute("SELECT 'abc-secret'::INTEGER")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "abc-secret" not in "".join(traceback.format_exception(info.value))
    with pytest.raises(InputError, match=r"\(OutOfRangeException\)") as info:
        with engine_errors():
            con.execute("SELECT 9223372036854775807::BIGINT + 98765")
    assert "98765" not in "".join(traceback.format_exception(info.value))
    # The query's text, not the data: DuckDB's own message stays.
    with pytest.raises(duckdb.CatalogException, match="no_such_table"):
        with engine_errors():
            con.execute("SELECT * FROM no_such_table")
    with engine_errors():  # and nothing happens without an error
        assert con.execute("SELECT 1").fetchall() == [(1,)]
