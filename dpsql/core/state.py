"""Per-connection state, in one place: the noise source and the ledger of each registered connection.

A connection or cursor registered with :func:`dpsql.register` draws its noise from one
:class:`~dpsql.core.noise.NoiseSource` and charges one :class:`~dpsql.core.ledger.Ledger`; cursors share
their connection's. The maps hold connections weakly: a closed, collected connection drops out.
"""
from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from typing import Optional

import duckdb

from dpsql.core.errors import ParameterError
from dpsql.core.ledger import DATABASE_SCOPE, Budget, Ledger, Release, ScopeStatus, resolve_scope
from dpsql.core.noise import NoiseSource
from dpsql.core import ledger_sql
from dpsql.core.scopes import Catalog

__all__ = ["ConnectionState", "attach", "state_of", "source_of", "ledger_of", "current_ledger",
           "set_budget", "budget", "releases"]


@dataclass
class ConnectionState:
    """What dpsql keeps for one registered connection or cursor."""

    source: NoiseSource
    ledger: Ledger


_STATES: "weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, ConnectionState]" = weakref.WeakKeyDictionary()


def attach(con: duckdb.DuckDBPyConnection, source: NoiseSource, ledger: Ledger) -> None:
    """Record (or replace) the noise source and ledger of ``con``."""
    _STATES[con] = ConnectionState(source, ledger)


def state_of(con: duckdb.DuckDBPyConnection) -> ConnectionState:
    try:
        return _STATES[con]
    except (KeyError, TypeError):
        raise ParameterError("this connection is not registered with dpsql; call dpsql.register(con) first "
                             "(or open it with dpsql.connect())") from None


def source_of(con: duckdb.DuckDBPyConnection) -> NoiseSource:
    """The noise source whose draws the connection's UDFs use (for tests and audits)."""
    return state_of(con).source


def ledger_of(con: duckdb.DuckDBPyConnection) -> Ledger:
    """The ledger that ``con``'s releases are charged to."""
    return state_of(con).ledger


def current_ledger(con: duckdb.DuckDBPyConnection) -> Optional[Ledger]:
    """The ledger of ``con`` if it is registered, else None."""
    state = _STATES.get(con)
    return state.ledger if state is not None else None


def set_budget(con: duckdb.DuckDBPyConnection, epsilon: float, delta: float,
               scope: str = DATABASE_SCOPE) -> Budget:
    """Set the total (epsilon, delta) of ``scope`` ('database' or a table name, resolved on ``con``).

    The budget goes where the scope's releases are charged: a table of another DuckDB file attached
    to ``con`` has it in that file's ledger (its sidecar, :func:`dpsql.core.ledger.sidecar_path`); 'database'
    is the connection's own database. A view is refused: a release on a view is charged to the tables
    and files it reads, so a budget on the view would never apply.

    A scope that names no existing table is kept (a budget may precede its table) and said with a
    :class:`UserWarning` naming the scope it is stored under, as ``dpsql budget set`` and
    ``dp_set_budget`` say it.
    """
    ledger = ledger_of(con)
    if resolve_scope(con, scope) == DATABASE_SCOPE:
        return ledger.set_budget(epsilon, delta, DATABASE_SCOPE)
    ((row,),) = con.execute("SELECT dp__catalog(?)", [scope]).fetchall()
    change = ledger_sql.set_scope_budget(ledger, scope, epsilon, delta, Catalog.from_row(row))
    if change.note:
        warnings.warn("dpsql: " + change.note, UserWarning, stacklevel=2)
    assert change.budget is not None  # set (not only checked)
    return change.budget


def budget(con: duckdb.DuckDBPyConnection) -> list[ScopeStatus]:
    """Spent and remaining budget per scope (the rows of ``SELECT * FROM dp_budget()``)."""
    return ledger_of(con).status()


def releases(con: duckdb.DuckDBPyConnection) -> list[Release]:
    """Every charged release, oldest first (the rows of ``SELECT * FROM dp_releases()``)."""
    return ledger_of(con).releases()
