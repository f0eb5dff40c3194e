"""Set union / partition selection: the method registry and the Python API.

Problem ([DPSU] Sec. 1): every user holds a set of items; release as many items
of the union as possible under user-level add/remove (epsilon, delta)-DP.
The engine caps each user's distinct items to ``max_items`` (uniform sample
that depends only on that user's rows), aggregates one weight per item, and
releases the items whose weight plus calibrated noise exceeds a threshold
([DPSU] Alg. 1 with an independent update policy; [MAD] Alg. 1).

Privacy argument, per method (user-level, add/remove one user with any set):

* after capping, one user touches at most ``max_items`` coordinates;
* ``count_*`` adds 1 to each: l1 sensitivity ``max_items``, l2 ``sqrt(max_items)``;
  ``weighted_laplace`` adds ``1/d``: l1 sensitivity 1; ``weighted_gaussian``
  adds ``1/sqrt(d)``: l2 sensitivity 1;
* Laplace/Gaussian noise of that sensitivity makes the noisy histogram over the
  items of both neighbours (epsilon, 0)- resp. (epsilon, delta/2)-DP;
* items only the added user holds (``t <= max_items`` of them, weight
  ``<= h(t)``) pass the threshold with probability ``<= delta`` (Laplace) resp.
  ``<= delta/2`` (Gaussian) -- see :mod:`dpsql.core.calibration` -- which pays for
  releasing a set whose support depends on the data ([DPSU] Thm 4.1, 5.1).

Only the set of items is released; the noisy weights never leave the query.
"""
from __future__ import annotations

import json
import time
from functools import lru_cache
from typing import Callable, Iterable, Optional, cast

import duckdb
import pyarrow as pa
from duckdb.sqltypes import DOUBLE, VARCHAR

from dpsql.union import policy  # noqa: F401 (dpsql.union.policy loaded with the package)
from dpsql.core import calibration, registry, release, runner
from dpsql.core.errors import engine_errors
from dpsql.core.mechanism import Mechanism, Param, preferred, sql_literal
from dpsql.core.state import current_ledger
from dpsql.core.udf import Udf, scalar
from dpsql.core.inputs import accepts_tables
from dpsql.core.validation import (
    DPParameterError,
    check_column_pair,
    check_delta,
    check_epsilon,
    check_identifier,
    check_max_items,
    check_table_name,
    derived_budget,
)

__all__ = ["METHODS", "DEFAULT_METHOD", "COMMON_PARAMS", "options_of", "check_options", "calibrate", "set_union", "udfs",
           "generated_sql"]


# The set-union methods: the declarations (MECHANISMS) of this package's member modules, found as the
# registry finds every family's (a new method is a new member module, or a declaration in one), in the
# order front ends list them: that of their SQL body files (basic, adaptive, cumulative, policy).
METHODS: dict[str, Mechanism] = {m.name: m for m in registry.declared_in(registry.package_modules(__name__))}

# The parameters every set-union macro shares; dp_set_union passes exactly these on (the others keep
# their defaults there and are reached through the method's own macro).
COMMON_PARAMS = ("tbl", "epsilon", "delta", "max_items", "user_col", "item_col")


def options_of(method: str) -> tuple[str, ...]:
    """The parameters of ``method`` beyond :data:`COMMON_PARAMS` (e.g. MAD2R's split, a policy's alpha)."""
    return tuple(n for n in METHODS[method].param_names if n not in COMMON_PARAMS)


# The most preferred method (Mechanism.preference): the best parallel method measured on the shared real
# datasets (benchmarks/README.md, "Utility"), sips_cumulative. The Spark backend's default is the most
# preferred method it runs (dpsql.frontends.spark.DEFAULT_METHOD).
DEFAULT_METHOD = preferred(METHODS.values())


def generated_sql() -> str:
    """What this family generates at registration beyond the methods' releasing macros: ``dp_set_union``
    (:func:`public_dispatch_sql`), created after them (the registry collects this hook)."""
    return public_dispatch_sql()


def check_method(method: object) -> str:
    """The name of a known set-union method."""
    if not isinstance(method, str) or method not in METHODS:
        raise DPParameterError(
            f"method must be one of {', '.join(sorted(METHODS))} (got {method!r})")
    return method


