"""Registering dpsql on a DuckDB connection: Python UDFs first, then TEMP macros.

Python cannot define DuckDB table functions, so every mechanism is a
``CREATE TEMP MACRO ... AS TABLE`` (text in the package's ``sql/*.sql``) that
calls the scalar UDFs registered here. Macros are TEMP so that a database file
never depends on dpsql to open; TEMP objects belong to one connection, so a
cursor needs :func:`register_macros` again (UDFs are shared with cursors).
"""
from __future__ import annotations

import inspect
import os
import weakref
from importlib import resources
from pathlib import Path
from typing import Optional

import duckdb
import duckdb.func
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR

from dpsql import calibration, noise, union
from dpsql.validation import DPParameterError

__all__ = ["connect", "register", "register_macros", "sql_dir", "sql_files", "source_of"]

# Connection -> noise source, so tests and audits can inspect what a connection draws.
_SOURCES: "weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, noise.NoiseSource]" = weakref.WeakKeyDictionary()


def sql_dir() -> Path:
    """Folder of the macro files: ``dpsql/sql`` inside an installed package.

    A source checkout keeps them at the repository root (``sql/``); that
    location is used only when the package folder has none.
    """
    packaged = Path(str(resources.files("dpsql"))) / "sql"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "sql"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("dpsql's SQL macro files are missing from the installation (dpsql/sql/*.sql)")


def sql_files() -> list[Path]:
    """The macro files in load order (file names sort in dependency order)."""
    return sorted(sql_dir().glob("*.sql"))


def _scalar(fn):
    """Wrap a Python function of scalars as an Arrow UDF body (one call per vector)."""

    def udf(*arrays: pa.Array) -> pa.Array:
        rows = zip(*(a.to_pylist() for a in arrays))
        return pa.array([fn(*row) for row in rows])

    udf.__name__ = fn.__name__
    udf.__signature__ = inspect.signature(fn)  # DuckDB checks the arity against the parameter types
    return udf


def _gaussian_threshold(epsilon, delta, max_items):
    return calibration.weighted_gaussian_calibration(epsilon, delta, max_items).threshold


def _laplace_threshold(epsilon, delta, max_items):
    return calibration.weighted_laplace_calibration(epsilon, delta, max_items).threshold


def _set_union_calibration(method, epsilon, delta, max_items, user_col, item_col):
    _check_columns(user_col, item_col)
    cal = union.calibrate(method, epsilon, delta, max_items)
    return {"scale": cal.scale, "threshold": cal.threshold}


def _set_union_scale(method, epsilon, delta, max_items):
    return union.calibrate(method, epsilon, delta, max_items).scale


def _set_union_threshold(method, epsilon, delta, max_items):
    return union.calibrate(method, epsilon, delta, max_items).threshold


def _check_method(method):
    union.check_method(method)
    return True


def _method_is(method, candidate):
    return union.check_method(method) == candidate


def _check_columns(user_col, item_col):
    for name, value in (("user_col", user_col), ("item_col", item_col)):
        if value is None or not str(value).strip():
            raise DPParameterError(f"{name} must name a column (got {value!r})")
    if user_col.lower() == item_col.lower():
        raise DPParameterError("user_col and item_col must name two different columns")
    return True


_CALIBRATION = duckdb.struct_type({"scale": DOUBLE, "threshold": DOUBLE})

# name -> (python function, parameter types, return type). All are pure, so
# DuckDB may constant-fold them: with constant arguments they run once, while
# the query is planned, and a bad parameter fails before any row is read.
_CALIBRATION_UDFS = {
    "dp__gaussian_sigma": (calibration.gaussian_sigma, [DOUBLE, DOUBLE, DOUBLE], DOUBLE),
    "dp__gaussian_threshold": (_gaussian_threshold, [DOUBLE, DOUBLE, DOUBLE], DOUBLE),
    "dp__laplace_threshold": (_laplace_threshold, [DOUBLE, DOUBLE, DOUBLE], DOUBLE),
    "dp__set_union_scale": (_set_union_scale, [VARCHAR, DOUBLE, DOUBLE, DOUBLE], DOUBLE),
    "dp__set_union_threshold": (_set_union_threshold, [VARCHAR, DOUBLE, DOUBLE, DOUBLE], DOUBLE),
    "dp__method_is": (_method_is, [VARCHAR, VARCHAR], BOOLEAN),
    "dp__check_method": (_check_method, [VARCHAR], BOOLEAN),
    "dp__set_union_calibration": (_set_union_calibration, [VARCHAR, DOUBLE, DOUBLE, DOUBLE, VARCHAR, VARCHAR],
                                  _CALIBRATION),
}


def _registered_udfs(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                       "WHERE function_name LIKE 'dp%' AND function_type = 'scalar'").fetchall()
    return {r[0] for r in rows}


def _create(con, existing, name, fn, params, ret, *, side_effects=False) -> None:
    if name in existing:  # re-registering (e.g. with another seed) replaces the UDF
        con.remove_function(name)
    # SPECIAL null handling: the UDF sees NULL parameters and rejects them by name.
    con.create_function(name, fn, params, ret, type=duckdb.func.ARROW,
                        null_handling=duckdb.func.SPECIAL, side_effects=side_effects)


def register_functions(con: duckdb.DuckDBPyConnection, source: noise.NoiseSource) -> None:
    """Register the calibration, validation, noise and salt UDFs (noise drawn from ``source``)."""
    existing = _registered_udfs(con)
    for name, (fn, params, ret) in _CALIBRATION_UDFS.items():
        _create(con, existing, name, _scalar(fn), params, ret)
    for name, fn in noise.arrow_udfs(source).items():
        _create(con, existing, name, fn, [DOUBLE], DOUBLE, side_effects=True)

    def secret_salt() -> pa.Array:
        return pa.array([source.salt()], type=pa.int64())

    _create(con, existing, "dp__secret_salt", secret_salt, [], BIGINT, side_effects=True)
    _SOURCES[con] = source


def register_macros(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create every TEMP macro on ``con``; needed once per connection and per cursor."""
    for path in sql_files():
        con.execute(path.read_text(encoding="utf-8"))


def register(con: duckdb.DuckDBPyConnection, *, seed: Optional[int] = None) -> duckdb.DuckDBPyConnection:
    """Register every dpsql UDF and TEMP macro on an existing connection.

    ``seed`` makes noise and sampling reproducible and the results **NOT
    PRIVATE** (a warning is issued); it also pins the connection to one
    thread, since the order in which DuckDB hands rows to the noise UDF
    otherwise varies between runs.
    """
    if seed is None:
        source = noise.secure_source()
    else:
        source = noise.seeded_source(seed)
        con.execute("SET threads = 1")
    register_functions(con, source)
    register_macros(con)
    return con


def connect(database: str = ":memory:", *, read_only: bool = False, config: Optional[dict] = None,
            seed: Optional[int] = None) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(...)`` with dpsql registered (see :func:`register` for ``seed``)."""
    con = duckdb.connect(os.fspath(database), read_only=read_only, config=config or {})
    return register(con, seed=seed)


def source_of(con: duckdb.DuckDBPyConnection) -> noise.NoiseSource:
    """The noise source whose draws the connection's UDFs use (for tests and audits)."""
    return _SOURCES[con]
