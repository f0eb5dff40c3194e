"""Private GROUP BY: the groups a set-union method selects (or a public list), with noisy aggregates per group.

Privacy unit: user-level add/remove (one user with all its rows). Proof note: ``docs/proofs/group_by.md``;
the calibration (contribution bounds, budget split, accountant, noise, interval half-widths) and its math:
:mod:`dpsql.groupby.calibration`.

``dp_group_by`` (unknown domain), in two steps charged as one release:

1. selection: the set-union method ``selection`` (any of :data:`dpsql.union.METHODS`) releases the group
   set ``S`` at the calibration's ``(selection_epsilon, selection_delta)``; with ``pre_threshold`` T > 1,
   ``dp__group_by_pre_selection`` instead (the one-shot weighting methods only, :data:`PRE_THRESHOLD_METHODS`);
   or one of dp_group_by's own rules (:data:`SELECTIONS`, :mod:`dpsql.groupby.selection`): the truncated
   geometric coin per group, or ``post_threshold`` (the noisy count itself selects; no selection budget).
   ``selection`` NULL (the default): the rule :func:`default_selection` names for ``max_items`` and
   ``max_groups`` (public parameters only), resolved by the calibration, which records it;
2. aggregates, given ``S`` (public from here on): each user's groups are restricted to ``S`` and capped to
   ``max_groups`` (default ``max_items``) by a salted hash of the user's own rows; each kept (user, group)
   cell has the user's number of rows (counted up to ``max_rows``) and value ``clamp(total, lower,
   upper)``; the measurements (count, rows, sum, sum of squares, the median's exponential mechanism) get
   granular Gaussian (default) or Laplace noise, composed with the selection by zCDP or basic composition
   (:mod:`dpsql.groupby.calibration`). mean, variance, stddev: post-processing.

A public list of groups (``items_tbl``) needs no selection: every listed group gets a row, and the
aggregates get the whole budget: ``dp_group_by(..., items_tbl := ...)`` with Gaussian (or Laplace) noise at
``(epsilon, delta)``, or ``dp_group_by_public`` with Laplace noise at ``(epsilon, 0)`` (pure DP: no delta).

Groups: one column ``item_col`` (output column ``item``), or several ``group_cols`` (output: one column per
grouping column, named as in the table): the key is the JSON text of the columns' values (``dp__group_key_value_rows``).

Accuracy: beside each value, its noise scale and the half-width of a ``confidence`` interval, from public
parameters only (the derived ones with the released count, post-processing).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import duckdb
import pyarrow as pa
from duckdb.sqltypes import BIGINT, BOOLEAN, DOUBLE, VARCHAR

from dpsql import union
from dpsql.core import release
from dpsql.core.inputs import accepts_tables
from dpsql.core.mechanism import (REQUIRED, AuditCase, Mechanism, Param, column_param, delta_param, epsilon_param,
                                  max_items_param, tbl_param, user_item_example, with_role)
from dpsql.core.udf import Udf, scalar
from dpsql.core.validation import DPParameterError, check_column_pair, check_identifier, check_table_name
from dpsql.groupby.calibration import (AGGREGATES, DEFAULT_CONFIDENCE, DEFAULT_SPLIT, MEASUREMENTS, MEDIAN_BINS,
                                       NOISES, PER_SETTING, POST_THRESHOLD, PRE_THRESHOLD_METHODS, SELECTIONS,
                                       TRUNCATED_GEOMETRIC, TRUNCATED_GEOMETRIC_MAX_CAP,
                                       GroupByCalibration, Measurement, check_aggregates, check_confidence,
                                       check_group_cols, check_max_groups, check_max_rows, check_noise,
                                       check_pre_threshold, check_selection, check_selection_share, default_selection,
                                       gaussian_ci, group_by_calibration, laplace_ci, measurements, median_ci,
                                       selection_zcdp)
from dpsql.groupby.selection import keep_udf

__all__ = ["AGGREGATES", "NOISES", "MEASUREMENTS", "MEDIAN_BINS", "DEFAULT_SPLIT", "DEFAULT_CONFIDENCE",
           "PRE_THRESHOLD_METHODS", "GroupByCalibration", "Measurement", "group_by_calibration", "check_aggregates",
           "check_noise", "check_max_groups", "check_max_rows", "check_group_cols", "check_selection_share",
           "check_confidence", "check_pre_threshold", "measurements", "laplace_ci", "gaussian_ci", "median_ci",
           "selection_zcdp", "check_selection", "SELECTIONS", "TRUNCATED_GEOMETRIC", "POST_THRESHOLD", "check_call",
           "default_selection", "TRUNCATED_GEOMETRIC_MAX_CAP", "PER_SETTING",
           "group_by", "udfs", "generated_sql", "MECHANISMS"]

# The selection of the conformance example: the family's reference one-shot method (it offers a pre-threshold).
_ONE_SHOT = with_role(union.METHODS.values(), "reference_one_shot")


# --------------------------------------------------------------------------
# UDFs
# --------------------------------------------------------------------------

# selection: the rule that selects (NULL with a public list), the per-setting default resolved, so a user sees it
_CAL_FIELDS = {"selection": VARCHAR, "gaussian": BOOLEAN, "max_rows": DOUBLE, "lower": DOUBLE, "upper": DOUBLE,
               "centre": DOUBLE, "half": DOUBLE, "sum_limit": DOUBLE, "aggregate_epsilon": DOUBLE,
               **{f"{m}_{f}": DOUBLE for m in ("count", "rows", "sum", "sumsq")
                  for f in ("granularity", "scale", "ci")},
               "mean_count_ci": DOUBLE, "mean_sum_ci": DOUBLE, "var_count_ci": DOUBLE, "var_sum_ci": DOUBLE,
               "var_sumsq_ci": DOUBLE, "median_bins": DOUBLE, "median_step": DOUBLE, "median_scale": DOUBLE,
               "median_ci": DOUBLE, "selection_threshold": DOUBLE}


def _cal_row(cal: GroupByCalibration) -> dict[str, Any]:
    """The one-row ``dp__cal`` of the SQL bodies (NULL: a measurement not made)."""
    row: dict[str, Any] = {k: None for k in _CAL_FIELDS}
    row.update(selection=cal.selection, gaussian=cal.noise == "gaussian", max_rows=float(cal.max_rows),
               lower=cal.lower, upper=cal.upper, aggregate_epsilon=cal.aggregate_epsilon,
               selection_threshold=cal.selection_threshold)
    if cal.lower is not None and cal.upper is not None:
        row.update(centre=(cal.lower + cal.upper) / 2.0, half=(cal.upper - cal.lower) / 2.0)
    for m in cal.measures:
        if m.name == "median":
            assert cal.lower is not None and cal.upper is not None
            row.update(median_bins=float(MEDIAN_BINS), median_step=(cal.upper - cal.lower) / MEDIAN_BINS,
                       median_scale=m.scale, median_ci=m.ci)
            continue
        row.update({f"{m.name}_granularity": m.granularity, f"{m.name}_scale": m.scale, f"{m.name}_ci": m.ci})
        if m.name in ("count", "sum"):
            row[f"mean_{m.name}_ci"] = m.ci_mean
        row[f"var_{m.name}_ci"] = m.ci_variance
    # sum_limit (in grid steps): sums are clamped to +-2^50 steps (1-Lipschitz, so the sensitivity holds)
    # so that sum + noise stays an exact multiple of g in a double (no error after the charge).
    if cal.measure("sum") is not None or cal.measure("sumsq") is not None:
        row["sum_limit"] = float(2 ** 50)
    return row


def _literal_list(name: str, values: Optional[Sequence[str]]) -> str:
    return release.sql_value(name, None if values is None else list(values), "VARCHAR[]")


# The CTE through which a set-union method reads the keys of group_cols (its `tbl`).
_KEYS_CTE = "dp__group_keys"


def selection_call_sql(cal: GroupByCalibration, values: dict[str, Any]) -> str:
    """The selection step of ``dp_group_by`` calibrated by ``cal``, as the SQL text ``dp__body_group_by`` runs.

    ``pre_threshold`` 1: the body of the set-union method ``cal.selection`` (:func:`dpsql.union.body_call_sql`,
    the dispatcher's rendering) at ``(selection_epsilon, selection_delta)``; above 1: ``dp__group_by_pre_selection``.
    ``values`` holds ``tbl``, ``max_items``, ``user_col``, ``item_col``, ``group_cols`` and ``items_tbl`` as bound;
    every value is a SQL literal (:func:`dpsql.core.release.sql_value`). With ``group_cols`` the method reads the
    CTE ``dp__group_keys`` (user_id, item = the groups' key) of the same text. With ``items_tbl`` (``cal`` has no
    selection): the public groups, :func:`public_items_sql`.
    """
    group_cols = values.get("group_cols")
    if cal.selection is None:  # a public list of groups: no selection
        return public_items_sql(values["tbl"], values["items_tbl"], values["item_col"], group_cols)
    if cal.selection == POST_THRESHOLD:  # the body selects by the noisy counts (dp__post_threshold)
        rows = rows_sql(values["tbl"], None, values["user_col"], values["item_col"], group_cols)
        return f"SELECT item FROM ({rows}) WHERE false"  # typed as the groups, empty
    prefix = ""
    target = dict(values)
    if group_cols is not None:
        prefix = (f"WITH {_KEYS_CTE} AS (SELECT user_id, item FROM dp__group_key_value_rows("
                  f"{release.sql_value('tbl', values['tbl'], 'VARCHAR')}, NULL, "
                  f"{release.sql_value('user_col', values['user_col'], 'VARCHAR')}, "
                  f"{_literal_list('group_cols', group_cols)})) ")
        target.update(tbl=_KEYS_CTE, user_col="user_id", item_col="item")
    if cal.selection == TRUNCATED_GEOMETRIC:
        return _truncated_geometric_sql(cal, prefix, target)
    if cal.pre_threshold == 1:
        return prefix + union.body_call_sql(cal.selection, {**target, "epsilon": cal.selection_epsilon,
                                                            "delta": cal.selection_delta})
    args = [release.sql_value("tbl", target["tbl"], "VARCHAR"),
            release.sql_value("epsilon", cal.selection_epsilon, "DOUBLE"),
            release.sql_value("delta", cal.selection_delta, "DOUBLE"),
            release.sql_value("max_items", target["max_items"], "DOUBLE"),
            release.sql_value("selection", cal.selection, "VARCHAR"),
            release.sql_value("pre_threshold", cal.pre_threshold, "DOUBLE"),
            release.sql_value("user_col", target["user_col"], "VARCHAR"),
            release.sql_value("item_col", target["item_col"], "VARCHAR")]
    return prefix + f"SELECT item FROM dp__group_by_pre_selection({', '.join(args)})"


def _truncated_geometric_sql(cal: GroupByCalibration, prefix: str, target: dict[str, Any]) -> str:
    """The truncated geometric selection: each user keeps ``selection_cap`` groups (``dp__capped_user_items``),
    ``n`` = the users per group, counted by the engine; one coin ``dp__group_by_keep(n, e0, d0)`` per group, in
    group order (a seeded release is reproducible) (docs/proofs/truncated_geometric.md)."""
    assert cal.selection_cap is not None
    args = ", ".join([release.sql_value("tbl", target["tbl"], "VARCHAR"),
                      f"max_items := {release.sql_value('max_groups', cal.selection_cap, 'DOUBLE')}",
                      f"user_col := {release.sql_value('user_col', target['user_col'], 'VARCHAR')}",
                      f"item_col := {release.sql_value('item_col', target['item_col'], 'VARCHAR')}"])
    counts = (f"dp__tg_counts AS MATERIALIZED (SELECT item, count(*) AS n FROM dp__capped_user_items({args}) "
              f"GROUP BY item ORDER BY item)")
    ctes = f"{prefix}, {counts}" if prefix else f"WITH {counts}"
    e0 = release.sql_value("epsilon", cal.selection_group_epsilon, "DOUBLE")
    d0 = release.sql_value("delta", cal.selection_group_delta, "DOUBLE")
    return f"{ctes} SELECT item FROM dp__tg_counts WHERE dp__group_by_keep(n, {e0}, {d0})"


def rows_sql(tbl: str, value_col: Optional[str], user_col: str, item_col: str,
             group_cols: Optional[Sequence[str]]) -> str:
    """The rows (user_id, item, v) the aggregates read, as SQL text: ``dp__user_item_value_rows`` or, with
    ``group_cols``, ``dp__group_key_value_rows`` (item = the groups' key)."""
    t, v = release.sql_value("tbl", tbl, "VARCHAR"), release.sql_value("value_col", value_col, "VARCHAR")
    u = release.sql_value("user_col", user_col, "VARCHAR")
    if group_cols is None:
        i = release.sql_value("item_col", item_col, "VARCHAR")
        return f"SELECT user_id, item, v FROM dp__user_item_value_rows({t}, {v}, user_col := {u}, item_col := {i})"
    return (f"SELECT user_id, item, v FROM dp__group_key_value_rows({t}, {v}, {u}, "
            f"{_literal_list('group_cols', group_cols)})")


def _key_sql(group_cols: Sequence[str]) -> tuple[str, str]:
    """(the key expression of ``group_cols``, their COLUMNS selector) as SQL text (dp__group_key_value_rows's key)."""
    names = _literal_list("group_cols", [g.lower() for g in group_cols])
    pick = f"COLUMNS(lambda c: list_contains({names}, lower(c)))"
    return f"dp__canonical(json_array(*{pick})::VARCHAR)", pick


def labels_sql(tbl: str, group_cols: Optional[Sequence[str]], groups: str = "dp__selected") -> str:
    """The group's columns of each released key (``dp__labels``: dp__key, then the columns, named and typed as in
    ``tbl``), as SQL text; without ``group_cols`` the one column ``item`` (the key itself). ``groups``: the
    relation (a CTE of the release) of the released keys (column ``item``).

    From the private table (dp_group_by) this reads the rows of the released keys only (``groups``), and
    every row of one key holds the same tuple (docs/proofs/group_by.md §10): the columns are a function of the
    released key."""
    rel = f"query_table({release.sql_value('groups', groups, 'VARCHAR')})"
    if group_cols is None:
        return f"SELECT item AS dp__key, item FROM {rel}"
    key, pick = _key_sql(group_cols)
    t = release.sql_value("tbl", tbl, "VARCHAR")
    return (f"SELECT dp__key, any_value({pick}) FROM (SELECT {key} AS dp__key, {pick} FROM query_table({t})) "
            f"WHERE dp__key IN (SELECT item FROM {rel}) GROUP BY dp__key")


def median_sql(aggregates: Sequence[str], kept: str, groups: str, cal: str) -> str:
    """The median step of ``dp__group_by_aggregates`` as SQL text (``dp__median``: item, median_j): with
    ``'median'`` among ``aggregates``, ``dp__group_by_median`` of the relations (CTEs of the release) ``kept``,
    ``groups`` and ``cal``; without, no rows (chosen while DuckDB binds, so the median's plan is not built)."""
    g = release.sql_value("groups", groups, "VARCHAR")
    if "median" not in aggregates:
        return f"SELECT item, CAST(NULL AS BIGINT) AS median_j FROM query_table({g}) WHERE false"
    k, c = release.sql_value("kept", kept, "VARCHAR"), release.sql_value("cal", cal, "VARCHAR")
    return f"SELECT item, median_j FROM dp__group_by_median({k}, {g}, {c})"


def public_items_sql(tbl: str, items_tbl: str, item_col: str, group_cols: Optional[Sequence[str]]) -> str:
    """The public groups (``dp__selected`` of dp_group_by_public: one column ``item``) as SQL text: the distinct
    canonical values of ``items_tbl``'s ``item_col``, or the distinct keys of its ``group_cols``; each public
    column must have the private column's type (``dp__check_same_type``), checked before anything is read."""
    it, t = release.sql_value("items_tbl", items_tbl, "VARCHAR"), release.sql_value("tbl", tbl, "VARCHAR")
    if group_cols is None:
        i = release.sql_value("item_col", item_col, "VARCHAR")
        return (f"SELECT DISTINCT dp__canonical(coalesce(coalesce(*COLUMNS(lambda c: lower(c) = lower({i}) "
                f"OR c = 'dp__absent')), error('dpsql: column ' || {i} || ' (item_col) of items_tbl contains NULL; '"
                f" || 'filter it out first'))) AS item "
                f"FROM (SELECT *, NULL AS dp__absent FROM query_table({it}) "
                f"WHERE dp__check_column_list({it}, ['item_col'], [{i}]) "
                f"AND dp__check_same_type({it}, {i}, 'items_tbl', {t}, {i}, 'item_col'))")
    key, pick = _key_sql(group_cols)
    cols = _literal_list("group_cols", group_cols)
    same = " AND ".join(f"dp__check_same_type({it}, {release.sql_value('group_cols', g, 'VARCHAR')}, 'items_tbl', "
                        f"{t}, {release.sql_value('group_cols', g, 'VARCHAR')}, 'group_cols')" for g in group_cols)
    return (f"SELECT DISTINCT item FROM (SELECT {key} AS item, "
            f"list_contains(list_transform(json_extract({key}, '$[*]'), lambda x: json_type(x)), 'NULL') AS dp__null "
            f"FROM query_table({it}) WHERE dp__check_column_list({it}, list_transform({cols}, lambda g: 'group_cols'), "
            f"{cols}) AND {same}) "
            f"WHERE CASE WHEN dp__null THEN error('dpsql: a column of group_cols of items_tbl contains NULL; filter "
            f"it out first') ELSE true END")


def _selection_arg(selection: object, public: bool) -> object:
    """group_by_calibration's ``selection`` for dp_group_by's: None with a public list (no selection); the
    declaration's NULL default as :data:`PER_SETTING` (the calibration resolves it by the setting)."""
    if public:
        return None
    return PER_SETTING if selection is None else selection


def _check_columns_call(user_col: object, item_col: object, group_cols: object) -> None:
    if group_cols is None:
        check_column_pair(user_col, item_col)
        return
    for g in check_group_cols(group_cols) or ():
        if str(user_col).lower() == g.lower():
            raise DPParameterError("user_col must not be one of group_cols")


def udfs(source: object) -> list[Udf]:
    """Calibration and SQL-text UDFs of dp_group_by (pure: folded while planning, so their checks run first)."""

    def calibrate(epsilon, delta, max_items, aggregates, value_col, lower, upper, noise, max_groups, max_rows,
                  selection, split, pre_threshold, confidence, group_cols, items_tbl, user_col, item_col, groups=None):
        _check_columns_call(user_col, item_col, group_cols)
        if items_tbl is not None:
            check_table_name(items_tbl)
        return group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper,
                                    _selection_arg(selection, items_tbl is not None), split, confidence,
                                    pre_threshold, noise, max_groups, max_rows, groups)

    # `groups`: the number of groups released (NULL: not known yet, the calibration before the selection)
    def cal_udf(epsilon, delta, max_items, aggregates, value_col, lower, upper, noise, max_groups, max_rows,
                selection, split, pre_threshold, confidence, group_cols, items_tbl, user_col, item_col, groups):
        return _cal_row(calibrate(epsilon, delta, max_items, aggregates, value_col, lower, upper, noise, max_groups,
                                  max_rows, selection, split, pre_threshold, confidence, group_cols, items_tbl,
                                  user_col, item_col, groups))

    def public_cal_udf(epsilon, max_items, aggregates, value_col, lower, upper, max_groups, max_rows, confidence,
                       group_cols, user_col, item_col, groups):
        _check_columns_call(user_col, item_col, group_cols)
        return _cal_row(group_by_calibration(epsilon, None, max_items, aggregates, value_col, lower, upper, None,
                                             None, confidence, 1, "laplace", max_groups, max_rows, groups))

    def selection_sql(tbl, epsilon, delta, max_items, aggregates, value_col, lower, upper, noise, max_groups,
                      max_rows, selection, split, pre_threshold, confidence, group_cols, items_tbl, user_col,
                      item_col):
        # The selection step of dp_group_by as SQL text, which query() binds (sql/97_groupby/groupby.sql): every
        # parameter is checked here, so a bad one fails while binding, before anything is read (the
        # release's wrapper charges the total once).
        cal = calibrate(epsilon, delta, max_items, aggregates, value_col, lower, upper, noise, max_groups, max_rows,
                        selection, split, pre_threshold, confidence, group_cols, items_tbl, user_col, item_col)
        return selection_call_sql(cal, {"tbl": tbl, "max_items": max_items, "user_col": user_col,
                                        "item_col": item_col, "group_cols": check_group_cols(group_cols),
                                        "items_tbl": items_tbl})

    def rows_udf(tbl, value_col, user_col, item_col, group_cols):
        return rows_sql(check_table_name(tbl), value_col, check_identifier("user_col", user_col),
                        check_identifier("item_col", item_col), check_group_cols(group_cols))

    def labels_udf(tbl, group_cols, groups):
        return labels_sql(check_table_name(tbl), check_group_cols(group_cols), check_identifier("groups", groups))

    def median_udf(aggregates, kept, groups, cal):
        return median_sql(check_aggregates(aggregates), check_identifier("kept", kept),
                          check_identifier("groups", groups), check_identifier("cal", cal))

    def public_items_udf(tbl, items_tbl, item_col, group_cols):
        return public_items_sql(check_table_name(tbl), check_table_name(items_tbl),
                                check_identifier("item_col", item_col), check_group_cols(group_cols))

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
    # epsilon, delta, max_items, aggregates, value_col, lower, upper, noise, max_groups, max_rows, selection, split,
    # pre_threshold, confidence, group_cols, items_tbl, user_col, item_col: the declaration's order
    args = (d, d, d, vl, v, d, d, v, d, d, v, d, d, d, vl, v, v, v)
    return [
        # the truncated geometric coin (dpsql.groupby.selection): draws, so never folded
        Udf("dp__group_by_keep", keep_udf(source), (BIGINT, d, d), BOOLEAN, side_effects=True),
        Udf("dp__group_by_calibration", scalar(cal_udf), (*args, BIGINT), cal_type),
        Udf("dp__group_by_public_calibration", scalar(public_cal_udf),
            (d, d, vl, v, d, d, d, d, d, vl, v, v, BIGINT), cal_type),
        # pure: query() evaluates them once while binding dp__body_group_by (and dp__group_by_aggregates)
        Udf("dp__group_by_selection_sql", scalar(selection_sql), (v, *args), VARCHAR),
        Udf("dp__group_by_rows_sql", scalar(rows_udf), (v, v, v, v, vl), VARCHAR),
        Udf("dp__group_by_labels_sql", scalar(labels_udf), (v, vl, v), VARCHAR),
        Udf("dp__group_by_public_items_sql", scalar(public_items_udf), (v, v, v, vl), VARCHAR),
        Udf("dp__group_by_median_sql", scalar(median_udf), (vl, v, v, v), VARCHAR),
        Udf("dp__group_by_pre_calibration", scalar(pre_cal), (v, d, d, d, d),
            duckdb.struct_type({"weighting": VARCHAR, "gaussian": BOOLEAN, "scale": DOUBLE,
                                "threshold": DOUBLE, "shift": DOUBLE})),
    ]


# --------------------------------------------------------------------------
# Python API
# --------------------------------------------------------------------------

def check_call(epsilon: object, delta: object, max_items: object, aggregates: Sequence[str], value_col: object,
               lower: object, upper: object, selection: object, split: object, pre_threshold: object,
               confidence: object, *, public: bool, noise: object = None, max_groups: object = None,
               max_rows: object = 1, groups: Optional[int] = None) -> GroupByCalibration:
    """The checks and calibration of a :func:`group_by` call (``public``: a list of groups, no selection).

    With ``public``, ``selection`` / ``split`` are not used, and without a ``delta`` the noise is Laplace at
    ``(epsilon, 0)`` (the macro ``dp_group_by_public``); with one, the aggregates get ``(epsilon, delta)``
    (``dp_group_by`` with ``items_tbl``). ``groups``: the number of groups released, once known (the noise's
    ``L0 = min(max_groups, groups)``). Shared by the Spark backend.
    """
    if not public:
        return group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper,
                                    _selection_arg(selection, False), split, confidence, pre_threshold, noise,
                                    max_groups, max_rows, groups)
    return group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper, None, None, confidence,
                                pre_threshold, noise, max_groups, max_rows, groups)


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