@lru_cache(maxsize=256)
def _calibrate(method: str, epsilon: float, delta: float, max_items: int) -> calibration.SetUnionCalibration:
    # The user's values are checked (calibrate); the method's rounds and halves are shares of them.
    with derived_budget():
        # every set-union method declares its calibration (Mechanism.calibrate is optional in general)
        calibrate = cast(Callable[..., calibration.SetUnionCalibration], METHODS[method].calibrate)
        return calibrate(epsilon, delta, max_items)


def check_options(method: str, options: Iterable[str]) -> None:
    """Refuse, by name, an option that is not one of ``method``'s own parameters."""
    for name in options:
        if name not in options_of(method):
            valid = ", ".join(options_of(method)) or "none"
            raise DPParameterError(f"{name} does not apply to method {method!r} (its own parameters: {valid}); "
                                   f"leave it out")


def calibrate(method: str, epsilon: float, delta: float, max_items: int) -> calibration.SetUnionCalibration:
    """Validate the parameters of ``method`` and return its noise and threshold."""
    method = check_method(method)
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    max_items = check_max_items(max_items)
    return _calibrate(method, epsilon, delta, max_items)


def udfs(source) -> list[Udf]:
    """Validation and calibration UDFs of the set-union macros (pure: folded when the query is planned)."""

    def set_union_calibration(method, epsilon, delta, max_items, user_col, item_col):
        check_column_pair(user_col, item_col)
        cal = calibrate(method, epsilon, delta, max_items)
        return {"scale": cal.scale, "threshold": cal.threshold}

    def set_union_scale(method, epsilon, delta, max_items):
        return calibrate(method, epsilon, delta, max_items).scale

    def set_union_threshold(method, epsilon, delta, max_items):
        return calibrate(method, epsilon, delta, max_items).threshold

    def release_check(method, bound_json):
        # dp_set_union's check: the chosen method's declaration validates and calibrates the common
        # parameters it has (a method without a cap has no max_items: the dispatcher does not pass it one)
        mech = METHODS[check_method(method)]
        bound = {k: v for k, v in json.loads(bound_json).items() if k in mech.param_names}
        checked = release.check_release(mech, bound)
        release.warn_weak(checked)
        return checked

    def body_sql(method, tbl, epsilon, delta, max_items, user_col, item_col):
        return body_call_sql(method, {"tbl": tbl, "epsilon": epsilon, "delta": delta, "max_items": max_items,
                                      "user_col": user_col, "item_col": item_col})

    d = DOUBLE
    return [
        Udf("dp__set_union_calibration", scalar(set_union_calibration), (VARCHAR, d, d, d, VARCHAR, VARCHAR),
            duckdb.struct_type({"scale": DOUBLE, "threshold": DOUBLE})),
        Udf("dp__set_union_scale", scalar(set_union_scale), (VARCHAR, d, d, d), DOUBLE),
        Udf("dp__set_union_threshold", scalar(set_union_threshold), (VARCHAR, d, d, d), DOUBLE),
        # pure: query() evaluates it once while binding dp__body_set_union (sql/30_union/90_dispatch.sql)
        Udf("dp__set_union_body_sql", scalar(body_sql), (VARCHAR, VARCHAR, d, d, d, VARCHAR, VARCHAR), VARCHAR),
        Udf("dp__set_union_release_check", scalar(release_check), (VARCHAR, VARCHAR), release.check_type()),
    ]



def _table_schema(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, str]]:
    """Column names and types of ``table`` as the macros read it (``query_table``): a table or view name, or a
    file path DuckDB can read (Parquet, CSV, JSON, ...). Reads the schema only, no rows."""
    try:
        rows = con.execute("SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM query_table($1))",
                           [table]).fetchall()
    except duckdb.CatalogException:
        raise DPParameterError(
            f"table {table!r} does not exist: it is neither a table or view of this connection nor a file DuckDB "
            f"can read; pass "
            f"the name of a table or view (as a string, e.g. 'user_items' or 'main.user_items') or a file path "
            f"such as 'events.parquet'") from None
    except duckdb.IOException as exc:
        raise DPParameterError(f"table {table!r}: DuckDB cannot read this file ({str(exc).splitlines()[0]}); "
                               f"pass an existing Parquet/CSV/JSON file or a table name") from None
    return [(str(r[0]), str(r[1])) for r in rows]


