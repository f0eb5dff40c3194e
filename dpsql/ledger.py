"""Privacy-budget ledger: every release is charged once, before its result can be read.

What is recorded. Each dpsql macro that releases something calls the UDF
``dp__charge(mechanism, unit, tbl, epsilon, delta, parameters, calibration)`` in
a one-row MATERIALIZED CTE that its output rows depend on. The charge runs after the
parameters are validated and before any output row exists; if it would take a
scope over its budget it raises, and the query (hence the release) fails with
nothing charged. Each charge is one immutable :class:`Release` value;
accountants (:func:`basic_composition`) consume lists of them.

Composition is basic: the (epsilon, delta) of a scope is the sum over its
releases (Dwork & Roth 2014, Thm 3.16). This is valid for any mix of
mechanisms, and loose for many Gaussian releases.

Scopes. A budget applies to ``'database'`` (every release on the connection's
database) or to one table name (releases whose ``tbl`` argument names that
table). A release must fit every budget that applies to it. The table scope is
bookkeeping by name: a view or a copy of the table is another name, so the
``'database'`` scope is the one that bounds an analyst.

Privacy units. Set-union and top-k are user-level (all of one user's rows); the
optimisation family is record-level (one universe element, stream or point
with all its rows); the PWS family (``dp_weighted_sample``,
``dp_sbh_histogram``) is element-level (one row). The ledger sums all kinds as
given and records the unit of each release; an element-level epsilon does not
bound a user's loss.

Storage. A SQLite file next to the database (``<database file>.dpsql-ledger``)
or, for an in-memory database, an in-memory ledger unless a path is given.
SQLite's ``BEGIN IMMEDIATE`` makes check-and-spend atomic across threads and
processes, including several processes that opened one DuckDB file read-only
(they could not write a table inside it). DuckDB cannot write to the database
from inside the running query that makes the release, which is the other
reason the ledger is a sidecar. The ledger is a guard against accidental
overspending by people who work through dpsql; anyone who can write files
(DuckDB's ``COPY`` included) can delete it, so it is not a security boundary.
"""
from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

import duckdb
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR

from dpsql.udf import Udf
from dpsql.validation import DPParameterError, check_epsilon

__all__ = ["Release", "Budget", "ScopeStatus", "Ledger", "BudgetExceededError", "LEDGER_SUFFIX",
           "DATABASE_SCOPE", "basic_composition", "normalize_scope", "sidecar_path", "database_path",
           "ledger_for", "ledger_of", "set_budget", "budget", "releases", "udfs"]

LEDGER_SUFFIX = ".dpsql-ledger"
DATABASE_SCOPE = "database"
UNITS = ("user", "element", "record")
# Budgets are compared with a relative slack so that, e.g., ten charges of 0.1 fit a budget of 1.0
# despite binary rounding; the slack is far below any meaningful epsilon.
_SLACK = 1e-9


class BudgetExceededError(DPParameterError):
    """A release would take a scope over its privacy budget; nothing was released or charged."""


@dataclass(frozen=True)
class Release:
    """One charged release (an immutable event, in the style of dp_accounting's DpEvent)."""

    id: int
    time: float           # seconds since the epoch (UTC)
    mechanism: str
    unit: str             # 'user', 'element' or 'record'
    table: str            # normalised table argument (the scope it is charged to besides 'database')
    epsilon: float
    delta: float
    parameters: str       # the macro's other arguments, as text
    calibration: str = ""  # the calibration the release used (noise scale, threshold, ...), as text


@dataclass(frozen=True)
class Budget:
    """A total (epsilon, delta) allowed for one scope."""

    scope: str
    epsilon: float
    delta: float


@dataclass(frozen=True)
class ScopeStatus:
    """Spent and remaining budget of one scope (remaining is None without a budget)."""

    scope: str
    epsilon_budget: Optional[float]
    delta_budget: Optional[float]
    epsilon_spent: float
    delta_spent: float
    releases: int

    @property
    def epsilon_remaining(self) -> Optional[float]:
        return None if self.epsilon_budget is None else max(0.0, self.epsilon_budget - self.epsilon_spent)

    @property
    def delta_remaining(self) -> Optional[float]:
        return None if self.delta_budget is None else max(0.0, self.delta_budget - self.delta_spent)


def basic_composition(releases: Iterable[Release]) -> tuple[float, float]:
    """Basic composition: (sum of epsilons, sum of deltas) (Dwork & Roth 2014, Thm 3.16)."""
    releases = list(releases)
    return math.fsum(r.epsilon for r in releases), math.fsum(r.delta for r in releases)


