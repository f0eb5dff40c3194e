"""The pre-noise stages of ``sql/*.sql`` translated for other SQL engines (one definition, two dialects).

The DuckDB macros stay the only definition of each stage. This module reads a
macro's body from the shipped macro files (:mod:`dpsql.core.sqltext`), binds its relation parameters
(``query_table(rows_rel)``, a nested macro call such as
``dp__capped_user_items(...)``, or a CTE of the macro) to relations of the
target engine, binds its scalar parameters to literals, and renders the result
with sqlglot in the target dialect (Spark SQL for :mod:`dpsql.frontends.spark`).

Only pre-noise stages are translated: noise, calibration, validation and any
bookkeeping in a release macro's ``cal`` CTE stay in Python (the target backend
calls the same functions). ``output`` selects one CTE of a macro and the CTEs it
reads, so the noisy parts of a release macro are never translated.

Exported stages are marked in the SQL. A macro or CTE another engine may
translate (a whole macro, or one CTE as ``output``) has the line
``-- dpsql:portable <name>`` directly above its definition (a macro's header or
body marker, or a CTE's first line); :func:`stages` lists them. :func:`stage_sql`
refuses any other stage, and binds only the stage's relation parameters and its
inputs (the CTEs and nested macros it reads), so a backend addresses no internal
name of a macro beyond the marked stage's interface; ``tests/frontends/test_portable.py``
checks the marks and their translations.

The translation also makes the DuckDB dialect's implicit choices explicit:

* a decimal literal (``1.0``) is a DOUBLE, as in DuckDB's arithmetic with
  doubles; Spark would type it DECIMAL and round divisions to 6 digits;
* ``error(msg)`` becomes ``raise_error(msg)``;
* ``hash(...)`` (DuckDB: 64 bits) becomes ``xxhash64(...)``: Spark's ``hash`` is
  a 32-bit murmur3, whose collisions would tie the cap's ranking keys;
* ``AS [NOT] MATERIALIZED`` hints are dropped (the caller materialises);
* a list subscript ``x[i]`` (1-based, negative from the end) becomes ``element_at(x, i)``, its
  Spark counterpart: Spark's ``x[i]`` counts from 0 and has no negative form;
* a scalar parameter declared ``INTEGER`` is bound as an integer literal (a list index), any
  other number as a DOUBLE;
* a ``UNION ALL`` branch whose ``WHERE`` is constant after binding is pruned,
  as DuckDB prunes it when planning (UserWeights' closed form vs. its UDF);
* outside DuckDB, a scalar subquery that looks one row up by key becomes a ``LEFT JOIN``
  (:func:`_keyed_lookups_as_joins`): Spark runs the subquery as a nested loop join once the
  looked-up relation outgrows its broadcast threshold.
"""
from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from dpsql.core import sqltext
from dpsql.core.sqltext import Macro

__all__ = ["Macro", "Stage", "macros", "stages", "stage_sql", "TranslationError", "MARKER"]

_NESTED_MACRO_PREFIXES = ("dp__", "dp_")
# The one form of an export mark: a line of its own, directly above the macro or CTE it names.
MARKER = sqltext.PORTABLE_MARKER
# DuckDB functions whose Spark SQL counterpart has another name (same semantics).
_RENAMED = {"error": "raise_error", "hash": "xxhash64"}


class TranslationError(ValueError):
    """A stage uses a construct that has no binding or no translation."""


def macros() -> dict[str, Macro]:
    """Every table macro of the shipped macro files, by name (a mechanism's body under its generated header)."""
    return {name: m for name, m in sqltext.macros().items() if m.table}


@dataclass(frozen=True)
class Stage:
    """A marked stage: a table macro (``cte`` is None) or one CTE of a macro's body."""

    macro: str
    cte: Optional[str] = None

    @property
    def name(self) -> str:
        return self.macro if self.cte is None else f"{self.macro}.{self.cte}"


def _marks() -> list[tuple[str, int, str, Optional[Stage]]]:
    """Every export mark of the macro files: (file, line, name, the stage below it or None)."""
    return [(m.file, m.line, m.name, None if m.macro is None else Stage(m.macro, m.cte)) for m in sqltext.marks()]


