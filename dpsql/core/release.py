"""The release path every dpsql mechanism goes through, and what it guarantees beyond the output set.

A mechanism's privacy proof covers the *set* (or the numbers) it outputs. A
release shows more: the values its parameters took in each use, the order of
its rows, its errors, what it charged. Every releasing macro is therefore one
**generated wrapper** around the mechanism's body (:func:`wrapper_sql`), so no
macro can get these wrong by hand:

* **Parameters bound once.** The wrapper reads every declared parameter once,
  into the one-row MATERIALIZED CTE ``dp__bound``, through ``getvariable`` of its text
  (``sql/00_core/00_release.sql``): DuckDB's binder refuses, before anything runs, an
  expression that is not constant (``random()``, a sequence, a column, a
  subquery) -- scalars, LISTs and STRUCTs alike. A constant expression is folded
  to one value while planning, so the body's uses, the validation and the
  charge all read that value, and the ledger records it.
* **Validated and calibrated before any row is read.** ``dp__release_check``
  (:func:`check_release`) validates the bound row by the declaration
  (:meth:`dpsql.core.mechanism.Mechanism.validate`) and calibrates it; the body
  waits for it.
* **All or nothing.** The body (``dp__body_<macro>``) computes the released
  rows, noise included, into a MATERIALIZED CTE; the charge waits for it; the
  wrapper then only reads and sorts those rows, which cannot fail. A release of
  several steps (top-k's domain and selection, group-by's selection and
  aggregates) is one body and one charge of its total.
* **Row order.** ``ORDER BY ALL``: the released columns, the order key first
  (item, key or rank), so the order is a function of the released values. Python
  entry points that assemble rows themselves sort them with :func:`sorted_release`.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import numbers
import warnings
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import duckdb
from duckdb.sqltypes import DOUBLE, VARCHAR, DuckDBPyType

from dpsql.core.errors import ParameterError, engine_errors
from dpsql.core.mechanism import Mechanism, Param, sql_literal
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import warn_weak_parameters

__all__ = ["body_macro", "signature", "release_sql", "wrapper_sql", "wrappers_sql", "check_release", "check_type",
           "sql_value", "call_sql", "sorted_release", "warn_weak", "calibration_text", "udfs"]


def body_macro(mech: Mechanism) -> str:
    """The SQL macro holding ``mech``'s body: same parameters, no binding, no charge, any row order."""
    return "dp__body_" + mech.macro.removeprefix("dp_")


def signature(params: Sequence[Param]) -> str:
    """The parameter list of a macro taking ``params``: names, order, types and defaults.

    The releasing macro and its body (whose header :mod:`dpsql.core.sqltext` generates) share it.
    """
    # DuckDB: a parameter without a default cannot follow one with a default (declarations keep that order).
    return ", ".join(f"{p.name} {p.sql_type}" if p.required else f"{p.name} {p.sql_type} := {p.sql_default()}"
                     for p in params)


