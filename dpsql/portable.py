"""The pre-noise stages of ``sql/*.sql`` translated for other SQL engines (one definition, two dialects).

The DuckDB macros stay the only definition of each stage. This module reads a
macro's body from the shipped macro files, binds its relation parameters
(``query_table(rows_rel)``, a nested macro call such as
``dp__capped_user_items(...)``, or a CTE of the macro) to relations of the
target engine, binds its scalar parameters to literals, and renders the result
with sqlglot in the target dialect (Spark SQL for :mod:`dpsql.spark`).

Only pre-noise stages are translated: noise, calibration, validation and any
bookkeeping in a release macro's ``cal`` CTE stay in Python (the target backend
calls the same functions). ``output`` selects one CTE of a macro and the CTEs it
reads, so the noisy parts of a release macro are never translated.

The translation also makes the DuckDB dialect's implicit choices explicit:

* a decimal literal (``1.0``) is a DOUBLE, as in DuckDB's arithmetic with
  doubles; Spark would type it DECIMAL and round divisions to 6 digits;
* ``error(msg)`` becomes ``raise_error(msg)``;
* ``AS [NOT] MATERIALIZED`` hints are dropped (the caller materialises);
* a ``UNION ALL`` branch whose ``WHERE`` is constant after binding is pruned,
  as DuckDB prunes it when planning (UserWeights' closed form vs. its UDF).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Optional

__all__ = ["Macro", "macros", "stage_sql", "TranslationError"]

_MACRO = re.compile(r"^CREATE OR REPLACE TEMP MACRO (\w+)\((.*?)\) AS TABLE\s*\n(.*?);[ \t]*$", re.S | re.M)
_NESTED_MACRO_PREFIXES = ("dp__", "dp_")


class TranslationError(ValueError):
    """A stage uses a construct that has no binding or no translation."""


@dataclass(frozen=True)
class Macro:
    """A table macro of ``sql/*.sql``: its name, parameter names and body (a query)."""

    name: str
    params: tuple[str, ...]
    body: str


def _param_names(signature: str) -> tuple[str, ...]:
    names = []
    for part in re.split(r",(?![^\[]*\])", signature):
        part = part.strip()
        if part:
            names.append(part.split()[0])
    return tuple(names)


@lru_cache(maxsize=1)
def macros() -> dict[str, Macro]:
    """Every table macro of the shipped macro files, by name."""
    from dpsql.registration import sql_files

    found: dict[str, Macro] = {}
    for path in sql_files():
        for m in _MACRO.finditer(path.read_text()):
            found[m.group(1)] = Macro(m.group(1), _param_names(m.group(2)), m.group(3))
    return found


def _sqlglot():
    try:
        import sqlglot
        from sqlglot import exp
        from sqlglot.optimizer.simplify import simplify
    except ImportError as err:  # pragma: no cover - the spark extra installs it
        raise ImportError("dpsql's SQL translation needs sqlglot: pip install 'dpsql[spark]'") from err
    return sqlglot, exp, simplify


def _literal(exp, value: object):
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, (int, float)):
        return exp.Literal.number(repr(float(value)))  # a decimal literal: the DOUBLE pass casts it
    raise TranslationError(f"cannot bind a constant of type {type(value).__name__}")


def _referenced(exp, node, names: set[str]) -> set[str]:
    """CTE names that ``node`` reads (as a table or through ``query_table('name')``)."""
    found = {t.name for t in node.find_all(exp.Table) if isinstance(t.this, exp.Identifier) and t.name in names}
    for fn in node.find_all(exp.Anonymous):
        if fn.name.lower() == "query_table" and fn.expressions and fn.expressions[0].is_string:
            if fn.expressions[0].this in names:
                found.add(fn.expressions[0].this)
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
        sides = []
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


def stage_sql(macro: str, relations: Mapping[str, str], constants: Optional[Mapping[str, object]] = None,
              output: Optional[str] = None, dialect: str = "spark") -> str:
    """The body of ``macro`` with its parameters bound, rendered in ``dialect``.

    ``relations`` maps relation parameters (read via ``query_table(p)``), nested
    macro names and CTE names to relation names of the target engine (a bound CTE
    is dropped from the query). ``constants`` binds scalar parameters. ``output``
    selects one CTE (and what it reads) instead of the macro's final SELECT.
    """
    sqlglot, exp, simplify = _sqlglot()
    defs = macros()
    if macro not in defs:
        raise TranslationError(f"no table macro named {macro!r} in the macro files")
    constants = dict(constants or {})
    tree = sqlglot.parse_one(defs[macro].body, read="duckdb")
    dropped = set(relations) & {c.alias for c in tree.find_all(exp.CTE)}
    tree = _select_output(exp, tree, output, dropped) if output else _drop_ctes(exp, tree, dropped)
    params = set(defs[macro].params)

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
            return _literal(exp, constants[node.name])
        if isinstance(node, exp.Anonymous) and node.name.lower() == "error":
            node.set("this", "raise_error")
        return node

    def as_double(node):
        if isinstance(node, exp.Literal) and not node.is_string and re.search(r"[.eE]", node.this):
            return exp.Cast(this=node.copy(), to=exp.DataType.build("double"))
        return node

    tree = tree.transform(bind)
    tree = _prune_constant_branches(exp, simplify, tree)
    tree = tree.transform(as_double)
    leftover = [f.name for f in tree.find_all(exp.Anonymous) if f.name.lower().startswith(_NESTED_MACRO_PREFIXES)]
    if leftover:
        raise TranslationError(f"{macro}: {', '.join(sorted(set(leftover)))} cannot run outside DuckDB; "
                               "bind it to a relation or keep this stage in Python")
    return tree.sql(dialect=dialect)
