"""The parallel set-union mechanisms on a Spark DataFrame of (user, item) rows.

``set_union(df, method, ...)`` runs the set-union methods that declare a Spark form
(:data:`PARALLEL_METHODS`, from ``Mechanism.spark``; ``dpsql mechanisms`` lists them) and
returns a Spark DataFrame with one column ``item`` (the released items);
``top_k_domain`` is the domain step of ``dp_top_k`` / ``dp_hitting_set``;
``group_by`` is ``dp_group_by`` / ``dp_group_by_public`` (selection by a parallel
method or the truncated geometric coin, as dp_group_by's per-setting default resolves it, then every
aggregate of :func:`dpsql.group_by` per group of one item column or of several ``group_cols``, with the
same calibration and noise).
The sequential policies have no parallel form: run them with DuckDB.

The default is the most preferred declaration with a Spark form (:data:`DEFAULT_METHOD`), today
DuckDB's default too: ``sips_cumulative``.

One definition of every stage: the contribution bounding and the pre-noise
weights are the stages of ``sql/00_core/20_contribution_bounding.sql``,
``sql/30_union/10_basic.sql``, ``sql/30_union/20_adaptive.sql``, ``sql/30_union/30_cumulative.sql``
and ``sql/97_groupby/groupby.sql`` marked
``-- dpsql:portable <name>``, translated to Spark SQL by :mod:`dpsql.frontends.portable`
(which refuses unmarked stages); the methods and their options are the
declarations of :mod:`dpsql.core.registry` (``Mechanism.spark``); validation and
calibration are the declarations' checks and the functions of
:mod:`dpsql.core.calibration` / :mod:`dpsql.union.adaptive` / :mod:`dpsql.union.cumulative` (same
numbers, same errors);
noise is :class:`dpsql.core.noise.NoiseSource`, drawn in vectorised Arrow batches.

Privacy argument: the same as the DuckDB macros (``dpsql.union``,
``dpsql.union.adaptive``, ``dpsql.groupby``), given the three properties it relies on, kept here:

* **cap**: each user's distinct items are capped to ``max_items`` by ranking them
  with a 64-bit hash keyed with a secret salt from the secure source (one salt
  per release, drawn on the driver): a uniform sample without replacement that
  depends only on that user's rows. The ranking key is the macros'
  ``hash(xor(hash(user_id, item), s))`` with Spark's 64-bit ``xxhash64`` for
  DuckDB's ``hash``, so the two engines cap differently but identically distributed;
* **noise**: one :class:`NoiseSource` per Spark task, keyed with 256 bits from
  the OS CSPRNG of the executor; never Spark's ``rand()``;
* **one draw per release**: every noisy intermediate that is read twice (MAD2R's
  round-one noisy weights, each DP-SIPS round's released set, each cumulative round's
  noisy weights, from which its released, dropped and tilted items follow) and the returned
  release are materialised once with an eager local checkpoint, so Spark's lazy
  re-evaluation cannot redraw noise (a second draw would be a second release).
  A lost checkpoint block fails the job instead of recomputing it.

The noisy weights never leave the function; only released items are returned.
A ``seed`` makes runs reproducible for tests (up to Spark's row order) and the
release **NOT private**, as ``dpsql.connect(seed=N)``.

Input. A NULL user or item is refused before anything is drawn, with the
:class:`~dpsql.core.validation.DPParameterError` (and the text) DuckDB's macros give,
``dpsql: column user_id (user_col) contains NULL; ...``. The check is one extra
scan of the input's two columns.

Executors. The functions dpsql runs in Spark tasks (the noise of each stage and
MAD2R's UserWeights) are shipped by value: a task imports numpy, pyarrow,
randomgen and pandas, never ``dpsql`` or ``duckdb``, so executors need neither
(the driver's dpsql code runs there, whatever version they have installed). On a
local master (``local``, ``local[N]``, ``local-cluster``), whose Python workers
run on this machine, dpsql's own tasks run with the driver's interpreter
(``sys.executable``) unless ``PYSPARK_PYTHON`` named one when the session was
created: PySpark's default is ``python3`` from ``PATH``, which in a virtualenv
that is not activated lacks the packages. The session is not changed: your own
UDFs still run with ``PYSPARK_PYTHON`` (set it to ``sys.executable`` before
creating the session for them). On a cluster, set ``PYSPARK_PYTHON`` to an
interpreter the executors have.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import threading
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from dpsql.union import adaptive, cumulative
from dpsql.core import calibration
from dpsql import groupby, topk, union
from dpsql.groupby import selection as rules
from dpsql.union.adaptive import user_weights_batch
from dpsql.core.mechanism import preferred
from dpsql.core.registry import set_union_methods
from dpsql.core.noise import NOT_PRIVATE_WARNING, NoiseSource, secure_source
from dpsql.core.ledger import Ledger
from dpsql.frontends import spark_ledger, spark_progress
from dpsql.frontends.spark_ledger import session_ledger
from dpsql.frontends.portable import stage_sql
from dpsql.core.validation import (DPParameterError, check_column_pair, check_identifier, check_max_items,
                              derived_budget, warn_weak_parameters)

__all__ = ["session_ledger", "PARALLEL_METHODS", "DEFAULT_METHOD", "set_union", "top_k_domain", "capped_user_items", "set_union_weights",
           "mad_weights", "mad_biased_weights", "sips_round_weights", "sips_cumulative_sums",
           "sips_cumulative_state", "sips_cumulative_next_rows", "group_by", "group_by_stats",
           "pre_selection_weights", "DEFAULT_SELECTION", "SPARK_SELECTIONS", "truncated_geometric_counts"]

# The methods with a parallel form, as declared (Mechanism.spark); the policies are sequential.
PARALLEL_METHODS = tuple(n for n, m in set_union_methods().items() if m.spark is not None)
# The Spark backend's default: the most preferred method it runs (Mechanism.preference), DuckDB's default
# (dpsql.union.DEFAULT_METHOD) as long as the most preferred declaration has a Spark form.
DEFAULT_METHOD = preferred(set_union_methods()[n] for n in PARALLEL_METHODS)
# group_by's default selection: the one dp_group_by declares (as dpsql.group_by's default): NULL, "per setting",
# resolved by the calibration (dpsql.groupby.default_selection) to the rule it records.
DEFAULT_SELECTION = {m.name: m for m in groupby.MECHANISMS}["group_by"].param("selection").default
_noise_stage = itertools.count(1)


# --------------------------------------------------------------------------
# Plumbing: views for the translated stages, materialisation, noise per task
# --------------------------------------------------------------------------

def _run_stage(macro: str, inputs: Mapping[str, Any], constants: Optional[Mapping[str, object]] = None,
               output: Optional[str] = None):
    """Run the Spark translation of ``macro`` on DataFrames bound to its relations."""
    session = next(iter(inputs.values())).sparkSession
    names = {key: f"dp__spark_{uuid.uuid4().hex}" for key in inputs}
    for key, frame in inputs.items():
        frame.createOrReplaceTempView(names[key])
    try:
        return session.sql(stage_sql(macro, names, constants, output=output))
    finally:  # the analysed plan keeps the views' plans
        for name in names.values():
            session.catalog.dropTempView(name)


def _one_row(session, row: Mapping[str, float]):
    """A one-row relation of parameters, marked for broadcast (the stages CROSS JOIN it with the rows)."""
    from pyspark.sql import functions as F

    # Literals, not createDataFrame of a Python list: that would run a Python task (another interpreter).
    return F.broadcast(session.range(1).select(*(F.lit(float(v)).cast("double").alias(k) for k, v in row.items())))


def _materialise(frame):
    """Evaluate ``frame`` once; later reads see these rows (noise is not redrawn).

    An eager local checkpoint, not ``persist()``: the translated SQL reads its inputs through
    temporary views, and Spark's cache lookup did not match them (the plans showed every read of
    a persisted input recomputed from the source), while a checkpoint cuts the lineage.
    """
    return frame.localCheckpoint(eager=True)


# PySpark's worker interpreter when PYSPARK_PYTHON is not set (SparkContext.pythonExec).
_SPARK_DEFAULT_PYTHON = "python3"
_shipping_lock = threading.RLock()


def _local_context(session):
    """The SparkContext of ``session`` if its Python workers run here with PySpark's default interpreter."""
    try:
        sc = session.sparkContext
    except Exception:  # Spark Connect: no driver-side context, the server picks the interpreter
        return None
    if not str(sc.master).startswith("local") or sc.pythonExec != _SPARK_DEFAULT_PYTHON:
        return None
    return sc