def release_sql(macro: str, params: Sequence[Param], body: str, check: str, checked: Sequence[str]) -> str:
    """A releasing macro ``macro(params)``: bind, check, ``body``, charge, sorted output.

    ``check`` is the SQL call of the check UDF on ``{bound}``, the JSON text of the bound parameters
    named in ``checked``; it returns the release's epsilon, delta, parameters, calibration, macro and
    unit (:func:`check_release`). The body gets every parameter, required ones by position.
    """
    names = [p.name for p in params]
    bound = ",\n           ".join(f"{n} AS {n}" for n in names)
    # getvariable() accepts only a constant name: DuckDB's binder refuses any other (sql/00_core/00_release.sql).
    binds = "\n      AND ".join(f"(getvariable('dp__bind:' || {n}::VARCHAR) IS NULL OR true)" for n in names)
    args = ", ".join(p.name if p.required else f"{p.name} := {p.name}" for p in params)
    # the check and the charge read the bound row (the body gets the same constant expressions; the charge
    # passes `tbl` itself, a constant, which its catalog needs while DuckDB binds: sql/00_core/05_ledger.sql);
    # the check's struct is unnested from a subquery, so its call is bound once, not once per field
    sent = "to_json({" + ", ".join(f"'{n}': dp__bound.{n}" for n in checked) + "})::VARCHAR"
    return f"""\
CREATE OR REPLACE TEMP MACRO {macro}({signature(params)}) AS TABLE
WITH dp__bound AS MATERIALIZED (
    SELECT {bound}
    WHERE {binds}),
dp__checked AS MATERIALIZED (
    SELECT unnest(dp__c) FROM (SELECT {check.format(bound=sent)} AS dp__c FROM dp__bound)),
dp__released AS MATERIALIZED (
    FROM {body}({args})
    WHERE (SELECT count(*) FROM dp__checked) = 1),
dp__paid AS MATERIALIZED (
    SELECT dp__charge(dp__checked.macro, dp__checked.unit, tbl, dp__checked.epsilon, dp__checked.delta,
                      dp__checked.parameters, dp__checked.calibration) AS paid
    FROM dp__bound, dp__checked WHERE (SELECT count(*) FROM dp__released) >= 0)
SELECT dp__released.* FROM dp__released, dp__paid WHERE paid
ORDER BY ALL;
"""


def wrapper_sql(mech: Mechanism) -> str:
    """The releasing macro of ``mech``: bind, check, body, charge, sorted output (see the module docstring)."""
    return release_sql(mech.macro, mech.params, body_macro(mech),
                       "dp__release_check(" + sql_literal(mech.name) + ", {bound})", mech.param_names)


def wrappers_sql(mechs: Mapping[str, Mechanism]) -> str:
    """Every releasing macro, generated from the declarations."""
    return "\n".join(wrapper_sql(m) for m in mechs.values())


def calibration_text(value: Any) -> str:
    """A calibration as JSON text (a dataclass by its fields; anything JSON cannot hold by its repr)."""
    return json.dumps(dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type)
                      else value, default=repr)


