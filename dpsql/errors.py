"""dpsql's exceptions: one base, one subclass per kind of failure.

Every message starts with ``dpsql: `` so that it is recognisable after DuckDB wraps it
(``Invalid Input Error: ... ParameterError: dpsql: epsilon ...``).
"""
from __future__ import annotations

__all__ = ["DpsqlError", "ParameterError", "DPParameterError", "InputError", "BudgetError", "LedgerIOError"]


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


class LedgerIOError(DpsqlError, OSError):
    """The privacy ledger (a SQLite file) cannot be read or written."""
