"""The release path every dpsql mechanism goes through, and what it guarantees beyond the output set.

A mechanism's privacy proof covers the *set* (or the numbers) it outputs. A
release shows more: the order of its rows, the values its parameters took in
each use, its errors. This module holds the checks that make those a function
of the DP output and of public input only:

* **Constant parameters.** A table macro substitutes each parameter expression
  wherever the parameter appears (calibration, charge, cap, threshold). An
  expression that is not constant (``random()``, a sequence, a column, a
  subquery) could take one value in the charge and another in the cap. Every
  releasing macro therefore passes each of its parameters through
  ``dp__constant(name, expr)`` (``sql/00_release.sql``) in the one-row CTE
  that its calibration and its charge read: DuckDB's ``stats(expr)`` is
  replaced by the expression's statistics while the query is planned, and
  :func:`check_constant` accepts only an expression whose statistics prove a
  single value (``approx_unique = 1`` and ``min = max``). A constant expression
  folds to the same value at each use, so each use reads that one value.
  Literals, prepared-statement parameters and ``getvariable(...)`` pass.
* **Row order.** Engine hash order depends on the data, so every releasing
  macro ends with ``ORDER BY`` its released columns, and Python entry points
  that assemble rows themselves sort them with :func:`sorted_release`.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
from duckdb.sqltypes import BOOLEAN, VARCHAR

from dpsql.udf import Udf, scalar
from dpsql.validation import DPParameterError

__all__ = ["check_constant", "sorted_release", "udfs"]


def check_constant(name: str, stats_json: object) -> bool:
    """True if ``stats_json`` (``stats(expr)::JSON`` of a parameter) proves the expression has one value.

    Raises :class:`DPParameterError` naming ``name`` otherwise.
    """
    try:
        stats = json.loads(stats_json) if isinstance(stats_json, str) else None
    except ValueError:
        stats = None
    constant = (isinstance(stats, dict) and stats.get("approx_unique") == 1
                and stats.get("has_null") != stats.get("has_no_null")
                and stats.get("min") == stats.get("max"))
    if not constant:
        # dp_set_union hands each branch its epsilon through a CASE on `method` (sql/90_dispatch.sql).
        via = " (through dp_set_union or dp_top_k, its method must be constant too)" if name == "epsilon" else ""
        raise DPParameterError(
            f"dpsql: {name} must be a constant expression{via}, evaluated once for the whole release (a literal, a "
            f"prepared-statement parameter or getvariable('...')); the expression passed can take different "
            f"values within one query (random(), a sequence, a column or a subquery). Compute the value first, "
            f"e.g. SET VARIABLE v = (...); then pass {name} := getvariable('v'); nothing was read or charged")
    return True


def sorted_release(table: pa.Table, columns: list[str] | None = None) -> pa.Table:
    """``table`` sorted by ``columns`` (default: all): a row order that depends only on the released values."""
    keys = columns or table.column_names
    if table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))


def udfs(source: object) -> list[Udf]:
    """``dp__check_constant``: pure, so DuckDB may fold it while planning."""
    return [Udf("dp__check_constant", scalar(check_constant), (VARCHAR, VARCHAR), BOOLEAN)]
