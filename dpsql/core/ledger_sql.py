"""SQL access to the ledger: the charge every release makes, the readers behind ``dp_budget()``
and ``dp_releases()``, and ``dp_set_budget()`` / ``dp_remove_budget()`` (sql/00_core/05_ledger.sql).

The charge ties two rooms together: :mod:`dpsql.core.scopes` traces the release's table argument to the
base tables and files it reads, and :mod:`dpsql.core.ledger` checks and records the release against every
budget that applies. Both are imported here, so that neither imports the other's user.

Setting a budget from SQL. ``dp_set_budget(scope, epsilon, delta)`` resolves ``scope`` on the connection
(as a release names its table), keeps the budget in the ledger the scope's releases are charged to (the
connection's, or an ATTACHed database file's sidecar), refuses a view and a budget below the scope's
spending (:meth:`Ledger.set_budget`), and returns the scope's status with a ``note`` when the scope names
no existing table or file (a budget may precede its table, so that is said, not refused). A statement
either changes budgets or makes releases, never both: a budget changed inside a release's query (say, by
a view that the release reads) would silently lift the limit the release is checked against, and the
order of the two inside one statement is DuckDB's to choose. So ``dp_set_budget`` must be called in the
statement's own text (not hidden in a view, a macro or a prepared ``EXECUTE``), is refused in a statement
that names a releasing macro, and a release is refused in a statement that names ``dp_set_budget``. The
ledger is not part of DuckDB's transactions: a ROLLBACK does not undo a budget set (nor a charge).
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any, Mapping, Optional

import duckdb
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR, DuckDBPyType

from dpsql.core import sqltext
from dpsql.core.errors import ParameterError
from dpsql.core.ledger import (DATABASE_SCOPE, Budget, Ledger, ScopeSet, ScopeStatus, scope_key, sidecar_path,
                               split_name)
from dpsql.core.scopes import Catalog, MacrosUnread, locate, needs_macros, trace
from dpsql.core.udf import Udf, scalar

__all__ = ["udfs", "BudgetChange", "budget_home", "set_scope_budget", "remove_scope_budget"]

# The SQL names that change a budget (the macros and the UDFs behind them).
_SETTERS = frozenset({"dp_set_budget", "dp__set_budget", "dp_remove_budget", "dp__remove_budget"})
# The UDFs a release's charge goes through: a macro or view whose text calls one (or calls such a macro) releases.
_CHARGES = frozenset({"dp__charge", "dp__charge_scoped"})
_WORD = re.compile(r"[a-z_][a-z0-9_$]*")


@dataclass(frozen=True)
class BudgetChange:
    """What setting or removing a budget did: the ledger that keeps it, the scope's status afterwards, and a
    note when the scope names no existing table or file (or could not be checked)."""

    ledger: Ledger
    status: ScopeStatus
    note: Optional[str] = None
    budget: Optional[Budget] = None


def _status(ledger: Ledger, key: str) -> ScopeStatus:
    return next((s for s in ledger.status() if s.scope == key), ScopeStatus(key, None, None, 0.0, 0.0, 0, 0))


def _is_file_scope(key: str) -> bool:
    # Table keys are database.schema.name; file scopes are absolute paths or URLs (ledger.file_scope).
    return os.path.isabs(key) or "://" in key


def _note(name: object, key: str, catalog: Optional[Catalog], unchecked: str = "") -> Optional[str]:
    """Why a budget on ``key`` may never apply: it names no table or view that exists, nor an existing file
    (without a catalog, that a table name could not be checked, and ``unchecked``: why)."""
    if key == DATABASE_SCOPE:
        return None
    if _is_file_scope(key):
        if "://" in key or (glob.has_magic(key) and glob.glob(key)) or os.path.exists(key):
            return None
        return (f"scope {name!r} names no existing file: the budget is stored under '{key}' and applies to "
                f"releases that read that file once it exists (check the path if you meant another file)")
    if catalog is None or not isinstance(name, str):
        why = f" ({unchecked})" if unchecked else ""
        return f"scope {name!r} is stored under '{key}'; whether a table of that name exists was not checked{why}"
    ctx = catalog.names
    try:
        parts = split_name(name)
    except ValueError:
        parts = []
    if ctx.relations is not None and 0 < len(parts) <= 3 \
            and any(c in ctx.relations for c in ctx.candidates(parts)[1]):
        return None
    return (f"scope {name!r} names no table or view of this database yet: the budget is stored under '{key}' "
            f"and applies to a table created under that name later (check the spelling if you meant an "
            f"existing table)")


def budget_home(ledger: Ledger, name: object, catalog: Optional[Catalog] = None, unchecked: str = "", *,
                view: bool = False) -> tuple[Ledger, str, Optional[str]]:
    """Where a budget on the scope ``name`` is kept: the ledger, the scope's key, and a note when the scope names
    nothing that exists (None if it does).

    ``catalog`` describes the connection (``dp__catalog(name)``); without one the scope is resolved as
    ``ledger`` resolves it (:meth:`Ledger.scope`) and the note says it was not checked (``unchecked``: why
    there is no catalog). A view is refused unless ``view`` (a release on it is charged to the tables and
    files it reads, so its budget would never apply; a budget set on one before that was refused may still
    be removed), and a table of another DuckDB file is kept in that file's sidecar, where its releases are
    charged.
    """
    if catalog is None:
        key = ledger.scope(name)
        return ledger, key, _note(name, key, None, unchecked)
    key = scope_key(name, catalog.names)
    if key == DATABASE_SCOPE:
        return ledger, key, None
    assert isinstance(name, str), "scope_key accepts only a str besides 'database'"
    database, is_view = locate(name, catalog)
    if is_view and not view:
        try:
            reads = "the tables and files it reads (" + ", ".join(s.scope for s in trace(name, catalog)) + ")"
        except ParameterError:
            reads = "the tables and files it reads"
        raise ParameterError(f"dpsql: scope {name!r} is a view: a release on it is charged to {reads}, so a budget "
                             f"on the view would never apply; set the budget on those tables instead")
    if database is not None and not ledger.owns(database):
        ledger = Ledger(sidecar_path(database))
    return ledger, key, _note(name, key, catalog)


def set_scope_budget(ledger: Ledger, name: object, epsilon: float, delta: float,
                     catalog: Optional[Catalog] = None, *, check_only: bool = False,
                     unchecked: str = "") -> BudgetChange:
    """Set the budget of the scope ``name`` where its releases are charged (:func:`budget_home`), refusing one
    below the scope's spending (:meth:`Ledger.set_budget`); nothing changes when it is refused.
    ``check_only``: only check (:meth:`Ledger.check_budget`); ``unchecked``: see :func:`budget_home`."""
    home, key, note = budget_home(ledger, name, catalog, unchecked)
    if check_only:
        return BudgetChange(home, _status(home, key), note, home.check_budget(epsilon, delta, key))
    budget = home.set_budget(epsilon, delta, key)
    return BudgetChange(home, _status(home, key), note, budget)


def remove_scope_budget(ledger: Ledger, name: object, catalog: Optional[Catalog] = None) -> BudgetChange:
    """Remove the budget of the scope ``name`` (its releases stay recorded); the note says when it had none."""
    home, key, _ = budget_home(ledger, name, catalog, view=True)
    note = None if home.remove_budget(key) else f"scope {name!r} ('{key}') had no budget; nothing was removed"
    return BudgetChange(home, _status(home, key), note)


def _releasing(row: Mapping[str, Any]) -> set[str]:
    """Names of the macros and views on the connection whose text makes a release: calls the charge, or a
    macro or view that does. Read as words of their text, so a mention in a comment counts too (it can only
    refuse more)."""
    bodies: dict[str, set[str]] = {}
    for m in row.get("macros") or ():
        bodies.setdefault(str(m["name"]).lower(), set()).update(_WORD.findall(str(m.get("definition") or "").lower()))
    for v in row.get("views") or ():
        if v.get("sql"):
            bodies.setdefault(str(v["name"]).lower(), set()).update(_WORD.findall(str(v["sql"]).lower()))
    found = set(_CHARGES)
    grew = True
    while grew:
        new = {name for name, words in bodies.items() if name not in found and words & found}
        found |= new
        grew = bool(new)
    return found


def _check_budget_statement(function: str, row: Optional[Mapping[str, Any]]) -> None:
    """Refuse a budget change that is not in the running statement's text, or shares it with a release."""
    query = str((row or {}).get("query") or "")
    named = sqltext.words(query)
    if not named & _SETTERS:
        raise ParameterError(
            f"dpsql: {function} must be called in the statement itself (SELECT {function}(...)), not inside a "
            f"view, a macro or a prepared statement run by EXECUTE, so that no query changes a budget unseen; "
            f"nothing was changed")
    releases = sorted(named & _releasing(row or {}))
    if releases:
        raise ParameterError(
            f"dpsql: {function} is called in a statement that also makes a release ({', '.join(releases)}): "
            f"the release could be checked against the budget before or after the change. Change the budget in "
            f"its own statement, then release; nothing was changed")