def _check_registered(con: object, macro: str) -> None:
    """Refuse, naming the fix, a connection or cursor on which dpsql's macros were not created."""
    if not isinstance(con, duckdb.DuckDBPyConnection):
        raise DPParameterError(f"con must be a DuckDB connection or cursor (got {type(con).__name__}); "
                               f"open one with dpsql.connect()")
    if current_ledger(con) is not None:
        return  # registered by dpsql.register, which creates the macros (the catalog query is not free: benchmarks/README.md)
    found = con.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name = $1", [macro]).fetchall()
    if not found[0][0]:
        raise DPParameterError(
            f"this connection has no dpsql macros ({macro} is missing); call dpsql.register(con) first. TEMP "
            f"macros belong to one connection: each cursor needs its own dpsql.register(cursor)")


def _check_columns(con: duckdb.DuckDBPyConnection, table: str, user_col: str, item_col: str,
                   schema: Optional[list[tuple[str, str]]] = None) -> None:
    """``user_col`` and ``item_col`` are two columns of ``table`` (``schema``: its :func:`_table_schema`, if read)."""
    columns = [name for name, _ in (schema if schema is not None else _table_schema(con, table))]
    check_column_pair(user_col, item_col)
    names = {c.lower() for c in columns}
    for param, col in (("user_col", user_col), ("item_col", item_col)):
        if col.lower() not in names:
            raise DPParameterError(
                f"{param} := {col!r} is not a column of {table!r}; its columns are {', '.join(columns)}. "
                f"Pass {param} := '<column name>'")


@accepts_tables("table")
def set_union(con: duckdb.DuckDBPyConnection, table: str, method: str = DEFAULT_METHOD, *,
              epsilon: float, delta: float, max_items: Optional[int] = None,
              user_col: str = "user_id", item_col: str = "item",
              progress: Optional[Callable[[float], None]] = None, **options: object) -> pa.Table:
    """Release items of ``table`` under user-level (epsilon, delta)-DP.

    ``table`` is what the SQL macros accept as ``tbl``: a table or view name
    (``'user_items'``, ``'main.user_items'``) or a file path DuckDB can read
    (``'events.parquet'``, ``'events.csv'``); or the data itself: a pandas or
    Polars DataFrame, an Arrow table or a DuckDB relation of ``con`` (the scope
    each is charged to: :mod:`dpsql.core.inputs`).

    Runs the SQL macro of ``method`` once on a connection prepared by
    :func:`dpsql.register` and returns the released items as a one-column
    Arrow table (``item``, of the input's type). Every parameter is validated
    (against the method's declaration) before the table is read. ``progress``,
    if given, is called with the engine's completion percentage (0-100) while
    the query runs. ``options`` are the method's own parameters
    (:func:`options`: e.g. MAD2R's ``split``, a policy's ``alpha``); left out,
    they keep the macro's defaults, as does ``max_items=None``.
    """
    method = check_method(method)
    mech = METHODS[method]
    _check_registered(con, mech.macro)
    if progress is not None and not callable(progress):
        raise DPParameterError(f"progress must be a function of one number (0-100) or None (got {progress!r})")
    check_options(method, options)
    given: dict[str, object] = {"tbl": table, "epsilon": epsilon, "delta": delta, "user_col": user_col,
                                "item_col": item_col, **options}
    if max_items is not None:
        if "max_items" not in mech.param_names:
            raise DPParameterError(f"max_items does not apply to method {method!r} (it has no cap); leave it out")
        given["max_items"] = max_items
    # Every parameter checked once, by the declaration; the macro calibrates (its check raises the same
    # dpsql error, before anything is read), so Python does not calibrate a second time.
    values = mech.validate(**given)
    _check_columns(con, values["tbl"], values["user_col"], values["item_col"])
    sql = f"SELECT item FROM {release.call_sql(mech, {k: v for k, v in values.items() if k in given})}"
    if progress is None:
        return release.run(con, sql)
    return _run_with_progress(con, sql, progress)


def _run_with_progress(con: duckdb.DuckDBPyConnection, sql: str, progress: Callable[[float], None]) -> pa.Table:
    """Run ``sql`` with :func:`dpsql.core.runner.run`: progress reported meanwhile (the rounds of a
    multi-round method, the users a policy's kernel has processed: :mod:`dpsql.core.progress`), Ctrl-C
    ordered with the charge."""
    def fetch() -> pa.Table:
        return release.run(con, sql)  # dpsql's own exceptions; the statement bound once

    return runner.run(con, fetch, progress=progress)


