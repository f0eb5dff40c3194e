"""Private GROUP BY: the items a set-union method selects, with noisy count, sum and mean per item.

Privacy unit: user-level add/remove (one user with all its rows). Proof note:
``docs/proofs/group_by.md``.

``dp_group_by`` (unknown domain). Privacy argument (adaptive sequential composition):

1. selection: the set-union method ``selection`` (any of :data:`dpsql.union.METHODS`) releases the
   item set ``S`` at ``(epsilon * split, delta)`` -- through ``dp_set_union``, which charges that
   share itself;
2. aggregates, given ``S`` (public from here on): each user's distinct items are restricted to
   ``S`` and capped to ``max_items`` by a salted hash of the user's own rows; each kept
   (user, item) cell has value ``clamp(sum of the user's values of that item, lower, upper)``.
   A user thus changes at most ``max_items`` counts by 1 (l1 ``max_items``) and at most
   ``max_items`` sums by at most ``M = max(|lower|, |upper|)`` (l1 ``max_items * M``). Each
   measurement (count, sum: the ones the requested aggregates need) gets an equal share of
   ``epsilon * (1 - split)`` and granular Laplace noise ``g * DLap(b/g)`` with ``b`` the rounded l1
   sensitivity over its epsilon (:func:`dpsql.core.calibration.discrete_laplace_scale`): pure DP, so the
   aggregates spend no delta. The mean is ``clamp(noisy sum / noisy count, lower, upper)``
   (post-processing);
3. composition: ``(epsilon * split + epsilon * (1 - split), delta + 0) = (epsilon, delta)``. The
   aggregate step is DP for every fixed ``S``, so it may read the data again with its own cap
   (adaptive composition needs no shared capping).

``pre_threshold`` T > 1: step 1 is ``dp__group_by_pre_selection`` instead, for the one-shot weighting
methods only (:data:`PRE_THRESHOLD_METHODS`): items with at least T capped users, weight shifted by
``T - 1`` before the method's own noise and threshold. Every user's weight is at most 1, so an item
the added user makes eligible has shifted weight at most that user's own weight: the novel-item
case the threshold's delta covers (proof note, section 8).

``dp_group_by_public`` (public domain ``items_tbl``): no selection; step 2 at the whole
``epsilon`` over the listed items, every listed item gets a row: ``(epsilon, 0)``-DP.

Accuracy: beside each noisy value, its Laplace scale and the half-width of a ``confidence``
interval, from public parameters only (:func:`laplace_ci`); the mean's from those of the sum and
the count at ``(1 - confidence)/2`` each and the released count (post-processing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional, Sequence

import duckdb
import pyarrow as pa
from duckdb.sqltypes import DOUBLE, VARCHAR

from dpsql import union
from dpsql.core import release
from dpsql.core.calibration import choose_granularity, default_granularity, discrete_laplace_scale
from dpsql.core.errors import engine_errors
from dpsql.core.mechanism import (REQUIRED, AuditCase, Mechanism, Param, column_param, delta_param, epsilon_param,
                             max_items_param, tbl_param, user_item_example, with_role)
from dpsql.core.udf import Udf, scalar
from dpsql.core.inputs import accepts_tables
from dpsql.core.validation import (EPSILON_MIN, DPParameterError, check_column_pair, check_delta, check_epsilon,
                              check_identifier, check_max_items, check_table_name, derived_budget, sql_string)

__all__ = ["AGGREGATES", "DEFAULT_SPLIT", "DEFAULT_CONFIDENCE", "PRE_THRESHOLD_METHODS", "GroupByCalibration",
           "group_by_calibration", "check_aggregates", "check_selection_share", "check_confidence", "check_pre_threshold",
           "laplace_ci", "check_call", "group_by", "udfs", "generated_sql", "MECHANISMS"]

AGGREGATES = ("count", "sum", "mean")
# Half of epsilon selects, half measures: the count noise then has twice the continuous scale of a
# count-only release at the full epsilon, and selection twice its noise (docs/proofs/group_by.md).
DEFAULT_SPLIT = 0.5
DEFAULT_CONFIDENCE = 0.95


# --------------------------------------------------------------------------
# Calibration (pure)
# --------------------------------------------------------------------------

def laplace_ci(scale: float, granularity: float, confidence: float) -> float:
    """Half-width ``g m`` of the narrowest symmetric interval holding ``g DLap(scale/g)`` w.p. ``>= confidence``.

    ``DLap(t)``, ``alpha = exp(-1/t)``: ``P[|Z| > m] = 2 alpha^(m+1) / (1 + alpha)``; ``m`` is the
    smallest integer ``>= 0`` with that ``<= 1 - confidence``. As ``g -> 0``: ``scale ln(1/(1-confidence))``.
    """
    t = scale / granularity
    log_alpha = -1.0 / t
    log_c = math.log1p(math.exp(log_alpha)) - math.log(2.0)
    target = math.log1p(-confidence)

    def log_tail(m: int) -> float:  # ln P[|Z| > m]
        return math.log(2.0) + (m + 1) * log_alpha - math.log1p(math.exp(log_alpha))

    m = max(0, math.ceil((target + log_c) / log_alpha) - 1)
    while log_tail(m) > target:
        m += 1
    while m > 0 and log_tail(m - 1) <= target:
        m -= 1
    return granularity * m


@dataclass(frozen=True)
class GroupByCalibration:
    """Budget split and noise of dp_group_by / dp_group_by_public (``None``: a measurement not made).

    ``selection`` is None for a public domain. ``count_*``: the count measurement (made for
    'count' and 'mean'); ``sum_*``: the sum measurement (made for 'sum' and 'mean'); ``*_ci``
    half-widths at ``confidence``; ``mean_*_ci`` at ``(1 + confidence)/2`` each (union bound).
    """

    aggregates: tuple[str, ...]
    selection: Optional[str]
    selection_epsilon: float
    selection_delta: float
    aggregate_epsilon: float
    confidence: float
    lower: Optional[float]
    upper: Optional[float]
    count_epsilon: Optional[float] = None
    count_granularity: Optional[float] = None
    count_scale: Optional[float] = None
    count_ci: Optional[float] = None
    sum_epsilon: Optional[float] = None
    sum_bound: Optional[float] = None
    sum_granularity: Optional[float] = None
    sum_scale: Optional[float] = None
    sum_ci: Optional[float] = None
    mean_count_ci: Optional[float] = None
    mean_sum_ci: Optional[float] = None
    pre_threshold: int = 1


def check_aggregates(aggregates: object) -> tuple[str, ...]:
    """A non-empty list of distinct names among count, sum, mean (returned in that order)."""
    if isinstance(aggregates, str) or not isinstance(aggregates, (list, tuple)) or not aggregates:
        raise DPParameterError(f"aggregates must be a non-empty list of {', '.join(AGGREGATES)}, e.g. "
                               f"aggregates := ['count', 'sum', 'mean'] (got {aggregates!r})")
    for a in aggregates:
        if a not in AGGREGATES:
            raise DPParameterError(f"aggregates: {a!r} is not one of {', '.join(AGGREGATES)}")
    if len(set(aggregates)) != len(aggregates):
        raise DPParameterError(f"aggregates must not repeat a name (got {list(aggregates)!r})")
    return tuple(a for a in AGGREGATES if a in aggregates)


def _check_fraction(name: str, value: object, hint: str) -> float:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not (0.0 < float(value) < 1.0):
        raise DPParameterError(f"{name} must be a number strictly between 0 and 1 (got {value!r}); {hint}")
    return float(value)


def check_selection_share(split: object) -> float:
    return _check_fraction("split", split, f"it is the share of epsilon spent on selection, e.g. {DEFAULT_SPLIT}")


# The selections whose pre-threshold has a proof (docs/proofs/group_by.md): one-shot weighting, each
# user's weight per item <= 1 -- the methods that declare a weighting (Mechanism.weighting), which
# dp__group_by_pre_selection applies.
PRE_THRESHOLD_METHODS = tuple(n for n, m in union.METHODS.items() if m.weighting is not None)
# The selection of the conformance example: the family's reference one-shot method (it offers a pre-threshold).
_ONE_SHOT = with_role(union.METHODS.values(), "reference_one_shot")


def check_pre_threshold(pre_threshold: object) -> int:
    """A whole number >= 1 (1: no pre-threshold)."""
    if pre_threshold is None or isinstance(pre_threshold, bool) or not isinstance(pre_threshold, (int, float)) \
            or not math.isfinite(float(pre_threshold)) or float(pre_threshold) != int(pre_threshold) \
            or pre_threshold < 1:
        raise DPParameterError(f"pre_threshold must be a whole number >= 1 (got {pre_threshold!r}); it is the "
                               f"least number of users an item needs to be selected (1: no pre-threshold)")
    return int(pre_threshold)


def check_confidence(confidence: object) -> float:
    return _check_fraction("confidence", confidence, "it is the coverage of the reported intervals, e.g. 0.95")


def _check_bounds(needs_values: bool, value_col: object, lower: object, upper: object
                  ) -> tuple[Optional[float], Optional[float]]:
    if not needs_values:
        for name, v in (("value_col", value_col), ("lower", lower), ("upper", upper)):
            if v is not None:
                raise DPParameterError(f"{name} is used only by the sum and mean aggregates; add 'sum' or 'mean' "
                                       f"to aggregates or leave {name} out")
        return None, None
    if value_col is None:
        raise DPParameterError("sum and mean need value_col := '<column of numbers>'")
    check_identifier("value_col", value_col)
    bounds = []
    for name, v in (("lower", lower), ("upper", upper)):
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise DPParameterError(f"{name} must be a finite number (got {v!r}): sum and mean clamp each user's "
                                   f"total per item to [lower, upper]; choose them from public knowledge, "
                                   f"never from the data")
        bounds.append(float(v))
    lo, hi = bounds
    if lo > hi:
        raise DPParameterError(f"lower must be <= upper (got lower = {lo!r}, upper = {hi!r})")
    if max(abs(lo), abs(hi)) == 0.0:
        raise DPParameterError("lower and upper must not both be 0 (every clamped value would be 0)")
    return lo, hi


@lru_cache(maxsize=256)
def _calibration(aggregates: tuple[str, ...], epsilon: float, delta: Optional[float], max_items: int,
                 lower: Optional[float], upper: Optional[float], selection: Optional[str], split: float,
                 confidence: float, pre_threshold: int = 1) -> GroupByCalibration:
    if selection is None:
        sel_eps, sel_delta, agg_eps = 0.0, 0.0, epsilon
    else:
        sel_eps, sel_delta, agg_eps = epsilon * split, float(delta or 0.0), epsilon * (1.0 - split)
        with derived_budget():
            union.calibrate(selection, sel_eps, sel_delta, max_items)  # the selection's own checks
    needs_count = "count" in aggregates or "mean" in aggregates
    needs_sum = "sum" in aggregates or "mean" in aggregates
    share = agg_eps / (int(needs_count) + int(needs_sum))
    half = (1.0 + confidence) / 2.0
    out: dict[str, Any] = {}
    with derived_budget():
        if needs_count:
            # counts are integers: a grid g <= 1 keeps them on it (no rounding, l1 = max_items exactly)
            g = choose_granularity(max_items / share, None, 1.0)
            b = discrete_laplace_scale(share, float(max_items), g, coordinates=max_items, on_grid=True)
            out.update(count_epsilon=share, count_granularity=g, count_scale=b, count_ci=laplace_ci(b, g, confidence),
                       mean_count_ci=laplace_ci(b, g, half) if "mean" in aggregates else None)
        if needs_sum:
            assert lower is not None and upper is not None
            bound = max(abs(lower), abs(upper))
            g = default_granularity(max_items * bound / share)
            b = discrete_laplace_scale(share, max_items * bound, g, coordinates=max_items, on_grid=False)
            out.update(sum_epsilon=share, sum_bound=bound, sum_granularity=g, sum_scale=b,
                       sum_ci=laplace_ci(b, g, confidence),
                       mean_sum_ci=laplace_ci(b, g, half) if "mean" in aggregates else None)
    return GroupByCalibration(aggregates, selection, sel_eps, sel_delta, agg_eps, confidence, lower, upper, **out,
                              pre_threshold=pre_threshold)


def group_by_calibration(epsilon: object, delta: object, max_items: object = 100,
                         aggregates: Sequence[str] = ("count",), value_col: object = None, lower: object = None,
                         upper: object = None, selection: object = union.DEFAULT_METHOD,
                         split: object = DEFAULT_SPLIT, confidence: object = DEFAULT_CONFIDENCE,
                         pre_threshold: object = 1) -> GroupByCalibration:
    """Validate the parameters of dp_group_by and split the budget (``selection=None``: public domain).

    Selection ``(epsilon split, delta)``; the aggregates ``(epsilon (1 - split), 0)``, shared
    equally by the count and sum measurements the aggregates need. Count: ``b = max_items / eps_c``
    on a grid ``g <= 1`` (exact for a power-of-two ``g``); sum: ``b = g (floor(max_items M / g)
    + max_items) / eps_s`` with ``M = max(|lower|, |upper|)`` (rounded sensitivity).
    ``pre_threshold > 1`` needs a selection of :data:`PRE_THRESHOLD_METHODS` (not a public domain).
    """
    aggs = check_aggregates(aggregates)
    epsilon = check_epsilon(epsilon)
    if selection is None:
        delta_value: Optional[float] = None
        split_value = 1.0
    else:
        selection = union.check_method(selection)
        delta_value = check_delta(delta)
        split_value = check_selection_share(split)
    max_items = check_max_items(max_items)
    conf = check_confidence(confidence)
    lo, hi = _check_bounds("sum" in aggs or "mean" in aggs, value_col, lower, upper)
    pre = check_pre_threshold(pre_threshold)
    if pre > 1 and selection not in PRE_THRESHOLD_METHODS:
        where = "a public list of items needs no selection" if selection is None else f"selection is {selection!r}"
        raise DPParameterError(f"pre_threshold > 1 needs selection := one of {', '.join(PRE_THRESHOLD_METHODS)} "
                               f"({where}); the adaptive and sequential methods have no proof for it")
    if selection is not None:
        for part, share in (("selection", epsilon * split_value), ("aggregates", epsilon * (1.0 - split_value))):
            if share < EPSILON_MIN:
                raise DPParameterError(f"epsilon * split is too small for the {part} (got {share!r}); pass a larger "
                                       f"epsilon or a split nearer 0.5")
    return _calibration(aggs, epsilon, delta_value, max_items, lo, hi, selection,
                        split_value if selection is not None else 0.0, conf, pre)


# --------------------------------------------------------------------------
# UDFs
# --------------------------------------------------------------------------

_CAL_FIELDS = {"count_granularity": DOUBLE, "count_scale": DOUBLE, "count_ci": DOUBLE,
               "sum_granularity": DOUBLE, "sum_scale": DOUBLE, "sum_ci": DOUBLE, "sum_limit": DOUBLE,
               "mean_count_ci": DOUBLE, "mean_sum_ci": DOUBLE, "lower": DOUBLE, "upper": DOUBLE,
               "aggregate_epsilon": DOUBLE}


def _cal_row(cal: GroupByCalibration) -> dict[str, Optional[float]]:
    # sum_limit (in grid steps): item sums are clamped to +-2^50 steps (1-Lipschitz, so the sensitivity
    # holds) so that sum + noise stays an exact multiple of g in a double (no error after the charge).
    limit = float(2 ** 50) if cal.sum_granularity is not None else None
    return {"count_granularity": cal.count_granularity, "count_scale": cal.count_scale, "count_ci": cal.count_ci,
            "sum_granularity": cal.sum_granularity, "sum_scale": cal.sum_scale, "sum_ci": cal.sum_ci,
            "sum_limit": limit, "mean_count_ci": cal.mean_count_ci, "mean_sum_ci": cal.mean_sum_ci,
            "lower": cal.lower, "upper": cal.upper, "aggregate_epsilon": cal.aggregate_epsilon}


def selection_call_sql(cal: GroupByCalibration, values: dict[str, Any]) -> str:
    """The selection step of ``dp_group_by`` calibrated by ``cal``, as the SQL text ``dp__body_group_by`` runs.

    ``pre_threshold`` 1: the body of the set-union method ``cal.selection`` (:func:`dpsql.union.body_call_sql`,
    the dispatcher's rendering) at ``(epsilon * split, delta)``; above 1: ``dp__group_by_pre_selection``.
    ``values`` holds ``tbl``, ``delta``, ``max_items``, ``user_col`` and ``item_col`` as bound; every value is
    a SQL literal (:func:`dpsql.core.release.sql_value`).
    """
    if cal.pre_threshold == 1:
        return union.body_call_sql(cal.selection, {**values, "epsilon": cal.selection_epsilon})
    args = [release.sql_value("tbl", values["tbl"], "VARCHAR"),
            release.sql_value("epsilon", cal.selection_epsilon, "DOUBLE"),
            release.sql_value("delta", values["delta"], "DOUBLE"),
            release.sql_value("max_items", values["max_items"], "DOUBLE"),
            release.sql_value("selection", cal.selection, "VARCHAR"),
            release.sql_value("pre_threshold", cal.pre_threshold, "DOUBLE"),
            release.sql_value("user_col", values["user_col"], "VARCHAR"),
            release.sql_value("item_col", values["item_col"], "VARCHAR")]
    return f"SELECT item FROM dp__group_by_pre_selection({', '.join(args)})"


def udfs(source: object) -> list[Udf]:
    """Calibration UDFs of dp_group_by (pure: folded while planning, so their checks run first)."""

    def cal_udf(epsilon, delta, max_items, aggregates, value_col, lower, upper, selection, split, pre_threshold,
                confidence, user_col, item_col):
        check_column_pair(user_col, item_col)
        cal = group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper, selection,
                                   split, confidence, pre_threshold)
        return _cal_row(cal)

    def public_cal_udf(epsilon, max_items, aggregates, value_col, lower, upper, confidence, user_col, item_col):
        check_column_pair(user_col, item_col)
        cal = group_by_calibration(epsilon, None, max_items, aggregates, value_col, lower, upper, None,
                                   None, confidence)
        return _cal_row(cal)

    def selection_sql(tbl, epsilon, delta, max_items, aggregates, value_col, lower, upper, selection, split,
                      pre_threshold, confidence, user_col, item_col):
        # The selection step of dp_group_by as SQL text, which query() binds (sql/97_groupby/groupby.sql): every
        # parameter is checked here, so a bad one fails while binding, before anything is read (the
        # release's wrapper charges the total once).
        cal = group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper, selection,
                                   split, confidence, pre_threshold)
        return selection_call_sql(cal, {"tbl": tbl, "delta": delta, "max_items": max_items, "user_col": user_col,
                                        "item_col": item_col})

    def pre_cal(method, epsilon, delta, max_items, pre_threshold):
        # the pre-thresholded selection (dp__group_by_pre_selection): the method's own noise and threshold
        sel = union.calibrate(method, epsilon, delta, max_items)
        weighting = union.METHODS[method].weighting
        if weighting is None:  # the release's check refuses it first (group_by_calibration)
            raise DPParameterError(f"pre_threshold > 1 needs selection := one of {', '.join(PRE_THRESHOLD_METHODS)}")
        return {"weighting": weighting, "gaussian": sel.noise == "gaussian", "scale": sel.scale,
                "threshold": sel.threshold, "shift": float(check_pre_threshold(pre_threshold) - 1)}

    d, v, vl = DOUBLE, VARCHAR, duckdb.list_type(VARCHAR)
    cal_type = duckdb.struct_type(_CAL_FIELDS)
    return [
        Udf("dp__group_by_calibration", scalar(cal_udf), (d, d, d, vl, v, d, d, v, d, d, d, v, v), cal_type),
        Udf("dp__group_by_public_calibration", scalar(public_cal_udf), (d, d, vl, v, d, d, d, v, v), cal_type),
        # pure: query() evaluates it once while binding dp__body_group_by
        Udf("dp__group_by_selection_sql", scalar(selection_sql), (v, d, d, d, vl, v, d, d, v, d, d, d, v, v), VARCHAR),
        Udf("dp__group_by_pre_calibration", scalar(pre_cal), (v, d, d, d, d),
            duckdb.struct_type({"weighting": VARCHAR, "gaussian": duckdb.sqltypes.BOOLEAN, "scale": DOUBLE,
                                "threshold": DOUBLE, "shift": DOUBLE})),
    ]


# --------------------------------------------------------------------------
# Python API
# --------------------------------------------------------------------------

def check_call(epsilon: object, delta: object, max_items: object, aggregates: Sequence[str], value_col: object,
               lower: object, upper: object, selection: object, split: object, pre_threshold: object,
               confidence: object, *, public: bool) -> GroupByCalibration:
    """The checks and calibration of a :func:`group_by` call (``public``: a list of items, no selection).

    With ``public`` a ``delta`` is refused and ``selection`` / ``split`` are not used (as the macro
    ``dp_group_by_public``, which has neither). Shared by the Spark backend.
    """
    if not public:
        return group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper, selection, split,
                                    confidence, pre_threshold)
    if delta is not None:
        raise DPParameterError("delta does not apply with items_tbl (a public domain spends no delta); leave it out")
    return group_by_calibration(epsilon, None, max_items, aggregates, value_col, lower, upper, None, None, confidence,
                                pre_threshold)


_NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                  "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL")


def _check_value_column(table: str, value_col: str, schema: list[tuple[str, str]]) -> None:
    """``value_col`` names a numeric column of ``table`` (``schema``: its columns and types): the macro's
    ``+ 0::DOUBLE`` would otherwise stop in DuckDB's binder with a message about ``+``."""
    kind = {name.lower(): kind for name, kind in schema}.get(value_col.lower())
    if kind is None:
        raise DPParameterError(f"value_col := {value_col!r} is not a column of {table!r}; its columns are "
                               f"{', '.join(name for name, _ in schema)}. Pass value_col := '<column name>'")
    if kind.upper().split("(")[0] not in _NUMERIC_TYPES:  # DECIMAL(p,s) is a number; INTEGER[] is not
        raise DPParameterError(f"value_col := {value_col!r} has type {kind}, not a number; convert it in a view "
                               f"first, e.g. CREATE VIEW v AS SELECT *, TRY_CAST({value_col} AS DOUBLE) AS value ...")


@accepts_tables("table", "items_tbl")
def group_by(con: duckdb.DuckDBPyConnection, table: str, *, epsilon: float, delta: Optional[float] = None,
             aggregates: Sequence[str] = ("count",), value_col: Optional[str] = None,
             lower: Optional[float] = None, upper: Optional[float] = None, max_items: int = 100,
             selection: str = union.DEFAULT_METHOD, split: float = DEFAULT_SPLIT, pre_threshold: int = 1,
             confidence: float = DEFAULT_CONFIDENCE, items_tbl: Optional[str] = None,
             user_col: str = "user_id", item_col: str = "item") -> pa.Table:
    """Private GROUP BY item: an Arrow table ``item`` plus, per aggregate, its value, noise scale and interval.

    Without ``items_tbl`` runs ``dp_group_by`` (selection by ``selection`` at ``(epsilon split,
    delta)``); with it runs ``dp_group_by_public`` (every listed item, ``(epsilon, 0)``; ``delta``
    must then be left out). Rows sorted by item. ``table`` and ``items_tbl``: a name or a file path, as
    for the SQL macros, or the data itself (a DataFrame, an Arrow table, a relation of ``con``: the scope
    each is charged to is in :mod:`dpsql.core.inputs`).
    """
    mech = MECHANISMS[0] if items_tbl is None else MECHANISMS[1]
    union._check_registered(con, mech.macro)
    given: dict[str, object] = {
        "tbl": table, "epsilon": epsilon, "max_items": max_items,
        "aggregates": list(aggregates) if isinstance(aggregates, tuple) else aggregates, "value_col": value_col,
        "lower": lower, "upper": upper, "confidence": confidence, "user_col": user_col, "item_col": item_col}
    if items_tbl is None:
        given.update(delta=delta, selection=selection, split=split, pre_threshold=pre_threshold)
    else:
        if delta is not None:
            raise DPParameterError("delta does not apply with items_tbl (a public domain spends no delta); "
                                   "leave it out")
        given["items_tbl"] = items_tbl
    # Every parameter checked once, by the declaration; the macro calibrates (its check raises the
    # calibration's dpsql error, e.g. a sum without bounds, before anything is read).
    values = mech.validate(**given)
    schema = union._table_schema(con, values["tbl"])  # one DESCRIBE for both column checks
    union._check_columns(con, values["tbl"], values["user_col"], values["item_col"], schema)
    if values["value_col"] is not None:
        _check_value_column(values["tbl"], values["value_col"], schema)
    return release.run(con, f"SELECT * FROM {release.call_sql(mech, values)} ORDER BY item")


# -- declarations (dpsql.core.mechanism) ------------------------------------------------------------------

def _aggregate_params() -> tuple[Param, ...]:
    return (Param("aggregates", "VARCHAR[]", ["count"], check_aggregates, "aggregates: count, sum, mean"),
            Param("value_col", "VARCHAR", None, lambda v: check_identifier("value_col", v),
                  "column of the values summed (sum, mean)"),
            Param("lower", "DOUBLE", None, None, "lower clamp of a user's total per item"),
            Param("upper", "DOUBLE", None, None, "upper clamp of a user's total per item"))


def _confidence_param() -> Param:
    return Param("confidence", "DOUBLE", DEFAULT_CONFIDENCE, check_confidence, "coverage of the reported intervals")


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="group_by", family="group_by", macro="dp_group_by", unit="user",
        params=(tbl_param(), epsilon_param(), delta_param(), max_items_param(), *_aggregate_params(),
                Param("selection", "VARCHAR", union.DEFAULT_METHOD, union.check_method,
                      "set-union method that selects the items"),
                Param("split", "DOUBLE", DEFAULT_SPLIT, check_selection_share, "share of epsilon spent on selection"),
                Param("pre_threshold", "DOUBLE", 1, check_pre_threshold,
                      "least number of users an item needs to be selected"),
                _confidence_param(), column_param("user_col", "user_id"), column_param("item_col", "item")),
        description="private GROUP BY: a set-union selection at (epsilon split, delta), then granular Laplace "
                    "count / sum / mean of the selected items at epsilon (1 - split)",
        proof="group_by", sql="97_groupby/groupby.sql",
        example=user_item_example(aggregates="['count', 'sum', 'mean']", value_col="'user_id'", lower="0", upper="10",
                                  selection=f"'{_ONE_SHOT}'", split="0.5", pre_threshold="1", confidence="0.9"),
        calibrate=lambda epsilon, delta, max_items=100, aggregates=("count",), value_col=None, lower=None,
        upper=None, selection=union.DEFAULT_METHOD, split=DEFAULT_SPLIT, confidence=DEFAULT_CONFIDENCE,
        pre_threshold=1, **_:
        group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper, selection, split,
                             confidence, pre_threshold),
        rounds=2),
    Mechanism(
        name="group_by_public", family="group_by", macro="dp_group_by_public", unit="user",
        params=(tbl_param(), Param("items_tbl", "VARCHAR", REQUIRED, check_table_name, "the public table of items"),
                epsilon_param(), max_items_param(), *_aggregate_params(), _confidence_param(),
                column_param("user_col", "user_id"), column_param("item_col", "item")),
        description="private GROUP BY over a public list of items (no selection): granular Laplace count / sum / "
                    "mean of every listed item at (epsilon, 0)",
        proof="group_by", sql="97_groupby/groupby.sql",
        # items_tbl: the table itself stands in for a public list
        example=user_item_example(items_tbl="'t'", delta=None, aggregates="['count', 'mean']", value_col="'user_id'",
                                  lower="0", upper="10", confidence="0.9"),
        # the aggregate step (the selection is a set-union release, audited as such): 3 users hold 2 public
        # items, the added user both; an item counts as released when its noisy count is >= 4 = n + 1, so
        # "2 of 2 released" has probability ratio e^(2 epsilon / max_items) = e^epsilon at max_items 2
        audit=(AuditCase("group_by_count", name="group_by_count", note="public domain, max_items 2; event: noisy count >= n + 1"),),
        calibrate=lambda epsilon, max_items=100, aggregates=("count",), value_col=None, lower=None, upper=None,
        confidence=DEFAULT_CONFIDENCE, **_:
        group_by_calibration(epsilon, None, max_items, aggregates, value_col, lower, upper, None, None, confidence),
        rounds=1),
)


def generated_sql() -> str:
    """``dp_group_by_calibration(...)``: dp_group_by's calibration without running it, its parameters (names,
    types, defaults) generated from the ``group_by`` declaration's, the table and column names left out
    (the registry creates it after the releasing macros)."""
    mech = next(m for m in MECHANISMS if m.name == "group_by")
    params = [p for p in mech.params if p.name not in ("tbl", "user_col", "item_col")]
    return (f"CREATE OR REPLACE TEMP MACRO dp_group_by_calibration({release.signature(params)}) AS\n"
            f"    dp__group_by_calibration({', '.join(p.name for p in params)}, 'user_id', 'item');\n")
