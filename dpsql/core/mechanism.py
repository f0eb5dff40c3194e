"""A mechanism, declared once.

A :class:`Mechanism` is an immutable description -- the role ``DpEvent`` plays in
Google's ``dp_accounting`` and a ``make_*`` constructor in OpenDP: its name, its SQL
entry point, its privacy unit, its typed parameters (defaults and checks), its pure
calibration, how it composes, and where its privacy argument is written down
(``docs/proofs/<note>.md``). Every front end derives from these declarations: the
``dp_set_union`` dispatcher (generated SQL, kept in sync by a test), ``dpsql.set_union``
and ``dpsql.calibrate``, the CLI's flags, the Spark backend's method list, the audit's
coverage check and the tests that enumerate mechanisms.

This module holds the types only; the declarations live beside each mechanism's code
and :mod:`dpsql.core.registry` collects them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["REQUIRED", "Param", "Mechanism", "PRIVACY_UNITS"]


class _Required:
    """Marker of a parameter without a default (the caller must pass it)."""

    _instance: Optional["_Required"] = None

    def __new__(cls) -> "_Required":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

# What two neighbouring datasets differ by (the unit the ledger records): all rows of one user
# (user-level DP); one element, i.e. one row of a weighted key (the PWS family); one record of the
# universe with all its memberships (the optimisation family: one element of the covered universe,
# one point, one stream record).
PRIVACY_UNITS = ("user", "element", "record")


@dataclass(frozen=True)
class Param:
    """One parameter of a mechanism's SQL macro (and of its Python and CLI front ends).

    ``check`` validates a value and returns it typed (e.g. ``check_epsilon``); ``default``
    is the Python value used when the parameter is left out (``REQUIRED``: no default;
    ``None``: SQL NULL, "let the mechanism choose").
    """

    name: str
    sql_type: str
    default: Any = REQUIRED
    check: Optional[Callable[[Any], Any]] = None
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def sql_default(self) -> Optional[str]:
        """The default as SQL text (``None`` when the parameter is required)."""
        if self.required:
            return None
        return sql_literal(self.default)


def sql_literal(value: Any) -> str:
    """A Python default as a SQL literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    return repr(value)


@dataclass(frozen=True)
class Mechanism:
    """A mechanism: what every front end needs to know about it, in one place.

    ``calibrate(**params)`` is pure: it takes the validated parameters (``validate``) that
    it names and returns the mechanism's calibration. ``rounds`` is how many noisy
    releases over the same users the mechanism composes (sequential composition of
    ``rounds`` shares of ``(epsilon, delta)``); ``proof`` names the note
    ``docs/proofs/<proof>.md`` with its privacy argument.
    """

    name: str
    family: str
    macro: str
    unit: str
    params: tuple[Param, ...]
    description: str
    proof: str
    calibrate: Optional[Callable[..., Any]] = None
    rounds: int = 1
    # Whether the Spark backend runs it (dpsql.frontends.spark translates its marked SQL stages).
    spark: bool = False

    def __post_init__(self) -> None:
        if self.unit not in PRIVACY_UNITS:
            raise TypeError(f"{self.name}: unit must be one of {PRIVACY_UNITS} (got {self.unit!r})")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise TypeError(f"{self.name}: duplicate parameter names {names}")

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"{self.macro} has no parameter {name!r}")

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def validate(self, **values: Any) -> dict[str, Any]:
        """Every parameter checked once, defaults filled in: the typed value inner code trusts.

        An unknown name or a missing required parameter is refused, naming the parameter.
        """
        from dpsql.core.errors import ParameterError

        unknown = sorted(set(values) - set(self.param_names))
        if unknown:
            raise ParameterError(f"{unknown[0]} is not a parameter of {self.macro}; its parameters are "
                                 f"{', '.join(self.param_names)}")
        out: dict[str, Any] = {}
        for p in self.params:
            value = values.get(p.name, p.default)
            if value is REQUIRED:
                raise ParameterError(f"{p.name} is required by {self.macro}; pass {p.name} := <value>")
            out[p.name] = p.check(value) if p.check is not None and value is not None else value
        return out


# -- the parameters most mechanisms share (one meaning per name across families) ----------------

def _checks():  # the validation module sits below this one; imported here to keep the types standalone
    from dpsql.core import validation
    return validation


def tbl_param() -> Param:
    """The private table: a table or view name, or a file path DuckDB can read."""
    return Param("tbl", "VARCHAR", REQUIRED, lambda v: _checks().check_table_name(v), "the private table")


def epsilon_param() -> Param:
    return Param("epsilon", "DOUBLE", REQUIRED, lambda v: _checks().check_epsilon(v), "privacy budget epsilon > 0")


def delta_param() -> Param:
    return Param("delta", "DOUBLE", REQUIRED, lambda v: _checks().check_delta(v), "privacy budget delta in (0, 1)")


def max_items_param(default: Any = 100) -> Param:
    return Param("max_items", "DOUBLE", default, lambda v: _checks().check_max_items(v),
                 "items kept per user (contribution bound)")


def column_param(name: str, default: str) -> Param:
    return Param(name, "VARCHAR", default, lambda v: _checks().check_identifier(name, v),
                 f"column of the {name[:-4]}s")


def user_item_params(*middle: Param, cap: bool = True) -> tuple[Param, ...]:
    """``tbl, epsilon, delta[, max_items], *middle, user_col, item_col``: the set-union signature."""
    head = (tbl_param(), epsilon_param(), delta_param()) + ((max_items_param(),) if cap else ())
    return head + tuple(middle) + (column_param("user_col", "user_id"), column_param("item_col", "item"))