# -- the dp_set_union dispatcher, generated from the declarations ---------------------------------------

_DISPATCH_HEADER = """\
-- GENERATED from the set-union declarations (dpsql.union.METHODS) by dpsql.union.dispatch_sql():
-- do not edit; write dpsql.union.dispatch_sql() to sql/30_union/90_dispatch.sql after adding a method
-- (tests/conformance/test_mechanisms.py fails while this file and the declarations disagree).
--
-- dp__body_set_union(tbl, epsilon, delta, method := ...): the BODY of every set-union method, by name,
-- for the releases that use a set union as one of their steps (dp_top_k's domain, dp_group_by's
-- selection) and for dp_set_union: no binding and no charge here, the calling release's wrapper does
-- both for its total. DuckDB's query() evaluates its argument once, while it binds: the pure UDF
-- dp__set_union_body_sql renders the call of the chosen method's body (dpsql.union.body_call_sql,
-- every value a SQL literal), so only that body is bound, planned and run (a UNION ALL of every
-- method's body, pruned by constant filters, was bound and planned whole: ~0.4 s a release).
-- An unknown method is the UDF's error, while binding: before anything is read.
-- query() evaluates even a volatile argument, so the argument's getvariable() makes DuckDB's binder
-- refuse any parameter that is not constant before the text is rendered (the wrappers' binding,
-- sql/00_core/00_release.sql): nothing is read or drawn, a sequence is not advanced.
-- A method's own parameters beyond the common ones keep their defaults here.
"""


def dispatch_sql() -> str:
    """The text of ``sql/30_union/90_dispatch.sql``: ``dp__body_set_union``, the chosen method's body through ``query()``."""
    common = [METHODS[DEFAULT_METHOD].param(n) for n in COMMON_PARAMS]
    method = f"method VARCHAR := {sql_literal(DEFAULT_METHOD)}"
    # DuckDB: a parameter without a default cannot follow one with a default.
    signature = ", ".join([f"{p.name} {p.sql_type}" for p in common if p.required] + [method]
                          + [f"{p.name} {p.sql_type} := {p.sql_default()}" for p in common if not p.required])
    names = ("method",) + COMMON_PARAMS
    bound = "{" + ", ".join(f"'{n}': {n}" for n in names) + "}::VARCHAR"
    return (_DISPATCH_HEADER + f"\nCREATE OR REPLACE TEMP MACRO dp__body_set_union({signature}) AS TABLE\n"
            f"FROM query(CASE WHEN getvariable('dp__bind:' || {bound}) IS NULL OR true\n"
            f"                THEN dp__set_union_body_sql({', '.join(names)}) END);\n")


def body_call_sql(method: object, values: dict[str, object]) -> str:
    """The SQL text of the one set-union body ``dp__body_set_union`` runs: ``method``'s body on ``values``
    (the common parameters, as bound; a method without a cap gets no ``max_items``).

    Every value is a literal (:func:`dpsql.core.release.sql_value`): a table or column name stays data, never SQL text.
    Raises the ``dpsql:`` error naming ``method`` and the valid choices for an unknown method.
    """
    mech = METHODS[check_method(method)]
    args = [release.sql_value("tbl", values["tbl"], mech.param("tbl").sql_type)]
    args += [f"{name} := {release.sql_value(name, values[name], mech.param(name).sql_type)}"
             for name in COMMON_PARAMS[1:] if name in mech.param_names]
    return f"SELECT item FROM {release.body_macro(mech)}({', '.join(args)})"


def public_dispatch_sql() -> str:
    """``dp_set_union(tbl, method := ...)``: one release for every set-union method, by name.

    Generated at registration, like every releasing macro (:func:`dpsql.core.release.release_sql`): it binds
    the common parameters and ``method`` (a constant, like every parameter), checks them by the chosen
    method's declaration (``dp__set_union_release_check``: an unknown method is refused there, before
    anything is read), runs that method's body through ``dp__body_set_union`` (only that body is bound
    and planned) and charges it once, as the method's own macro.
    """
    common = [METHODS[DEFAULT_METHOD].param(n) for n in COMMON_PARAMS]
    method = Param("method", "VARCHAR", DEFAULT_METHOD)
    params = [p for p in common if p.required] + [method] + [p for p in common if not p.required]
    return release.release_sql("dp_set_union", params, "dp__body_set_union",
                               "dp__set_union_release_check(method, {bound})", COMMON_PARAMS)


