"""Parameter validation shared by the Python API, the SQL UDFs and the CLI.

Every check runs before any data is read, and every failure names the
parameter, the value received and how to fix it. Failures raise
:class:`~dpsql.core.errors.ParameterError` (also named ``DPParameterError``), a :class:`ValueError`.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import numbers
import os
import re
import sys
import threading
import warnings
from types import FrameType
from typing import Any, Callable, Iterator, Optional, TypeGuard, TypeVar, cast

import duckdb

from dpsql.core.errors import DPParameterError

__all__ = [
    "DPParameterError",
    "check_epsilon",
    "check_delta",
    "check_max_items",
    "check_positive",
    "check_identifier",
    "check_table_name",
    "check_column_pair",
    "check_k",
    "K_LIMIT",
    "sql_string",
    "derived_budget",
    "user_budget",
    "warn_weak_parameters",
    "weak_parameters_message",
    "WEAK_EPSILON",
    "WEAK_DELTA",
    "WeakPrivacyWarning",
]


def _is_real(x: object) -> TypeGuard[numbers.Real]:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _not_a_string(value: object) -> str:
    return ", a string: write the number without quotes" if isinstance(value, (str, bytes)) else ""


def check_positive(name: str, value: object) -> float:
    """A finite real number > 0."""
    if value is None:
        raise DPParameterError(f"{name} must not be NULL; pass a finite number > 0")
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:
        raise DPParameterError(f"{name} must be a finite number > 0 (got {value!r})")
    return float(value)


# Smallest epsilon and delta a user may pass (README, "Bad input and edge cases"). Below them the
# calibrations overflow (epsilon = 1e-320 gave an infinite Laplace scale, delta = 1e-320 an infinite
# GreedyUpdate threshold); such budgets release nothing anyway, so a value this small is a mistake.
# The bounds apply to the parameters the user passed. The shares a mechanism derives from them (a
# round's fraction of split, top-k's halves, a Gaussian threshold's delta/2) are checked only to be
# > 0 (see derived_budget): tests/frontends/test_python_api.py checks that every calibration stays finite at
# the smallest user values with the smallest split fraction (SPLIT_MIN in dpsql.union.adaptive).
EPSILON_MIN = 1e-200
# delta has a second, stronger floor: the samplers draw 53-bit uniforms, so an event meant to have
# probability delta < 2^-53 (a PWS key released with probability pi = delta) happens with probability
# 2^-53 ~ 1.1e-16 instead; below 1e-15 the promised delta would not be delivered (docs/proofs/granular_noise.md).
DELTA_MIN = 1e-15
# Largest epsilon accepted: beyond it the calibrations lose all precision or overflow (8 epsilon in
# dp_peeling_epsilon reached inf at 2.2e307), and e^1e6 is no privacy guarantee at all.
EPSILON_MAX = 1e6

# True while a calibration works on shares of a budget it has already validated.
_DERIVED: contextvars.ContextVar[bool] = contextvars.ContextVar("dpsql_derived_budget", default=False)


@contextlib.contextmanager
def derived_budget() -> Iterator[None]:
    """Within this block check_epsilon/check_delta see shares of a validated budget.

    The user's own epsilon and delta are checked against EPSILON_MIN/DELTA_MIN
    first; a share of them (``f * epsilon``, ``delta / 2``) may be smaller, and a
    message quoting it would show a value the user never passed. Shares are
    still refused when not > 0 (an underflow).
    """
    token = _DERIVED.set(True)
    try:
        yield
    finally:
        _DERIVED.reset(token)


_F = TypeVar("_F", bound=Callable[..., Any])


def user_budget(fn: _F) -> _F:
    """Decorator: check ``fn``'s own ``epsilon``/``delta`` arguments, then run its body in :func:`derived_budget`.

    Called from inside another calibration (already derived), the arguments are
    shares and only the derived checks apply.
    """
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _DERIVED.get():
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if "epsilon" in bound.arguments:
                check_epsilon(bound.arguments["epsilon"])
            if "delta" in bound.arguments:
                check_delta(bound.arguments["delta"])
        with derived_budget():
            return fn(*args, **kwargs)

    return cast(_F, wrapper)


def check_epsilon(epsilon: object, maximum: float = EPSILON_MAX) -> float:
    """epsilon: finite, EPSILON_MIN <= epsilon <= maximum (a mechanism whose formulas use e^epsilon passes one).

    Within :func:`derived_budget` the lower bound is only epsilon > 0.
    """
    if epsilon is None:
        raise DPParameterError("epsilon must not be NULL; pass e.g. epsilon := 1.0")
    if not _is_real(epsilon) or not math.isfinite(float(epsilon)) or float(epsilon) <= 0:
        raise DPParameterError(
            f"epsilon must be a finite number > 0 (got {epsilon!r}{_not_a_string(epsilon)}); pass e.g. epsilon := 1.0")
    if float(epsilon) < EPSILON_MIN and not _DERIVED.get():
        raise DPParameterError(
            f"epsilon must be >= {EPSILON_MIN:g} (got {epsilon!r}); smaller budgets overflow the calibration")
    if float(epsilon) > maximum:
        raise DPParameterError(
            f"epsilon must be <= {maximum:g} here (got {epsilon!r}); larger values overflow the calibration, "
            f"and an epsilon this large protects nobody")
    return float(epsilon)


def check_delta(delta: object, name: str = "delta") -> float:
    """delta: DELTA_MIN <= delta < 1 (within :func:`derived_budget`: 0 < delta < 1)."""
    if delta is None:
        raise DPParameterError(f"{name} must not be NULL; pass e.g. {name} := 1e-5")
    if not _is_real(delta) or not (0.0 < float(delta) < 1.0):
        raise DPParameterError(
            f"{name} must be a number with 0 < {name} < 1 (got {delta!r}{_not_a_string(delta)}); "
            f"a typical choice is {name} := 1e-5, well below 1/number_of_users")
    if float(delta) < DELTA_MIN and not _DERIVED.get():
        raise DPParameterError(
            f"{name} must be >= {DELTA_MIN:g} (got {delta!r}); dpsql's samplers cannot deliver a smaller delta")
    return float(delta)


# Weak-parameter warnings: see warn_weak_parameters for the choice.
WEAK_EPSILON = 10.0
WEAK_DELTA = 1e-3


class WeakPrivacyWarning(UserWarning):
    """Parameters that are valid but give a guarantee a careful user would not rely on."""


# A warning names the first frame outside these (dpsql, DuckDB's Python layer, the thread a release may run
# in): the user's line.
_LIBRARY_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
                 os.path.dirname(os.path.abspath(duckdb.__file__ or "")) + os.sep)
_LIBRARY_FILES = tuple(os.path.abspath(m.__file__ or "") for m in (contextlib, threading))


def _caller_stacklevel(stacklevel: int) -> Optional[int]:
    """The ``stacklevel`` of ``warnings.warn``, called by the caller of this function, that names the first
    frame from ``stacklevel`` on outside dpsql and DuckDB: the user's line that started the release, not
    dpsql's source. None when this thread has no such frame: DuckDB runs most UDFs on its own threads."""
    try:
        frame: Optional[FrameType] = sys._getframe(stacklevel)  # what warnings.warn(stacklevel=...) names
    except ValueError:
        return None
    level = stacklevel
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_LIBRARY_DIRS) and name not in _LIBRARY_FILES:
            return level
        frame, level = frame.f_back, level + 1
    return None


