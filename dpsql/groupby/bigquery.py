"""BigQuery's differential-privacy query in DuckDB: ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...)``.

A statement of BigQuery's (GoogleSQL's) form::

    SELECT WITH DIFFERENTIAL_PRIVACY
        OPTIONS (epsilon = 1, delta = 1e-5, max_groups_contributed = 2, privacy_unit_column = user_id)
        item,
        COUNT(*, contribution_bounds_per_group => (0, 1)) AS users,
        AVG(spend, contribution_bounds_per_group => (0, 50)) AS avg_spend
    FROM purchases
    WHERE country = 'FR'
    GROUP BY item

becomes ONE release of dpsql's private GROUP BY (:func:`dpsql.group_by`, macro ``dp_group_by``) on a TEMP
view of the rows the FROM and WHERE select, so the ledger charges the base tables and files that view
reads (:mod:`dpsql.core.scopes`); the output columns are selected from the release's and named as BigQuery
names them (post-processing). :func:`sql` runs one (``dpsql.sql(con, text)``); ``dpsql shell`` runs one
typed at its prompt (:func:`is_dp_query` tells it apart; any other statement goes to DuckDB untouched).

**What is translated, and why it is the same quantity.** BigQuery's aggregates work per privacy unit
and group, then across units: each unit's rows in a group are aggregated, that is clamped to the
``contribution_bounds_per_group``, and the clamped values are aggregated across units. For unit ``u``
and group ``g`` with rows ``r(u, g)`` (``n(u, g) >= 1`` of them when ``u`` is in ``g``):

* ``COUNT(*, contribution_bounds_per_group => (lo, hi))``, ``0 <= lo <= 1``: each unit's row count
  ``n(u, g)`` clamped to ``[lo, hi]`` is ``min(n(u, g), hi)`` (``n >= 1 >= lo``). With ``hi = 1`` that
  is 1 for every unit in ``g``, so the count is the number of units: dpsql's ``count``. With a whole
  ``hi = k > 1`` it is ``sum_u min(n(u, g), k)``: dpsql's ``rows`` with ``max_rows`` k (each kept
  user's rows in the group, counted up to ``max_rows``);
* ``SUM(x, contribution_bounds_per_group => (lo, hi))``: ``sum_u clamp(sum of x over r(u, g), lo, hi)``,
  NULLs skipped: dpsql's ``sum`` with ``value_col`` x, ``lower`` lo, ``upper`` hi (it clamps each
  user's total per group);
* ``AVG(x, contribution_bounds_per_group => (lo, hi))``: the average over units of
  ``clamp(avg of x over r(u, g), lo, hi)``. dpsql's ``mean`` is ``noisy sum / noisy count`` of each
  user's clamped *total*, so the view gives each row of ``(u, g)`` the value ``x / n_x(u, g)``
  (``n_x``: the unit's non-NULL values in ``g``): the total dpsql clamps is then the unit's average.
  A unit whose values in ``g`` are all NULL still counts in dpsql's count (BigQuery leaves it out of
  the average): write ``WHERE x IS NOT NULL`` to leave it out. The view keeps every row (a window,
  not a GROUP BY), so a ``COUNT(*)`` beside it still counts rows;
* ``GROUP BY a``: ``item_col`` a (output column ``item``, renamed); ``GROUP BY a, b, ...``:
  ``group_cols`` [a, b, ...] (one output column each).

``max_groups_contributed`` bounds the groups of a unit for the selection of the groups and for the
aggregates alike, which dpsql's ``max_items`` does; ``epsilon`` and ``delta`` are the release's
total (BigQuery's split of epsilon among the aggregates is not reproduced: dpsql's is documented with
:mod:`dpsql.groupby`); ``privacy_unit_column`` is ``user_col``.

Everything else is refused before anything is read, with :data:`SUPPORTED`, because dpsql's GROUP BY
computes another quantity: BigQuery's bounds derived from the data (an aggregate without
``contribution_bounds_per_group``); ``COUNT(*)`` with bounds other than the above; ``COUNT(x)`` (rows
with a non-NULL x: dpsql's ``rows`` counts every row of a unit in the group, and a ``WHERE x IS NOT
NULL`` would also change which groups are selected); ``VAR_POP``, ``STDDEV_POP`` and
``PERCENTILE_CONT``, which clamp each *row* (``contribution_bounds_per_row``) and measure the rows'
values, where dpsql's ``variance``, ``stddev`` and ``median`` measure each user's clamped *total* per
group; ``SUM`` and ``AVG`` in one query (one value per unit and group: the total for one, the average
for the other); grouping by an expression; joins, subqueries in the WHERE or the select list, the
older ``WITH ANONYMIZATION`` / ``ANON_*`` form. The tables below (:data:`OPTIONS`, :data:`AGGREGATES`)
and :func:`_grouping` are the whole mapping.

**Privacy unit.** The guarantee is user-level on the rows of the view: each privacy unit's rows after
FROM and WHERE must be a function of that unit's own rows, as for any view passed to a dpsql release.
A WHERE filters row by row; a subquery in FROM is the caller's view (a join with a public table keeps
that; an aggregate across units does not). Subqueries and window functions are refused in the WHERE and
in the select list, where BigQuery's semantics is row by row.

The text is read with DuckDB's tokenizer (:func:`dpsql.core.sqltext.tokens`): quotes and comments mean
what they mean to DuckDB; the FROM and WHERE text is passed to DuckDB as written.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping, Optional, Sequence

import duckdb
import pyarrow as pa

from dpsql.groupby import _check_value_column, check_group_cols, check_max_rows, group_by
from dpsql.core import sqltext
from dpsql.core.errors import ParameterError
from dpsql.core.sqltext import Token

__all__ = ["SUPPORTED", "OPTIONS", "AGGREGATES", "Option", "Aggregate", "Translation",
           "DpSyntaxError", "is_dp_query", "translate", "sql"]

SUPPORTED = (
    "dpsql runs BigQuery's SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = <number>, delta = <number>, "
    "max_groups_contributed = <whole number>, privacy_unit_column = <column>) [group columns,] <aggregates> "
    "FROM <table, file, table function or (subquery)> [AS alias] [WHERE <condition>] GROUP BY <column>[, "
    "<column> ...], with the aggregates COUNT(*, contribution_bounds_per_group => (0, 1)) (privacy units per "
    "group), COUNT(*, contribution_bounds_per_group => (0, k)) (rows per group, up to a whole k per privacy "
    "unit), SUM(x, contribution_bounds_per_group => (lower, upper)) or AVG(x, contribution_bounds_per_group => "
    "(lower, upper)), each at most once, each with an optional alias (docs/bigquery_syntax.md)")


class DpSyntaxError(ParameterError):
    """A differential-privacy statement outside the subset dpsql translates; nothing was read or charged."""


def _refuse(problem: str) -> DpSyntaxError:
    return DpSyntaxError(f"dpsql: {problem}. {SUPPORTED}")


# -- the mapping ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """A BigQuery privacy option: the dp_group_by parameters it sets, and how its value is read.

    ``kind``: ``number``, ``whole`` (an integer >= 1) or ``column`` (a column path).
    """

    targets: tuple[str, ...]
    kind: str


# BigQuery option -> dp_group_by parameters. max_groups_contributed bounds a unit's groups for the selection
# and the aggregates alike: max_items is both caps today (with a separate cap of the aggregates, both names).
OPTIONS: Mapping[str, Option] = {
    "epsilon": Option(("epsilon",), "number"),
    "delta": Option(("delta",), "number"),
    "max_groups_contributed": Option(("max_items",), "whole"),
    "privacy_unit_column": Option(("user_col",), "column"),
}


@dataclass(frozen=True)
class Aggregate:
    """A BigQuery DP aggregate as dp_group_by computes it (the first entry of :data:`AGGREGATES` that
    ``matches`` a call translates it).

    ``star``: the call is ``f(*)``. ``measure``: the dp_group_by aggregate, None when dp_group_by does not
    compute BigQuery's quantity (the call is refused with ``why``). ``per_unit``: the value each (unit, group) gives
    dp_group_by, which clamps a user's total per group: ``total`` (the rows' values as they are) or
    ``average`` (each value over the unit's count of values in the group); None for a count. ``bounds``:
    the named argument of its bounds (required); ``accepts``: the bounds for which ``measure`` is the
    BigQuery aggregate; ``params``: the dp_group_by parameters the bounds set.
    """

    function: str
    star: bool
    measure: Optional[str]
    per_unit: Optional[str] = None
    bounds: str = "contribution_bounds_per_group"
    accepts: Callable[[float, float], bool] = lambda lo, hi: True
    params: Callable[[float, float], dict[str, Any]] = lambda lo, hi: {"lower": lo, "upper": hi}
    why: str = ""

    def matches(self, function: str, star: bool, bounds: Optional[tuple[float, float]]) -> bool:
        return function == self.function and star == self.star and (bounds is None or self.accepts(*bounds))


def _whole_upper(lo: float, hi: float) -> bool:
    """Bounds whose clamp of a unit's row count ``n >= 1`` is ``min(n, hi)`` with a whole ``hi >= 2``."""
    return 0.0 <= lo <= 1.0 and hi >= 2.0 and hi == int(hi)


_COUNT_BOUNDS = ("COUNT(*) takes contribution_bounds_per_group => (0, 1) (the number of privacy units in each group) "
                 "or (0, k) with a whole k >= 2 (the rows of each group, counting up to k rows per privacy unit); "
                 "a lower bound from 0 to 1 means the same, since a unit in a group has at least one row there")
_PER_ROW = ("it clamps each row (contribution_bounds_per_row) and measures the rows' values, while dpsql's variance, "
            "stddev and median measure each user's clamped total per group, another quantity; run dpsql.group_by "
            "with aggregates ['variance', 'stddev', 'median'] for those")

AGGREGATES: tuple[Aggregate, ...] = (
    Aggregate("COUNT", True, "count", accepts=lambda lo, hi: hi == 1.0 and 0.0 <= lo <= 1.0, params=lambda lo, hi: {}),
    Aggregate("COUNT", True, "rows", accepts=_whole_upper, params=lambda lo, hi: {"max_rows": int(hi)}),
    Aggregate("COUNT", True, None, why=_COUNT_BOUNDS),
    Aggregate("COUNT", False, None, why="COUNT(x) counts the rows whose x is not NULL, while dpsql's rows counts every "
                                        "row of a privacy unit in the group (and a WHERE x IS NOT NULL would also "
                                        "change which groups are selected); " + _COUNT_BOUNDS),
    Aggregate("SUM", False, "sum", per_unit="total"),
    Aggregate("AVG", False, "mean", per_unit="average"),
    Aggregate("VAR_POP", False, None, bounds="contribution_bounds_per_row", why=_PER_ROW),
    Aggregate("STDDEV_POP", False, None, bounds="contribution_bounds_per_row", why=_PER_ROW),
    Aggregate("PERCENTILE_CONT", False, None, bounds="contribution_bounds_per_row", why=_PER_ROW),
)


def _grouping(keys: Sequence[str]) -> dict[str, Any]:
    """The dp_group_by parameters of the GROUP BY columns ``keys`` (the view's column names): one column is
    ``item_col`` (the release names it ``item``), several are ``group_cols`` (one release column each, named
    as in the view)."""
    return {"item_col": keys[0]} if len(keys) == 1 else {"group_cols": list(keys)}


# The default names of unnamed aggregates, as BigQuery names anonymous columns: f0_, f1_, ...
_ANONYMOUS = "f{}_"


@dataclass(frozen=True)
class Translation:
    """A statement as one dp_group_by release.

    ``source``: the query of the rows the release reads (the TEMP view's body); ``params``: the keyword
    arguments of :func:`dpsql.group_by` besides the table; ``columns``: ``(release column, output name)`` in
    the order of the select list; ``value_check``: ``(query, column)`` whose type must be a number before the
    view is made (the AVG view divides it), or None.
    """

    source: str
    params: dict[str, Any]
    columns: tuple[tuple[str, str], ...]
    value_check: Optional[tuple[str, str]] = None


# -- reading the text --------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _reserved() -> frozenset[str]:
    """DuckDB's reserved keywords (they cannot name a column or an alias unquoted)."""
    con = duckdb.connect()
    try:
        rows = con.execute("SELECT upper(keyword_name) FROM duckdb_keywords() WHERE keyword_category = 'reserved'")
        return frozenset(r[0] for r in rows.fetchall())
    finally:
        con.close()


def _word(tok: Optional[Token]) -> str:
    """A token's text in upper case if it is a bare word (identifier or keyword), else ''."""
    return tok.text.upper() if tok is not None and tok.kind in ("identifier", "keyword") else ""


def _is_name(tok: Optional[Token]) -> bool:
    """A token that can name a column or alias: an identifier (quoted or not) or a non-reserved keyword."""
    return tok is not None and (tok.kind == "identifier"
                                or (tok.kind == "keyword" and tok.text.upper() not in _reserved()))


def _is(tok: Optional[Token], text: str) -> bool:
    return tok is not None and tok.kind == "operator" and tok.text == text


def _unquote(name: str) -> str:
    for quote in ('"', "`"):
        if len(name) > 1 and name[0] == quote and name[-1] == quote:
            return name[1:-1].replace(quote * 2, quote)
    return name


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _depths(toks: Sequence[Token]) -> list[int]:
    """The parenthesis depth at each token (before it)."""
    out, depth = [], 0
    for tok in toks:
        out.append(depth)
        if tok.kind == "operator":
            depth += tok.text.count("(") + tok.text.count("[") - tok.text.count(")") - tok.text.count("]")
    return out


def _split(toks: Sequence[Token], sep: str = ",") -> list[list[Token]]:
    """``toks`` split at the top-level operator ``sep``."""
    parts: list[list[Token]] = [[]]
    for tok, depth in zip(toks, _depths(toks)):
        if depth == 0 and _is(tok, sep):
            parts.append([])
        else:
            parts[-1].append(tok)
    return parts


def _closing(toks: Sequence[Token], start: int) -> int:
    """The index of the parenthesis closing the one at ``start``."""
    depth = 0
    for i in range(start, len(toks)):
        if toks[i].kind == "operator":
            depth += toks[i].text.count("(") - toks[i].text.count(")")
            if depth == 0:
                return i
    raise _refuse("a parenthesis is not closed")


class _Text:
    """The statement's text and its tokens without comments."""

    def __init__(self, text: str):
        statements = sqltext.split_statements(text)
        if len(statements) != 1:
            raise _refuse("give one statement" if statements else "the text holds no statement")
        self.text = statements[0]
        self.toks = [t for t in sqltext.tokens(self.text) if t.kind != "comment"]
        if self.toks and _depths([*self.toks, Token(len(self.text), ";", "operator")])[-1] != 0:
            raise _refuse("a parenthesis is not closed")

    def of(self, toks: Sequence[Token]) -> str:
        """The original text spanned by ``toks`` (comments inside kept)."""
        return self.text[toks[0].start:toks[-1].end] if toks else ""


def _path(toks: Sequence[Token]) -> Optional[list[str]]:
    """The parts of a column path ``a.b.c`` (unquoted), or None if ``toks`` is not one."""
    if not toks or len(toks) % 2 == 0:
        return None
    parts = []
    for i, tok in enumerate(toks):
        if i % 2 == 0:
            if not _is_name(tok):
                return None
            parts.append(_unquote(tok.text))
        elif not _is(tok, "."):
            return None
    return parts


def _number(toks: Sequence[Token], what: str) -> float:
    """A numeric literal, optionally signed."""
    sign = 1.0
    rest = list(toks)
    if rest and rest[0].kind == "operator" and rest[0].text in ("+", "-"):
        sign = -1.0 if rest[0].text == "-" else 1.0
        rest = rest[1:]
    if len(rest) == 1 and rest[0].kind == "numeric_const":
        try:
            value = sign * float(rest[0].text)
        except ValueError:
            pass
        else:
            if math.isfinite(value):
                return value
    raise _refuse(f"{what} must be a number literal")


def _is_alias(toks: Sequence[Token]) -> bool:
    """Whether ``toks`` is nothing or an alias ``[AS] name``."""
    rest = toks[1:] if toks and _word(toks[0]) == "AS" else toks
    return not toks or (len(rest) == 1 and (rest[0].kind == "identifier"
                                            or (rest[0].kind == "keyword" and rest[0].text.upper() not in _reserved())))


def _alias(toks: Sequence[Token], what: str) -> Optional[str]:
    """The alias ``[AS] name`` of an item (``toks``: what follows it), or None."""
    if not _is_alias(toks):
        raise _refuse(f"{what} is followed by something other than an alias")
    return _unquote(toks[-1].text) if toks else None


# Words after which a parenthesis opens a query, not an expression.
_QUERY_WORDS = frozenset({"SELECT", "FROM", "WITH", "VALUES", "TABLE", "PIVOT", "UNPIVOT", "SUMMARIZE", "DESCRIBE",
                          "SHOW"})


def _row_wise(toks: Sequence[Token], where: str) -> None:
    """Refuse a subquery or a window function in an expression BigQuery evaluates row by row."""
    for i, tok in enumerate(toks):
        after_paren = i > 0 and _is(toks[i - 1], "(")
        if _word(tok) == "SELECT" or (after_paren and _word(tok) in _QUERY_WORDS):
            raise _refuse(f"{where} holds a subquery, which could make one privacy unit's rows depend on other "
                          f"units' rows; filter in a subquery in FROM if it keeps each unit's rows its own")
        if _word(tok) == "OVER":
            raise _refuse(f"{where} holds a window function, which mixes privacy units' rows")


# -- parsing ------------------------------------------------------------------------------------------------

@dataclass
class _Call:
    function: str
    star: bool
    value: str  # the argument's text ('' for *)
    bounds: Optional[tuple[float, float]]
    bounds_name: Optional[str]
    alias: Optional[str]
    text: str


@dataclass
class _Statement:
    options: dict[str, Any] = field(default_factory=dict)
    unit: list[str] = field(default_factory=list)
    unit_text: str = ""
    items: list[tuple[str, Any]] = field(default_factory=list)  # ("key", (path, alias)) or ("agg", _Call)
    source: str = ""
    where: str = ""
    keys: list[list[str]] = field(default_factory=list)  # the GROUP BY columns' paths
    keys_text: list[str] = field(default_factory=list)


def is_dp_query(text: str) -> bool:
    """Whether ``text`` holds BigQuery's ``SELECT WITH DIFFERENTIAL_PRIVACY`` (or the older
    ``SELECT WITH ANONYMIZATION``) anywhere outside quotes and comments: no statement DuckDB runs does."""
    upper = text.upper()
    if "DIFFERENTIAL_PRIVACY" not in upper and "ANONYMIZATION" not in upper:  # the shell asks of every statement
        return False
    words = [_word(t) for t in sqltext.tokens(text) if t.kind != "comment"]
    return any(words[i:i + 2] == ["SELECT", "WITH"] and words[i + 2] in ("DIFFERENTIAL_PRIVACY", "ANONYMIZATION")
               for i in range(len(words) - 2))


def _options(text: _Text, toks: Sequence[Token]) -> tuple[dict[str, Any], list[str], str]:
    """The privacy options (by dp_group_by parameter), the unit's column path and its text."""
    found: dict[str, Any] = {}
    unit: list[str] = []
    unit_text = ""
    seen: set[str] = set()
    for part in _split(toks):
        if len(part) < 3 or not _is(part[1], "=") or _word(part[0]) == "":
            raise _refuse(f"OPTIONS takes name = value pairs (got {text.of(part) or 'an empty option'!r})")
        name = _unquote(part[0].text).lower()
        if name in ("kappa", "k_threshold"):
            raise _refuse(f"the option {name} belongs to the older syntax; write max_groups_contributed")
        option = OPTIONS.get(name)
        if option is None:
            raise _refuse(f"unknown option {name!r}; the options are {', '.join(OPTIONS)}")
        if name in seen:
            raise _refuse(f"the option {name} is given twice")
        seen.add(name)
        value = part[2:]
        if option.kind == "column":
            path = _path(value)
            if path is None:
                raise _refuse(f"{name} must be a column (a name, or table.name), not "
                              f"{'a string' if value[0].kind == 'string_const' else repr(text.of(value))}")
            unit, unit_text = path, text.of(value)
            parsed: Any = path[-1]
        else:
            number = _number(value, name)
            if option.kind == "whole":
                if number != int(number) or number < 1:
                    raise _refuse(f"{name} must be a whole number >= 1 (got {text.of(value)})")
                number = int(number)
            parsed = number
        for target in option.targets:
            found[target] = parsed
    missing = [n for n in OPTIONS if n not in seen]
    if missing:
        raise _refuse(f"OPTIONS must give {', '.join(missing)}: dpsql takes no privacy parameter from the data or "
                      f"from a view's policy")
    return found, unit, unit_text


def _call(text: _Text, toks: Sequence[Token], end: int) -> _Call:
    """An aggregate call ``f(args)`` (``end``: its closing parenthesis) and its alias."""
    function = _unquote(toks[0].text).upper()
    args = _split(toks[2:end])
    rest = toks[end + 1:]
    call_text = text.of(toks[:end + 1])
    if function.startswith("ANON_"):
        raise _refuse(f"{function} belongs to the older WITH ANONYMIZATION syntax; write "
                      f"{function.removeprefix('ANON_')}(x, contribution_bounds_per_group => (lower, upper))")
    if function not in {a.function for a in AGGREGATES}:
        raise _refuse(f"{call_text} is not one of the differentially private aggregates "
                      f"({', '.join(dict.fromkeys(a.function for a in AGGREGATES))})")
    computable = [a for a in AGGREGATES if a.function == function and a.measure is not None]
    if not computable:  # e.g. PERCENTILE_CONT(x, 0.5, ...): refused before its own arguments are read
        raise _refuse(f"{call_text}: {next(a.why for a in AGGREGATES if a.function == function)}")
    first = args[0]
    if not first:
        raise _refuse(f"{call_text} has no argument")
    if _word(first[0]) in ("DISTINCT", "ALL"):
        raise _refuse(f"{call_text}: {first[0].text.upper()} is not supported in a differentially private "
                      f"aggregate")
    if any(_word(t) == "CLAMPED" for t in first):
        raise _refuse(f"{call_text}: write the bounds as contribution_bounds_per_group => (lower, upper) "
                      f"(CLAMPED BETWEEN belongs to the older syntax)")
    if any(_word(t) in ("IGNORE", "RESPECT", "ORDER") for t in first):
        raise _refuse(f"{call_text}: an aggregate's argument is one value (no ORDER BY, IGNORE or RESPECT NULLS)")
    star = len(first) == 1 and _is(first[0], "*")
    if not star:
        _row_wise(first, f"the argument of {function}")
    bounds: Optional[tuple[float, float]] = None
    bounds_name: Optional[str] = None
    for arg in args[1:]:
        if len(arg) < 3 or not _is(arg[1], "=>") or not _is_name(arg[0]):
            raise _refuse(f"{call_text}: its arguments after the first are named, e.g. "
                          f"contribution_bounds_per_group => (lower, upper)")
        name = _unquote(arg[0].text).lower()
        if name not in {a.bounds for a in AGGREGATES}:
            raise _refuse(f"{call_text}: unknown argument {name}")
        if bounds_name is not None:
            raise _refuse(f"{call_text} gives its bounds twice")
        inner = arg[2:]
        if not (_is(inner[0], "(") and _is(inner[-1], ")") and _closing(inner, 0) == len(inner) - 1):
            raise _refuse(f"{call_text}: {name} takes (lower, upper)")
        pair = _split(inner[1:-1])
        if len(pair) != 2:
            raise _refuse(f"{call_text}: {name} takes (lower, upper)")
        bounds = (_number(pair[0], f"the lower bound of {function}"), _number(pair[1], f"the upper bound of {function}"))
        bounds_name = name
    return _Call(function, star, "" if star else text.of(first), bounds, bounds_name, _alias(rest, call_text),
                 call_text)


def _select_list(text: _Text, toks: Sequence[Token]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for part in _split(toks):
        if not part:
            raise _refuse("the select list has an empty item")
        if _is_name(part[0]) and len(part) > 1 and _is(part[1], "("):
            items.append(("agg", _call(text, part, _closing(part, 1))))
            continue
        if _word(part[0]) in ("DISTINCT", "ALL"):
            raise _refuse(f"SELECT {part[0].text.upper()} is not supported")
        end = 1
        while end + 1 < len(part) and _is(part[end], ".") and _is_name(part[end + 1]):
            end += 2
        path = _path(part[:end])
        if path is None or not _is_alias(part[end:]):
            raise _refuse(f"the select list holds {text.of(part)!r}: it may hold the GROUP BY column and the "
                          f"differentially private aggregates only")
        items.append(("key", (path, _alias(part[end:], text.of(part[:end])))))
    return items


def _from(text: _Text, toks: Sequence[Token]) -> str:
    """The FROM clause's text: one table (a path), file (a string), table function call or (subquery),
    with an optional alias."""
    if not toks:
        raise _refuse("FROM names no table")
    if _is(toks[0], "("):
        end = _closing(toks, 0)
        if _word(toks[1] if len(toks) > 1 else None) not in _QUERY_WORDS:
            raise _refuse("FROM ( ... ) must hold a query (SELECT ... or FROM ...); write a join inside a subquery")
    elif toks[0].kind == "string_const":
        end = 0
    elif _is_name(toks[0]):
        end = 0
        while end + 2 < len(toks) and _is(toks[end + 1], ".") and _is_name(toks[end + 2]):
            end += 2
        if end + 1 < len(toks) and _is(toks[end + 1], "("):
            end = _closing(toks, end + 1)
    else:
        raise _refuse(f"FROM {text.of(toks)!r} is not a table, a file, a table function or a (subquery)")
    rest = toks[end + 1:]
    if rest and (_is(rest[0], ",") or _word(rest[0]) in ("JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS",
                                                          "NATURAL", "POSITIONAL", "ASOF", "ANTI", "SEMI")
                 or any(_word(t) in ("JOIN", "ON", "USING") or _is(t, ",") for t in rest)):
        raise _refuse("FROM reads one table, file or subquery: write a join inside a subquery, FROM (SELECT ... "
                      "FROM a JOIN b ...) AS s, keeping each privacy unit's rows its own")
    _alias(rest, f"FROM {text.of(toks[:end + 1])}")
    return text.of(toks)


def _parse(text: _Text) -> _Statement:
    toks = text.toks
    words = [_word(t) for t in toks]
    if words[:2] != ["SELECT", "WITH"] or len(words) < 3 \
            or words[2] not in ("DIFFERENTIAL_PRIVACY", "ANONYMIZATION"):
        if is_dp_query(text.text):
            raise _refuse("SELECT WITH DIFFERENTIAL_PRIVACY must be the whole statement (not inside another "
                          "query, a WITH or an EXPLAIN)")
        raise _refuse("the statement is not a SELECT WITH DIFFERENTIAL_PRIVACY query (run other SQL on the "
                      "connection)")
    if words[2] == "ANONYMIZATION":
        raise _refuse("the older WITH ANONYMIZATION syntax is not supported; write WITH DIFFERENTIAL_PRIVACY")
    if words[3:4] != ["OPTIONS"] or not _is(toks[4] if len(toks) > 4 else None, "("):
        raise _refuse("WITH DIFFERENTIAL_PRIVACY must be followed by OPTIONS (...)")
    close = _closing(toks, 4)
    st = _Statement()
    st.options, st.unit, st.unit_text = _options(text, toks[5:close])
    body = toks[close + 1:]
    depths = _depths(body)
    top = [(i, _word(t)) for i, (t, d) in enumerate(zip(body, depths)) if d == 0]
    for _, word in top:
        if word in ("UNION", "EXCEPT", "INTERSECT", "HAVING", "QUALIFY", "WINDOW", "ORDER", "LIMIT", "OFFSET"):
            raise _refuse(f"{word} is not supported with a differentially private query (sort or filter the "
                          f"released rows afterwards)")
    positions = {word: i for i, word in reversed(top) if word in ("FROM", "WHERE", "GROUP")}
    if "FROM" not in positions:
        raise _refuse("the query has no FROM")
    if "GROUP" not in positions or _word(body[positions["GROUP"] + 1] if positions["GROUP"] + 1 < len(body)
                                         else None) != "BY":
        raise _refuse("the query has no GROUP BY (dpsql releases per group; a total over all rows is not supported)")
    start_from, start_group = positions["FROM"], positions["GROUP"]
    start_where = positions.get("WHERE")
    if not start_from < start_group or (start_where is not None and not start_from < start_where < start_group):
        raise _refuse("the clauses must come in the order SELECT ... FROM ... [WHERE ...] GROUP BY ...")
    st.items = _select_list(text, body[:start_from])
    if not any(kind == "agg" for kind, _ in st.items):
        raise _refuse("the select list has no differentially private aggregate")
    st.source = _from(text, body[start_from + 1:start_where if start_where is not None else start_group])
    if start_where is not None:
        where = body[start_where + 1:start_group]
        if not where:
            raise _refuse("WHERE has no condition")
        _row_wise(where, "the WHERE")
        st.where = text.of(where)
    for part in _split(body[start_group + 2:]):
        key = _path(part)
        if key is None:
            raise _refuse(f"GROUP BY {text.of(part) or '(nothing)'!r} is not a column name (dpsql groups by "
                          f"columns; compute an expression in a subquery in FROM)")
        if key[-1].lower() in (k[-1].lower() for k in st.keys):
            raise _refuse(f"GROUP BY names the column {key[-1]} twice")
        st.keys.append(key)
        st.keys_text.append(text.of(part))
    return st


# -- translation ----------------------------------------------------------------------------------------------

def _rule(call: _Call) -> Aggregate:
    found = next((a for a in AGGREGATES if a.matches(call.function, call.star, call.bounds)), None)
    if found is None:
        if call.star:
            raise _refuse(f"{call.text}: {call.function}(*) is not supported; write {call.function}(x, ...)")
        raise _refuse(f"{call.text}: {call.function}(*, ...) is the form of this aggregate")
    if found.measure is None:
        raise _refuse(f"{call.text}: {found.why}")
    if call.bounds is None:
        raise _refuse(f"{call.text} needs {found.bounds} => (lower, upper): BigQuery derives missing bounds from the "
                      f"data, dpsql takes them from public knowledge only")
    if call.bounds_name != found.bounds:
        raise _refuse(f"{call.text}: {call.function} takes {found.bounds}, not {call.bounds_name}")
    return found


def translate(text: str) -> Translation:
    """The dp_group_by release of a ``SELECT WITH DIFFERENTIAL_PRIVACY`` statement (pure: reads no data).

    Raises :class:`DpSyntaxError` (a :class:`~dpsql.core.errors.ParameterError`) for anything outside the
    subset, saying what is supported (:data:`SUPPORTED`).
    """
    st = _parse(_Text(text))
    unit = st.unit[-1]
    keys = [k[-1] for k in st.keys]
    lowered = [k.lower() for k in keys]
    if unit.lower() in lowered:
        raise _refuse("the GROUP BY columns must differ from privacy_unit_column")
    measures: list[str] = []
    value: Optional[tuple[str, str, dict[str, Any]]] = None  # (per_unit, expression text, bound params)
    extra: dict[str, Any] = {}
    columns: list[tuple[str, str]] = []  # (release column, output name)
    anonymous = 0
    for kind, item in st.items:
        if kind == "key":
            path, alias = item
            # the GROUP BY column of the same name, qualified alike when both are qualified
            at = next((i for i, k in enumerate(st.keys) if path[-1].lower() == k[-1].lower()
                       and (len(path) == 1 or len(k) == 1 or [p.lower() for p in path] == [p.lower() for p in k])),
                      None)
            if at is None:
                raise _refuse(f"the select list holds the column {'.'.join(path)}: it may hold the GROUP BY "
                              f"column{'s' if len(keys) > 1 else ''} ({', '.join(st.keys_text)}) and the "
                              f"differentially private aggregates only")
            # dp_group_by names the one item_col column item; each of group_cols keeps its name
            columns.append(("item" if len(keys) == 1 else keys[at], alias or keys[at]))
            continue
        call: _Call = item
        rule = _rule(call)
        if rule.measure in measures:
            raise _refuse(f"{call.text}: dpsql's {rule.measure!r} appears twice; each aggregate is released once "
                          f"per query")
        assert call.bounds is not None
        bound = rule.params(*call.bounds)
        if rule.per_unit is not None:
            mine = (rule.per_unit, call.value, bound)
            if value is not None and value != mine:
                what = ("a unit's total for SUM and its average for AVG" if value[0] != rule.per_unit
                        else "one column with one pair of bounds")
                raise _refuse(f"{call.text}: one dpsql release measures one value per privacy unit and group "
                              f"({what}); run the aggregates as separate queries (each is charged)")
            value = mine
        else:  # a count: its bounds may set parameters of their own (max_rows for the count of rows)
            try:
                if "max_rows" in bound:
                    check_max_rows(bound["max_rows"])
            except ParameterError as exc:
                raise _refuse(f"{call.text}: its upper bound is dpsql's max_rows, and "
                              f"{str(exc).removeprefix('dpsql: ').rstrip('.')}") from None
            extra.update(bound)
        measures.append(rule.measure)  # type: ignore[arg-type]
        name = call.alias
        if name is None:
            name, anonymous = _ANONYMOUS.format(anonymous), anonymous + 1
        columns.append((rule.measure, name))  # type: ignore[arg-type]
    seen: dict[str, str] = {}
    for _, name in columns:
        if name.lower() in seen:
            raise _refuse(f"two output columns are named {name!r}; give one an alias")
        seen[name.lower()] = name
    params: dict[str, Any] = dict(st.options)
    grouping = _grouping(keys)
    try:  # dp_group_by's own check of the columns, so that a refusal comes before anything is read
        check_group_cols(grouping.get("group_cols"))
    except ParameterError as exc:
        raise _refuse(str(exc).removeprefix("dpsql: ").rstrip(".")) from None
    params.update(grouping, aggregates=measures, **extra)
    select = [f"{st.unit_text} AS {_quoted(unit)}"] + [f"{t} AS {_quoted(k)}" for t, k in zip(st.keys_text, keys)]
    value_check = None
    if value is not None:
        per_unit, expression, bounds = value
        taken = [unit.lower(), *lowered]
        simple = _path([t for t in sqltext.tokens(expression) if t.kind != "comment"])
        value_col = simple[-1] if simple is not None and simple[-1].lower() not in taken \
            else "value" if "value" not in taken else "dp_value"
        select.append(f"{expression} AS {_quoted(value_col)}")
        params.update(value_col=value_col, **bounds)
    source = f"SELECT {', '.join(select)}\nFROM {st.source}" + (f"\nWHERE {st.where}" if st.where else "")
    if value is not None and value[0] == "average":
        # each row's share of its unit's average in the group: the unit's total is then its average
        v, u, k = _quoted(params["value_col"]), _quoted(unit), ", ".join(_quoted(g) for g in keys)
        value_check = (source, params["value_col"])
        source = (f"SELECT {u}, {k}, CAST({v} AS DOUBLE) / count({v}) OVER (PARTITION BY {u}, {k}) AS {v}\n"
                  f"FROM ({source})")
    return Translation(source, params, tuple(columns), value_check)


# -- running ---------------------------------------------------------------------------------------------------

def _check_value(con: duckdb.DuckDBPyConnection, query: str, column: str) -> None:
    """The value AVG divides is a number whose conversion to DOUBLE cannot fail (dp_group_by's own check)."""
    schema = [(r[0], r[1]) for r in con.execute(f"DESCRIBE {query}").fetchall()]
    _check_value_column("the FROM clause", column, schema)


def sql(con: duckdb.DuckDBPyConnection, text: str) -> pa.Table:
    """Run BigQuery's ``SELECT WITH DIFFERENTIAL_PRIVACY ...`` on ``con`` as one dp_group_by release.

    Returns the released rows as an Arrow table (read once: a lazy relation would release again when read
    again), the columns named as in BigQuery: the GROUP BY column (or its alias) and each aggregate's alias
    (``f0_``, ``f1_``, ... for unnamed ones), rows sorted by the group. The release reads a TEMP view (a
    fresh name, dropped afterwards, even on error) over the FROM and WHERE, so it is charged once to the
    tables and files they read. Raises :class:`DpSyntaxError` for a statement outside the subset
    (:data:`SUPPORTED`) and dpsql's errors of :func:`dpsql.group_by` otherwise.
    """
    if not isinstance(text, str):
        raise _refuse(f"the statement must be a string (got {type(text).__qualname__})")
    plan = translate(text)
    view = f"dpsql_sql_{secrets.token_hex(8)}"
    try:
        if plan.value_check is not None:
            _check_value(con, *plan.value_check)
        try:
            # TEMP: private to this connection, so nothing else can replace it before the release reads it
            con.execute(f"CREATE TEMP VIEW {_quoted(view)} AS {plan.source}")
        except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ParameterError(f"dpsql: the FROM, WHERE or a column of the differentially private query is not "
                                 f"valid here: {first}") from None
        released = group_by(con, view, **plan.params)
    finally:
        _drop(con, view)
    return pa.table({name: released.column(column) for column, name in plan.columns})


def _drop(con: duckdb.DuckDBPyConnection, view: str) -> None:
    for _ in range(2):  # a Ctrl-C aimed at the release may interrupt the first attempt
        try:
            con.execute(f"DROP VIEW IF EXISTS temp.main.{_quoted(view)}")
            return
        except duckdb.Error:
            continue