def stages() -> dict[str, Stage]:
    """The stages marked ``-- dpsql:portable <name>``, by :attr:`Stage.name` (``macro`` or ``macro.cte``).

    A mark that is not directly above the definition of the macro or CTE it names is an error.
    """
    out: dict[str, Stage] = {}
    for file, line, name, stage in _marks():
        if stage is None:
            raise TranslationError(f"{file}:{line}: the mark {MARKER} {name} is not directly above the "
                                   f"definition of a macro or CTE named {name!r}")
        out[stage.name] = stage
    return out


def _check_marked(stage: Stage) -> None:
    if stage.name not in stages():
        what = f"the CTE {stage.cte} of {stage.macro}" if stage.cte else f"the macro {stage.macro}"
        raise TranslationError(
            f"{what} is not an exported stage: only a macro or CTE marked '{MARKER} <name>' in the macro files "
            f"is translated (exported: {', '.join(sorted(stages()))})")


def _sqlglot():
    try:
        import sqlglot
        from sqlglot import exp
        from sqlglot.optimizer.simplify import simplify
    except ImportError as err:  # pragma: no cover - the spark extra installs it
        raise ImportError("dpsql's SQL translation needs sqlglot: pip install '.[spark]' in dpsql's checkout") from err
    return sqlglot, exp, simplify


_INTEGER_TYPES = ("INTEGER", "INT", "BIGINT")


def _literal(exp, value: object, declared: str = ""):
    if value is None:  # a NULL of the declared type (a DOUBLE by default)
        return exp.Cast(this=exp.Null(), to=exp.DataType.build(declared or "double"))
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, int) and declared.upper() in _INTEGER_TYPES:
        return exp.Literal.number(str(value))
    if isinstance(value, (int, float)):
        number = float(value)
        if not math.isfinite(number):  # no literal spells it: text both engines cast ('-Infinity', 'NaN')
            return exp.Cast(this=exp.Literal.string(repr(number).replace("inf", "Infinity").replace("nan", "NaN")),
                            to=exp.DataType.build("double"))
        # the shortest repr with an exponent: both engines read it as a DOUBLE, exactly (a plain decimal
        # literal is a DECIMAL first, and its conversion can round twice); the DOUBLE pass casts it too
        text = repr(abs(number))
        literal = exp.Literal(this=text if "e" in text else text + "e0", is_string=False)
        return exp.Neg(this=literal) if number < 0 else literal
    raise TranslationError(f"cannot bind a constant of type {type(value).__name__}")


def _subscripts_as_element_at(exp, tree):
    """DuckDB's list subscript ``x[i]`` as ``element_at(x, i)`` (both 1-based, negative from the end).

    sqlglot's DuckDB reader stores a literal index minus one (its 0-based form, also for a negative
    one) and any other index as written, so a literal gets its one back. A string subscript (a struct
    field) is left alone.
    """
    def convert(node):
        if not isinstance(node, exp.Bracket) or len(node.expressions) != 1:
            return node
        index = node.expressions[0]
        if isinstance(index, exp.Literal) and index.is_string:
            return node
        if isinstance(index, exp.Literal) or (isinstance(index, exp.Neg) and isinstance(index.this, exp.Literal)):
            written = int(index.this.this if isinstance(index, exp.Neg) else index.this)
            written = (-written if isinstance(index, exp.Neg) else written) + 1
            index = exp.Literal.number(str(written)) if written >= 0 else exp.Neg(
                this=exp.Literal.number(str(-written)))
        return exp.Anonymous(this="element_at", expressions=[node.this, index])

    return tree.transform(convert)


