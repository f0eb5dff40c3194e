"""SQL access to the ledger: the charge every release makes, and the readers behind ``dp_budget()``
and ``dp_releases()`` (sql/00_core/05_ledger.sql).

The charge ties two rooms together: :mod:`dpsql.core.scopes` traces the release's table argument to the
base tables and files it reads, and :mod:`dpsql.core.ledger` checks and records the release against every
budget that applies. Both are imported here, so that neither imports the other's user.
"""
from __future__ import annotations

import duckdb
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR, DuckDBPyType

from dpsql.core.ledger import Ledger, ScopeSet
from dpsql.core.scopes import Catalog, trace
from dpsql.core.udf import Udf

__all__ = ["udfs"]


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


def _releases_type() -> DuckDBPyType:
    return duckdb.list_type(duckdb.struct_type({
        "release_id": BIGINT, "released_at": DOUBLE, "mechanism": VARCHAR, "unit": VARCHAR, "table_name": VARCHAR,
        "epsilon": DOUBLE, "delta": DOUBLE, "parameters": VARCHAR, "calibration": VARCHAR, "seeded": BOOLEAN}))


def udfs(ledger: Ledger, seeded: bool = False) -> list[Udf]:
    """``dp__charge_scoped`` (called by the macro ``dp__charge``) and the readers behind ``dp_budget()``
    and ``dp_releases()``.

    ``seeded``: the connection's noise source is seeded, so its releases are
    recorded as NOT private. All three have side effects (or read changing
    state), so DuckDB must not fold them while planning: a folded charge
    would be paid at plan time (and by EXPLAIN), a folded reader would show a
    stale ledger.
    """

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
            scopes = ScopeSet(trace(t, Catalog.from_row(k)))
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

    return [
        Udf("dp__charge_scoped", charge,
            (VARCHAR, VARCHAR, VARCHAR, DOUBLE, DOUBLE, VARCHAR, VARCHAR, _catalog_type()), BOOLEAN,
            side_effects=True),
        Udf("dp__budget_status", status, (DOUBLE,), _status_type(), side_effects=True),
        Udf("dp__budget_releases", releases, (DOUBLE,), _releases_type(), side_effects=True),
    ]