def _check_release_statement(catalog: Catalog) -> None:
    """Refuse a release in a statement that changes a budget (see the module docstring)."""
    query = catalog.query
    if "budget" in query.lower() and sqltext.words(query) & _SETTERS:
        raise ParameterError(
            "dpsql: this statement changes a privacy budget (dp_set_budget or dp_remove_budget) and makes a "
            "release: the release could be checked against the budget before or after the change. Change the "
            "budget in its own statement, then release; nothing was released or charged (a budget change that "
            "ran before this refusal stays: dp_budget() shows the budgets)")


# What dp__release_catalog's query() runs: the macros listed, or not (a NULL list: DuckDB then never plans the scan).
_MACROS_READ = "FROM dp__macros()"
_MACROS_UNREAD = "SELECT NULL::STRUCT(name VARCHAR, type VARCHAR, definition VARCHAR)[] AS macros"


def _literal(text: Optional[str]) -> str:
    return "NULL" if text is None else "'" + text.replace("'", "''") + "'"


def _binding_only() -> bool:
    """Whether DuckDB's Python client is binding a relation (``con.sql``) to learn its columns, not running it.

    The guess of which macros a release lists needs the statement's text, ``current_query()``, while DuckDB
    binds; DuckDB 2.0 fails with an internal error on that function where the client binds a relation
    without running it (it has no running query then). That bind is what runs this UDF from the client's
    own ``bind`` (found on the Python stack); it gets the full listing, which it binds but never runs.
    The suite runs releases through ``con.sql`` throughout, so a client that binds otherwise fails there.
    """
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if "bind" in code.co_name and os.path.dirname(code.co_filename) == _DUCKDB_DIR:
            return True
        frame = frame.f_back
    return False