def _keyed_lookups_as_joins(exp, tree):
    """A scalar subquery that looks up one row by key, ``(SELECT v FROM u WHERE u.k IS NOT DISTINCT FROM
    a.k)`` in the select list of a query over the one relation ``a``, as ``LEFT JOIN u AS l ON l.k <=> a.k``
    and ``v`` read from ``l`` (an expression ``v`` only where ``l`` found a row: ``u`` is joined with a
    ``dp__found`` flag, as the subquery's value is NULL, not a struct of NULLs, without one).

    Both return, for each row of ``a``, the value of ``u``'s row with the same key, or NULL without one,
    given what the DuckDB form requires anyway: at most one row of ``u`` per key (DuckDB refuses a scalar
    subquery that returns two). DuckDB plans the subquery as a single join that builds on ``u``; Spark plans
    it as a broadcast hash join only while ``u`` is under its broadcast threshold, else as a nested loop
    join (rows x keys: a million users never finish), whereas an equi-join (``<=>`` is one in Spark) is
    planned by size like any other. The columns the query reads unqualified are qualified with ``a``'s
    name first, so the join cannot make them ambiguous (one that belonged to an outer query then fails
    loudly instead of changing meaning).
    """
    count = 0
    for select in list(tree.find_all(exp.Select)):
        source = select.args.get("from_")
        if source is None or not isinstance(source.this, exp.Table) or select.args.get("joins"):
            continue
        outer = source.this.alias_or_name
        lookups = []
        for projection in select.expressions:
            sub = projection.this if isinstance(projection, exp.Alias) else projection
            inner = sub.this if isinstance(sub, exp.Subquery) else None
            if (not isinstance(inner, exp.Select) or len(inner.expressions) != 1
                    or any(inner.args.get(k) for k in ("joins", "group", "having", "order", "limit", "distinct",
                                                       "with_", "with"))):
                continue
            table = inner.args["from_"].this if inner.args.get("from_") else None
            cond = inner.args["where"].this if inner.args.get("where") else None
            if not isinstance(table, exp.Table) or not isinstance(cond, exp.NullSafeEQ):
                continue
            key, other = cond.this, cond.expression
            if isinstance(other, exp.Column) and other.table == table.alias_or_name:
                key, other = other, key
            if not (isinstance(key, exp.Column) and isinstance(other, exp.Column)
                    and key.table == table.alias_or_name and other.table == outer):
                continue
            lookups.append((sub, inner, table, key, other))
        if not lookups:
            continue
        for column in select.find_all(exp.Column):  # this query's own columns, not its subqueries'
            if not column.table and column.find_ancestor(exp.Select) is select:
                column.set("table", exp.to_identifier(outer))
        for sub, inner, table, key, other in lookups:
            alias = f"dp__lookup{count}"
            count += 1
            value = inner.expressions[0].copy()
            for column in value.find_all(exp.Column):
                if not column.table or column.table == table.alias_or_name:
                    column.set("table", exp.to_identifier(alias))
            if isinstance(value, exp.Column):  # NULL without a match, as the subquery's
                joined = table.copy()
                joined.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
            else:  # an expression of a missing row is not NULL (a struct of NULLs): NULL it as the subquery does
                bare = table.copy()
                bare.set("alias", None)
                joined = exp.select(exp.Star(), exp.alias_(exp.true(), "dp__found")).from_(bare).subquery(alias)
                value = exp.Case(ifs=[exp.If(this=exp.column("dp__found", table=alias), true=value)])
            select.join(joined, on=exp.NullSafeEQ(this=exp.column(key.name, table=alias), expression=other.copy()),
                        join_type="left", copy=False)
            sub.replace(value)
    return tree


def _referenced(exp, node, names: set[str]) -> set[str]:
    """CTE names that ``node`` reads (as a table or through ``query_table('name')``)."""
    found = {t.name for t in node.find_all(exp.Table) if isinstance(t.this, exp.Identifier) and t.name in names}
    for fn in node.find_all(exp.Anonymous):
        if fn.name.lower() == "query_table" and fn.expressions and fn.expressions[0].is_string:
            if fn.expressions[0].this in names:
                found.add(fn.expressions[0].this)
    return found


def _inputs(exp, tree, output: Optional[str]) -> set[str]:
    """The CTEs and nested macros (table functions) the stage reads, directly or through its CTEs."""
    with_ = tree.args.get("with_") or tree.args.get("with")
    ctes = {c.alias: c for c in (with_.expressions if with_ else [])}
    if output is None:
        nodes = [tree]
        found = set(ctes)
    else:
        if output not in ctes:
            raise TranslationError(f"no CTE named {output!r} (CTEs: {', '.join(ctes)})")
        found, todo = set(), [output]
        while todo:
            name = todo.pop()
            if name not in found:
                found.add(name)
                todo.extend(_referenced(exp, ctes[name].this, set(ctes)))
        nodes = [ctes[name].this for name in found]
        found.discard(output)
    for node in nodes:
        found |= {t.this.name for t in node.find_all(exp.Table) if isinstance(t.this, exp.Anonymous)
                  and t.this.name.lower().startswith(_NESTED_MACRO_PREFIXES)}
    return found