def normalize_scope(name: object) -> str:
    """Scope key of a table argument: lower case, no double quotes, no leading ``main.``.

    DuckDB identifiers are case-insensitive, so ``T``, ``"t"`` and ``main.t``
    are one table; ``'database'`` is the whole-database scope.
    """
    if not isinstance(name, str) or not name.strip():
        raise DPParameterError(f"scope must be 'database' or a table name (got {name!r})")
    key = name.strip().replace('"', "").lower()
    if key.startswith("main."):
        key = key[len("main."):]
    return key


def sidecar_path(database: Union[str, os.PathLike]) -> Path:
    """The ledger file of a database (or data) file: ``<file>.dpsql-ledger``."""
    return Path(os.fspath(database) + LEDGER_SUFFIX)


def _check_budget_delta(delta: object) -> float:
    # A budget's delta may be 0 (pure-DP releases only) but not >= 1.
    if delta is None or isinstance(delta, bool) or not isinstance(delta, (int, float)) \
            or not (0.0 <= float(delta) < 1.0):
        raise DPParameterError(f"delta budget must be a number with 0 <= delta < 1 (got {delta!r})")
    return float(delta)


def _check_release_delta(delta: object) -> float:
    # A release's delta is 0 for pure-DP mechanisms, else in (0, 1).
    if delta is None or isinstance(delta, bool) or not isinstance(delta, (int, float)) \
            or not (0.0 <= float(delta) < 1.0) or math.isnan(float(delta)):
        raise DPParameterError(f"delta must be a number with 0 <= delta < 1 (got {delta!r})")
    return float(delta)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (scope TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL);
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, mechanism TEXT NOT NULL, unit TEXT NOT NULL,
    tbl TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, parameters TEXT NOT NULL,
    calibration TEXT NOT NULL);