def _check_group_columns(table: str, user_col: str, group_cols: Sequence[str], schema: list[tuple[str, str]]) -> None:
    names = {name.lower() for name, _ in schema}
    for param, col in [("user_col", user_col)] + [("group_cols", g) for g in group_cols]:
        if col.lower() not in names:
            raise DPParameterError(f"{param} := {col!r} is not a column of {table!r}; its columns are "
                                   f"{', '.join(name for name, _ in schema)}. Pass {param} := '<column name>'")


@accepts_tables("table", "items_tbl")
def group_by(con: duckdb.DuckDBPyConnection, table: str, *, epsilon: float, delta: Optional[float] = None,
             aggregates: Sequence[str] = ("count",), value_col: Optional[str] = None,
             lower: Optional[float] = None, upper: Optional[float] = None, max_items: int = 100,
             noise: Optional[str] = None, max_groups: Optional[int] = None, max_rows: int = 1,
             selection: Optional[str] = None, split: float = DEFAULT_SPLIT, pre_threshold: int = 1,
             confidence: float = DEFAULT_CONFIDENCE, items_tbl: Optional[str] = None,
             group_cols: Optional[Sequence[str]] = None, user_col: str = "user_id",
             item_col: str = "item") -> pa.Table:
    """Private GROUP BY: an Arrow table of the groups plus, per aggregate, its value, noise scale and interval.

    Without ``items_tbl`` runs ``dp_group_by`` (selection by ``selection``, then the aggregates; ``delta``
    required). With it every listed group gets a row, no selection: with a ``delta``, ``dp_group_by(...,
    items_tbl := ...)`` (Gaussian noise by default, at ``(epsilon, delta)``); without, ``dp_group_by_public``
    (Laplace noise at ``(epsilon, 0)``). ``noise`` None: the macro's default. ``group_cols``: group by several
    columns (one output column each, named as in the table) instead of ``item_col`` (output column ``item``).
    Rows sorted by the group. ``table``
    and ``items_tbl``: a name or a file path, as for the SQL macros, or the data itself (a DataFrame, an
    Arrow table, a relation of ``con``: the scope each is charged to is in :mod:`dpsql.core.inputs`).
    """
    pure = items_tbl is not None and delta is None
    mech = MECHANISMS[1] if pure else MECHANISMS[0]
    union._check_registered(con, mech.macro)
    given: dict[str, object] = {
        "tbl": table, "epsilon": epsilon, "max_items": max_items,
        "aggregates": list(aggregates) if isinstance(aggregates, tuple) else aggregates, "value_col": value_col,
        "lower": lower, "upper": upper, "max_groups": max_groups, "max_rows": max_rows, "confidence": confidence,
        "group_cols": list(group_cols) if isinstance(group_cols, tuple) else group_cols, "user_col": user_col,
        "item_col": item_col, "items_tbl": items_tbl}
    if pure:
        if noise not in (None, "laplace"):
            raise DPParameterError("noise := 'gaussian' needs delta := <a small number, e.g. 1e-5>; or pass "
                                   "noise := 'laplace' for (epsilon, 0)-DP")
    else:
        given.update(delta=delta, selection=selection, split=split, pre_threshold=pre_threshold,
                     **({} if noise is None else {"noise": noise}))
    # Every parameter checked once, by the declaration; the macro calibrates (its check raises the
    # calibration's dpsql error, e.g. a sum without bounds, before anything is read).
    values = mech.validate(**given)
    schema = union._table_schema(con, values["tbl"])  # one DESCRIBE for every column check
    if values["group_cols"] is None:
        union._check_columns(con, values["tbl"], values["user_col"], values["item_col"], schema)
    else:
        _check_group_columns(values["tbl"], values["user_col"], values["group_cols"], schema)
    if values["value_col"] is not None:
        _check_value_column(values["tbl"], values["value_col"], schema)
    return release.run(con, f"SELECT * FROM {release.call_sql(mech, values)}")