def _select_output(exp, tree, output: str, dropped: set[str]):
    """``WITH <the CTEs output needs, minus dropped> SELECT * FROM output``."""
    with_ = tree.args.get("with_") or tree.args.get("with")
    ctes = {c.alias: c for c in (with_.expressions if with_ else [])}
    if output not in ctes:
        raise TranslationError(f"no CTE named {output!r} (CTEs: {', '.join(ctes)})")
    needed, todo = set(), [output]
    while todo:
        name = todo.pop()
        if name in needed or name in dropped:
            continue
        needed.add(name)
        todo.extend(_referenced(exp, ctes[name].this, set(ctes)))
    kept = [c.copy() for name, c in ctes.items() if name in needed]
    query = exp.select("*").from_(output)
    for c in kept:
        query = query.with_(c.alias, as_=c.this)
    return query


def _drop_ctes(exp, tree, dropped: set[str]):
    with_ = tree.args.get("with_") or tree.args.get("with")
    if with_:
        keep = [c for c in with_.expressions if c.alias not in dropped]
        if keep:
            with_.set("expressions", keep)
        else:
            with_.pop()
    return tree


def _prune_constant_branches(exp, simplify, tree):
    for union in list(tree.find_all(exp.Union)):
        # (side, its WHERE node, the folded WHERE): sqlglot nodes are untyped; WHERE is None only with no verdict
        sides: list[tuple[Any, Any, Optional[bool]]] = []
        for side in (union.this, union.expression):
            where = side.args.get("where") if isinstance(side, exp.Select) else None
            verdict = None
            if where is not None and not list(where.find_all(exp.Column)):
                folded = simplify(where.this.copy())
                if isinstance(folded, exp.Boolean):
                    verdict = folded.this
            sides.append((side, where, verdict))
        alive = [(s, w, v) for s, w, v in sides if v is not False]
        for s, w, v in alive:
            if v is True:
                w.pop()
        if len(alive) == 1:
            if union is tree:
                key = "with_" if "with_" in union.args else "with"
                with_ = union.args.get(key)
                tree = alive[0][0]
                tree.pop()
                if with_ is not None:
                    tree.set(key, with_.pop())
            else:
                union.replace(alive[0][0])
        elif not alive:
            raise TranslationError("every branch of a UNION ALL is pruned")
    return tree


# A relation name the cached translations may stand in for: a plain identifier no dialect reserves.
_SLOT_NAME = re.compile(r"dp__[A-Za-z0-9_]+")
_TEMPLATES: dict[tuple, str] = {}
_TEMPLATES_KEPT = 512
_TEMPLATES_LOCK = threading.Lock()


def stage_sql(macro: str, relations: Mapping[str, str], constants: Optional[Mapping[str, object]] = None,
              output: Optional[str] = None, dialect: str = "spark") -> str:
    """The body of ``macro`` with its parameters bound, rendered in ``dialect`` (:func:`_stage_sql`).

    A backend binds fresh relation names (``dp__...``) at every call, so the translation is kept once per
    (stage, bound keys, constants, dialect) with a slot name per relation, and the call's names are put in
    the slots: parsing and rewriting a macro body costs far more than the release's small stages do.
    Any other relation name is translated afresh.
    """
    relations = dict(relations)
    if not all(_SLOT_NAME.fullmatch(name) for name in relations.values()):
        return _stage_sql(macro, relations, constants, output, dialect)
    keys = sorted(relations)
    slots = {key: f"dp__slot_{i}_" for i, key in enumerate(keys)}
    cache_key = (macro, tuple(keys), tuple(sorted((k, repr(v)) for k, v in (constants or {}).items())), output,
                 dialect)
    with _TEMPLATES_LOCK:
        template = _TEMPLATES.get(cache_key)
    if template is None:
        template = _stage_sql(macro, slots, constants, output, dialect)
        with _TEMPLATES_LOCK:
            if len(_TEMPLATES) >= _TEMPLATES_KEPT:  # constants vary per release (bounds, caps): keep it small
                _TEMPLATES.clear()
            _TEMPLATES[cache_key] = template
    by_slot = {slots[key]: relations[key] for key in keys}
    return re.sub(r"\bdp__slot_[0-9]+_\b", lambda m: by_slot[m.group(0)], template)