def check_release(mech: Mechanism, bound: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the bound parameters by the declaration and calibrate them: what the charge records.

    Returns the release's total ``epsilon`` and ``delta`` (0 for a mechanism without delta), its
    other parameters and its calibration as JSON text, and the ``macro`` and ``unit`` it is charged as.
    Raises :class:`dpsql.core.errors.ParameterError` naming the parameter; runs before any row is read.
    """
    values = mech.validate(**dict(bound))
    calibration = ""
    if mech.calibrate is not None:
        wanted = inspect.signature(mech.calibrate).parameters
        takes_all = any(p.kind is p.VAR_KEYWORD for p in wanted.values())
        cal = mech.calibrate(**{k: v for k, v in values.items() if takes_all or k in wanted})
        calibration = calibration_text(cal)
    others = {k: v for k, v in values.items() if k not in ("tbl", "epsilon", "delta")}
    return {"epsilon": float(values["epsilon"]), "delta": float(values.get("delta") or 0.0),
            "parameters": json.dumps(others, default=repr), "calibration": calibration,
            "macro": mech.macro, "unit": mech.unit}


def warn_weak(checked: Mapping[str, Any]) -> None:
    """The release's one :class:`~dpsql.core.validation.WeakPrivacyWarning`, if its epsilon or delta (what
    :func:`check_release` returned) is weak: a release's check UDF runs once per statement and calls this
    each time (its result may be cached), while its steps' calibrations, which DuckDB calls several times
    and which see shares of the budget, do not warn."""
    warn_weak_parameters(checked["epsilon"], checked["delta"], what=checked["macro"])


def sql_value(name: str, value: Any, sql_type: str) -> str:
    """``value`` of the parameter ``name`` as a SQL literal of ``sql_type`` that DuckDB reads back exactly.

    A string is quoted (quotes doubled: a table or column name stays data, never SQL text); a DOUBLE goes
    through the text of its shortest repr (an exact decimal literal such as ``0.12345678901234567`` would
    be converted with a second rounding); a LIST element by element. Raises
    :class:`~dpsql.core.errors.ParameterError` naming ``name`` for a value of another kind.
    """
    if value is None:
        return f"CAST(NULL AS {sql_type})"
    if sql_type.endswith("[]"):
        if isinstance(value, (list, tuple)):
            return f"CAST([{', '.join(sql_value(name, v, sql_type[:-2]) for v in value)}] AS {sql_type})"
    elif sql_type == "VARCHAR":
        if isinstance(value, str):
            return "'" + value.replace("'", "''") + "'"
    elif sql_type == "DOUBLE":
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return f"CAST('{int(value)}' AS DOUBLE)"
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return f"CAST('{float(value)!r}' AS DOUBLE)"
    elif sql_type == "BOOLEAN":
        if isinstance(value, bool):
            return "true" if value else "false"
    else:
        raise TypeError(f"dpsql: no SQL literal for parameters of type {sql_type} ({name})")
    kind = {"DOUBLE": "a number", "VARCHAR": "a string", "BOOLEAN": "true or false"}.get(sql_type, f"a {sql_type}")
    raise ParameterError(f"{name} must be {kind} (got {value!r})")


def call_sql(mech: Mechanism, values: Mapping[str, Any]) -> str:
    """The call of ``mech``'s releasing macro on ``values`` (its validated parameters, :meth:`Mechanism.validate`),
    every value a literal (:func:`sql_value`): the required parameters by position, the others by name."""
    args = [sql_value(p.name, values[p.name], p.sql_type) if p.required
            else f"{p.name} := {sql_value(p.name, values[p.name], p.sql_type)}"
            for p in mech.params if p.required or p.name in values]
    return f"{mech.macro}({', '.join(args)})"


def run(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run the release ``sql`` once and return its rows as an Arrow table (dpsql's own exceptions raised as such).

    ``con.execute`` binds and plans the statement once; a relation (``con.sql(sql).to_arrow_table()``)
    binds it to learn its schema, then again when it runs, and binding a release (its calibration, its
    body) is a large part of its latency on a small table. DuckDB's client warns that Arrow output of an
    executed statement copies the rows: here they are the released rows, few.
    """
    with engine_errors():  # dpsql's own exception (e.g. BudgetExceededError), not duckdb's wrapper
        con.execute(sql)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)
            return con.to_arrow_table()


def sorted_release(table: pa.Table, columns: list[str] | None = None) -> pa.Table:
    """``table`` sorted by ``columns`` (default: all): a row order that depends only on the released values."""
    keys = columns or table.column_names
    if table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))


def check_type() -> DuckDBPyType:
    """What a release's check UDF returns (:func:`check_release`)."""
    return duckdb.struct_type({"epsilon": DOUBLE, "delta": DOUBLE, "parameters": VARCHAR, "calibration": VARCHAR,
                               "macro": VARCHAR, "unit": VARCHAR})


def udfs(registry: Callable[[], Mapping[str, Mechanism]]) -> list[Udf]:
    """``dp__release_check(name, bound JSON)``: pure, so DuckDB may fold it while planning.

    DuckDB calls a folded function several times while it plans one query; the result is a pure
    function of its arguments, so the last one is kept.
    """
    last: dict[tuple[str, str], dict[str, Any]] = {}

    def release_check(name: str, bound_json: str) -> dict[str, Any]:
        key = (name, bound_json)
        found = last.get(key)
        if found is None:
            declared = registry()
            if name not in declared:  # its family was removed from the registry after this connection's macros
                raise ParameterError(f"{name} is no longer a registered mechanism (its family was removed); "
                                     f"nothing was released: register its family again, or use another mechanism")
            found = check_release(declared[name], json.loads(bound_json))
            last.clear()
            last[key] = found
        warn_weak(found)
        return dict(found)

    return [Udf("dp__release_check", scalar(release_check), (VARCHAR, VARCHAR), check_type())]