def weak_parameters_message(epsilon: object, delta: object = None, *, what: str = "") -> Optional[str]:
    """The one-line message of :func:`warn_weak_parameters`, or None when the parameters are not weak."""
    weak = []
    if _is_real(epsilon) and float(epsilon) > WEAK_EPSILON:
        weak.append(f"epsilon = {float(epsilon):g} > {WEAK_EPSILON:g} (the odds of any outcome may change by "
                    f"a factor up to e^epsilon)")
    if _is_real(delta) and float(delta) > WEAK_DELTA:
        weak.append(f"delta = {float(delta):g} > {WEAK_DELTA:g} (delta should be well below 1/number of users)")
    if not weak:
        return None
    where = f" of {what}" if what else ""
    return (f"dpsql: weak privacy parameters{where}: " + "; ".join(weak) + ". The release runs; choose smaller "
            "values for a meaningful guarantee")


def warn_weak_parameters(epsilon: object, delta: object = None, *, what: str = "", stacklevel: int = 2) -> None:
    """Warn (:class:`WeakPrivacyWarning`) when ``epsilon > WEAK_EPSILON`` or ``delta > WEAK_DELTA``.

    Never refuses: such a release is still differentially private, but its
    guarantee is too weak to rely on. The thresholds are fixed and public,
    because the usual rule ``delta << 1/n`` needs the number of users, which
    is private (a check against it would itself leak). ``delta > 1e-3``
    permits mechanisms that publish one person in a thousand outright
    (``delta = 1/n`` at ``n = 1000``); ``epsilon > 10`` lets the odds of any
    outcome change by ``e^10 > 22,000``, beyond the per-release budgets of
    published deployments.

    ``what`` names the release. A release warns once, with its own values: its check calls this
    (:func:`dpsql.core.release.check_release`), not the calibrations of its steps, which DuckDB
    calls several times while it plans a statement and which see shares of the budget (dp_top_k's
    domain step runs at half of it). The warning names the first frame from ``stacklevel`` on that
    is outside dpsql (the user's call), not dpsql's source. Non-numeric values are left to the checks.
    """
    message = weak_parameters_message(epsilon, delta, what=what)
    if message is None:
        return
    level = _caller_stacklevel(stacklevel + 1)
    if level is not None:
        warnings.warn(message, WeakPrivacyWarning, stacklevel=level)
    else:  # no line of the user's to name: one line that names dpsql, not a line of its source
        warnings.warn_explicit(message, WeakPrivacyWarning, "<dpsql>", 0, module="dpsql")


