"""Registering dpsql on a DuckDB connection: Python UDFs first, then TEMP macros.

Python cannot define DuckDB table functions, so every mechanism is a
``CREATE TEMP MACRO ... AS TABLE`` (text in the package's ``sql/*.sql``, read by
:mod:`dpsql.core.sqltext`) that calls the scalar UDFs registered here. Macros are
TEMP so that a database file never depends on dpsql to open.

DuckDB facts this module works with (DuckDB 2.0): Python UDFs belong to the
database instance, so every cursor (and every other connection to the same
file in this process) sees them, but only the connection object that created
a UDF can remove or replace it, and closing that connection drops its
reference to the Python function while the catalog entry stays (calling it
then crashed the process). TEMP macros belong to one connection or cursor.
Hence :func:`register` creates the UDFs once per database instance, on the
first connection registered, keeps its own references to them while any
registered connection or cursor of the instance lives, and creates only the
macros on every further connection or cursor, which share the first one's
noise source and ledger.
"""
from __future__ import annotations

import os
import secrets
import threading
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Optional, Union

import duckdb
import duckdb.func
from duckdb.sqltypes import BOOLEAN, DOUBLE, VARCHAR

from dpsql.core import calibration, ledger as ledger_mod, registry as mechanisms, noise
from dpsql.core import keys, ledger_sql, progress, release, sqltext, state
from dpsql.core.sqltext import sql_dir, sql_files
from dpsql.core.state import source_of
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import DPParameterError

__all__ = ["connect", "register", "register_macros", "sql_dir", "sql_files", "source_of"]

@dataclass
class _Registration:
    """dpsql's UDFs on one database instance: the connection that owns them, their source and ledger."""

    owner: "weakref.ref[duckdb.DuckDBPyConnection]"
    source: noise.NoiseSource
    ledger: ledger_mod.Ledger
    members: "weakref.WeakSet[duckdb.DuckDBPyConnection]" = field(default_factory=weakref.WeakSet)
    # The Python functions behind the catalog's UDFs: held here so that closing the owner (e.g. a
    # cursor registered first) cannot free a function that other connections still call.
    functions: list = field(default_factory=list)


# Token -> registration. The token is part of a UDF's name (dp__registration_<token>), so any
# connection finds its instance's registration in the catalog without calling a UDF (which would
# crash if its owner was closed).
_REGISTRATIONS: dict[str, _Registration] = {}
_TOKEN_PREFIX = "dp__registration_"


def _forget_closed() -> None:
    """Drop the registrations none of whose connections is alive any more (they belong to closed databases)."""
    for token in [t for t, r in _REGISTRATIONS.items() if not len(r.members)]:
        del _REGISTRATIONS[token]


def _instance_registration(con: duckdb.DuckDBPyConnection) -> Optional[tuple[str, _Registration]]:
    _forget_closed()
    rows = con.execute("SELECT function_name FROM duckdb_functions() WHERE starts_with(function_name, $1)",
                       [_TOKEN_PREFIX]).fetchall()
    for (name,) in rows:
        token = name[len(_TOKEN_PREFIX):]
        if token in _REGISTRATIONS:
            return token, _REGISTRATIONS[token]
    return None


def _calibration_udfs(source: noise.NoiseSource) -> list[Udf]:
    """SQL access to the shared calibration formulas (dp_gaussian_sigma & co. wrap these)."""

    return [
        Udf("dp__gaussian_sigma", scalar(calibration.gaussian_sigma), (DOUBLE, DOUBLE, DOUBLE), DOUBLE),
        # granular noise (dpsql.core.calibration, "Granular noise"); NULL granularity = the default grid
        Udf("dp__granularity", scalar(calibration.choose_granularity), (DOUBLE, DOUBLE, DOUBLE), DOUBLE),
        Udf("dp__rounded_sensitivity", scalar(calibration.rounded_sensitivity), (DOUBLE, DOUBLE, DOUBLE, BOOLEAN),
            DOUBLE),
        Udf("dp__discrete_laplace_scale", scalar(calibration.discrete_laplace_scale),
            (DOUBLE, DOUBLE, DOUBLE, DOUBLE, BOOLEAN), DOUBLE),
        Udf("dp__discrete_laplace_threshold", scalar(calibration.discrete_laplace_threshold),
            (DOUBLE, DOUBLE, DOUBLE, DOUBLE), DOUBLE),
        Udf("dp__discrete_gaussian_sigma", scalar(calibration.discrete_gaussian_sigma),
            (DOUBLE, DOUBLE, DOUBLE, DOUBLE, BOOLEAN), DOUBLE),
        Udf("dp__discrete_gaussian_delta", scalar(calibration.discrete_gaussian_delta),
            (DOUBLE, DOUBLE, DOUBLE, DOUBLE, BOOLEAN), DOUBLE),
    ]