_DUCKDB_DIR = os.path.dirname(os.path.abspath(duckdb.__file__))


def _catalog_type() -> DuckDBPyType:
    # The struct the macro dp__catalog(tbl) (sql/00_core/05_ledger.sql) builds; dpsql.core.scopes.Catalog reads it.
    return duckdb.struct_type({
        "database": VARCHAR, "schema": VARCHAR, "search_path": VARCHAR,
        "databases": duckdb.list_type(duckdb.struct_type({"name": VARCHAR, "path": VARCHAR, "type": VARCHAR})),
        "relations": duckdb.list_type(duckdb.struct_type({"database": VARCHAR, "schema": VARCHAR,
                                                          "name": VARCHAR})),
        "views": duckdb.list_type(duckdb.struct_type({"database": VARCHAR, "schema": VARCHAR, "name": VARCHAR,
                                                      "sql": VARCHAR})),
        "macros": duckdb.list_type(duckdb.struct_type({"name": VARCHAR, "type": VARCHAR, "definition": VARCHAR})),
        "query": VARCHAR})


def _status_type() -> DuckDBPyType:
    return duckdb.list_type(duckdb.struct_type({
        "scope": VARCHAR, "epsilon_budget": DOUBLE, "delta_budget": DOUBLE, "epsilon_spent": DOUBLE,
        "delta_spent": DOUBLE, "epsilon_remaining": DOUBLE, "delta_remaining": DOUBLE, "releases": BIGINT,
        "seeded_releases": BIGINT}))


