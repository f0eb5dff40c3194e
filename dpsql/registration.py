"""Registering dpsql on a DuckDB connection: Python UDFs first, then TEMP macros.

Python cannot define DuckDB table functions, so every mechanism is a
``CREATE TEMP MACRO ... AS TABLE`` (text in the package's ``sql/*.sql``) that
calls the scalar UDFs registered here. Macros are TEMP so that a database file
never depends on dpsql to open; TEMP objects belong to one connection, so a
cursor needs :func:`register_macros` again (UDFs are shared with cursors).
"""
from __future__ import annotations

import os
import weakref
from importlib import resources
from pathlib import Path
from typing import Callable, Optional, Union

import duckdb
import duckdb.func
from duckdb.sqltypes import BOOLEAN, DOUBLE

from dpsql import adaptive, calibration, ledger as ledger_mod, noise, union
from dpsql import topk
from dpsql import pws
from dpsql import policy
from dpsql import optimize, subsampling
from dpsql import release
from dpsql.udf import Udf, scalar

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


def _calibration_udfs(source: noise.NoiseSource) -> list[Udf]:
    """SQL access to the shared calibration formulas (dp_gaussian_sigma & co. wrap these)."""

    def gaussian_threshold(epsilon, delta, max_items):
        return calibration.weighted_gaussian_calibration(epsilon, delta, max_items).threshold

    def laplace_threshold(epsilon, delta, max_items):
        return calibration.weighted_laplace_calibration(epsilon, delta, max_items).threshold

    return [
        Udf("dp__gaussian_sigma", scalar(calibration.gaussian_sigma), (DOUBLE, DOUBLE, DOUBLE), DOUBLE),
        Udf("dp__gaussian_threshold", scalar(gaussian_threshold), (DOUBLE, DOUBLE, DOUBLE), DOUBLE),
        Udf("dp__laplace_threshold", scalar(laplace_threshold), (DOUBLE, DOUBLE, DOUBLE), DOUBLE),
        # granular noise (dpsql.calibration, "Granular noise"); NULL granularity = the default grid
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


# Every family's UDF declarations, in registration order. A new mechanism family adds its
# module's ``udfs`` here and its macros as sql/NN_family.sql.
UDF_PROVIDERS: tuple[Callable[[noise.NoiseSource], list[Udf]], ...] = (
    release.udfs,
    _calibration_udfs,
    noise.udfs,
    union.udfs,
    adaptive.udfs,
    topk.udfs,
    pws.udfs,
    policy.udfs,
    subsampling.udfs,
    optimize.udfs,
)


def _registered_udfs(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                       "WHERE function_name LIKE 'dp%' AND function_type = 'scalar'").fetchall()
    return {r[0] for r in rows}


def register_functions(con: duckdb.DuckDBPyConnection, source: noise.NoiseSource,
                       ledger: Union[None, str, os.PathLike, ledger_mod.Ledger] = None) -> None:
    """Register every family's UDFs on ``con``, their randomness drawn from ``source``.

    ``ledger`` receives the charges of every release (see :func:`dpsql.ledger.ledger_for`: a
    connection registered again keeps its ledger). Releases are marked seeded when ``source`` is.
    """
    ledger = ledger_mod.ledger_for(con, ledger)  # before any change: a refused ledger changes nothing
    existing = _registered_udfs(con)
    declared = [udf for provider in UDF_PROVIDERS for udf in provider(source)] + \
        ledger_mod.udfs(ledger, seeded=source.seeded)
    for udf in declared:
        if udf.name in existing:  # re-registering (e.g. with another seed) replaces the UDF
            con.remove_function(udf.name)
        # SPECIAL null handling: the UDF sees NULL parameters and rejects them by name.
        con.create_function(udf.name, udf.fn, list(udf.params), udf.returns, type=duckdb.func.ARROW,
                            null_handling=duckdb.func.SPECIAL, side_effects=udf.side_effects)
    _SOURCES[con] = source
    ledger_mod.attach(con, ledger)


def register_macros(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create every TEMP macro on ``con``; needed once per connection and per cursor."""
    for path in sql_files():
        con.execute(path.read_text(encoding="utf-8"))


def register(con: duckdb.DuckDBPyConnection, *, seed: Optional[int] = None,
             ledger: Union[None, str, os.PathLike, ledger_mod.Ledger] = None) -> duckdb.DuckDBPyConnection:
    """Register every dpsql UDF and TEMP macro on an existing connection.

    ``ledger``: where releases are charged; default the sidecar file
    ``<database file>.dpsql-ledger``, or an in-memory ledger for an in-memory
    database; a path or a :class:`dpsql.ledger.Ledger` overrides it. Registering
    again keeps the connection's ledger (a spent budget stays spent); another
    ledger is refused while the current one holds releases or budgets.

    ``seed`` makes noise and sampling reproducible and the results **NOT
    PRIVATE** (a warning is issued); it also pins the connection to one
    thread, since the order in which DuckDB hands rows to the noise UDF
    otherwise varies between runs.
    """
    # The ledger first: a refused ledger leaves the connection (source, threads) as it was.
    ledger = ledger_mod.ledger_for(con, ledger)
    if seed is None:
        source = noise.secure_source()
    else:
        source = noise.seeded_source(seed)
        con.execute("SET threads = 1")
    register_functions(con, source, ledger)
    register_macros(con)
    return con


def connect(database: str = ":memory:", *, read_only: bool = False, config: Optional[dict] = None,
            seed: Optional[int] = None,
            ledger: Union[None, str, os.PathLike, ledger_mod.Ledger] = None) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(...)`` with dpsql registered (see :func:`register` for ``seed`` and ``ledger``)."""
    con = duckdb.connect(os.fspath(database), read_only=read_only, config=config or {})
    return register(con, seed=seed, ledger=ledger)


def source_of(con: duckdb.DuckDBPyConnection) -> noise.NoiseSource:
    """The noise source whose draws the connection's UDFs use (for tests and audits)."""
    return _SOURCES[con]