# -- declarations (dpsql.core.mechanism) ------------------------------------------------------------------

def _aggregate_params(noise: bool) -> tuple[Param, ...]:
    """aggregates, value_col, lower, upper[, noise], max_groups, max_rows (this order: the calibration UDFs')."""
    return (Param("aggregates", "VARCHAR[]", ["count"], check_aggregates,
                  "aggregates: " + ", ".join(AGGREGATES)),
            Param("value_col", "VARCHAR", None, lambda v: check_identifier("value_col", v),
                  "column of the values (sum, mean, variance, stddev, median)"),
            Param("lower", "DOUBLE", None, None, "lower clamp of a user's total per group"),
            Param("upper", "DOUBLE", None, None, "upper clamp of a user's total per group"),
            *((Param("noise", "VARCHAR", "gaussian", check_noise, "noise of the aggregates: gaussian or laplace"),)
              if noise else ()),
            Param("max_groups", "DOUBLE", None, check_max_groups,
                  "groups a user contributes to the aggregates (NULL: max_items)"),
            Param("max_rows", "DOUBLE", 1, check_max_rows, "rows per user per group counted by 'rows'"))


def _confidence_param() -> Param:
    return Param("confidence", "DOUBLE", DEFAULT_CONFIDENCE, check_confidence, "coverage of the reported intervals")