# The fields of what dp_set_budget / dp_remove_budget return: DuckDB's type and Arrow's (a note that is NULL in
# every row of a batch must still arrive as a string column).
_CHANGE_FIELDS = (("scope", VARCHAR, pa.string()), ("epsilon_budget", DOUBLE, pa.float64()),
                  ("delta_budget", DOUBLE, pa.float64()), ("epsilon_spent", DOUBLE, pa.float64()),
                  ("delta_spent", DOUBLE, pa.float64()), ("epsilon_remaining", DOUBLE, pa.float64()),
                  ("delta_remaining", DOUBLE, pa.float64()), ("releases", BIGINT, pa.int64()),
                  ("seeded_releases", BIGINT, pa.int64()), ("ledger", VARCHAR, pa.string()),
                  ("note", VARCHAR, pa.string()))
_CHANGE_ARROW = pa.struct([(name, arrow) for name, _, arrow in _CHANGE_FIELDS])


def _change_type() -> DuckDBPyType:
    return duckdb.struct_type({name: sql for name, sql, _ in _CHANGE_FIELDS})


def _change_row(change: BudgetChange) -> dict[str, Any]:
    s = change.status
    return {"scope": s.scope, "epsilon_budget": s.epsilon_budget, "delta_budget": s.delta_budget,
            "epsilon_spent": s.epsilon_spent, "delta_spent": s.delta_spent,
            "epsilon_remaining": s.epsilon_remaining, "delta_remaining": s.delta_remaining,
            "releases": s.releases, "seeded_releases": s.seeded_releases,
            "ledger": None if change.ledger.path is None else str(change.ledger.path), "note": change.note}


def _releases_type() -> DuckDBPyType:
    return duckdb.list_type(duckdb.struct_type({
        "release_id": BIGINT, "released_at": DOUBLE, "mechanism": VARCHAR, "unit": VARCHAR, "table_name": VARCHAR,
        "epsilon": DOUBLE, "delta": DOUBLE, "parameters": VARCHAR, "calibration": VARCHAR, "seeded": BOOLEAN}))