def udf_providers() -> tuple[Callable[[noise.NoiseSource], list[Udf]], ...]:
    """Every UDF declaration, in registration order: the shared machinery first, then each registered
    family's ``udfs`` (:func:`dpsql.core.registry.udf_providers`: found with the family's declarations,
    so a new family needs no edit here; its macros go in its own SQL file)."""
    shared: tuple[Callable[[noise.NoiseSource], list[Udf]], ...] = (
        lambda source: release.udfs(mechanisms.all_mechanisms),
        keys.udfs,
        _calibration_udfs,
        noise.udfs,
        progress.udfs,
    )
    return shared + mechanisms.udf_providers()


def _registered_udfs(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                       "WHERE function_name LIKE 'dp%' AND function_type = 'scalar'").fetchall()
    return {r[0] for r in rows}


def register_functions(con: duckdb.DuckDBPyConnection, source: noise.NoiseSource,
                       ledger: Union[None, str, os.PathLike, ledger_mod.Ledger] = None, *,
                       _new_instance: bool = False) -> None:
    """Register every family's UDFs on ``con``, their randomness drawn from ``source``.

    ``ledger`` receives the charges of every release (see :func:`dpsql.core.ledger.ledger_for`: a
    connection registered again keeps its ledger). Releases are marked seeded when ``source`` is.
    ``_new_instance``: ``con`` is the only connection of a database instance just opened (no UDF and no
    registration to look up: each lookup scans DuckDB's whole function list).
    """
    ledger = ledger_mod.ledger_for(con, ledger, state.current_ledger(con))  # before any change: a refused ledger changes nothing
    existing = set() if _new_instance else _registered_udfs(con)
    declared = [udf for provider in udf_providers() for udf in provider(source)] + \
        ledger_sql.udfs(ledger, seeded=source.seeded)
    for udf in declared:
        if udf.name in existing:  # re-registering (e.g. with another seed) replaces the UDF
            con.remove_function(udf.name)
        # SPECIAL null handling: the UDF sees NULL parameters and rejects them by name.
        con.create_function(udf.name, udf.fn, list(udf.params), udf.returns, type=duckdb.func.ARROW,
                            null_handling=duckdb.func.SPECIAL, side_effects=udf.side_effects)
    if _new_instance:
        _forget_closed()  # the lookup below, which also does it, is skipped
    found = None if _new_instance else _instance_registration(con)
    if found is None:
        token = secrets.token_hex(8)

        def token_fn():
            return token

        con.create_function(_TOKEN_PREFIX + token, token_fn, [], VARCHAR)
        registration = _REGISTRATIONS[token] = _Registration(weakref.ref(con), source, ledger)
        registration.functions.append(token_fn)
    else:
        registration = found[1]
        registration.source, registration.ledger = source, ledger
        del registration.functions[1:]  # the owner just replaced them in the catalog
    registration.functions.extend(udf.fn for udf in declared)
    registration.members.add(con)
    for member in list(registration.members):  # cursors see the replaced UDFs: keep their view in step
        state.attach(member, source, ledger)