"""


class Ledger:
    """Budgets and releases of one database, kept in a SQLite file or in memory.

    ``path=None`` keeps the ledger in memory (it lives as long as this object).
    """

    def __init__(self, path: Optional[Union[str, os.PathLike]] = None, *,
                 aliases: Optional[dict[str, str]] = None):
        self.path = None if path is None else Path(os.fspath(path))
        # Table names recorded in place of others (the CLI reads its input through a TEMP view and
        # records the input's table or file name instead of the view's).
        self.aliases = {normalize_scope(k): v for k, v in (aliases or {}).items()}
        self._lock = threading.Lock()
        self._memory: Optional[sqlite3.Connection] = None
        self._ready = False  # tables created (on first use, so registering writes nothing)
        if self.path is None:
            self._memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        # A file ledger is created on first use, so registering dpsql on a database writes nothing.

    def __repr__(self) -> str:
        return f"Ledger({str(self.path) if self.path else 'in memory'})"

    # -- storage -------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves; timeout: wait for other writers.
        return sqlite3.connect(os.fspath(self.path), timeout=60.0, isolation_level=None)

    class _Tx:
        def __init__(self, ledger: "Ledger"):
            self.ledger = ledger

        def __enter__(self) -> sqlite3.Connection:
            self.ledger._lock.acquire()
            try:
                self.db = self.ledger._memory if self.ledger._memory is not None else self.ledger._open()
                if not self.ledger._ready:  # once per Ledger: a charge is on every release's path
                    self.db.executescript(_SCHEMA)
                    self.ledger._ready = True
                # IMMEDIATE takes the write lock now: no other process can spend between our check and insert.
                self.db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self.ledger._lock.release()
                raise DPParameterError(
                    f"dpsql: cannot use the privacy ledger {self.ledger.path} ({exc}); nothing was released. "
                    f"Make its folder writable or pass ledger= a writable path to dpsql.connect/register") from exc
            except BaseException:
                self.ledger._lock.release()
                raise
            return self.db

        def __exit__(self, exc_type, exc, tb) -> None:
            try:
                self.db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                if self.ledger._memory is None:
                    self.db.close()
                self.ledger._lock.release()

    def _transaction(self) -> "Ledger._Tx":
        return Ledger._Tx(self)

    # -- budgets -------------------------------------------------------------------------------
    def set_budget(self, epsilon: float, delta: float, scope: str = DATABASE_SCOPE) -> Budget:
        """Set (replace) the total budget of ``scope``; releases already charged stay charged."""
        budget = Budget(normalize_scope(scope), check_epsilon(epsilon), _check_budget_delta(delta))
        with self._transaction() as db:
            db.execute("INSERT INTO budgets VALUES (?, ?, ?) ON CONFLICT(scope) DO UPDATE SET "
                       "epsilon = excluded.epsilon, delta = excluded.delta",
                       (budget.scope, budget.epsilon, budget.delta))
        return budget

    def remove_budget(self, scope: str = DATABASE_SCOPE) -> None:
        """Remove the limit of ``scope`` (its releases stay recorded)."""
        with self._transaction() as db:
            db.execute("DELETE FROM budgets WHERE scope = ?", (normalize_scope(scope),))

    def budgets(self) -> list[Budget]:
        with self._transaction() as db:
            rows = db.execute("SELECT scope, epsilon, delta FROM budgets ORDER BY scope").fetchall()
        return [Budget(*r) for r in rows]

    # -- releases ------------------------------------------------------------------------------
    def releases(self) -> list[Release]:
        with self._transaction() as db:
            rows = db.execute("SELECT id, time, mechanism, unit, tbl, epsilon, delta, parameters, calibration "
                              "FROM releases ORDER BY id").fetchall()
        return [Release(*r) for r in rows]

    def status(self) -> list[ScopeStatus]:
        """One row per scope that has a budget or a release: 'database' first, then tables."""
        with self._transaction() as db:
            budgets = {s: (e, d) for s, e, d in db.execute("SELECT scope, epsilon, delta FROM budgets")}
            rows = db.execute("SELECT tbl, epsilon, delta FROM releases").fetchall()
        spent: dict[str, list] = {DATABASE_SCOPE: [[], [], 0]}
        for tbl, eps, delta in rows:
            for scope in (DATABASE_SCOPE, tbl):
                entry = spent.setdefault(scope, [[], [], 0])
                entry[0].append(eps)
                entry[1].append(delta)
                entry[2] += 1
        for scope in budgets:
            spent.setdefault(scope, [[], [], 0])
        order = [DATABASE_SCOPE] + sorted(s for s in spent if s != DATABASE_SCOPE)
        return [ScopeStatus(s, budgets.get(s, (None, None))[0], budgets.get(s, (None, None))[1],
                            math.fsum(spent[s][0]), math.fsum(spent[s][1]), spent[s][2]) for s in order]

    def charge(self, mechanism: str, unit: str, table: str, epsilon: float, delta: float,
               parameters: str = "", calibration: str = "") -> Release:
        """Atomically check every applicable budget and record the release.

        Raises :class:`BudgetExceededError` (recording nothing) if the release
        would exceed the budget of ``'database'`` or of ``table``.
        """
        if unit not in UNITS:
            raise DPParameterError(f"unit must be one of {UNITS} (got {unit!r})")
        epsilon = check_epsilon(epsilon)
        delta = _check_release_delta(delta)
        table = normalize_scope(table)
        table = normalize_scope(self.aliases.get(table, table))
        with self._transaction() as db:
            for scope in dict.fromkeys((DATABASE_SCOPE, table)):
                row = db.execute("SELECT epsilon, delta FROM budgets WHERE scope = ?", (scope,)).fetchone()
                if row is None:
                    continue
                where = "" if scope == DATABASE_SCOPE else " WHERE tbl = ?"
                args = () if scope == DATABASE_SCOPE else (scope,)
                spent = db.execute(f"SELECT epsilon, delta FROM releases{where}", args).fetchall()
                eps_spent = math.fsum(r[0] for r in spent)
                delta_spent = math.fsum(r[1] for r in spent)
                if eps_spent + epsilon > row[0] * (1 + _SLACK) or delta_spent + delta > row[1] * (1 + _SLACK):
                    raise BudgetExceededError(
                        f"dpsql: privacy budget of scope '{scope}' exceeded: {mechanism} on {table} needs "
                        f"epsilon={epsilon:g}, delta={delta:g}, but only epsilon={max(0.0, row[0] - eps_spent):g}, "
                        f"delta={max(0.0, row[1] - delta_spent):g} remain of ({row[0]:g}, {row[1]:g}); nothing was "
                        f"released. Raise the budget with dpsql.set_budget / 'dpsql budget set' if that is intended.")
            now = time.time()
            cur = db.execute("INSERT INTO releases (time, mechanism, unit, tbl, epsilon, delta, parameters, "
                             "calibration) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (now, mechanism, unit, table, epsilon, delta, parameters, calibration))
            return Release(int(cur.lastrowid), now, mechanism, unit, table, epsilon, delta, parameters, calibration)


# -- connections ----------------------------------------------------------------------------------

# Connection -> ledger; cursors share their connection's UDFs and therefore its ledger.
_LEDGERS: "weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, Ledger]" = weakref.WeakKeyDictionary()


def database_path(con: duckdb.DuckDBPyConnection) -> Optional[str]:
    """File of the connection's current database, or None for an in-memory one."""
    rows = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    path = rows[0][0] if rows else None
    return path or None


