"""What a release reads: the base tables and files behind its table argument, and which database holds each.

A release is charged to the data it reads, not to the name it was given (:func:`trace`). Its
``tbl`` argument is followed, with DuckDB's own parser (``json_serialize_sql`` on a private
in-memory instance), through

* the common table expressions (``WITH``) of the running statement (``current_query()``): a CTE
  that a macro of the statement can see when it reads ``tbl`` is traced into its FROM clauses,
  through further CTEs of its scope, as DuckDB binds them;
* views (``duckdb_views().sql``), recursively, each bound as DuckDB binds a view: TEMP objects first,
  then the view's own database and schema, then the session's search path;
* the file readers (``read_parquet``, ``read_csv``, ``read_json``, ... with literal paths or globs)
  and names that DuckDB reads as files: the file's scope (:func:`dpsql.core.ledger.file_scope`; a glob is
  its own scope);
* scalar macros whose definition reads tables (their definitions are traced like views).

It ends at base tables (scope ``database.schema.table``, :class:`dpsql.core.ledger.NameContext`) and files.
A name that DuckDB would read as a Python object (a pandas or Arrow variable), an unknown table
function, a table macro, or anything else that cannot be traced is refused with a
:class:`~dpsql.core.errors.ParameterError` that says why and how to fix it. An object registered with
``con.register(name, obj)`` is a TEMP view over the object: its scope is ``temp.main.<name>``, the
name it was registered under (register one dataset under one name: another name is another scope).

Which CTE a macro reads. When ``tbl`` is one plain name and a CTE of the statement has that name, the
release reads, at each place of the statement where a macro can read ``tbl`` (a table function other
than the file readers, or a macro call), the CTE of that name visible there, else the catalog's object.
All of those are charged; so is the catalog's object when a view or macro defined outside the statement
holds ``tbl`` as a literal (it does not see the statement's CTEs). A statement that DuckDB's
serializer cannot parse whole (``INSERT ... ON CONFLICT``, ``PIVOT``) is parsed from its first query;
if ``tbl``'s name is an identifier elsewhere in it, the release is refused.

Pure except for the private parser: what the connection knows comes in through :class:`Catalog`
(the struct the SQL macro ``dp__catalog(tbl)`` builds, ``sql/00_core/05_ledger.sql``), since a UDF cannot
query the connection whose query is running it.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, NamedTuple, Optional, Union

import duckdb

from dpsql.core import sqltext
from dpsql.core.errors import ParameterError
from dpsql.core.ledger import NameContext, file_scope, looks_like_file, split_name
from dpsql.core.sqltext import Token

__all__ = ["Source", "Catalog", "MacrosUnread", "needs_macros", "trace", "locate"]

# Table functions that read the files named by their first argument (a path, a glob or a list of them).
_FILE_READERS = frozenset({
    "read_parquet", "parquet_scan", "read_csv", "read_csv_auto", "read_json", "read_json_auto", "read_ndjson",
    "read_ndjson_auto", "read_json_objects", "read_json_objects_auto", "read_ndjson_objects", "read_text",
    "read_blob", "read_xlsx"})
# Table functions that read no table or file (their arguments are still traced: they may hold subqueries).
_NO_DATA = frozenset({"range", "generate_series", "unnest", "repeat", "repeat_row"})
# The scans DuckDB's Python client puts in the TEMP view that con.register(name, obj) creates.
_PYTHON_SCANS = frozenset({"pandas_scan", "python_arrow_scan", "arrow_scan", "arrow_scan_dumb", "polars_scan"})
# Table references that only hold other references and expressions.
_CONTAINERS = frozenset({"JOIN", "SUBQUERY", "EXPRESSION_LIST", "EMPTY", "PIVOT"})
_TABLE_REFS = _CONTAINERS | {"BASE_TABLE", "TABLE_FUNCTION", "SHOW_REF", "COLUMN_DATA", "DELIM_GET", "CTE",
                             "BOUND_TABLE_REF", "INVALID"}
_QUERY_STARTS = frozenset({"WITH", "SELECT", "FROM", "VALUES"})
_MATERIALISE = "materialise the data into a table (CREATE TABLE name AS ...) and pass that table as tbl"
_MATERIALISE_FIX = "Materialise the data into a table (CREATE TABLE name AS ...) and pass that table as tbl"


class Source(NamedTuple):
    """One base table or file a release reads: its scope, and the DuckDB file holding it (None: the
    connection's own data -- an in-memory or TEMP table, or a file read by path)."""

    scope: str
    database: Optional[str] = None


@dataclass(frozen=True)
class Catalog:
    """What tracing needs from the connection: the struct ``dp__catalog(tbl)`` returns.

    ``views`` maps a view's lower-case (database, schema, name) to its ``CREATE VIEW`` text (None for
    DuckDB's own views); ``macros`` maps a macro's lower-case name to its definition (None for a
    table macro); ``definitions`` holds the text of every macro; ``query`` is the running statement.
    ``macros_read``: False when the macros were not listed (a release whose tracing needs none of them,
    :func:`needs_macros`); tracing that reaches a view or a CTE then raises :class:`MacrosUnread`.
    """

    names: NameContext = field(default_factory=NameContext)
    views: Mapping[tuple[str, str, str], Optional[str]] = field(default_factory=dict)
    macros: Mapping[str, Optional[str]] = field(default_factory=dict)
    definitions: tuple[str, ...] = ()
    query: str = ""
    macros_read: bool = True

    @classmethod
    def from_row(cls, row: Optional[Mapping[str, Any]]) -> "Catalog":
        if not row:
            return cls()
        views = {(v["database"].lower(), v["schema"].lower(), v["name"].lower()): v.get("sql")
                 for v in row.get("views") or ()}
        macros: dict[str, Optional[str]] = {}
        for m in row.get("macros") or ():
            # A name that is a table macro in any overload or schema is refused as one.
            name, table = m["name"].lower(), m.get("type") != "macro"
            macros[name] = None if table or (name in macros and macros[name] is None) else m.get("definition")
        definitions = tuple(m["definition"] for m in row.get("macros") or () if m.get("definition"))
        return cls(NameContext.from_row(row), views, macros, definitions, row.get("query") or "",
                   row.get("macros") is not None)

    def holds_literal(self, text: str) -> bool:
        """Whether ``text`` occurs as a string literal in a view's or a macro's definition."""
        literal = "'" + text.replace("'", "''") + "'"
        return any(literal in d for d in (*self.definitions, *(v for v in self.views.values() if v)))


# -- DuckDB's parser ---------------------------------------------------------------------------------

class _Parser:
    """A private in-memory DuckDB whose ``json_serialize_sql`` parses SQL text (one per process)."""

    lock = threading.Lock()
    con: Optional[duckdb.DuckDBPyConnection] = None

    @classmethod
    def parse(cls, sql: str) -> Optional[list[dict[str, Any]]]:
        """The query nodes of ``sql``'s statements, or None when DuckDB cannot serialize them."""
        with cls.lock:
            if cls.con is None:
                cls.con = duckdb.connect()
            ((text,),) = cls.con.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()
        doc = json.loads(text)
        if doc.get("error"):
            return None
        return [s["node"] for s in doc.get("statements") or ()]


def _identifier(token: Token) -> Optional[str]:
    if token.kind != "identifier":
        return None
    text = token.text
    return (text[1:-1].replace('""', '"') if text.startswith('"') and len(text) > 1 else text).lower()


def _statement(sql: str) -> tuple[Optional[list[dict[str, Any]]], frozenset[str]]:
    """The statement's query nodes, and the identifiers of its text outside them (lower case).

    ``json_serialize_sql`` takes SELECT statements only; for another (``CREATE TABLE ... AS``,
    ``INSERT INTO ... SELECT``, ``COPY (...) TO``, ``EXPLAIN ANALYZE``) its first query that parses
    stands for it: from a WITH, SELECT, FROM or VALUES outside parentheses, or inside the first
    parentheses that hold one.
    """
    nodes = _Parser.parse(sql)
    if nodes is not None:
        return nodes, frozenset()
    tokens = sqltext.tokens(sql)
    depth = 0
    opened: list[int] = []
    closing: dict[int, int] = {}
    starts: list[int] = []
    for i, tok in enumerate(tokens):
        if tok.kind == "operator" and tok.text == ")":
            depth -= 1
            if opened:
                closing[opened.pop()] = i
        elif depth == 0 and (tok.kind == "keyword" and tok.text.upper() in _QUERY_STARTS or tok.text == "("):
            starts.append(i)
        if tok.kind == "operator" and tok.text == "(":
            depth += 1
            opened.append(i)
    for i in starts:
        spans = [(i, len(tokens))] + ([(i + 1, closing[i])] if tokens[i].text == "(" and i in closing else [])
        for first, stop in spans:
            end = tokens[stop].start if stop < len(tokens) else len(sql)
            nodes = _Parser.parse(sql[tokens[first].start:end])
            if nodes is not None:
                outside = tokens[:first] + tokens[stop:]
                return nodes, frozenset(n for n in map(_identifier, outside) if n)
    return None, frozenset(n for n in map(_identifier, tokens) if n)


def _view_query(sql: str) -> Optional[dict[str, Any]]:
    """The query of a ``CREATE VIEW name [(columns)] AS query`` text (DuckDB writes it in that form)."""
    for tok in sqltext.tokens(sql):
        if tok.kind == "keyword" and tok.text.upper() == "AS":
            nodes = _Parser.parse(sql[tok.start + 2:])
            return nodes[0] if nodes is not None and len(nodes) == 1 else None
    return None


# -- CTE scopes --------------------------------------------------------------------------------------

class _Cte:
    """One WITH entry: its query and the CTEs that query sees."""

    def __init__(self, name: str, node: dict[str, Any], scope: dict[str, "_Cte"]):
        self.name, self.node, self.scope = name, node, scope


_Scope = Mapping[str, _Cte]


def _entries(node: Mapping[str, Any], outer: _Scope) -> Iterator[tuple[_Cte, dict[str, _Cte]]]:
    """Each CTE of a query node with the scope it is visible in afterwards (DuckDB: a CTE sees the
    entries before it, and itself only when recursive)."""
    scope = dict(outer)
    for entry in (node.get("cte_map") or {}).get("map") or ():
        body = entry["value"]["query_node"]
        cte = _Cte(entry["key"].lower(), body, dict(scope))
        if body.get("type") == "RECURSIVE_CTE_NODE":
            cte.scope[cte.name] = cte
        scope[cte.name] = cte
        yield cte, scope


def _inner_scope(node: Mapping[str, Any], outer: _Scope) -> _Scope:
    scope: _Scope = outer
    for _, scope in _entries(node, outer):
        pass
    return scope


def _function_name(node: Mapping[str, Any]) -> str:
    return str(node.get("function_name") or "").lower()


def _sites(obj: Any, scope: _Scope, name: str, macros: Mapping[str, Optional[str]],
           out: list[Optional[_Cte]]) -> None:
    """At each place of a statement where a macro may read ``name`` (a table function other than the
    file readers, or a macro call), the CTE of that name visible there (None: the catalog's object)."""
    if isinstance(obj, list):
        for item in obj:
            _sites(item, scope, name, macros, out)
        return
    if not isinstance(obj, dict):
        return
    if "cte_map" in obj:
        for cte, _ in _entries(obj, scope):
            _sites(cte.node, cte.scope, name, macros, out)
        scope = _inner_scope(obj, scope)
    if "class" not in obj and obj.get("type") == "TABLE_FUNCTION":
        if _function_name(obj.get("function") or {}) not in _FILE_READERS | _NO_DATA:
            out.append(scope.get(name))
    elif obj.get("class") == "FUNCTION" and _function_name(obj) in macros:
        out.append(scope.get(name))
    for key, value in obj.items():
        if key != "cte_map":
            _sites(value, scope, name, macros, out)


# -- tracing -----------------------------------------------------------------------------------------

def _refusal(tbl: str, what: str, via: str, fix: str = _MATERIALISE_FIX) -> ParameterError:
    where = f" (through {via})" if via else ""
    return ParameterError(f"dpsql: tbl {tbl!r}: {what}{where}, so dpsql cannot tell which tables or files the "
                          f"release reads, nor whose privacy budget applies; nothing was released or charged. {fix}")


def _then(via: str, step: str) -> str:
    return f"{via}, {step}" if via else step


class _Tracer:
    """Follows one release's ``tbl`` to the base tables and files it reads (see the module docstring)."""

    def __init__(self, tbl: str, catalog: Catalog):
        self.tbl, self.catalog = tbl, catalog
        self.found: dict[str, Source] = {}
        self.done: set[Union[int, tuple[str, str, str]]] = set()  # CTEs (by id) and views already traced

    def add(self, scope: str, database: Optional[str] = None) -> None:
        self.found.setdefault(scope, Source(scope, database))

    def macros_needed(self) -> None:
        """A view's or a CTE's text may call a macro that reads tables: tracing it needs the macros."""
        if not self.catalog.macros_read:
            raise MacrosUnread(self.tbl)

    def database_file(self, alias: str) -> Optional[str]:
        """The DuckDB file holding database ``alias``, None for an in-memory, TEMP or non-DuckDB one."""
        for name, path, kind in self.catalog.names.databases:
            if name.lower() == alias and path and path != ":memory:" and (kind or "duckdb") == "duckdb":
                return path
        return None

    def name(self, parts: list[str], ctx: NameContext, scope: _Scope, via: str) -> None:
        """A table name as a FROM clause or ``query_table`` reads it."""
        if len(parts) == 1 and parts[0].lower() in scope:
            self.cte(scope[parts[0].lower()], ctx, via)
        else:
            self.relation(parts, ctx, via)

    def relation(self, parts: list[str], ctx: NameContext, via: str) -> None:
        """A name of the catalog (a table, a view) or, failing that, a file DuckDB reads by its name."""
        joined = ".".join(parts)
        if len(parts) <= 3:
            relations = ctx.relations or frozenset()
            for found in ctx.candidates(parts)[1]:
                if found in self.catalog.views:
                    self.view(found, ctx, via)
                    return
                if found in relations:
                    self.add(ctx.key(*found), None if found[0] == "temp" else self.database_file(found[0]))
                    return
        if looks_like_file(joined):
            self.add(file_scope(joined))
            return
        what = (f"{joined!r} is no table, view, CTE or file that DuckDB's catalog knows (a Python variable that "
                f"DuckDB reads by its name?)")
        if parts[-1].lower().startswith("__duckdb_source_"):  # DuckDB's Python client read a variable by name
            what, via = "it is a Python object that DuckDB reads by its variable name (a replacement scan)", ""
        raise _refusal(self.tbl, what, via,
                       f"Materialise it into a table (CREATE TABLE name AS FROM ...), or register it with "
                       f"con.register('name', obj) -- a registered object is its own scope, temp.main.name -- and "
                       f"pass that name as tbl")

    def cte(self, cte: _Cte, ctx: NameContext, via: str) -> None:
        self.macros_needed()
        if id(cte) in self.done:
            return
        self.done.add(id(cte))
        self.node(cte.node, ctx, cte.scope, _then(via, f"CTE {cte.name}"))

    def view(self, found: tuple[str, str, str], ctx: NameContext, via: str) -> None:
        self.macros_needed()
        if found in self.done:
            return
        self.done.add(found)
        key = ctx.key(*found)
        sql = self.catalog.views.get(found)
        query = _view_query(sql) if sql else None
        if query is None:
            raise _refusal(self.tbl, f"the definition of view {key} cannot be parsed", via)
        source = query.get("from_table") or {}
        if found[0] == "temp" and source.get("type") == "TABLE_FUNCTION" \
                and _function_name(source.get("function") or {}) in _PYTHON_SCANS:
            self.add(key)  # con.register(name, obj): the registered name is the scope
            return
        # DuckDB binds a view in its own database and schema (after TEMP), then the session's search path.
        self.node(query, dataclasses.replace(ctx, view=(found[0], found[1])), {}, _then(via, f"view {key}"))

    def node(self, obj: Any, ctx: NameContext, scope: _Scope, via: str) -> None:
        """Every table and file a query node (or any part of one: a subquery, an expression) reads."""
        if isinstance(obj, list):
            for item in obj:
                self.node(item, ctx, scope, via)
            return
        if not isinstance(obj, dict):
            return
        if "cte_map" in obj:
            scope = _inner_scope(obj, scope)  # a CTE's query is traced where it is read, in its own scope
        kind = obj.get("type")
        if "class" not in obj and kind in _TABLE_REFS:
            if kind == "BASE_TABLE":
                parts = [p for p in (obj.get("catalog_name"), obj.get("schema_name"), obj.get("table_name")) if p]
                self.name(parts, ctx, scope, via)
                return
            if kind == "TABLE_FUNCTION":
                self.function(obj.get("function") or {}, ctx, scope, via)
                return
            if kind not in _CONTAINERS:
                raise _refusal(self.tbl, f"it reads a {str(kind).lower()} reference", via)
        elif obj.get("class") == "FUNCTION" and _function_name(obj) in self.catalog.macros:
            self.macro(_function_name(obj), ctx, scope, via)
        for key, value in obj.items():
            if key != "cte_map":
                self.node(value, ctx, scope, via)

    def function(self, fn: Mapping[str, Any], ctx: NameContext, scope: _Scope, via: str) -> None:
        """A table function in a FROM clause."""
        name = _function_name(fn)
        args = fn.get("arguments") or []
        positional = [a.get("expression") for a in args if not a.get("name")]
        if name in _NO_DATA:
            self.node(args, ctx, scope, via)
        elif name in _FILE_READERS:
            paths = _literals(positional[0]) if positional else None
            if not paths:
                raise _refusal(self.tbl, f"{name}() is given a path that is not a literal string (or list of them)",
                               via, "Pass the file's path as a literal, or " + _MATERIALISE)
            for path in paths:
                self.add(file_scope(path))
            self.node([a for a in args if a.get("name")], ctx, scope, via)
        elif name == "query_table":
            names = _literals(positional[0]) if positional else None
            if not names:
                raise _refusal(self.tbl, "query_table() is given a name that is not a literal string", via)
            for text in names:
                self.name(_parts(self.tbl, text, via), ctx, scope, via)
        elif name in self.catalog.macros:
            raise _refusal(self.tbl, f"it reads the table macro {name}()", via)
        else:
            raise _refusal(self.tbl, f"it reads the table function {name}(), whose data dpsql cannot trace to "
                           f"tables or files", via)

    def macro(self, name: str, ctx: NameContext, scope: _Scope, via: str) -> None:
        """A scalar macro call: its definition is read where it is called."""
        definition = self.catalog.macros.get(name)
        nodes = _Parser.parse("SELECT " + definition) if definition else None
        if not nodes:
            raise _refusal(self.tbl, f"it calls the macro {name}, whose definition dpsql cannot parse", via)
        self.node(nodes, ctx, scope, _then(via, f"macro {name}"))


def _literals(expr: Any) -> Optional[list[str]]:
    """The strings of a literal string or a literal list of strings, else None."""
    if not isinstance(expr, dict):
        return None
    literal = expr.get("literal") if expr.get("type") == "VALUE_CONSTANT" else None
    if isinstance(literal, dict):
        return [literal["text"]] if literal.get("kind") == "STRING" and isinstance(literal.get("text"), str) else None
    if expr.get("class") == "FUNCTION" and _function_name(expr) in ("list_value", "array_value"):
        items = [_literals(a.get("expression")) for a in expr.get("arguments") or []]
        if items and all(i is not None and len(i) == 1 for i in items):
            return [i[0] for i in items if i]
    return None


def _parts(tbl: str, name: str, via: str) -> list[str]:
    try:
        return split_name(name)
    except ValueError:
        if looks_like_file(name):
            return [name]  # more than three parts or unparsable: DuckDB reads it as a file
        raise _refusal(tbl, f"{name!r} is not a name DuckDB can parse", via) from None


def trace(tbl: str, catalog: Catalog) -> tuple[Source, ...]:
    """The base tables and files the table argument ``tbl`` reads, on the connection ``catalog`` describes.

    Raises :class:`~dpsql.core.errors.ParameterError` (a ``dpsql:`` message naming ``tbl`` and the fix)
    for data that cannot be traced; see the module docstring for what is followed.
    """
    if not isinstance(tbl, str) or not tbl.strip():
        raise ParameterError(f"dpsql: tbl must name a table, view or file (got {tbl!r})")
    tracer = _Tracer(tbl, catalog)
    parts = _parts(tbl, tbl, "")
    ctx = catalog.names
    if len(parts) != 1:
        tracer.relation(parts, ctx, "")
        return tuple(tracer.found.values())
    name = parts[0].lower()
    nodes, outside = _statement(catalog.query) if catalog.query else ([], frozenset())
    if not catalog.macros_read and (name in outside or name in _cte_names(nodes or [])):
        raise MacrosUnread(tbl)  # a CTE of the statement may bear the name, and its text call a macro
    if name in outside:
        raise _refusal(tbl, f"the running statement cannot be parsed whole, so whether {parts[0]!r} names one of "
                       f"its CTEs (WITH {parts[0]} AS ...) is unknown", "",
                       "Run the release from a SELECT statement (CREATE TABLE ... AS SELECT and INSERT INTO ... "
                       "SELECT work too), or " + _MATERIALISE)
    sites: list[Optional[_Cte]] = []
    _sites(nodes or [], {}, name, catalog.macros, sites)
    bindings = {id(s): s for s in sites}
    if not bindings or catalog.holds_literal(tbl):
        bindings[id(None)] = None  # read outside the statement's CTEs (a view, a macro): the catalog's object
    for cte in bindings.values():
        if cte is None:
            tracer.relation(parts, ctx, "")
        else:
            tracer.cte(cte, ctx, "")
    return tuple(tracer.found.values())


def _cte_names(obj: Any) -> set[str]:
    """The names of every CTE anywhere in a statement's query nodes (lower case)."""
    if isinstance(obj, list):
        return set().union(*(_cte_names(item) for item in obj)) if obj else set()
    if not isinstance(obj, dict):
        return set()
    found = {str(e["key"]).lower() for e in (obj.get("cte_map") or {}).get("map") or ()} if "cte_map" in obj else set()
    return found.union(*(_cte_names(value) for value in obj.values()))


class MacrosUnread(Exception):
    """Tracing ``tbl`` reached a view or a CTE, but the catalog holds no macros (``macros_read`` False): the
    connection's catalog is no longer what :func:`needs_macros` saw. The charge refuses the release."""


def needs_macros(tbl: object, catalog: Optional[Catalog], known: frozenset[str] = frozenset()) -> bool:
    """Whether tracing ``tbl`` may need the connection's macro definitions, judged while DuckDB binds the
    release, from the running statement (``catalog.query``) and the catalog the connection's last charge
    saw (None: none yet); ``known``: the names whose tracing needed them before (lower case).

    Listing the macros means scanning ``duckdb_functions()``, most of a small release's time, and
    tracing reads them only through a view or a CTE of the statement (whose text may call a macro that
    reads tables). So they are listed unless ``tbl`` resolved, in that catalog, to a base table or to a
    file by path, and the statement does not write ``tbl``'s name outside its strings (as a CTE of that
    name would be). The guess is checked when the release is charged, on the catalog read then: tracing
    that reaches a view or a CTE without the macros raises :class:`MacrosUnread` and the charge refuses
    the release, nothing released or charged (a table replaced by a view since the last charge); a second
    run lists the macros.
    """
    if catalog is None or not isinstance(tbl, str) or tbl.lower() in known:
        return True
    try:
        parts = split_name(tbl)
    except ValueError:
        return not looks_like_file(tbl)
    if len(parts) == 1 and parts[0].lower() in sqltext.words(catalog.query):
        return True
    if len(parts) <= 3:
        ctx = catalog.names
        for found in ctx.candidates(parts)[1]:
            if found in catalog.views:
                return True
            if found in (ctx.relations or frozenset()):
                return False
    return not looks_like_file(".".join(parts))


def locate(name: str, catalog: Catalog) -> tuple[Optional[str], bool]:
    """Where a scope name points, without a statement: the DuckDB file holding the table or view it names
    (None: the connection's own data, a file, or nothing that parses) and whether it is a view. A name
    nothing matches yet is where DuckDB would create it (so a budget may precede its table)."""
    ctx = catalog.names
    try:
        parts = split_name(name)
    except ValueError:
        return None, False
    if len(parts) > 3:
        return None, False
    default, lookups = ctx.candidates(parts)
    found = next((c for c in lookups if c in (ctx.relations or frozenset())), None)
    if found is None and looks_like_file(".".join(parts)):
        return None, False
    where = found or default
    database = None if where[0] == "temp" else _Tracer(name, catalog).database_file(where[0])
    return database, found is not None and found in catalog.views