def _group_cols_param() -> Param:
    return Param("group_cols", "VARCHAR[]", None, check_group_cols,
                 "columns to group by (NULL: item_col); one output column each")


def _calibrate_group_by(epsilon, delta, max_items=100, aggregates=("count",), value_col=None, lower=None, upper=None,
                        noise="gaussian", max_groups=None, max_rows=1, selection=None,
                        split=DEFAULT_SPLIT, pre_threshold=1, confidence=DEFAULT_CONFIDENCE, items_tbl=None, **_):
    """dp_group_by's calibration (what the ledger records, with the selection rule that ran): no selection with a
    public ``items_tbl``."""
    return group_by_calibration(epsilon, delta, max_items, aggregates, value_col, lower, upper,
                                _selection_arg(selection, items_tbl is not None), split, confidence, pre_threshold,
                                noise, max_groups, max_rows)


def _calibrate_public(epsilon, max_items=100, aggregates=("count",), value_col=None, lower=None, upper=None,
                      max_groups=None, max_rows=1, confidence=DEFAULT_CONFIDENCE, **_):
    """dp_group_by_public's calibration: Laplace noise at (epsilon, 0) on every listed group."""
    return group_by_calibration(epsilon, None, max_items, aggregates, value_col, lower, upper, None, None, confidence,
                                1, "laplace", max_groups, max_rows)


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="group_by", family="group_by", macro="dp_group_by", unit="user",
        params=(tbl_param(), epsilon_param(), delta_param(), max_items_param(), *_aggregate_params(noise=True),
                # NULL: per setting (calibration.default_selection, the rule the calibration records)
                Param("selection", "VARCHAR", None, check_selection,
                      f"how groups are selected: a set-union method, 'truncated_geometric' or 'post_threshold' "
                      f"(NULL: 'truncated_geometric' when max_items and max_groups are at most "
                      f"{TRUNCATED_GEOMETRIC_MAX_CAP}, else '{union.DEFAULT_METHOD}')"),
                Param("split", "DOUBLE", DEFAULT_SPLIT, check_selection_share,
                      "share of epsilon spent on selection (post_threshold: the share of delta)"),
                Param("pre_threshold", "DOUBLE", 1, check_pre_threshold,
                      "least number of users a group needs to be selected"),
                _confidence_param(), _group_cols_param(),
                Param("items_tbl", "VARCHAR", None, check_table_name,
                      "a public table of the groups (NULL: select them): no selection, every listed group a row"),
                column_param("user_col", "user_id"), column_param("item_col", "item")),
        description="private GROUP BY: a set-union selection at (epsilon split, delta) (or a public list), then "
                    "granular Gaussian (or Laplace) count / rows / sum / mean / variance / stddev / median of the "
                    "groups, composed with the selection by zCDP",
        proof="group_by", sql="97_groupby/groupby.sql",
        example=user_item_example(aggregates="['count', 'rows', 'sum', 'mean', 'variance', 'stddev', 'median']",
                                  value_col="'user_id'", lower="0", upper="10", noise="'gaussian'",
                                  max_groups="5", max_rows="2", selection=f"'{_ONE_SHOT}'", split="0.5",
                                  pre_threshold="1", confidence="0.9", group_cols="NULL", items_tbl="NULL"),
        # the aggregate step over a public list, Gaussian (the selection is a set-union release, audited as such)
        audit=(AuditCase("group_by_count", name="group_by_count_gaussian",
                         note="public domain (items_tbl), max_groups 2, Gaussian at (epsilon, delta); event: noisy "
                              "count >= n + 1"),
               # dp_group_by's own selection rules (dpsql.groupby.selection); the set-union ones are audited as such
               AuditCase("group_by_selection", name="group_by_truncated_geometric",
                         options=(("selection", TRUNCATED_GEOMETRIC), ("max_groups", 1)),
                         note="truncated geometric coin, max_groups 1, against its (epsilon split, delta split); "
                              "event: the group is released"),
               AuditCase("group_by_selection", name="group_by_truncated_geometric_l0",
                         options=(("selection", TRUNCATED_GEOMETRIC), ("max_groups", 2)),
                         note="truncated geometric coins at (epsilon, delta) split / 2 per group, max_groups 2; "
                              "event: how many of the added user's 2 groups are released"),
               AuditCase("group_by_selection", name="group_by_post_threshold",
                         options=(("selection", POST_THRESHOLD), ("max_groups", 2)),
                         note="post-aggregation threshold, Gaussian count, max_groups 2, against (epsilon, delta); "
                              "event: how many of the added user's 2 groups are released")),
        calibrate=_calibrate_group_by,
        rounds=2),
    Mechanism(
        name="group_by_public", family="group_by", macro="dp_group_by_public", unit="user",
        params=(tbl_param(), Param("items_tbl", "VARCHAR", REQUIRED, check_table_name, "the public table of groups"),
                epsilon_param(), max_items_param(), *_aggregate_params(noise=False), _confidence_param(),
                _group_cols_param(), column_param("user_col", "user_id"), column_param("item_col", "item")),
        description="private GROUP BY over a public list of groups (no selection): granular Laplace count / rows / "
                    "sum / mean / variance / stddev / median of every listed group at (epsilon, 0)",
        proof="group_by", sql="97_groupby/groupby.sql",
        # items_tbl: the table itself stands in for a public list
        example=user_item_example(items_tbl="'t'", delta=None, aggregates="['count', 'mean', 'median']",
                                  value_col="'user_id'", lower="0", upper="10", max_groups="NULL", max_rows="1",
                                  confidence="0.9", group_cols="NULL"),
        # the aggregate step: 3 users hold 2 public groups, the added user both; a group counts as released when
        # its noisy count is >= 4 = n + 1, so "2 of 2 released" has probability ratio e^(2 epsilon / max_groups)
        # = e^epsilon at max_groups 2
        audit=(AuditCase("group_by_count", name="group_by_count",
                         note="public domain, max_groups 2, Laplace; event: noisy count >= n + 1"),
               AuditCase("group_by_count", name="group_by_rows", options=(("aggregate", "rows"),),
                         note="public domain, max_groups 2, max_rows 3, Laplace; the added user has 3 rows per "
                              "group; event: noisy rows >= 3n + 3"),
               AuditCase("group_by_median", name="group_by_median",
                         note="public domain, max_groups 2, Laplace; median over [0, 10]: 20 users at 0, the added "
                              "user at 10; event: median = 0")),
        calibrate=_calibrate_public,
        rounds=1),
)


def generated_sql() -> str:
    """``dp_group_by_calibration(...)``: dp_group_by's calibration without running it, its parameters (names,
    types, defaults) generated from the ``group_by`` declaration's, the table and column names left out
    (the registry creates it after the releasing macros)."""
    mech = next(m for m in MECHANISMS if m.name == "group_by")
    params = [p for p in mech.params if p.name not in ("tbl", "user_col", "item_col")]
    # the calibration before the selection: L0 = max_groups (the release's own may be smaller, L0 = min(max_groups,
    # the number of groups released))
    return (f"CREATE OR REPLACE TEMP MACRO dp_group_by_calibration({release.signature(params)}) AS\n"
            f"    dp__group_by_calibration({', '.join(p.name for p in params)}, 'user_id', 'item', NULL);\n")
