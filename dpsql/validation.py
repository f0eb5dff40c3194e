"""Parameter validation shared by the Python API, the SQL UDFs and the CLI.

Every check runs before any data is read, and every failure names the
parameter, the value received and how to fix it. Failures raise
:class:`DPParameterError`, a :class:`ValueError`.
"""
from __future__ import annotations

import math
import numbers
import re

__all__ = [
    "DPParameterError",
    "check_epsilon",
    "check_delta",
    "check_max_items",
    "check_positive",
    "check_identifier",
    "check_table_name",
    "sql_string",
]


class DPParameterError(ValueError):
    """A privacy parameter or an input description is invalid.

    The message starts with ``dpsql: `` so that it is recognisable after DuckDB
    wraps it (``Invalid Input Error: ... DPParameterError: dpsql: epsilon ...``).
    """

    def __init__(self, message: object = "", *args: object):
        text = str(message)
        super().__init__(text if text.startswith("dpsql") else f"dpsql: {text}", *args)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_positive(name: str, value: object) -> float:
    """A finite real number > 0."""
    if value is None:
        raise DPParameterError(f"{name} must not be NULL; pass a finite number > 0")
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:
        raise DPParameterError(f"{name} must be a finite number > 0 (got {value!r})")
    return float(value)


# Smallest epsilon and delta accepted. Below them the calibrations overflow: 1/epsilon, ln(1/delta)/epsilon
# and 1/(2 delta) must stay finite even after the budget is split k <= 10^6 ways (e.g. epsilon = 1e-320 gave
# an infinite Laplace scale, delta = 1e-320 an infinite GreedyUpdate threshold). Such budgets release nothing
# anyway; a value this small is a mistake, not a setting.
EPSILON_MIN = 1e-200
DELTA_MIN = 1e-305
# Largest epsilon accepted: beyond it the calibrations lose all precision or overflow (8 epsilon in
# dp_peeling_epsilon reached inf at 2.2e307), and e^1e6 is no privacy guarantee at all.
EPSILON_MAX = 1e6


def check_epsilon(epsilon: object, maximum: float = EPSILON_MAX) -> float:
    """epsilon: finite, EPSILON_MIN <= epsilon <= maximum (a mechanism whose formulas use e^epsilon passes one)."""
    if epsilon is None:
        raise DPParameterError("epsilon must not be NULL; pass e.g. epsilon := 1.0")
    if not _is_real(epsilon) or not math.isfinite(float(epsilon)) or float(epsilon) <= 0:
        raise DPParameterError(
            f"epsilon must be a finite number > 0 (got {epsilon!r}); pass e.g. epsilon := 1.0")
    if float(epsilon) < EPSILON_MIN:
        raise DPParameterError(
            f"epsilon must be >= {EPSILON_MIN:g} (got {epsilon!r}); smaller budgets overflow the calibration")
    if float(epsilon) > maximum:
        raise DPParameterError(
            f"epsilon must be <= {maximum:g} here (got {epsilon!r}); larger values overflow the calibration, "
            f"and an epsilon this large protects nobody")
    return float(epsilon)


def check_delta(delta: object, name: str = "delta") -> float:
    """delta: DELTA_MIN <= delta < 1."""
    if delta is None:
        raise DPParameterError(f"{name} must not be NULL; pass e.g. {name} := 1e-5")
    if not _is_real(delta) or not (0.0 < float(delta) < 1.0):
        raise DPParameterError(
            f"{name} must be a number with 0 < {name} < 1 (got {delta!r}); "
            f"a typical choice is {name} := 1e-5, well below 1/number_of_users")
    if float(delta) < DELTA_MIN:
        raise DPParameterError(
            f"{name} must be >= {DELTA_MIN:g} (got {delta!r}); smaller values overflow the calibration")
    return float(delta)


# max_items bounds the per-user cap; thresholds loop over t = 1..max_items, so
# an absurd value would be a denial of service rather than a useful setting
# (measured: at 1,000,000 one dp_set_union_mad2r call spent 221 s calibrating, at load 9 on 2 cores).
MAX_ITEMS_LIMIT = 100_000


def check_max_items(max_items: object) -> int:
    """max_items: an integer between 1 and MAX_ITEMS_LIMIT (a float with an integral value is accepted)."""
    if max_items is None:
        raise DPParameterError("max_items must not be NULL; pass e.g. max_items := 100")
    if not _is_real(max_items) or not math.isfinite(float(max_items)) \
            or float(max_items) != int(float(max_items)):
        raise DPParameterError(f"max_items must be a whole number >= 1 (got {max_items!r})")
    value = int(float(max_items))
    if value < 1:
        raise DPParameterError(
            f"max_items must be >= 1 (got {value}); it caps how many distinct items each user contributes")
    if value > MAX_ITEMS_LIMIT:
        raise DPParameterError(f"max_items must be <= {MAX_ITEMS_LIMIT} (got {value})")
    return value


_IDENT = re.compile(r"^[^\x00]{1,255}$")


def check_identifier(name: str, value: object) -> str:
    """A column name: a non-empty string without NUL characters."""
    if not isinstance(value, str) or not _IDENT.match(value):
        raise DPParameterError(f"{name} must be a column name (a non-empty string), got {value!r}")
    return value


def check_table_name(table: object) -> str:
    """A single table or view name (lists of tables are refused: one release reads one table)."""
    if isinstance(table, (list, tuple, set)):
        raise DPParameterError(
            "table must be the name of one table or view, not a list; to combine tables, "
            "create a view with UNION ALL first so that each user is one user across them")
    if not isinstance(table, str) or not table.strip():
        raise DPParameterError(f"table must be a table or view name, got {table!r}")
    return table


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal (single quotes doubled): table and column names reach the
    macros as data, never as SQL text."""
    return "'" + value.replace("'", "''") + "'"