# max_items bounds the per-user cap; thresholds loop over t = 1..max_items, so
# an absurd value would be a denial of service rather than a useful setting
# (a calibration's time grows with it: benchmarks/README.md, "Figures moved out of the code").
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
        # the type only: an object's repr (a DataFrame's) shows its rows
        raise DPParameterError(f"table must be a table or view name, got "
                               f"{repr(table) if isinstance(table, str) else 'a ' + type(table).__qualname__}")
    return table


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal (single quotes doubled): table and column names reach the
    macros as data, never as SQL text."""
    return "'" + value.replace("'", "''") + "'"


def check_column_pair(user_col: object, item_col: object) -> None:
    """Two non-empty, different column names (whether they exist is the binder's business)."""
    for name, value in (("user_col", user_col), ("item_col", item_col)):
        if value is None or not str(value).strip():
            raise DPParameterError(f"{name} must name a column (got {value!r})")
    if str(user_col).lower() == str(item_col).lower():
        raise DPParameterError("user_col and item_col must name two different columns")


# k bounds the number of sequential rounds / released rows; an absurd value is a denial of service.
K_LIMIT = 1_000_000


def check_k(k: object, name: str = "k") -> int:
    """k: a whole number between 1 and K_LIMIT (a float with an integral value is accepted)."""
    if k is None:
        raise DPParameterError(f"{name} must not be NULL; pass the number of items to release, e.g. {name} := 10")
    if isinstance(k, bool) or not isinstance(k, numbers.Real) or not math.isfinite(float(k)) \
            or float(k) != int(float(k)):
        raise DPParameterError(f"{name} must be a whole number >= 1 (got {k!r}), e.g. {name} := 10")
    value = int(float(k))
    if value < 1:
        raise DPParameterError(f"{name} must be >= 1 (got {value}); it is the number of items to release")
    if value > K_LIMIT:
        raise DPParameterError(f"{name} must be <= {K_LIMIT} (got {value})")
    return value