def _stage_sql(macro: str, relations: Mapping[str, str], constants: Optional[Mapping[str, object]] = None,
               output: Optional[str] = None, dialect: str = "spark") -> str:
    """The body of ``macro`` with its parameters bound, rendered in ``dialect``.

    ``relations`` maps relation parameters (read via ``query_table(p)``), nested
    macro names and CTE names to relation names of the target engine (a bound CTE
    is dropped from the query). ``constants`` binds scalar parameters. ``output``
    selects one CTE (and what it reads) instead of the macro's final SELECT.
    The stage must be marked (:func:`stages`) and ``relations`` may bind only
    relation parameters and inputs of the stage; anything else raises
    :class:`TranslationError`.
    """
    sqlglot, exp, simplify = _sqlglot()
    defs = macros()
    if macro not in defs:
        raise TranslationError(f"no table macro named {macro!r} in the macro files")
    constants = dict(constants or {})
    stage = Stage(macro, output)
    _check_marked(stage)
    tree = sqlglot.parse_one(defs[macro].body, read="duckdb")
    inputs = _inputs(exp, tree, output)
    for key in relations:  # a relation parameter, or a CTE or nested macro the stage reads
        if key not in defs[macro].params and key not in inputs:
            raise TranslationError(f"{stage.name}: cannot bind {key!r}, which is neither a relation parameter "
                                   f"nor an input of the stage (its inputs: {', '.join(sorted(inputs)) or 'none'})")
    dropped = set(relations) & {c.alias for c in tree.find_all(exp.CTE)}
    tree = _select_output(exp, tree, output, dropped) if output else _drop_ctes(exp, tree, dropped)
    params = set(defs[macro].params)
    declared = {p.name: p.type for p in sqltext.parameters(defs[macro].signature)}

    def bind(node):
        if isinstance(node, exp.CTE):
            node.set("materialized", None)
            return node
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
            fn = node.this
            if fn.name.lower() == "query_table":
                arg = fn.expressions[0]
                key = arg.this if arg.is_string else arg.name
                if key not in relations and arg.is_string:
                    return exp.Table(this=exp.to_identifier(key), alias=node.args.get("alias"))
                if key not in relations:
                    raise TranslationError(f"{macro}: relation parameter {key!r} is not bound")
                return exp.Table(this=exp.to_identifier(relations[key]),
                                 alias=node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(key)))
            if fn.name in relations:
                return exp.Table(this=exp.to_identifier(relations[fn.name]), alias=node.args.get("alias"))
            raise TranslationError(f"{macro}: the table function {fn.name} has no binding")
        if isinstance(node, exp.Table) and node.name in relations and node.name in dropped:
            return exp.Table(this=exp.to_identifier(relations[node.name]),
                             alias=node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(node.name)))
        if isinstance(node, exp.Column) and not node.table and node.name in params:
            if node.name not in constants:
                raise TranslationError(f"{macro}: scalar parameter {node.name!r} is not bound")
            return _literal(exp, constants[node.name], declared.get(node.name, ""))
        if isinstance(node, exp.Anonymous) and node.name.lower() in _RENAMED:
            node.set("this", _RENAMED[node.name.lower()])
        return node

    def as_double(node):
        if isinstance(node, exp.Literal) and not node.is_string and re.search(r"[.eE]", node.this):
            return exp.Cast(this=node.copy(), to=exp.DataType.build("double"))
        return node

    tree = _subscripts_as_element_at(exp, tree)  # before binding: a bound index is a literal as written
    if dialect != "duckdb":
        tree = _keyed_lookups_as_joins(exp, tree)
    tree = tree.transform(bind)
    tree = _prune_constant_branches(exp, simplify, tree)
    tree = tree.transform(as_double)
    leftover = [f.name for f in tree.find_all(exp.Anonymous) if f.name.lower().startswith(_NESTED_MACRO_PREFIXES)]
    if leftover:
        raise TranslationError(f"{macro}: {', '.join(sorted(set(leftover)))} cannot run outside DuckDB; "
                               "bind it to a relation or keep this stage in Python")
    return tree.sql(dialect=dialect)
