"""dpsql's exceptions: one base, one subclass per kind of failure.

Every message starts with ``dpsql: `` so that it is recognisable after DuckDB wraps it
(``Invalid Input Error: ... ParameterError: dpsql: epsilon ...``).
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

import duckdb

__all__ = ["DpsqlError", "ParameterError", "DPParameterError", "InputError", "BudgetError", "BudgetExceededError",
           "LedgerIOError", "NOT_CONSTANT", "NOT_SHOWN", "from_engine", "engine_errors", "quotes_data",
           "data_error"]


class DpsqlError(Exception):
    """Base of every error dpsql raises on purpose."""

    def __init__(self, message: object = "", *args: object):
        text = str(message)
        super().__init__(text if text.startswith("dpsql") else f"dpsql: {text}", *args)


class ParameterError(DpsqlError, ValueError):
    """A privacy parameter or an input description (table, column, option) is invalid.

    Raised before anything is read or charged; the message names the parameter and the fix.
    """


# The name dpsql has exported since its first release.
DPParameterError = ParameterError


class InputError(DpsqlError, ValueError):
    """The data does not have the shape a mechanism needs (a NULL user, a list of the wrong length).

    Raised while the data is read, before the charge; the message carries no data value.
    """


class BudgetError(DpsqlError):
    """A release would exceed the privacy budget set for its table."""


class BudgetExceededError(BudgetError):
    """A release would take a scope over its privacy budget; nothing was released or charged."""


class LedgerIOError(DpsqlError, OSError):
    """The privacy ledger (a SQLite file) cannot be read or written."""


# -- errors that come back through DuckDB -------------------------------------------------------------

# A dpsql exception raised in a UDF reaches Python as a duckdb.Error whose message quotes the class by
# its name; these are the names dpsql raises (DPParameterError is ParameterError's old name).
_BY_NAME: dict[str, type[DpsqlError]] = {
    "DpsqlError": DpsqlError, "ParameterError": ParameterError, "DPParameterError": ParameterError,
    "InputError": InputError, "BudgetError": BudgetError, "BudgetExceededError": BudgetExceededError,
    "LedgerIOError": LedgerIOError}
_UDF = re.compile(r"Python exception occurred while executing the UDF: (\w+): (dpsql\b.*)", re.S)
# SQL's error('dpsql: ...') in a macro: an InvalidInputException without a class name.
_SQL_ERROR = re.compile(r"Invalid Input Error: (dpsql: .*)", re.S)
# The macros' SQL checks are of the data (a NULL user, too many items) unless they name a parameter
# (``order_col := ...``), a combination of options (``... apply to ...``) or a value passed (``(got ...)``).
_NAMES_A_PARAMETER = re.compile(r" := |\bapply to\b|\bunknown\b|\(got ")
# The binder's refusal, in the generated release wrapper (sql/00_core/00_release.sql), of a parameter that is not constant.
_GETVARIABLE_NOT_CONSTANT = 'argument in function "getvariable" must be a constant expression'
# DuckDB appends the statement's excerpt ("LINE 1: ...") to some messages: not part of dpsql's text.
_EXCERPT = re.compile(r"\n\s*LINE \d+:.*", re.S)

NOT_CONSTANT = ("dpsql: every parameter of a release must be a constant expression (a literal, a prepared-statement "
                "parameter or getvariable('name')), evaluated once for the whole release; one of the parameters "
                "passed can take different values within the query (a column, random(), nextval() or a subquery). "
                "Compute the value first from public information, e.g. SET VARIABLE v = ...; then pass "
                "getvariable('v') (a value computed from the private data is not covered by the guarantee); "
                "nothing was read or charged")


def from_engine(exc: BaseException) -> BaseException:
    """The dpsql exception that ``exc`` (a ``duckdb.Error``) carries, else ``exc`` itself.

    DuckDB wraps an exception raised in a UDF (``Invalid Input Error: Python exception occurred while
    executing the UDF: BudgetExceededError: dpsql: ...``): it becomes that class again, with dpsql's message.
    A ``dpsql:`` message raised by a macro's SQL ``error()`` becomes a :class:`ParameterError` when it names a
    parameter, else an :class:`InputError` (a check of the data). DuckDB's binder refusing a parameter that is
    not constant (the release wrapper passes every parameter through ``getvariable``) becomes a
    :class:`ParameterError` saying so. Raise the result ``from exc`` (see :func:`engine_errors`).
    """
    if not isinstance(exc, duckdb.Error):
        return exc
    text = _EXCERPT.sub("", str(exc)).strip()
    udf = _UDF.search(text)
    if udf is not None:  # another class (a warning turned into an error, a bug) keeps DuckDB's error
        cls = _BY_NAME.get(udf.group(1))
        return exc if cls is None else cls(udf.group(2))
    raised = _SQL_ERROR.match(text)
    if raised is not None:
        message = raised.group(1)
        return (ParameterError if _NAMES_A_PARAMETER.search(message) else InputError)(message)
    if isinstance(exc, duckdb.BinderException) and _GETVARIABLE_NOT_CONSTANT in text:
        return ParameterError(NOT_CONSTANT)
    return exc


# DuckDB's messages that quote the data they failed on: a value that does not convert, a line of a CSV file,
# a piece of a JSON document. A DataError (conversion, out of range, type mismatch) always names a value.
_QUOTES_DATA = re.compile(r"Original Line|Could not convert|Could not parse|Failed to cast|can't be cast|"
                          r"JSON transform error|Malformed JSON|Conversion Error|out of range", re.I)
NOT_SHOWN = "DuckDB's own message is not shown because it quotes the data"


def quotes_data(exc: BaseException) -> bool:
    """Whether ``exc``, an engine error, may quote a value of the data (its message is then never shown)."""
    return isinstance(exc, duckdb.DataError) or (isinstance(exc, duckdb.Error) and bool(_QUOTES_DATA.search(str(exc))))


def data_error(exc: duckdb.Error) -> InputError:
    """The :class:`InputError` shown for ``exc``, an engine error that quotes the data: its kind only."""
    return InputError(f"dpsql: DuckDB could not read or convert a value of the input ({type(exc).__name__}); "
                      f"{NOT_SHOWN}. Check the types of the columns the release reads (a view's casts, a file's "
                      f"values): e.g. TRY_CAST, then filter the NULLs out, in the view passed")


@contextmanager
def engine_errors() -> Iterator[None]:
    """Around the lines that run a release's SQL: a dpsql error DuckDB wrapped is raised as its dpsql
    class (:func:`from_engine`), with the ``duckdb.Error`` as its ``__cause__``. An engine error that quotes
    the data (:func:`quotes_data`: a cast of a view's column failing on a value) is raised as an
    :class:`InputError` naming its kind only, with no cause or context a traceback would print (a traceback
    is output too). Other errors pass unchanged."""
    try:
        yield
        return
    except duckdb.Error as exc:
        mapped = from_engine(exc)
        if mapped is not exc:
            raise mapped from exc
        if not quotes_data(exc):
            raise
        hidden = data_error(exc)
    raise hidden from None  # outside the handler: no __context__ either