def ledger_for(con: duckdb.DuckDBPyConnection,
               ledger: Union[None, str, os.PathLike, Ledger] = None) -> Ledger:
    """The ledger a newly registered connection uses.

    ``ledger`` may be a :class:`Ledger`, a file path, or None: the sidecar of
    the database file, or an in-memory ledger for an in-memory database.
    """
    if isinstance(ledger, Ledger):
        return ledger
    if ledger is not None:
        return Ledger(ledger)
    path = database_path(con)
    return Ledger(sidecar_path(path)) if path else Ledger(None)


def attach(con: duckdb.DuckDBPyConnection, ledger: Ledger) -> None:
    _LEDGERS[con] = ledger


def ledger_of(con: duckdb.DuckDBPyConnection) -> Ledger:
    """The ledger that ``con``'s releases are charged to (``con`` must be registered)."""
    try:
        return _LEDGERS[con]
    except KeyError:
        raise DPParameterError("this connection has no dpsql ledger; call dpsql.register(con) first") from None


def set_budget(con: duckdb.DuckDBPyConnection, epsilon: float, delta: float,
               scope: str = DATABASE_SCOPE) -> Budget:
    """Set the total (epsilon, delta) of ``scope`` ('database' or a table name) for ``con``'s ledger."""
    return ledger_of(con).set_budget(epsilon, delta, scope)


def budget(con: duckdb.DuckDBPyConnection) -> list[ScopeStatus]:
    """Spent and remaining budget per scope (the rows of ``SELECT * FROM dp_budget()``)."""
    return ledger_of(con).status()


def releases(con: duckdb.DuckDBPyConnection) -> list[Release]:
    """Every charged release, oldest first (the rows of ``SELECT * FROM dp_releases()``)."""
    return ledger_of(con).releases()


# -- SQL access ---------------------------------------------------------------------------------

def _status_type():
    return duckdb.list_type(duckdb.struct_type({
        "scope": VARCHAR, "epsilon_budget": DOUBLE, "delta_budget": DOUBLE, "epsilon_spent": DOUBLE,
        "delta_spent": DOUBLE, "epsilon_remaining": DOUBLE, "delta_remaining": DOUBLE, "releases": BIGINT}))


def _releases_type():
    return duckdb.list_type(duckdb.struct_type({
        "release_id": BIGINT, "released_at": DOUBLE, "mechanism": VARCHAR, "unit": VARCHAR, "table_name": VARCHAR,
        "epsilon": DOUBLE, "delta": DOUBLE, "parameters": VARCHAR, "calibration": VARCHAR}))


def udfs(ledger: Ledger) -> list[Udf]:
    """``dp__charge`` and the two readers behind ``dp_budget()`` / ``dp_releases()``.

    All three have side effects (or read changing state), so DuckDB must not
    fold them while planning: a folded charge would be paid at plan time (and
    by EXPLAIN), a folded reader would show a stale ledger.
    """

    def charge(mechanism, unit, table, epsilon, delta, parameters, calibration):
        # ``calibration`` is the macro's one-row calibration CTE cast to text: passing it makes
        # DuckDB evaluate (and so validate) the calibration before the charge. A charge that only
        # read the CTE's row could run with the calibration's columns pruned away.
        out = []
        for m, u, t, e, d, p, c in zip(mechanism.to_pylist(), unit.to_pylist(), table.to_pylist(),
                                       epsilon.to_pylist(), delta.to_pylist(), parameters.to_pylist(),
                                       calibration.to_pylist()):
            ledger.charge(m, u, t, e, d, p or "", c or "")
            out.append(True)
        return pa.array(out, pa.bool_())

    def status(dummy):
        rows = [{"scope": s.scope, "epsilon_budget": s.epsilon_budget, "delta_budget": s.delta_budget,
                 "epsilon_spent": s.epsilon_spent, "delta_spent": s.delta_spent,
                 "epsilon_remaining": s.epsilon_remaining, "delta_remaining": s.delta_remaining,
                 "releases": s.releases} for s in ledger.status()]
        return pa.array([rows] * len(dummy))

    def releases(dummy):
        rows = [{"release_id": r.id, "released_at": r.time, "mechanism": r.mechanism, "unit": r.unit,
                 "table_name": r.table, "epsilon": r.epsilon, "delta": r.delta, "parameters": r.parameters,
                 "calibration": r.calibration}
                for r in ledger.releases()]
        return pa.array([rows] * len(dummy))

    return [
        Udf("dp__charge", charge, (VARCHAR, VARCHAR, VARCHAR, DOUBLE, DOUBLE, VARCHAR, VARCHAR), BOOLEAN,
            side_effects=True),
        Udf("dp__budget_status", status, (DOUBLE,), _status_type(), side_effects=True),
        Udf("dp__budget_releases", releases, (DOUBLE,), _releases_type(), side_effects=True),
    ]