@contextmanager
def _by_value():
    """While held, PySpark pickles dpsql's functions and classes by value (tasks never import dpsql)."""
    from pyspark import cloudpickle

    with _shipping_lock:
        registered = "dpsql" in cloudpickle.list_registry_pickle_by_value()
        if not registered:
            cloudpickle.register_pickle_by_value(sys.modules["dpsql"])
        try:
            yield
        finally:
            if not registered:
                cloudpickle.unregister_pickle_by_value(sys.modules["dpsql"])


@contextmanager
def _shipping(session):
    """Around the creation of a Python UDF of dpsql (PySpark pickles it then and records the interpreter).

    The function goes by value (:func:`_by_value`) and, on a local master with PySpark's default
    interpreter, is run by ``sys.executable``; the session's setting is restored on exit.
    """
    with _by_value():
        sc = _local_context(session)
        if sc is None:
            yield
            return
        previous, sc.pythonExec = sc.pythonExec, sys.executable
        try:
            yield
        finally:
            sc.pythonExec = previous


def _task_source(seed: Optional[int], stage: int) -> NoiseSource:
    """The noise source of one Spark task: OS CSPRNG keyed, or derived from (seed, stage, partition)."""
    if seed is None:
        return NoiseSource()
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    return NoiseSource(int(np.random.SeedSequence([seed, stage, partition]).generate_state(1, np.uint64)[0]))


@dataclass(frozen=True)
class _Noise:
    kind: str          # "gaussian" or "laplace" (a NoiseSource method)
    scale: float       # standard deviation / Laplace b
    threshold: float   # release if noisy > threshold (strict) or >= threshold
    strict: bool


