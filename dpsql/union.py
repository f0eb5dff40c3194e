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
  ``<= delta/2`` (Gaussian) -- see :mod:`dpsql.calibration` -- which pays for
  releasing a set whose support depends on the data ([DPSU] Thm 4.1, 5.1).

Only the set of items is released; the noisy weights never leave the query.
"""
from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import duckdb
import pyarrow as pa
from duckdb.sqltypes import BOOLEAN, DOUBLE, VARCHAR

from dpsql import adaptive, calibration, policy
from dpsql.udf import Udf, scalar
from dpsql.validation import (
    DPParameterError,
    check_delta,
    check_epsilon,
    check_identifier,
    check_max_items,
    check_table_name,
    derived_budget,
    sql_string,
    warn_weak_parameters,
)

__all__ = ["METHODS", "DEFAULT_METHOD", "SetUnionMethod", "calibrate", "set_union", "udfs"]


@dataclass(frozen=True)
class SetUnionMethod:
    """A set-union mechanism: its SQL macro and its calibration function."""

    name: str
    macro: str
    description: str
    calibrate: Callable[[float, float, int], calibration.SetUnionCalibration]
    # Extra macro parameters the method accepts beyond the common ones (set_union passes them on).
    options: tuple[str, ...] = ()


METHODS: dict[str, SetUnionMethod] = {
    m.name: m
    for m in [
        SetUnionMethod("count_laplace", "dp_set_union_count_laplace",
                       "plain counts of capped users, Laplace noise ([DPSU] Sec. 1.1 baseline)",
                       calibration.count_laplace_calibration),
        SetUnionMethod("count_gaussian", "dp_set_union_count_gaussian",
                       "plain counts of capped users, Gaussian noise ([DPSU] Sec. 1.1 baseline)",
                       calibration.count_gaussian_calibration),
        SetUnionMethod("weighted_laplace", "dp_set_union_weighted_laplace",
                       "weights 1/d per capped user, Laplace noise ([DPSU] App. B)",
                       calibration.weighted_laplace_calibration),
        SetUnionMethod("weighted_gaussian", "dp_set_union_weighted_gaussian",
                       "weights 1/sqrt(d) per capped user, Gaussian noise (WGM, Basic; [DPSU] Thm 5.1)",
                       calibration.weighted_gaussian_calibration),
        SetUnionMethod("mad", "dp_set_union_mad",
                       "MaxAdaptiveDegree: Basic's noise and threshold, excess weight of items far above the "
                       "threshold rerouted to the others ([MAD] Alg. 3)",
                       adaptive.mad_set_union_calibration),
        SetUnionMethod("mad2r", "dp_set_union_mad2r",
                       "MAD in two rounds (budget 0.1/0.9), round two biased by round one's noisy weights "
                       "([MAD] Alg. 4)",
                       adaptive.mad2r_set_union_calibration),
        SetUnionMethod("sips", "dp_set_union_sips",
                       "DP-SIPS: Basic in two rounds (budget 0.1/0.9), round two without round one's items "
                       "(Swanberg et al. 2023)",
                       adaptive.sips_set_union_calibration),
        SetUnionMethod("policy_laplace", "dp_set_union_policy_laplace",
                       "sequential l1-descent towards a cutoff, Laplace noise ([DPSU] Alg. 4)",
                       policy.policy_laplace_calibration, ("alpha", "passes")),
        SetUnionMethod("policy_gaussian", "dp_set_union_policy_gaussian",
                       "sequential l2-descent towards a cutoff, Gaussian noise ([DPSU] Alg. 6)",
                       policy.policy_gaussian_calibration, ("alpha", "passes")),
        SetUnionMethod("greedy_update", "dp_set_union_greedy_update",
                       "sequential greedy fill, most repeated items first, no max_items cap, Laplace noise "
                       "(Carvalho et al. 2022)",
                       policy.greedy_update_calibration, ("alpha",)),
    ]
}

# The best parallel method measured on the real datasets (benchmarks/README.md, "Adaptive methods"):
# MAD2R released the most items at (1, 1e-5, 100); see README "Privacy accounting of multi-round methods".
DEFAULT_METHOD = "mad2r"


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
        return METHODS[method].calibrate(epsilon, delta, max_items)


def calibrate(method: str, epsilon: float, delta: float, max_items: int) -> calibration.SetUnionCalibration:
    """Validate the parameters of ``method`` and return its noise and threshold."""
    method = check_method(method)
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    max_items = check_max_items(max_items)
    return _calibrate(method, epsilon, delta, max_items)


def check_column_pair(user_col: object, item_col: object) -> None:
    """Two non-empty, different column names (whether they exist is the binder's business)."""
    for name, value in (("user_col", user_col), ("item_col", item_col)):
        if value is None or not str(value).strip():
            raise DPParameterError(f"{name} must name a column (got {value!r})")
    if str(user_col).lower() == str(item_col).lower():
        raise DPParameterError("user_col and item_col must name two different columns")


def udfs(source) -> list[Udf]:
    """Validation and calibration UDFs of the set-union macros (pure: folded when the query is planned)."""

    def set_union_calibration(method, epsilon, delta, max_items, user_col, item_col):
        check_column_pair(user_col, item_col)
        cal = calibrate(method, epsilon, delta, max_items)
        warn_weak_parameters(epsilon, delta, what=METHODS[method].macro, stacklevel=1)
        return {"scale": cal.scale, "threshold": cal.threshold}

    def set_union_scale(method, epsilon, delta, max_items):
        return calibrate(method, epsilon, delta, max_items).scale

    def set_union_threshold(method, epsilon, delta, max_items):
        return calibrate(method, epsilon, delta, max_items).threshold

    def check_method_udf(method):
        check_method(method)
        return True

    def method_is(method, candidate):
        # Never raises: for an unknown method every branch of dp_set_union then folds to false and
        # is pruned before execution (nothing drawn, nothing charged); dp__check_method reports it.
        return method == candidate

    d = DOUBLE
    return [
        Udf("dp__set_union_calibration", scalar(set_union_calibration), (VARCHAR, d, d, d, VARCHAR, VARCHAR),
            duckdb.struct_type({"scale": DOUBLE, "threshold": DOUBLE})),
        Udf("dp__set_union_scale", scalar(set_union_scale), (VARCHAR, d, d, d), DOUBLE),
        Udf("dp__set_union_threshold", scalar(set_union_threshold), (VARCHAR, d, d, d), DOUBLE),
        Udf("dp__check_method", scalar(check_method_udf), (VARCHAR,), BOOLEAN),
        Udf("dp__method_is", scalar(method_is), (VARCHAR, VARCHAR), BOOLEAN),
    ]



def _table_columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """Column names of ``table`` as the macros read it (``query_table``): a table or view name, or a
    file path DuckDB can read (Parquet, CSV, JSON, ...). Reads the schema only, no rows."""
    try:
        rows = con.execute("SELECT column_name FROM (DESCRIBE SELECT * FROM query_table($1))", [table]).fetchall()
    except duckdb.CatalogException:
        raise DPParameterError(
            f"table {table!r} does not exist: it is neither a table or view of this connection nor a file DuckDB "
            f"can read; pass "
            f"the name of a table or view (as a string, e.g. 'user_items' or 'main.user_items') or a file path "
            f"such as 'events.parquet'") from None
    except duckdb.IOException as exc:
        raise DPParameterError(f"table {table!r}: DuckDB cannot read this file ({str(exc).splitlines()[0]}); "
                               f"pass an existing Parquet/CSV/JSON file or a table name") from None
    return [str(r[0]) for r in rows]


def _check_registered(con: object, macro: str) -> None:
    """Refuse, naming the fix, a connection or cursor on which dpsql's macros were not created."""
    if not isinstance(con, duckdb.DuckDBPyConnection):
        raise DPParameterError(f"con must be a DuckDB connection or cursor (got {type(con).__name__}); "
                               f"open one with dpsql.connect()")
    found = con.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name = $1", [macro]).fetchall()
    if not found[0][0]:
        raise DPParameterError(
            f"this connection has no dpsql macros ({macro} is missing); call dpsql.register(con) first. TEMP "
            f"macros belong to one connection: each cursor needs its own dpsql.register(cursor)")


def _check_columns(con: duckdb.DuckDBPyConnection, table: str, user_col: str, item_col: str) -> None:
    columns = _table_columns(con, table)
    check_column_pair(user_col, item_col)
    names = {c.lower() for c in columns}
    for param, col in (("user_col", user_col), ("item_col", item_col)):
        if col.lower() not in names:
            raise DPParameterError(
                f"{param} := {col!r} is not a column of {table!r}; its columns are {', '.join(columns)}. "
                f"Pass {param} := '<column name>'")


def set_union(con: duckdb.DuckDBPyConnection, table: str, method: str = DEFAULT_METHOD, *,
              epsilon: float = 1.0, delta: float = 1e-5, max_items: int = 100,
              user_col: str = "user_id", item_col: str = "item",
              progress: Optional[Callable[[float], None]] = None,
              alpha: Optional[float] = None, passes: Optional[int] = None) -> pa.Table:
    """Release items of ``table`` under user-level (epsilon, delta)-DP.

    ``table`` is what the SQL macros accept as ``tbl``: a table or view name
    (``'user_items'``, ``'main.user_items'``) or a file path DuckDB can read
    (``'events.parquet'``, ``'events.csv'``).

    Runs the SQL macro of ``method`` once on a connection prepared by
    :func:`dpsql.register` and returns the released items as a one-column
    Arrow table (``item``, of the input's type). Every parameter is validated
    before the table is read. ``progress``, if given, is called with the
    engine's completion percentage (0-100) while the query runs. ``alpha`` and
    ``passes`` go to the methods that take them (``METHODS[m].options``);
    None keeps the macro's default.
    """
    method = check_method(method)
    _check_registered(con, METHODS[method].macro)
    if progress is not None and not callable(progress):
        raise DPParameterError(f"progress must be a function of one number (0-100) or None (got {progress!r})")
    table = check_table_name(table)
    user_col = check_identifier("user_col", user_col)
    item_col = check_identifier("item_col", item_col)
    calibrate(method, epsilon, delta, max_items)
    options = {"alpha": alpha, "passes": passes}
    extra = ""
    for name, value in options.items():
        if value is not None and name not in METHODS[method].options:
            raise DPParameterError(f"{name} does not apply to method {method!r}; leave it out")
    if alpha is not None:
        extra += f", alpha := {policy.check_alpha(alpha)!r}"
    if passes is not None:
        extra += f", passes := {policy.check_passes(passes)}"
    _check_columns(con, table, user_col, item_col)
    # greedy_update has no cap: its macro takes no max_items.
    cap = "" if method == "greedy_update" else f", max_items := {int(max_items)}"
    sql = (f"SELECT item FROM {METHODS[method].macro}({sql_string(table)}, "
           f"epsilon := {float(epsilon)!r}, delta := {float(delta)!r}{cap}{extra}, "
           f"user_col := {sql_string(user_col)}, item_col := {sql_string(item_col)})")
    if progress is None:
        return con.sql(sql).to_arrow_table()
    if method in policy.POLICIES:  # the kernel reports the share of users processed
        from dpsql.registration import source_of

        relay = policy.ProgressRelay(progress)
        with policy.reporting(source_of(con), relay.kernel):
            return _run_with_progress(con, sql, relay.engine)
    return _run_with_progress(con, sql, progress)


def _run_with_progress(con: duckdb.DuckDBPyConnection, sql: str,
                       progress: Callable[[float], None], interval: float = 0.5) -> pa.Table:
    """Run ``sql`` in a worker thread and report ``con.query_progress()`` meanwhile."""
    result: dict = {}

    def work() -> None:
        try:
            result["table"] = con.sql(sql).to_arrow_table()
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc

    def report(pct: float) -> None:
        # A charged release must reach the caller: a failing callback is reported, not raised.
        nonlocal progress
        if progress is None:
            return
        try:
            progress(pct)
        except Exception as exc:
            warnings.warn(f"dpsql: the progress callback failed ({type(exc).__name__}); progress is no longer "
                          f"reported, the release goes on", RuntimeWarning, stacklevel=3)
            progress = None

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    last = -1.0
    while worker.is_alive():
        worker.join(interval)
        try:
            pct = float(con.query_progress())
        except Exception:  # progress is best effort; the query's own error wins
            pct = -1.0
        if pct >= 0 and pct != last:
            report(pct)
            last = pct
    if "error" in result:
        raise result["error"]
    report(100.0)
    return result["table"]