def udfs(ledger: Ledger, seeded: bool = False) -> list[Udf]:
    """``dp__charge_scoped`` (called by the macro ``dp__charge``) and the readers behind ``dp_budget()``
    and ``dp_releases()``.

    ``seeded``: the connection's noise source is seeded, so its releases are
    recorded as NOT private. All of them have side effects (or read changing
    state), so DuckDB must not fold them while planning: a folded charge
    would be paid at plan time (and by EXPLAIN), as would a folded budget
    change, and a folded reader would show a stale ledger.
    """

    # The catalog the last charge read (its macros and statement left out) and the table arguments whose
    # tracing needed the macros it had not listed, for dp__catalog_macros_sql's guess while DuckDB binds the
    # next release: whether tracing that one may need the macros (scopes.needs_macros).
    seen: list[Optional[Catalog]] = [None]
    needed: set[str] = set()

    def macros_sql(table: Optional[str]) -> str:
        if _binding_only():
            return _MACROS_READ
        return f"FROM query(dp__catalog_macros_for({_literal(table)}, current_query()))"

    def macros_for(table: Optional[str], query: Optional[str]) -> str:
        last = seen[0]
        catalog = None if last is None else dataclasses.replace(last, query=query or "")
        return _MACROS_READ if needs_macros(table, catalog, frozenset(needed)) else _MACROS_UNREAD

    def charge(mechanism: pa.Array, unit: pa.Array, table: pa.Array, epsilon: pa.Array, delta: pa.Array,
               parameters: pa.Array, calibration: pa.Array, catalog: pa.Array) -> pa.Array:
        # ``calibration`` is the macro's one-row calibration CTE cast to text: passing it makes
        # DuckDB evaluate (and so validate) the calibration before the charge. A charge that only
        # read the CTE's row could run with the calibration's columns pruned away. ``catalog`` is
        # what tracing ``table`` to the data it reads needs from the connection, which a UDF cannot
        # query itself.
        out = []
        for m, u, t, e, d, p, c, k in zip(mechanism.to_pylist(), unit.to_pylist(), table.to_pylist(),
                                          epsilon.to_pylist(), delta.to_pylist(), parameters.to_pylist(),
                                          calibration.to_pylist(), catalog.to_pylist()):
            found = Catalog.from_row(k)
            seen[0] = dataclasses.replace(found, macros={}, definitions=(), query="")
            _check_release_statement(found)
            try:
                scopes = ScopeSet(trace(t, found))
            except MacrosUnread:
                needed.add(str(t).lower())
                raise ParameterError(
                    f"dpsql: tbl {t!r} reads a view, or a CTE of the statement, where this connection's last release "
                    f"saw a table, so this run did not list the macros that tracing it needs (a catalog scan "
                    f"skipped for tables); nothing was released or charged. Run the statement again: it lists "
                    f"them from now on") from None
            ledger.charge(m, u, t, e, d, p or "", c or "", seeded=seeded, scope=scopes)
            out.append(True)
        return pa.array(out, pa.bool_())

    def status(dummy: pa.Array) -> pa.Array:
        rows = [{"scope": s.scope, "epsilon_budget": s.epsilon_budget, "delta_budget": s.delta_budget,
                 "epsilon_spent": s.epsilon_spent, "delta_spent": s.delta_spent,
                 "epsilon_remaining": s.epsilon_remaining, "delta_remaining": s.delta_remaining,
                 "releases": s.releases, "seeded_releases": s.seeded_releases} for s in ledger.status()]
        return pa.array([rows] * len(dummy))

    def releases(dummy: pa.Array) -> pa.Array:
        # Ledger.releases() gives parameters and calibration as JSON text ("" for none: NULL in SQL).
        rows = [{"release_id": r.id, "released_at": r.time, "mechanism": r.mechanism, "unit": r.unit,
                 "table_name": r.table, "epsilon": r.epsilon, "delta": r.delta, "parameters": r.parameters or None,
                 "calibration": r.calibration or None, "seeded": r.seeded}
                for r in ledger.releases()]
        return pa.array([rows] * len(dummy))

    def set_budget(scope: pa.Array, epsilon: pa.Array, delta: pa.Array, catalog: pa.Array) -> pa.Array:
        rows = list(zip(scope.to_pylist(), epsilon.to_pylist(), delta.to_pylist(), catalog.to_pylist()))
        # Every row is checked before any budget changes: a refused row leaves the others of its batch unset.
        for n, e, d, k in rows:
            _check_budget_statement("dp_set_budget", k)
            set_scope_budget(ledger, n, e, d, Catalog.from_row(k), check_only=True)
        return pa.array([_change_row(set_scope_budget(ledger, n, e, d, Catalog.from_row(k))) for n, e, d, k in rows],
                        type=_CHANGE_ARROW)

    def remove_budget(scope: pa.Array, catalog: pa.Array) -> pa.Array:
        rows = list(zip(scope.to_pylist(), catalog.to_pylist()))
        for _, k in rows:
            _check_budget_statement("dp_remove_budget", k)
        return pa.array([_change_row(remove_scope_budget(ledger, n, Catalog.from_row(k))) for n, k in rows],
                        type=_CHANGE_ARROW)

    return [
        # Pure: query() runs the text it renders while DuckDB binds the release (sql/00_core/05_ledger.sql).
        Udf("dp__catalog_macros_sql", scalar(macros_sql), (VARCHAR,), VARCHAR),
        Udf("dp__catalog_macros_for", scalar(macros_for), (VARCHAR, VARCHAR), VARCHAR),
        Udf("dp__charge_scoped", charge,
            (VARCHAR, VARCHAR, VARCHAR, DOUBLE, DOUBLE, VARCHAR, VARCHAR, _catalog_type()), BOOLEAN,
            side_effects=True),
        Udf("dp__budget_status", status, (DOUBLE,), _status_type(), side_effects=True),
        Udf("dp__budget_releases", releases, (DOUBLE,), _releases_type(), side_effects=True),
        # Writes the ledger: never folded while planning (EXPLAIN must not change a budget), run per row.
        Udf("dp__set_budget", set_budget, (VARCHAR, DOUBLE, DOUBLE, _catalog_type()), _change_type(),
            side_effects=True),
        Udf("dp__remove_budget", remove_budget, (VARCHAR, _catalog_type()), _change_type(), side_effects=True),
    ]
