"""Keys by identity: which DuckDB types group values by their representation.

A GROUP BY, DISTINCT or join merges values that compare equal and keeps one row's spelling for the
group. Where equal values can print differently ('SECRET' = 'secret' under NOCASE, INTERVAL
'1 month' = '30 days', -0.0 = 0.0), the spelling released depends on which private row came first,
and one added user's spelling shows in the release. :func:`key_type_problem` says, from a column's
DESCRIBEd type alone (no row read), whether a key of that type groups by identity once the readers
pass it through ``dp__canonical`` (sql/00_core/15_checks.sql: a top-level VARCHAR of any collation made
binary), and if not, why and how to fix it. An allow-list: a type dpsql has not examined (VARIANT,
GEOMETRY, an extension's type) is refused, never assumed exact.
"""
from __future__ import annotations

import re
from typing import Optional

from duckdb.sqltypes import VARCHAR

from dpsql.core.udf import Udf, scalar

__all__ = ["ACCEPTED", "type_words", "key_type_problem", "udfs"]

# BOOLEAN, the integers, DECIMAL, BIGNUM, BIT, BLOB, UUID, DATE, TIME, the TIMESTAMPs (TIMESTAMPTZ is an
# instant), ENUM, the type "NULL" (a column of NULLs: the reader's NULL error names it), and these
# nested in LIST, ARRAY, STRUCT and MAP; VARCHAR and JSON at the top level only.
ACCEPTED = frozenset({
    "BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
    "UBIGINT", "UHUGEINT", "DECIMAL", "BIGNUM", "BIT", "BLOB", "UUID", "DATE", "TIME", "TIME_NS", "TIMESTAMP",
    "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS", "TIMESTAMPTZ", "TIMESTAMPTZ_NS", "ENUM", "STRUCT", "MAP",
    "VARCHAR", "JSON", '"NULL"'})

_QUOTED_NAME = re.compile(r'"(?:[^"]|"")*" |\'(?:[^\']|\'\')*\'')  # a quoted field name, or an ENUM label
_FIELD_NAME = re.compile(r'([(]|, )[^ "(),\[\]]+ ')                  # an unquoted field name after ( or ,
_WORD = re.compile(r'[^ (),\[\]0-9][^ (),\[\]]*')


def type_words(t: str) -> list[str]:
    """The words of a DESCRIBEd type, without struct field names and ENUM labels (which may spell anything,
    a type name included): ``'STRUCT(a DOUBLE, "b c" VARCHAR[])'`` -> ``['STRUCT', 'DOUBLE', 'VARCHAR']``.
    A quoted word that is no field name (the type ``"NULL"``) stays a word, never mistaken for another."""
    text = _QUOTED_NAME.sub("", t)
    text = text.replace("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ").replace("TIME WITH TIME ZONE", "TIMETZ")
    return _WORD.findall(_FIELD_NAME.sub(r"\1", text))


def key_type_problem(t: Optional[str], col: Optional[str]) -> Optional[str]:
    """None if a key column ``col`` of DESCRIBEd type ``t`` groups by identity, else why not and the fix."""
    if t is None:
        return None
    col = col or "x"
    words = type_words(t)
    bad = [w for w in words if w not in ACCEPTED]
    if {"FLOAT", "DOUBLE"} & set(bad):
        return ("equal floating-point values print differently (-0.0 = 0.0; NaNs of either sign are equal). "
                f"Cast it in a view: CAST({col} AS DECIMAL(18,6)) or {col}::VARCHAR")
    if "INTERVAL" in bad:
        return ("equal intervals print differently (INTERVAL '1 month' = '30 days', '1 day' = '24 hours'). "
                f"Cast it in a view: {col}::VARCHAR")
    if "TIMETZ" in bad:
        return ("how the same instant at two offsets ('12:00:00+01', '11:00:00+00') compares is the engine's "
                f"choice, not a guarantee. Cast it in a view: {col}::VARCHAR")
    if bad:
        return f"dpsql does not know that equal {bad[0]} values print alike. Cast it in a view: {col}::VARCHAR"
    if {"VARCHAR", "JSON"} & set(words) and ({"STRUCT", "MAP"} & set(words) or "[" in t):
        # a string inside a nested value may carry a collation DESCRIBE does not show (default_collation
        # applies inside LIST and STRUCT values, and a view's [x COLLATE NOCASE] keeps its NOCASE), and
        # dp__canonical cannot reach it
        return ("a string inside a nested value may compare under a collation DESCRIBE does not show "
                "(default_collation, or COLLATE in a view), so equal values may print differently. "
                f"Cast it in a view: {col}::VARCHAR")
    return None


def udfs(source: object) -> list[Udf]:
    """``dp__key_type_problem(type, col)``: pure, so DuckDB may fold it while planning."""
    return [Udf("dp__key_type_problem", scalar(key_type_problem), (VARCHAR, VARCHAR), VARCHAR)]