def _noise_task(noise: _Noise, seed: Optional[int], stage: int,
                keep_all: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function of :func:`_noisy`: numpy, pyarrow and (by value) :class:`NoiseSource` only."""
    kind, scale, threshold, strict = noise.kind, float(noise.scale), float(noise.threshold), noise.strict

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        source = _task_source(seed, stage)
        draw = getattr(source, kind)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            w = batch.column(batch.schema.get_field_index("w")).to_numpy(zero_copy_only=False)
            noisy = w + draw(np.full(len(w), scale))
            items = batch.column(batch.schema.get_field_index("item"))
            if keep_all:
                yield pa.RecordBatch.from_arrays([items, pa.array(noisy, pa.float64())], ["item", "noisy"])
            else:
                passed = noisy > threshold if strict else noisy >= threshold
                yield pa.RecordBatch.from_arrays([items.filter(pa.array(passed))], ["item"])

    return run


def _noisy(weights, noise: _Noise, seed: Optional[int], keep_all: bool = False):
    """``(item[, noisy])`` of the rows of ``weights`` (item, w) whose ``w + noise`` passes the threshold.

    With ``keep_all`` every row is returned with its noisy weight (MAD2R's round one, internal only).
    """
    from pyspark.sql.types import DoubleType, StructField, StructType

    item_field = weights.schema["item"]
    fields = [StructField("item", item_field.dataType, item_field.nullable)]
    if keep_all:
        fields.append(StructField("noisy", DoubleType(), False))
    run = _noise_task(noise, seed, next(_noise_stage), keep_all)
    with _shipping(weights.sparkSession):
        return weights.select("item", "w").mapInArrow(run, StructType(fields))


# --------------------------------------------------------------------------
# Input and contribution bounding
# --------------------------------------------------------------------------

def _null_message(col: str, param: str) -> str:
    # The text of dp__user_items (sql/00_core/20_contribution_bounding.sql).
    what = "users" if param == "user_col" else "items"
    return f"dpsql: column {col} ({param}) contains NULL; filter NULL {what} out first, e.g. with a view"


def _group_null_message(group_cols: Sequence[str]) -> str:
    # The text of dp__group_key_value_rows (sql/97_groupby/groupby.sql).
    return (f"dpsql: a column of group_cols ({', '.join(group_cols)}) contains NULL; filter NULL groups out first, "
            f"e.g. with a view")


def _checked_rows(df, user_col: str, item_col: str, value_col: Optional[str] = None,
                  group_cols: Optional[Sequence[str]] = None):
    """(user_id, item[, v]) per row of ``df``: ``dp__user_item_rows`` (with ``value_col``: ``dp__user_item_value_rows``;
    with ``group_cols``: ``dp__group_key_value_rows``).

    Built here, in Python: column lookup (a ``value_col`` must be numeric, as the macro's binder
    requires), then one scan that refuses a NULL user or item with DuckDB's error, before anything
    is drawn. ``v`` is the value as DOUBLE; a NULL value stays NULL and the sum skips it.

    With ``group_cols`` the key ``item`` is a struct of those columns, named as in ``df`` and in its
    column order (the macro's key is their JSON text in the table's order): each column a key by
    identity, so two keys are equal exactly when every column is; a NULL in any of them is refused
    with the macro's text. ``item_col`` is then not read.
    """
    from pyspark.sql import functions as F

    user_col = check_identifier("user_col", user_col)
    if group_cols is None:
        item_col = check_identifier("item_col", item_col)
        check_column_pair(user_col, item_col)
        checked = [("user_col", user_col), ("item_col", item_col)]
    else:
        checked = [("user_col", user_col)] + [("group_cols", check_identifier("group_cols", g)) for g in group_cols]
    if value_col is not None:
        checked.append(("value_col", check_identifier("value_col", value_col)))
    columns = {c.lower(): c for c in df.columns}
    for param, col in checked:
        if col.lower() not in columns:
            raise DPParameterError(f"{param} := {col!r} is not a column of the DataFrame; its columns are "
                                   f"{', '.join(df.columns)}")

    if value_col is not None:
        # As the macro's `+ 0::DOUBLE`: a numeric column (the schema), whose NULLs the sum skips.
        kind = df.schema[columns[value_col.lower()]].dataType
        if not isinstance(kind, _numeric_types()):
            raise DPParameterError(f"value_col := {value_col!r} has type {kind.simpleString()}, not a number; "
                                   f"convert it first, e.g. with a cast to double")
    keys = [(param, col) for param, col in checked if param != "value_col"]
    for param, col in keys:  # by identity, as the SQL readers (sql/00_core/15_checks.sql): on the schema, no rows read
        problem = _key_type_problem(df.schema[columns[col.lower()]].dataType)
        if problem:
            raise DPParameterError(f"{param} := {col!r} has type {df.schema[columns[col.lower()]].dataType.simpleString()}, "
                                   f"which cannot be a grouping key: {problem}")

    # Checked here, in Python, because a raise_error inside the job reaches the driver as a Java stack
    # trace whose exception type depends on the plan (and whose text may lack the message).
    nulls = df.select(*(F.max(F.col(f"`{columns[col.lower()]}`").isNull().cast("int")).alias(f"k{i}")
                        for i, (param, col) in enumerate(keys))).first()
    messages = [_null_message(col, param) if param != "group_cols" else _group_null_message(group_cols or ())
                for param, col in keys]
    for i, message in enumerate(messages):
        if nulls is not None and nulls[f"k{i}"]:
            raise DPParameterError(message)

    def not_null(col: str, message: str):
        # A guard for input that changes between the check and the release (e.g. a non-deterministic source).
        return F.coalesce(F.col(f"`{columns[col.lower()]}`"), F.raise_error(F.lit(message)))

    selected = [not_null(keys[0][1], messages[0]).alias("user_id")]
    if group_cols is None:
        selected.append(not_null(keys[1][1], messages[1]).alias("item"))
    else:
        wanted = {g.lower() for g in group_cols}
        selected.append(F.struct(*(not_null(c, messages[1]).alias(c) for c in df.columns
                                   if c.lower() in wanted)).alias("item"))
    if value_col is not None:
        selected.append(F.col(f"`{columns[value_col.lower()]}`").cast("double").alias("v"))
    return df.select(*selected)


def _key_type_problem(kind) -> Optional[str]:
    """Why a key (user or item) of Spark type ``kind`` does not group by identity, or None.

    As ``dp__key_type_problem`` (sql/00_core/15_checks.sql): equal values that print differently would release
    whichever private row's spelling came first. Binary strings, integers, decimals, dates, timestamps,
    booleans and binaries are exact; a collated string (Spark 4's ``UTF8_LCASE``, ...), a float or double
    (-0.0 = 0.0, NaN), an interval, and a nested value holding any of those or a string are refused.
    """
    from pyspark.sql import types as T

    fix = "cast it first, e.g. to a binary-collated string or a decimal"
    if isinstance(kind, T.StringType):
        collation = getattr(kind, "collation", "UTF8_BINARY")
        return None if collation == "UTF8_BINARY" else f"under collation {collation} equal strings print differently; {fix}"
    if isinstance(kind, (T.FloatType, T.DoubleType)):
        return f"equal floating-point values print differently (-0.0 = 0.0, NaN); {fix}"
    if isinstance(kind, (T.ArrayType, T.MapType, T.StructType)):
        children = ([kind.elementType] if isinstance(kind, T.ArrayType) else
                    [kind.keyType, kind.valueType] if isinstance(kind, T.MapType) else [f.dataType for f in kind.fields])
        if any(isinstance(c, T.StringType) or _key_type_problem(c) for c in children):
            return f"a nested value holding strings or floating-point numbers may hold equal values that print differently; {fix}"
        return None
    exact = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType, T.DateType, T.TimestampType,
             T.TimestampNTZType, T.BooleanType, T.BinaryType)
    return None if isinstance(kind, exact) else f"dpsql does not know that equal {kind.simpleString()} values print alike; {fix}"


def _numeric_types() -> tuple[type, ...]:
    from pyspark.sql import types as T

    return (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType)


def _user_items(df, user_col: str, item_col: str):
    """``dp__user_items``: distinct (user_id, item) pairs; a NULL user or item raises DuckDB's error first.

    The rows of ``dp__user_item_rows`` are :func:`_checked_rows`; the pairs are the translated macro.
    """
    return _run_stage("dp__user_items", {"dp__user_item_rows": _checked_rows(df, user_col, item_col)})


def _salt_relation(session, salt: int):
    """The one-row ``dp__salt`` (column ``s``) of the capping macros, for the salt drawn on the driver."""
    from pyspark.sql import functions as F

    return F.broadcast(session.range(1).select(F.lit(int(salt)).cast("long").alias("s")))


def capped_user_items(pairs, max_items: int, salt: int, *, window: bool = False):
    """(user_id, item, d) with each user's distinct items capped to ``max_items``: ``dp__capped_user_items``.

    The translated macro (``window``: ``dp__capped_user_items_window``, the same rows for one salt)
    with its ``dp__salt`` bound to ``salt``: a user with more items keeps the ``max_items`` of
    smallest ``hash(xor(hash(user_id, item), s))``, a uniform sample without replacement that depends
    only on the user's rows and the secret salt. ``d`` is the capped degree.
    """
    max_items = check_max_items(max_items)
    return _run_stage("dp__capped_user_items_window" if window else "dp__capped_user_items",
                      {"dp__user_items": pairs, "dp__salt": _salt_relation(pairs.sparkSession, salt)},
                      {"max_items": max_items})


# --------------------------------------------------------------------------
# Pre-noise stages (translated macros). NOT releases: exact aggregates of the data.
# --------------------------------------------------------------------------

def set_union_weights(capped, weighting: str):
    """``dp__set_union_weights``: (item, w) of capped rows (user_id, item, d); weighting count/inverse/inverse_sqrt."""
    if weighting not in ("count", "inverse", "inverse_sqrt"):
        raise DPParameterError(f"weighting must be count, inverse or inverse_sqrt (got {weighting!r})")
    return _run_stage("dp__set_union_weights", {"dp__capped_user_items": capped}, {"weighting": weighting})


def _mad_stage(rows, params: Mapping[str, float]):
    """``dp__mad_stage`` on rows (user_id, item, d, uw) with (tau, alpha, min_degree, max_degree)."""
    return _run_stage("dp__mad_stage", {"rows_rel": rows, "params_rel": _one_row(rows.sparkSession, params)})


def _user_weight_rows(biased, b_min: float, b_max: float):
    """``dp__user_weight_rows``: (user_id, item, d, uw) of rows (user_id, item, b) ([MAD] Alg. 2).

    The closed form (b_min * b_max >= 1) is the translated macro; otherwise Alg. 2's loop runs in
    :func:`dpsql.union.adaptive.user_weights_batch` (the function behind DuckDB's ``dp__user_weights``), one
    pandas group per user.
    """
    if b_min * b_max >= 1.0:
        return _run_stage("dp__user_weight_rows", {"rows_rel": biased}, {"b_min": b_min, "b_max": b_max})

    schema = (f"user_id {biased.schema['user_id'].dataType.simpleString()}, "
              f"item {biased.schema['item'].dataType.simpleString()}, d long, uw double")
    with _shipping(biased.sparkSession):
        return biased.groupBy("user_id").applyInPandas(_user_weights_task(b_min, b_max), schema)


def _user_weights_task(b_min: float, b_max: float):
    """The applyInPandas function of :func:`_user_weight_rows` (one user's rows): numpy and pandas only."""
    b_min, b_max = float(b_min), float(b_max)

    def per_user(frame):
        b = frame["b"].to_numpy(dtype=np.float64)
        uw = user_weights_batch(b, np.array([0, len(b)]), b_min, b_max)
        return frame.assign(d=len(b), uw=uw)[["user_id", "item", "d", "uw"]]

    return per_user


def _mad_params(tau: object, max_adaptive_degree: object, max_items: object, b_min: object, b_max: object) -> dict:
    """MAD's parameters, from the function behind ``dp__mad_parameters``."""
    row = adaptive.mad_parameters(tau, max_adaptive_degree, max_items, b_min, b_max)
    return {k: row[k] for k in ("tau", "alpha", "min_degree", "max_degree")}


def mad_weights(capped, tau: float, max_adaptive_degree: int = 50, max_items: int = 100):
    """``dp__mad_weights`` on capped rows (user_id, item, d): (item, w, w_init, w_trunc, w_reroute). Testing/audit."""
    params = _mad_params(tau, max_adaptive_degree, max_items, 1.0, 1.0)
    rows = _run_stage("dp__body_set_union_mad", {"dp__capped_user_items_window": capped}, output="dp__mad_rows")
    return _mad_stage(rows, params)


def mad_biased_weights(rows, tau: float, max_adaptive_degree: int = 50, b_min: float = 0.5, b_max: float = 2.0):
    """``dp__mad_biased_weights`` on capped rows (user_id, item, b): biased MAD as in MAD2R's round two."""
    params = _mad_params(tau, max_adaptive_degree, max_adaptive_degree, b_min, b_max)
    return _mad_stage(_user_weight_rows(rows.select("user_id", "item", "b"), b_min, b_max), params)


def sips_round_weights(rows, removed):
    """One DP-SIPS round's Basic weights (item, w) on rows (user_id, item) minus the items of ``removed``."""
    return _run_stage("dp__sips_round", {"rows_rel": rows.select("user_id", "item"),
                                         "removed_rel": removed.select("item")}, output="dp__sr_weights")


def _round_constants(c: cumulative.CumulativeParameters, r: int) -> dict[str, object]:
    """Round ``r``'s calibration, the constants of its stages (as DuckDB's body writes them in: literals)."""
    return {"share": c.share[r - 1], "cumulative_share": c.cumulative_share[r - 1], "sigma": c.sigma[r - 1],
            "rho": c.rho[r - 1], "drop_below": c.drop_below[r - 1], "max_boost": c.max_boost,
            "mean_sigma": c.mean_sigma[r - 1], "last_rho": c.rho[-1], "tilt": c.tilt}


def sips_cumulative_sums(rows, prev, c: cumulative.CumulativeParameters, r: int):
    """Round ``r``'s pre-noise sums (item, y) of ``sips_cumulative``: the stage ``dp__scr_sums``. NOT a release.

    ``rows`` (user_id, item, p FLOAT) the live rows with their tilts, ``prev`` (item, z, passed,
    dropped) the previous round's state (empty in round one), ``c`` the parameters
    (:func:`dpsql.union.cumulative.sips_cumulative_parameters`). ``y`` adds each live row's
    ``least(1, max_boost/sqrt(e_u), p/sqrt(S_u))`` and the item's ``z_prev / share[r]``. Testing/audit.
    """
    return _run_stage("dp__sips_cumulative_round", {"rows_rel": rows.select("user_id", "item", "p"),
                                                    "prev_rel": prev.select("item", "z", "passed", "dropped")},
                      _round_constants(c, r), output="dp__scr_sums")


def sips_cumulative_state(noisy, c: cumulative.CumulativeParameters, r: int):
    """(item, z, passed, dropped) of round ``r`` from its noisy sums (item, noisy): the stage ``dp__scr_state``."""
    return _run_stage("dp__sips_cumulative_round", {"dp__scr_noisy": noisy.select("item", "noisy")},
                      _round_constants(c, r), output="dp__scr_state")


def sips_cumulative_next_rows(rows, state, c: cumulative.CumulativeParameters, r: int):
    """Round ``r + 1``'s rows (user_id, item, p): ``dp__sips_cumulative_next`` with its tilt ``dp__sips_cumulative_tilt``,
    or without dropping (``c.plain``) ``dp__sips_cumulative_next_plain``.

    ``rows`` round ``r``'s rows, ``state`` its (item, z, passed, dropped). Also round two's rows
    (``r = 1``): DuckDB's ``dp__sips_cumulative_next_first`` gives the same rows under 32-bit ids.
    """
    rows = rows.select("user_id", "item", "p")
    state = state.select("item", "z", "passed", "dropped")
    if c.plain:
        return _run_stage("dp__sips_cumulative_next_plain", {"rows_rel": rows, "z_rel": state})
    constants = _round_constants(c, r)
    tilt = _run_stage("dp__sips_cumulative_tilt", {"z_rel": state}, constants)
    return _run_stage("dp__sips_cumulative_next", {"rows_rel": rows, "z_rel": state, "dp__sips_cumulative_tilt": tilt},
                      constants)


# --------------------------------------------------------------------------
# Releases
# --------------------------------------------------------------------------

_options_of = union.options_of


def _validated(method: str, common: Mapping[str, object], options: Mapping[str, object]) -> dict:
    """Every parameter of ``method`` checked by its declaration (defaults filled in), as dpsql.set_union does.

    The declaration without ``tbl``: the DataFrame is not a table name.
    """
    mech = set_union_methods()[method]
    union.check_options(method, options)
    without_tbl = dataclasses.replace(mech, params=tuple(p for p in mech.params if p.name != "tbl"))
    return without_tbl.validate(**common, **options)


def _weighting(method: str) -> str:
    """The one-shot weighting ``method`` declares (Mechanism.weighting)."""
    weighting = set_union_methods()[method].weighting
    if weighting is None:
        raise DPParameterError(f"method {method!r} has no one-shot weighting")
    return weighting


def _release_one_shot(capped, cal: calibration.SetUnionCalibration, seed, method: str):
    weights = set_union_weights(capped, _weighting(method))
    return _noisy(weights, _Noise(cal.noise, cal.scale, cal.threshold, strict=True), seed)


def _release_biased_round(capped, r: adaptive.MadRound, seed, method: str):
    rows = _run_stage("dp__body_set_union_mad", {"dp__capped_user_items_window": capped}, output="dp__mad_rows")
    weights = _mad_stage(rows, r.sql_row())
    return _noisy(weights, _Noise("gaussian", r.sigma, r.rho, strict=False), seed)


def _release_two_rounds(capped, c: adaptive.Mad2rCalibration, seed, method: str):
    session = capped.sparkSession
    cal = _one_row(session, {**c.round1.sql_row("1"), **c.round2.sql_row("2"),
                             "lower_offset": c.lower_offset, "upper_offset": c.upper_offset})
    rows = _materialise(_run_stage("dp__body_set_union_mad2r", {"dp__capped_user_items_window": capped}, output="dp__m2_rows"))
    # Round one's noisy weights: drawn once, read twice (the release and round two's biases).
    noisy1 = _materialise(_noisy(_mad_stage(rows, c.round1.sql_row()),
                                 _Noise("gaussian", c.round1.sigma, 0.0, strict=False), seed, keep_all=True))
    spark_progress.step(1, 2)
    released1 = noisy1.where(noisy1["noisy"] >= c.round1.rho).select("item")
    items2 = _run_stage("dp__body_set_union_mad2r", {"dp__m2_noisy1": noisy1, "dp__m2_cal": cal}, output="dp__m2_items2")
    biased = _run_stage("dp__body_set_union_mad2r", {"dp__m2_rows": rows, "dp__m2_items2": items2},
                        output="dp__m2_biased")
    rows2 = _materialise(_user_weight_rows(biased, c.round2.b_min, c.round2.b_max))  # read 3 times
    released2 = _noisy(_mad_stage(rows2, c.round2.sql_row()),
                       _Noise("gaussian", c.round2.sigma, c.round2.rho, strict=False), seed)
    return released1.unionByName(released2)


def _release_peeling_rounds(capped, rounds: Sequence[calibration.RoundCalibration], seed, method: str):
    rows = _run_stage("dp__body_set_union_sips", {"dp__capped_user_items_window": capped}, output="dp__s_rows")
    removed = rows.select("item").limit(0)
    released = []
    for done, r in enumerate(rounds, 1):
        weights = sips_round_weights(rows, removed)
        # Each round's set is drawn once: it is both output and removed from the later rounds.
        out = _materialise(_noisy(weights, _Noise("gaussian", r.scale, r.threshold, strict=False), seed))
        released.append(out)
        removed = removed.unionByName(out)
        spark_progress.step(done, len(rounds))
    result = released[0]
    for out in released[1:]:
        result = result.unionByName(out)
    return result


def _release_cumulative_rounds(capped, c: cumulative.CumulativeParameters, seed, method: str):
    """``dp__body_set_union_sips_cumulative``'s rounds (``dp__sips_cumulative_rounds``) as translated stages, the noise
    drawn here.

    Round ``r``: the sums of the live rows (:func:`sips_cumulative_sums`), one Gaussian draw per item
    (``sigma[r]``), then the state (passed, dropped) and the next round's rows and tilts. The noisy
    sums are materialised once a round: the state, the release and every later round read them.
    """
    rows = _run_stage("dp__sips_cumulative_rounds", {"dp__capped_user_items_window": capped}, output="dp__sc_rows1")
    state = rows.select("item").limit(0).selectExpr("item", "CAST(0.0 AS DOUBLE) AS z", "false AS passed",
                                                    "false AS dropped")
    released = []
    for r in range(1, c.rounds + 1):
        sums = sips_cumulative_sums(rows, state, c, r)
        noisy = _materialise(_noisy(sums.select("item", sums["y"].alias("w")),
                                    _Noise("gaussian", c.sigma[r - 1], 0.0, strict=False), seed, keep_all=True))
        state = _materialise(sips_cumulative_state(noisy, c, r))
        released.append(state.where("passed").select("item"))
        if r < c.rounds:  # the rows of a round are stored, as the macro's (they shrink as items leave)
            rows = _materialise(sips_cumulative_next_rows(rows, state, c, r))
        spark_progress.step(r, c.rounds)
    result = released[0]
    for out in released[1:]:
        result = result.unionByName(out)
    return result


# The Spark releases a declaration can name (SparkForm.release), by the shape of the release: each takes
# the capped rows, the calibration, the seed and the method's name. "one_shot" (weights, noise, threshold)
# reads the capped rows once; the others run translated adaptive stages, which read them several times:
# "biased_round" (one round of MAD's rerouted weights), "two_rounds" (a round, then one biased by its
# noisy weights), "peeling_rounds" (rounds on the items no earlier round released), "cumulative_rounds"
# (rounds whose noisy weights add up per item: released, dropped or tilted by the running mean).
RELEASES: dict[str, Callable[..., Any]] = {"one_shot": _release_one_shot, "biased_round": _release_biased_round,
                                           "two_rounds": _release_two_rounds,
                                           "peeling_rounds": _release_peeling_rounds,
                                           "cumulative_rounds": _release_cumulative_rounds}


def _set_union_plan(method: str, epsilon: float, delta: float, max_items: int, user_col: str, item_col: str,
                    options: Mapping[str, object]) -> tuple[str, dict, Any]:
    """The method, its validated parameters and its calibration: every check before any row is read."""
    method = union.check_method(method)
    if method not in PARALLEL_METHODS:
        raise DPParameterError(f"method {method!r} has no Spark form; the Spark backend runs "
                               f"{', '.join(PARALLEL_METHODS)} (run {method} with DuckDB)")
    values = _validated(method, {"epsilon": epsilon, "delta": delta, "max_items": max_items,
                                 "user_col": user_col, "item_col": item_col}, options)
    epsilon, delta, max_items = values["epsilon"], values["delta"], values["max_items"]
    union.calibrate(method, epsilon, delta, max_items)  # as dpsql.set_union: the method at its defaults
    form = set_union_methods()[method].spark
    assert form is not None  # a PARALLEL_METHODS method
    if form.calibrate is not None:
        cal = form.calibrate(epsilon, delta, max_items, **{n: values[n] for n in _options_of(method)})
    else:
        cal = union.calibrate(method, epsilon, delta, max_items)
    return method, values, cal


def _rounds(cal: Any) -> int:
    """The rounds of a release with calibration ``cal`` (its progress steps, :func:`spark_progress.step`, each
    reported by the release when done): a cumulative DP-SIPS calibration's, MAD2R's two, the length of
    DP-SIPS's list of rounds, else one."""
    if isinstance(cal, cumulative.CumulativeParameters):
        return cal.rounds
    if isinstance(cal, adaptive.Mad2rCalibration):
        return 2
    if isinstance(cal, (list, tuple)):
        return len(cal)
    return 1


def _set_union_run(df, method: str, values: Mapping[str, Any], cal: Any, seed: Optional[int], pairs=None):
    """The Spark jobs of a set-union release planned by :func:`_set_union_plan` (charged by the caller).

    ``pairs``: the distinct (user_id, item) rows of ``df`` if the caller has them (group_by's keys), else read here.
    """
    form = set_union_methods()[method].spark
    assert form is not None
    spark_progress.step(0, _rounds(cal))  # the input's check and the cap count in the first round
    release = RELEASES[form.release]
    max_items = values["max_items"]
    if pairs is None:
        pairs = _user_items(df, values["user_col"], values["item_col"])
    if seed is not None:
        warnings.warn(NOT_PRIVATE_WARNING, stacklevel=3)
        salt = NoiseSource(int(seed)).salt()
    else:
        salt = secure_source().salt()
    if form.release == "one_shot":
        released = release(capped_user_items(pairs, max_items, salt), cal, seed, method)
    else:  # the adaptive stages read the capped rows several times: cap once (the macros' window form)
        capped = _materialise(capped_user_items(pairs, max_items, salt, window=True))
        released = release(capped, cal, seed, method)
    # Sorted: the partitions' order depends on the data (README, "What a release shows").
    return _materialise(released.orderBy("item"))


def _recorded(values: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """What the ledger records as a release's parameters: all but epsilon and delta (recorded apart)."""
    return {**more, **{k: v for k, v in values.items() if k not in ("epsilon", "delta")}}


def set_union(df, method: str = DEFAULT_METHOD, *, epsilon: float, delta: float,
              max_items: int = 100, user_col: str = "user_id", item_col: str = "item",
              seed: Optional[int] = None, ledger: Union[None, str, os.PathLike, Ledger] = None,
              scope: Optional[str] = None, progress: Optional[Callable[[float], None]] = None, **options):
    """Release items of the Spark DataFrame ``df`` under user-level (epsilon, delta)-DP.

    The Spark counterpart of :func:`dpsql.set_union` for the parallel methods
    (:data:`PARALLEL_METHODS`); ``options`` are the method's own parameters as
    declared (e.g. MAD2R's ``split``, ``max_adaptive_degree``, ``beta``, ``b_min``,
    ``b_max``, ``c_lb``, ``c_ub``). Every parameter is validated, and every budget that
    applies checked, before any Spark job runs. Charged once to ``ledger`` (a ledger file, as
    DuckDB's; default the session's in-memory ledger) for the files ``df`` reads, or for
    ``scope`` (:mod:`dpsql.frontends.spark_ledger`). Returns a materialised DataFrame with one
    column ``item`` (the input's type). ``seed`` is for tests only: the release is then NOT private.
    ``progress``, if given, is called with the release's progress in percent, as by :func:`dpsql.set_union`
    (the rounds done of a multi-round method, the tasks done of its Spark jobs:
    :mod:`dpsql.frontends.spark_progress`). A Spark failure (e.g. a task failing on an executor) raises
    dpsql's ``InputError`` without Spark's message (it may quote the data); nothing is charged.
    """
    progress = spark_progress.check_progress(progress)
    method, values, cal = _set_union_plan(method, epsilon, delta, max_items, user_col, item_col, options)
    warn_weak_parameters(values["epsilon"], values["delta"], what=set_union_methods()[method].macro, stacklevel=2)
    return spark_ledger.charged(df, ledger=ledger, scope=scope, mechanism=set_union_methods()[method].macro,
                                epsilon=values["epsilon"], delta=values["delta"],
                                parameters=_recorded(values, method=method), calibration=cal,
                                seeded=seed is not None, release=lambda: _set_union_run(df, method, values, cal, seed),
                                progress=progress)


def top_k_domain(df, k: int, *, epsilon: float, delta: float, max_items: int = 100,
                 domain_method: str = topk.DEFAULT_DOMAIN_METHOD, user_col: str = "user_id",
                 item_col: str = "item", seed: Optional[int] = None,
                 ledger: Union[None, str, os.PathLike, Ledger] = None, scope: Optional[str] = None,
                 progress: Optional[Callable[[float], None]] = None):
    """The domain step of ``dp_top_k`` / ``dp_hitting_set``: ``domain_method`` at (epsilon/2, delta/2).

    The same budget split and validation as :func:`dpsql.topk.top_k_calibration` ([MM] Alg. 2); the
    selection step (epsilon/2, delta/2) is left to the caller, e.g. on the (small) domain in DuckDB.
    """
    cal = topk.top_k_calibration(k, epsilon, delta, max_items, domain_method)
    # charged as the set-union release it is, at the domain step's (epsilon/2, delta/2)
    return set_union(df, cal.domain_method, epsilon=cal.domain_epsilon, delta=cal.domain_delta,
                     max_items=max_items, user_col=user_col, item_col=item_col, seed=seed, ledger=ledger,
                     scope=scope, progress=progress)


# --------------------------------------------------------------------------
# Private GROUP BY (dp_group_by, dp_group_by_public)
# --------------------------------------------------------------------------

def _group_by_cal_relation(session, cal: groupby.GroupByCalibration):
    """The one-row ``dp__cal`` the group-by stages read: every field of ``dpsql.groupby._cal_row`` (NULL: a
    measurement not made), with its declared type (``gaussian`` a boolean, ``selection`` a string, the rest
    doubles)."""
    from pyspark.sql import functions as F

    row = groupby._cal_row(cal)
    spark_kind = {"BOOLEAN": "boolean", "VARCHAR": "string"}
    kinds = {k: spark_kind.get(str(t).upper(), "double") for k, t in groupby._CAL_FIELDS.items()}
    cast = {"boolean": bool, "string": str, "double": float}
    return F.broadcast(session.range(1).select(*(
        F.lit(None if v is None else cast[kinds[k]](v)).cast(kinds[k]).alias(k)
        for k, v in ((k, row.get(k)) for k in kinds))))


def group_by_kept(rows, selected, max_items: int, salt: int, max_groups: Optional[int] = None):
    """(user_id, item, v, r) of the selected groups: the stage ``dp__kept`` of ``dp_group_by`` (its aggregate step,
    ``dp__group_by_aggregates``). NOT a release.

    ``rows`` (user_id, item, v), ``selected`` (item). Per (user, selected group) the user's total ``v`` of
    the values (NULL if all are NULL) and its number of rows ``r``; each user keeps at most ``max_groups``
    (None: ``max_items``) of its selected groups, ranked by ``hash(xor(hash(user_id, item), s))`` with
    ``s = salt`` (as the cap of :func:`capped_user_items`). Testing/audit.
    """
    max_items = check_max_items(max_items)
    if "v" not in rows.columns:
        from pyspark.sql import functions as F

        rows = rows.withColumn("v", F.lit(None).cast("double"))
    return _run_stage("dp__group_by_aggregates",
                      {"value_rows": rows.select("user_id", "item", "v"),
                       "groups": selected.select("item"), "salt": _salt_relation(rows.sparkSession, salt)},
                      {"max_items": max_items, "max_groups": max_items if max_groups is None else max_groups},
                      output="dp__kept")


def _kept_stats(kept, cal: groupby.GroupByCalibration):
    """(item, n, n_rows, s_steps, q_steps) of the kept cells: the stage ``dp__stats``."""
    return _run_stage("dp__group_by_aggregates", {"dp__kept": kept.select("user_id", "item", "v", "r"),
                                                  "cal": _group_by_cal_relation(kept.sparkSession, cal)},
                      output="dp__stats")


def group_by_stats(rows, selected, max_items: int, salt: int, cal: groupby.GroupByCalibration):
    """(item, n, n_rows, s_steps, q_steps) of the selected items: the stage ``dp__stats`` of ``dp_group_by`` (its
    aggregate step, ``dp__group_by_aggregates``). NOT a release.

    The cells of :func:`group_by_kept` (each user keeps at most ``cal.max_groups`` of its selected items);
    ``n`` users per item, ``n_rows`` the sum of their rows counted up to ``cal.max_rows``, ``s_steps`` the
    sum of the totals clamped to ``[lower, upper]`` and rounded to the sum's grid, in grid steps (NULL when
    no sum is measured), ``q_steps`` the sum of squared distances to the centre on the sum of squares'
    grid (NULL when not measured). Items no kept user holds have no row. Testing/audit.
    """
    return _kept_stats(group_by_kept(rows, selected, max_items, salt, cal.max_groups), cal)


def median_utility(kept, selected, cal: groupby.GroupByCalibration):
    """(item, j, u) of every selected item and grid point j = 0..K: ``dp__median_utility``. NOT a release.

    ``kept`` (item, v): the kept cells (:func:`group_by_kept`); ``u(j) = -|B(j) - A(j)|``, the kept values
    clamped and snapped to the median's grid below (B) and above (A) point j. No rows unless ``cal``
    measures a median. Testing/audit.
    """
    return _run_stage("dp__median_utility", {"kept": kept.select("item", "v"), "groups": selected.select("item"),
                                             "cal": _group_by_cal_relation(kept.sparkSession, cal)})


def group_by_output(measured, cal: groupby.GroupByCalibration):
    """The released columns of every aggregate from the noisy measurements: ``dp__group_by_output``.

    ``measured`` (item, n_noisy, r_noisy, s_noisy, q_noisy, median_j): post-processing of released
    numbers and public parameters only (integer counts, the sum's sign, the clamped mean and
    variance, stddev, the median's grid point, the derived intervals). Every aggregate's columns.
    """
    return _run_stage("dp__group_by_output", {"noisy": measured,
                                              "cal": _group_by_cal_relation(measured.sparkSession, cal)})


# dp__noisy of dp__group_by_aggregates (sql/97_groupby/groupby.sql): per noisy measurement (dpsql.groupby.MEASUREMENTS but
# the median, which is dp__median's argmax), its exact column of dp__stats, its noisy column (dp__group_by_output's
# input), and whether the exact column is in grid steps (sums: clamped to +-sum_limit steps, times the grid)
# or a count (the value itself).
_NOISY_COLUMNS: dict[str, tuple[str, str, bool]] = {
    "count": ("n", "n_noisy", False), "rows": ("n_rows", "r_noisy", False),
    "sum": ("s_steps", "s_noisy", True), "sumsq": ("q_steps", "q_noisy", True)}
assert set(_NOISY_COLUMNS) | {"median"} == set(groupby.MEASUREMENTS), "a measurement without its Spark columns"


def _group_by_task(cal: groupby.GroupByCalibration, seed: Optional[int],
                   stage: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function of :func:`_group_by_noisy` on (item, n, n_rows, s_steps, q_steps): ``dp__noisy``.

    Each measurement ``cal`` makes (but the median) gets ``dp_granular_gaussian_noise`` or
    ``dp_granular_laplace_noise`` (the same Arrow functions, on the task's source) at its scale and
    grid from ``dpsql.groupby._cal_row``; the rest are NULL.
    """
    from dpsql.core.noise import _granular_noise

    row = groupby._cal_row(cal)
    made = [(*_NOISY_COLUMNS[m.name], float(row[f"{m.name}_scale"]), float(row[f"{m.name}_granularity"]))
            for m in cal.measures if m.name in _NOISY_COLUMNS]
    limit = float(row["sum_limit"] or 0.0)
    sampler = ("discrete_gaussian", "sigma") if cal.noise == "gaussian" else ("discrete_laplace", "scale")
    names = ["item", *(noisy for _, noisy, _ in _NOISY_COLUMNS.values())]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        granular = _granular_noise(_task_source(seed, stage), *sampler)
        for batch in batches:
            size = batch.num_rows
            if size == 0:
                continue
            out: dict[str, Any] = {"item": batch.column(batch.schema.get_field_index("item"))}
            for exact, noisy, in_steps, scale, g in made:
                col = batch.column(batch.schema.get_field_index(exact))  # NULL: no kept user (coalesce 0)
                x = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
                value = np.clip(x, -limit, limit).astype(np.float64) * g if in_steps else x.astype(np.float64)
                drawn = granular(pa.array(np.full(size, scale)), pa.array(np.full(size, g))).to_numpy()
                out[noisy] = pa.array(value + drawn, pa.float64())
            yield pa.RecordBatch.from_arrays([out.get(c, pa.nulls(size, pa.float64())) for c in names], names)

    return run


def _group_by_noisy(stats, cal: groupby.GroupByCalibration, seed: Optional[int]):
    """(item, n_noisy, r_noisy, s_noisy, q_noisy) of (item, n, n_rows, s_steps, q_steps): NULL where not measured."""
    from pyspark.sql.types import DoubleType, StructField, StructType

    item_field = stats.schema["item"]
    fields = [StructField("item", item_field.dataType, item_field.nullable)]
    fields += [StructField(noisy, DoubleType(), True) for _, noisy, _ in _NOISY_COLUMNS.values()]
    run = _group_by_task(cal, seed, next(_noise_stage))
    with _shipping(stats.sparkSession):
        return stats.select("item", *(exact for exact, _, _ in _NOISY_COLUMNS.values())).mapInArrow(
            run, StructType(fields))


def _gumbel_task(scale: float, seed: Optional[int],
                 stage: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function of :func:`_group_by_median`: (item, j, u) -> (item, j, u + Gumbel(scale))."""
    scale = float(scale)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        source = _task_source(seed, stage)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            u = np.asarray(batch.column(batch.schema.get_field_index("u")).to_numpy(zero_copy_only=False),
                           dtype=np.float64)
            noisy = u + source.gumbel(np.full(len(u), scale))
            yield pa.RecordBatch.from_arrays([batch.column(batch.schema.get_field_index("item")),
                                              batch.column(batch.schema.get_field_index("j")),
                                              pa.array(noisy, pa.float64())], ["item", "j", "noisy"])

    return run


def _group_by_median(kept, selected, cal: groupby.GroupByCalibration, seed: Optional[int]):
    """(item, median_j): ``dp__median``, the exponential mechanism over the grid points of :func:`median_utility`
    sampled as ``argmax_j u(j) + Gumbel(2/eps0)`` (the Gumbel-max form of ``exp(eps0 u / 2)``). The float
    Gumbel noise only decides the argmax, never a released number (as the macro's ``dp_gumbel_noise``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    m = cal.measure("median")
    assert m is not None
    utility = median_utility(kept, selected, cal)
    item_field = utility.schema["item"]
    schema = StructType([StructField("item", item_field.dataType, item_field.nullable),
                         StructField("j", LongType(), False), StructField("noisy", DoubleType(), False)])
    run = _gumbel_task(m.scale, seed, next(_noise_stage))
    with _shipping(kept.sparkSession):
        noisy = utility.select("item", F.col("j").cast("long").alias("j"), F.col("u").cast("double").alias("u")
                               ).mapInArrow(run, schema)
    return noisy.groupBy("item").agg(F.max_by("j", "noisy").alias("median_j"))


def _released_columns(columns: Sequence[str], aggregates: Sequence[str]) -> list[str]:
    """The columns of ``dp__group_by_output`` dp_group_by returns: its final SELECT's ``COLUMNS(lambda c:
    list_contains(aggregates, split_part(c, '_', 1)))`` (each requested aggregate's value, scale, interval)."""
    return [c for c in columns if c != "item" and c.split("_")[0] in aggregates]


def pre_selection_weights(capped, weighting: str):
    """(item, n, w) of capped rows (user_id, item, d): ``dp__weights`` of ``dp__group_by_pre_selection``. Testing/audit.

    ``n`` capped users per item and the weight ``w`` of ``weighting`` (count, inverse, inverse_sqrt).
    """
    from pyspark.sql import functions as F

    if weighting not in ("count", "inverse", "inverse_sqrt"):
        raise DPParameterError(f"weighting must be count, inverse or inverse_sqrt (got {weighting!r})")
    row = F.broadcast(capped.sparkSession.range(1).select(F.lit(weighting).alias("weighting")))
    return _run_stage("dp__group_by_pre_selection", {"dp__capped_user_items": capped, "dp__cal": row},
                      output="dp__weights")


def _pre_selection(pairs, method: str, epsilon: float, delta: float, max_items: int, pre_threshold: int,
                   salt: int, seed: Optional[int]):
    """``dp__group_by_pre_selection``: items with ``>= pre_threshold`` capped users, weight shifted by T - 1.

    The weights are the translated stage ``dp__weights``; the method's own noise and strict threshold
    (:func:`dpsql.union.calibrate`, as ``dp__group_by_pre_calibration``) through :func:`_noisy`.
    """
    from pyspark.sql import functions as F

    with derived_budget():
        sel = union.calibrate(method, epsilon, delta, max_items)
    weights = pre_selection_weights(capped_user_items(pairs, max_items, salt), _weighting(method))
    shifted = weights.where(F.col("n") >= F.lit(pre_threshold)).select(
        "item", (F.col("w") - F.lit(float(pre_threshold - 1))).alias("w"))
    return _noisy(shifted, _Noise(sel.noise, sel.scale, sel.threshold, strict=True), seed)


def truncated_geometric_counts(pairs, max_groups: int, salt: int):
    """(item, n): the users of each group after each user keeps at most ``max_groups`` of its groups
    (:func:`capped_user_items`, the salted hash of ``dp__capped_user_items``): ``dp__tg_counts`` of dp_group_by's
    truncated geometric selection. NOT a release: exact counts."""
    from pyspark.sql import functions as F

    return capped_user_items(pairs, max_groups, salt).groupBy("item").agg(F.count(F.lit(1)).alias("n"))


def _keep_task(table: np.ndarray, seed: Optional[int],
               stage: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function of :func:`_truncated_geometric`: (item, n) -> the items whose coin
    ``U < p(n)`` keeps them (``dp__group_by_keep``: ``U`` from :meth:`NoiseSource.uniform`, on the 2^-53 grid;
    ``table`` the keep probabilities, computed once on the driver)."""
    from dpsql.groupby.selection import keep_with

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        source = _task_source(seed, stage)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            n = batch.column(batch.schema.get_field_index("n")).to_numpy(zero_copy_only=False)
            kept = keep_with(table, source.uniform(len(n)), n)
            yield pa.RecordBatch.from_arrays([batch.column(batch.schema.get_field_index("item")).filter(
                pa.array(kept))], ["item"])

    return run


def _truncated_geometric(pairs, cal: groupby.GroupByCalibration, salt: int, seed: Optional[int]):
    """(item): dp_group_by's truncated geometric selection (docs/proofs/truncated_geometric.md): one coin per
    group of :func:`truncated_geometric_counts` at the calibration's (epsilon, delta) per group, drawn in the
    Spark tasks."""
    from pyspark.sql.types import StructField, StructType

    assert cal.selection_cap is not None
    assert cal.selection_group_epsilon is not None and cal.selection_group_delta is not None
    table = np.asarray(rules.keep_probabilities(cal.selection_group_epsilon, cal.selection_group_delta))
    counts = truncated_geometric_counts(pairs, cal.selection_cap, salt)
    item_field = counts.schema["item"]
    run = _keep_task(table, seed, next(_noise_stage))
    with _shipping(counts.sparkSession):
        return counts.select("item", "n").mapInArrow(
            run, StructType([StructField("item", item_field.dataType, item_field.nullable)]))


# The selections the Spark backend runs: the parallel set-union methods and the truncated geometric coin.
SPARK_SELECTIONS = PARALLEL_METHODS + (groupby.TRUNCATED_GEOMETRIC,)


def group_by(df, *, epsilon: float, delta: Optional[float] = None, aggregates: Sequence[str] = ("count",),
             value_col: Optional[str] = None, lower: Optional[float] = None, upper: Optional[float] = None,
             max_items: int = 100, noise: Optional[str] = None, max_groups: Optional[int] = None,
             max_rows: int = 1, selection: Optional[str] = DEFAULT_SELECTION, split: float = groupby.DEFAULT_SPLIT,
             pre_threshold: int = 1, confidence: float = groupby.DEFAULT_CONFIDENCE, items=None,
             group_cols: Optional[Sequence[str]] = None, user_col: str = "user_id", item_col: str = "item",
             seed: Optional[int] = None, ledger: Union[None, str, os.PathLike, Ledger] = None,
             scope: Optional[str] = None, progress: Optional[Callable[[float], None]] = None):
    """Private GROUP BY of the Spark DataFrame ``df``: the Spark counterpart of :func:`dpsql.group_by`.

    The same parameters, checks, calibration, contribution bounding, granular Gaussian or Laplace noise
    and columns (the group, then per aggregate its value, scale and interval half-width), rows sorted by
    the group, for every aggregate (:data:`dpsql.groupby.AGGREGATES`: count, rows with ``max_rows``,
    sum, mean, variance, stddev, median) of one item column (output column ``item``) or of several
    ``group_cols`` (one output column each, named and typed as in ``df``, in its column order). Without
    ``items`` the groups are selected by ``selection`` (one of :data:`SPARK_SELECTIONS`: a parallel set-union
    method or the truncated geometric coin; None: the rule dp_group_by's default names for ``max_items`` and
    ``max_groups``, :func:`dpsql.groupby.default_selection`; or with ``pre_threshold > 1`` the pre-thresholded
    one-shot weighting) at the calibration's share; ``items``
    is a DataFrame of public groups (column ``item_col``, or the ``group_cols``, each of ``df``'s type):
    every listed group gets a row, no selection: without a ``delta`` at ``(epsilon, 0)``
    (``dp_group_by_public``: Laplace noise), with one at ``(epsilon, delta)`` (``dp_group_by(...,
    items_tbl := ...)``: Gaussian noise by default). Every parameter is validated before any row is read; then one scan
    refuses a NULL user or group with DuckDB's text before anything is drawn (a NULL value is skipped
    by the sums, as in DuckDB). The pre-noise stages (the aggregates' cap ``dp__kept``, the
    measurements ``dp__stats``, the median's utility ``dp__median_utility``) and the post-processing
    (``dp__group_by_output``) are the macro's, translated; the noise is drawn in Spark tasks: granular
    per measurement, Gumbel for the median's argmax (which only decides the grid point released).
    The selection and the aggregates are one release, charged once to ``ledger`` for the files ``df``
    reads, or for ``scope``, as :func:`set_union` (``(epsilon, delta)``, or ``(epsilon, 0)`` with
    ``items`` and no ``delta``); the budgets are checked before any Spark job runs. The aggregates' cap has its own
    salt (as the macro's ``dp__salt``). ``seed`` is for tests only: the release is then NOT private.
    ``progress`` and a Spark failure: as :func:`set_union`.
    """
    progress = spark_progress.check_progress(progress)
    public = items is not None
    pure = public and delta is None  # dp_group_by_public: Laplace at (epsilon, 0); with a delta, dp_group_by
    mech = {m.name: m for m in groupby.MECHANISMS}["group_by_public" if pure else "group_by"]
    declared = dataclasses.replace(mech, params=tuple(p for p in mech.params if p.name not in ("tbl", "items_tbl")))
    common = {"epsilon": epsilon, "max_items": max_items, "aggregates": aggregates, "value_col": value_col,
              "lower": lower, "upper": upper, "max_groups": max_groups, "max_rows": max_rows,
              "confidence": confidence, "group_cols": list(group_cols) if isinstance(group_cols, tuple) else group_cols,
              "user_col": user_col, "item_col": item_col}
    if pure:
        if noise not in (None, "laplace"):
            raise DPParameterError("noise := 'gaussian' needs delta := <a small number, e.g. 1e-5>; or pass "
                                   "noise := 'laplace' for (epsilon, 0)-DP")
        values = declared.validate(**common)
    else:
        values = declared.validate(**common, delta=delta, selection=selection, split=split,
                                   pre_threshold=pre_threshold, **({} if noise is None else {"noise": noise}))
    # as the macro's calibration UDF: the columns' roles, then the calibration's checks (a public list: no selection)
    groupby._check_columns_call(values["user_col"], values["item_col"], values["group_cols"])
    cal = groupby.check_call(epsilon, delta, max_items, values["aggregates"], value_col, lower, upper,
                             None if public else selection, None if public else split, pre_threshold, confidence,
                             public=public, noise="laplace" if pure else values["noise"], max_groups=max_groups,
                             max_rows=values["max_rows"])
    if not public and cal.pre_threshold == 1 and cal.selection not in SPARK_SELECTIONS:
        raise DPParameterError(f"selection {cal.selection!r} has no Spark form; the Spark "
                               f"backend selects with {', '.join(SPARK_SELECTIONS)} (run selection := "
                               f"'{cal.selection}' with DuckDB's dp_group_by)")
    warn_weak_parameters(epsilon, None if pure else delta, what=mech.macro, stacklevel=2)
    plan = None
    if not public:
        assert cal.selection is not None
        with derived_budget():  # shares of the budget checked above
            plan = None if cal.pre_threshold > 1 or cal.selection == groupby.TRUNCATED_GEOMETRIC else _set_union_plan(
                cal.selection, cal.selection_epsilon, cal.selection_delta, values["max_items"], values["user_col"],
                values["item_col"], {})
    return spark_ledger.charged(
        df, ledger=ledger, scope=scope, mechanism=mech.macro, epsilon=values["epsilon"],
        delta=0.0 if pure else values["delta"], parameters=_recorded(values), calibration=cal,
        seeded=seed is not None,
        release=lambda: _group_by_run(df, items, values, cal, plan, seed), progress=progress)


def _group_by_run(df, items, values: Mapping[str, Any], cal: groupby.GroupByCalibration,
                  plan: Optional[tuple[str, dict, Any]], seed: Optional[int]):
    """The Spark jobs of a GROUP BY release checked by :func:`group_by` (charged by the caller)."""
    from pyspark.sql import functions as F

    public = items is not None
    max_items = values["max_items"]
    group_cols = values["group_cols"]
    rows = _checked_rows(df, values["user_col"], values["item_col"], values["value_col"], group_cols)
    if public:
        selected = _public_items(items, values["item_col"], rows.schema["item"].dataType, group_cols)
    if seed is not None:
        warnings.warn(NOT_PRIVATE_WARNING, stacklevel=2)
        salt = NoiseSource(int(np.random.SeedSequence([int(seed), 1]).generate_state(1, np.uint64)[0])).salt()
    else:
        salt = secure_source().salt()
    if not public:
        assert cal.selection is not None
        pairs = _run_stage("dp__user_items", {"dp__user_item_rows": rows.select("user_id", "item")})
        with derived_budget():  # shares of the budget checked above
            if cal.selection == groupby.TRUNCATED_GEOMETRIC:  # the coin's cap has its own salt
                tg_salt = secure_source().salt() if seed is None else NoiseSource(int(seed)).salt()
                selected = _materialise(_truncated_geometric(pairs, cal, tg_salt, seed))
            elif plan is None:
                pre_salt = secure_source().salt() if seed is None else NoiseSource(int(seed)).salt()
                selected = _materialise(_pre_selection(pairs, cal.selection, cal.selection_epsilon,
                                                       cal.selection_delta, max_items, cal.pre_threshold, pre_salt,
                                                       seed))
            else:  # a step of this release: charged with it, not apart
                selected = _set_union_run(df, *plan, seed, pairs=pairs)
    # the noise for L0 = min(max_groups, the groups released), as dp_group_by's dp__cal (the same budget)
    selected = _materialise(selected)
    cal = groupby.check_call(values["epsilon"], values.get("delta"), max_items, values["aggregates"],
                             values["value_col"], values["lower"], values["upper"], cal.selection, values.get("split"),
                             cal.pre_threshold, values["confidence"], public=public, noise=cal.noise,
                             max_groups=values["max_groups"], max_rows=values["max_rows"], groups=selected.count())
    kept = group_by_kept(rows, selected, max_items, salt, cal.max_groups)
    median = cal.measure("median") is not None
    if median:  # read twice (the measurements and the median's utility): one cap
        kept = _materialise(kept)
    joined = selected.select("item").join(_kept_stats(kept, cal), "item", "left")
    measured = _group_by_noisy(joined, cal, seed)
    if median:
        measured = measured.join(_group_by_median(kept, selected, cal, seed), "item", "left")
    else:
        measured = measured.withColumn("median_j", F.lit(None).cast("long"))
    out = group_by_output(measured, cal)
    # the group's columns first (the struct's fields with group_cols, else item), then the aggregates' columns
    labels = ([F.col("item")[f.name].alias(f.name) for f in rows.schema["item"].dataType.fields]
              if group_cols is not None else [F.col("item")])
    released = out.select(*labels, *_released_columns(out.columns, cal.aggregates))
    # Sorted by the group (the macro's ORDER BY ALL): the partitions' order depends on the data.
    quoted = [F.col("`" + c.replace("`", "``") + "`") for c in released.columns[:len(labels)]]
    return _materialise(released.orderBy(*quoted))


def _public_items(items, item_col: str, key_type, group_cols: Optional[Sequence[str]] = None):
    """The distinct groups of the public DataFrame ``items``: its column ``item_col``, or with ``group_cols``
    the struct of those columns (as :func:`_checked_rows`'s key of type ``key_type``); a NULL is refused, and
    each public column must have the private one's type (``dp__check_same_type``): a join of two types
    would convert values."""
    from pyspark.sql import functions as F

    columns = {c.lower(): c for c in items.columns}
    if group_cols is None:
        wanted = [("item_col", item_col, key_type)]
    else:
        wanted = [("group_cols", f.name, f.dataType) for f in key_type.fields]
    picked = []
    for param, col, kind in wanted:
        if col.lower() not in columns:
            raise DPParameterError(f"{param} := {col!r} is not a column of items; its columns are "
                                   f"{', '.join(items.columns)}")
        public = items.schema[columns[col.lower()]].dataType
        if public != kind:
            raise DPParameterError(
                f"column {col} of items has type {public.simpleString()} but {param} := {col!r} of the DataFrame "
                f"has type {kind.simpleString()}; comparing them would convert values. Give them one type, e.g. "
                f"with a cast of the public column to {kind.simpleString()}")
        picked.append(F.col(f"`{columns[col.lower()]}`").alias(col))
    any_null = picked[0].isNull()
    for col in picked[1:]:
        any_null = any_null | col.isNull()
    if items.where(any_null).limit(1).count():
        if group_cols is None:
            raise DPParameterError(f"dpsql: column {item_col} (item_col) of items contains NULL; filter it out first")
        raise DPParameterError("dpsql: a column of group_cols of items contains NULL; filter it out first")
    key = picked[0].alias("item") if group_cols is None else F.struct(*picked).alias("item")
    return items.select(key).distinct()
