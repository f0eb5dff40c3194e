"""What a Python release function accepts as a table, and the ledger scope each form is charged to.

The SQL macros read a table by name (``tbl``: a table or view name, or a file DuckDB reads by its path).
The Python functions accept those and, for the data people already hold in Python, the object itself:

* a ``str`` (a name or a path) or an ``os.PathLike`` (a file): passed on as it is; the ledger charges
  the base tables and files it reads (:mod:`dpsql.core.scopes`);
* a DuckDB relation made on the same connection (``con.sql(...)``, ``con.table(...)``): a TEMP view
  over its query for the release, so the ledger charges the tables and files the relation reads, as
  for any view (a relation that reads a Python object by its variable name is refused there, as such a
  view is: pass the object itself); a relation of another connection is refused (its names mean other
  tables there);
* a pandas or Polars DataFrame, or an Arrow table, record batch or record batch reader: registered
  (``con.register``) for the release under the name ``dpsql_input`` (``dpsql_input_<parameter>`` for a
  public table such as ``items_tbl``). Its scope is that name, ``temp.main.dpsql_input``: every
  in-memory object passed to a function is charged to that one scope (besides ``database``), which
  charges two different frames to one budget rather than ever letting one frame escape its budget
  under a fresh name. To give a frame a scope of its own, register it yourself
  (``con.register('events', df)``) and pass the name.

The name exists only while the release runs; a table or view already holding it is refused, not
replaced. Errors name the parameter and the type, never the object's contents (a frame's repr shows
its rows).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import Any, Callable, Iterator, Optional, TypeVar

import duckdb
import pyarrow as pa

from dpsql.core.errors import DPParameterError

__all__ = ["accepts_tables", "as_table", "scope_name"]

# The private table's parameter, whatever a function calls it.
_PRIVATE = frozenset({"table", "tbl"})
_ARROW = (pa.Table, pa.RecordBatch, pa.RecordBatchReader)

F = TypeVar("F", bound=Callable[..., Any])


def scope_name(param: str) -> str:
    """The name an in-memory object passed as ``param`` is registered under (its scope ``temp.main.<name>``)."""
    return "dpsql_input" if param in _PRIVATE else f"dpsql_input_{param}"


def _is_frame(obj: object) -> bool:
    """A pandas or Polars DataFrame, without importing either (neither is a core dependency)."""
    kind = type(obj)
    return kind.__name__ == "DataFrame" and kind.__module__.split(".")[0] in ("pandas", "polars")


def _refuse_taken(con: duckdb.DuckDBPyConnection, name: str, param: str) -> None:
    rows = con.execute(
        "SELECT 1 FROM (SELECT table_name AS n FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views()) "
        "WHERE lower(n) = ? LIMIT 1", [name]).fetchall()
    if rows:
        raise DPParameterError(
            f"dpsql: {param} is an in-memory object, which dpsql registers for the release as {name}, but a table "
            f"or view named {name} exists on this connection; drop or rename it, or register the object yourself "
            f"(con.register('<name>', obj)) and pass {param} := '<name>'")


@contextlib.contextmanager
def _registered(con: duckdb.DuckDBPyConnection, obj: object, name: str) -> Iterator[str]:
    con.register(name, obj)
    try:
        yield name
    finally:
        con.unregister(name)


@contextlib.contextmanager
def as_table(con: duckdb.DuckDBPyConnection, obj: object, param: str) -> Iterator[Any]:
    """``obj`` as a table argument of the SQL macros, for the duration of the ``with`` block (see the module
    docstring); anything else is passed on for the function's own check."""
    if obj is None or isinstance(obj, str):
        yield obj
        return
    if isinstance(obj, os.PathLike):
        yield os.fspath(obj)
        return
    name = scope_name(param)
    if isinstance(obj, duckdb.DuckDBPyRelation):
        if getattr(obj, "_con", None) is not con:
            raise DPParameterError(
                f"dpsql: {param} is a DuckDB relation of another connection (or one whose connection dpsql cannot "
                f"see); make it on the connection that runs the release, or materialise it first "
                f"(rel.to_arrow_table()) and pass that")
        _refuse_taken(con, name, param)
        try:
            con.execute(f'CREATE TEMP VIEW "{name}" AS {obj.sql_query()}')
        except duckdb.Error:
            raise DPParameterError(
                f"dpsql: {param} is a DuckDB relation whose query cannot be made a view on this connection; "
                f"pass the data itself (a DataFrame or Arrow table), or materialise the relation "
                f"(rel.to_table('<name>')) and pass that name") from None
        try:
            yield name
        finally:
            con.execute(f'DROP VIEW IF EXISTS temp.main."{name}"')
        return
    if isinstance(obj, _ARROW) or _is_frame(obj):
        _refuse_taken(con, name, param)
        with _registered(con, obj, name) as registered:
            yield registered
        return
    yield obj  # anything else: the function's own check refuses it (by its type, never its contents)


def accepts_tables(*params: str) -> Callable[[F], F]:
    """Let a release function (its first parameter the connection, ``con``) take the data itself (see the module
    docstring) as each of ``params``: in-memory objects are registered for the call and removed after it."""
    def wrap(fn: F) -> F:
        signature = inspect.signature(fn)
        missing = [p for p in params if p not in signature.parameters]
        if missing or "con" not in signature.parameters:
            raise TypeError(f"{fn.__qualname__} has no parameter {', '.join(missing or ['con'])}")

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return fn(*args, **kwargs)  # Python's own message for a wrong call
            con: Optional[duckdb.DuckDBPyConnection] = bound.arguments.get("con")
            with contextlib.ExitStack() as stack:
                for p in params:
                    value = bound.arguments.get(p)
                    if isinstance(con, duckdb.DuckDBPyConnection) and value is not None \
                            and not isinstance(value, str):
                        bound.arguments[p] = stack.enter_context(as_table(con, value, p))
                return fn(*bound.args, **bound.kwargs)
        return run  # type: ignore[return-value]
    return wrap