def register_macros(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create every TEMP macro on ``con``; needed once per connection and per cursor.

    The files hold the shared stages and each mechanism's body, whose header is generated from its
    declaration (:func:`dpsql.core.sqltext.script`, in the files' order); the releasing macros are
    generated from the declarations afterwards (:func:`dpsql.core.release.wrappers_sql`), then the
    what the families generate beyond them, e.g. the
    dispatchers that call them (a macro binds against the macros that exist when it is created).
    """
    for statement in _statements(sqltext.script(), release.wrappers_sql(mechanisms.all_mechanisms()),
                                 *mechanisms.generated_sql()):
        con.execute(statement)


_PARSING = threading.Lock()


def _statements(*texts: str) -> tuple[duckdb.Statement, ...]:
    """The statements of ``texts``, parsed once per process (keyed by the text, which follows the registry):
    a connection then only creates the macros. Parsed on a private connection (not the module's default
    one, which is the user's), one thread at a time (dbt registers cursors from several threads)."""
    with _PARSING:
        return _parse(texts)


@lru_cache(maxsize=4)
def _parse(texts: tuple[str, ...]) -> tuple[duckdb.Statement, ...]:
    parser = duckdb.connect()
    try:
        return tuple(s for text in texts for s in parser.extract_statements(text))
    finally:
        parser.close()


def register(con: duckdb.DuckDBPyConnection, *, seed: Optional[int] = None,
             ledger: Union[None, str, os.PathLike, ledger_mod.Ledger] = None) -> duckdb.DuckDBPyConnection:
    """Register every dpsql UDF and TEMP macro on an existing connection or cursor.

    Connections, cursors and threads: register the connection you opened
    first (``dpsql.connect`` does). Its cursors share its UDFs, noise source
    and ledger, but DuckDB's TEMP macros belong to one cursor, so call
    ``dpsql.register(cursor)`` on each cursor before using dpsql there (it
    only creates the cursor's macros). A DuckDB connection must not be used by
    two threads at once: give each thread its own ``con.cursor()`` and
    register it; the threads then charge the one ledger (atomically) and draw
    from the one noise source. ``seed`` and ``ledger`` apply to the whole
    database instance (every cursor, and every connection of this process to
    the same file); only the connection or cursor registered first may change
    them, and a cursor given another seed or ledger is refused.

    ``ledger``: where releases are charged; default the sidecar file
    ``<database file>.dpsql-ledger``, or an in-memory ledger for an in-memory
    database; a path or a :class:`dpsql.core.ledger.Ledger` overrides it. Registering
    again keeps the connection's ledger (a spent budget stays spent); another
    ledger is refused while the current one holds releases or budgets.

    ``seed`` makes noise and sampling reproducible and the results **NOT
    PRIVATE** (a warning is issued); it also pins the connection to one
    thread, since the order in which DuckDB hands rows to the noise UDF
    otherwise varies between runs.
    """
    return _register(con, seed=seed, ledger=ledger, new_instance=False)


def _register(con: duckdb.DuckDBPyConnection, *, seed: Optional[int],
              ledger: Union[None, str, os.PathLike, ledger_mod.Ledger],
              new_instance: bool) -> duckdb.DuckDBPyConnection:
    found = None if new_instance else _instance_registration(con)
    if found is not None and found[1].owner() is not con:
        return _register_member(con, found[1], seed=seed, ledger=ledger)
    # The ledger first: a refused ledger leaves the connection (source, threads) as it was.
    ledger = ledger_mod.ledger_for(con, ledger, state.current_ledger(con))
    if seed is None:
        source = noise.secure_source()
    else:
        source = noise.seeded_source(seed)
        con.execute("SET threads = 1")
    register_functions(con, source, ledger, _new_instance=new_instance)
    register_macros(con)
    return con


def _register_member(con: duckdb.DuckDBPyConnection, registration: _Registration, *, seed: Optional[int],
                     ledger: Union[None, str, os.PathLike, ledger_mod.Ledger]) -> duckdb.DuckDBPyConnection:
    """Register a cursor (or another connection to the same instance): its macros, the owner's UDFs."""
    if seed is not None:
        raise DPParameterError(
            "dpsql: seed applies to the whole database: this connection shares the functions of the connection "
            "registered first (cursors share their connection's noise source); call dpsql.register(that "
            "connection, seed=...) instead, or open a separate database for a seeded run")
    if ledger is not None:
        current = registration.ledger
        same = ledger is current if isinstance(ledger, ledger_mod.Ledger) else (
            current.path is not None and os.path.realpath(current.path) == os.path.realpath(os.fspath(ledger)))
        if not same:
            raise DPParameterError(
                f"dpsql: ledger applies to the whole database: this connection shares the ledger of the "
                f"connection registered first ({current!r}); register without ledger=, or register that "
                f"connection with the new ledger")
    registration.members.add(con)
    state.attach(con, registration.source, registration.ledger)
    register_macros(con)
    return con


def connect(database: str = ":memory:", *, read_only: bool = False, config: Optional[dict] = None,
            seed: Optional[int] = None,
            ledger: Union[None, str, os.PathLike, ledger_mod.Ledger] = None) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(...)`` with dpsql registered (see :func:`register` for ``seed`` and ``ledger``)."""
    path = os.fspath(database)
    con = duckdb.connect(path, read_only=read_only, config=config or {})
    # An unnamed in-memory database is a new instance whose only connection is this one; a file (or a
    # named in-memory database) may be an instance this process has open already.
    return _register(con, seed=seed, ledger=ledger, new_instance=path in (":memory:", ""))

