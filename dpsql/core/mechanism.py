"""A mechanism, declared once.

A :class:`Mechanism` is an immutable description -- the role ``DpEvent`` plays in
Google's ``dp_accounting`` and a ``make_*`` constructor in OpenDP: its name, its SQL
entry point and the file of its body, its privacy unit, its typed parameters (defaults
and checks), its pure calibration, how it composes, where its privacy argument is
written down (``docs/proofs/<note>.md``), and what the front ends and checks need to
know of it: how the Spark backend runs it, whether it is a front end's default, its
audit cases and a small valid call. Every front end derives from these declarations:
the ``dp_set_union`` dispatcher (generated SQL, kept in sync by a test), ``dpsql.set_union``
and ``dpsql.calibrate``, the CLI's flags and its list of mechanisms, the Spark backend's
methods and stages, top-k's and group-by's choices of composition, the audit's cases and
the tests that enumerate mechanisms.

This module holds the types only; the declarations live beside each mechanism's code
and :mod:`dpsql.core.registry` collects them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

__all__ = ["REQUIRED", "Param", "Mechanism", "PRIVACY_UNITS", "WEIGHTINGS", "SparkForm", "AuditCase", "Example",
           "EXAMPLE_USER_ITEMS", "EXAMPLE_PUBLIC_ORDER", "user_item_example", "preferred", "with_role"]


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


# The one-shot weightings of ``dp__set_union_weights`` (sql/30_union/10_basic.sql): a capped user with
# d items adds 1 ('count'), 1/d ('inverse') or 1/sqrt(d) ('inverse_sqrt') to each of its items.
WEIGHTINGS = ("count", "inverse", "inverse_sqrt")


@dataclass(frozen=True)
class SparkForm:
    """How the Spark backend (:mod:`dpsql.frontends.spark`) runs a set-union method.

    ``release`` names the backend's release of the capped rows (``dpsql.frontends.spark.RELEASES``), by
    its shape: ``"one_shot"`` -- the declaration's ``weighting``, then the method's noise and strict
    threshold (its ``calibrate``) -- or one of the translated adaptive forms (``"biased_round"``,
    ``"two_rounds"``, ``"peeling_rounds"``, ``"cumulative_rounds"``).
    ``calibrate``: the calibration that release reads, called as
    ``calibrate(epsilon, delta, max_items, **the method's own options)``; ``None``: the declaration's
    ``calibrate(epsilon, delta, max_items)``.
    """

    release: str
    calibrate: Optional[Callable[..., Any]] = None


@dataclass(frozen=True)
class AuditCase:
    """One case of the empirical privacy audit (:mod:`dpsql.tools.audit`) of a mechanism, as data.

    The audit builds the case from the declaration: ``kind`` names how (the neighbouring datasets,
    the events and the SQL call: one of ``dpsql.tools.audit.CASE_KINDS``), ``options`` are that
    builder's keyword arguments, ``name`` is the case's name in the audit ("": the kind's default,
    e.g. the mechanism's name or ``order_<name>``), ``note`` what the audit's table says of it.
    """

    kind: str
    name: str = ""
    options: tuple[tuple[str, Any], ...] = ()
    note: str = ""


@dataclass(frozen=True)
class Example:
    """A small valid call of a mechanism's releasing macro, for the conformance tests.

    ``setup`` is SQL that creates the tables the call reads (any number of statements); ``args`` the
    valid SQL text of every parameter (a name -> text pair each); ``order_by`` the columns the
    released rows are sorted by (the order key first). The tests pass the required parameters by
    position, the others by name (``tests/conformance/test_release.py``).
    """

    setup: str
    args: tuple[tuple[str, str], ...]
    order_by: tuple[str, ...] = ("item",)

    @classmethod
    def of(cls, setup: str, order_by: tuple[str, ...] = ("item",), **args: Optional[str]) -> "Example":
        """An example with ``args`` as keywords (a ``None`` leaves the parameter out)."""
        return cls(setup, tuple((k, v) for k, v in args.items() if v is not None), order_by)

    @property
    def arguments(self) -> dict[str, str]:
        return dict(self.args)


# The data most examples read: 300 users; user u holds items i0 .. i(u % 17), so popularity falls
# from 300 users (i0) to 17 (i16).
EXAMPLE_USER_ITEMS = ("CREATE TABLE t AS SELECT u AS user_id, 'i' || j AS item FROM range(300) a(u), range(17) b(j) "
                      "WHERE j <= u % 17")
# A public order of items (a sequential policy's order_tbl), independent of t: i16 .. i0 by rank.
EXAMPLE_PUBLIC_ORDER = "CREATE TABLE o AS SELECT 'i' || j AS item, 16 - j AS rank FROM range(17) b(j)"


def user_item_example(setup: str = EXAMPLE_USER_ITEMS, order_by: tuple[str, ...] = ("item",),
                      **args: Optional[str]) -> Example:
    """An example on :data:`EXAMPLE_USER_ITEMS`: the set-union signature's values, then ``args``
    (which add parameters, change them, or leave one out with ``None``)."""
    common: dict[str, Optional[str]] = {"tbl": "'t'", "epsilon": "1.0", "delta": "1e-5", "max_items": "10",
                                        "user_col": "'user_id'", "item_col": "'item'"}
    return Example.of(setup, order_by, **{**common, **args})


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
    # The SQL file holding the body ``dp__body_<macro>``: a path relative to dpsql's sql folder (loaded
    # with the package's files), or an absolute one for a family added from outside the package (loaded
    # after them). The registry lists mechanisms in the order of these paths (the SQL load order), then
    # of their module's MECHANISMS: how front ends order them.
    sql: str = ""
    # One-shot set-union methods: the weighting of ``dp__set_union_weights`` their body uses (WEIGHTINGS;
    # each user's weight per item <= 1). None for the adaptive and sequential methods. It is also what
    # dp_group_by's pre-threshold needs (docs/proofs/group_by.md): only these methods offer it.
    weighting: Optional[str] = None
    # How the Spark backend runs it; None: it has no Spark form (e.g. the sequential policies).
    spark: Optional[SparkForm] = None
    # Rank by measured utility among its family (1 = best; benchmarks/README.md, "Utility"); None: never a
    # default. A front end's default is the most preferred declaration it runs (:func:`preferred`).
    preference: Optional[int] = None
    # Its release at (epsilon, delta) with its default options is a Gaussian mechanism (or rounds
    # composing exactly to one) of sigma = gaussian_sigma(epsilon, delta/2) per unit of l2 sensitivity,
    # plus novel items released with probability <= delta/2: dp_top_k may then compose it with its
    # selection by zCDP (dpsql.topk.tight_peeling_epsilon, docs/proofs/top_k.md).
    gaussian_domain: bool = False
    # The named defaults of other rooms this declaration fills (each held by exactly one declaration of
    # its family; :func:`with_role`), e.g. "top_k_domain": dp_top_k's default domain method.
    roles: tuple[str, ...] = ()
    # A small valid call, for the conformance tests (tests/conformance/test_release.py).
    example: Optional[Example] = None
    # Its cases in the empirical privacy audit (dpsql.tools.audit).
    audit: tuple[AuditCase, ...] = ()

    def __post_init__(self) -> None:
        if self.unit not in PRIVACY_UNITS:
            raise TypeError(f"{self.name}: unit must be one of {PRIVACY_UNITS} (got {self.unit!r})")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise TypeError(f"{self.name}: duplicate parameter names {names}")
        if self.weighting is not None and self.weighting not in WEIGHTINGS:
            raise TypeError(f"{self.name}: weighting must be one of {WEIGHTINGS} (got {self.weighting!r})")
        if self.spark is not None and self.spark.release == "one_shot" and self.weighting is None:
            raise TypeError(f"{self.name}: the Spark release 'one_shot' needs the declaration's weighting")

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


def with_role(mechanisms: Iterable[Mechanism], role: str) -> str:
    """The name of the one of ``mechanisms`` that declares ``role`` (Mechanism.roles)."""
    names = [m.name for m in mechanisms if role in m.roles]
    if len(names) != 1:
        raise LookupError(f"dpsql: {len(names)} of these mechanisms declare the role {role!r} ({', '.join(names)}); "
                          f"exactly one must (Mechanism.roles)")
    return names[0]


def preferred(mechanisms: Iterable[Mechanism]) -> str:
    """The name of the most preferred of ``mechanisms`` (the smallest ``preference``): a front end's default."""
    ranked = sorted((m.preference, m.name) for m in mechanisms if m.preference is not None)
    if not ranked:
        raise LookupError("dpsql: none of these mechanisms declares a preference; declare one (Mechanism.preference)")
    return ranked[0][1]
