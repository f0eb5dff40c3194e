"""Privacy-budget ledger: every release is charged once, before its result can be read.

What is recorded. Each dpsql macro that releases something calls
``dp__charge(mechanism, unit, tbl, epsilon, delta, parameters, calibration)`` in
a one-row MATERIALIZED CTE that its output rows depend on. The charge runs after the
parameters are validated and before any output row exists; if it would take a
scope over its budget, or the ledger cannot be written, it raises and the query
(hence the release) fails with nothing charged. Each charge is one immutable
:class:`Release` value; accountants (:func:`basic_composition`) consume lists of them.

Composition is basic: the (epsilon, delta) of a scope is the sum over its
releases (Dwork & Roth 2014, Thm 3.16). This is valid for any mix of
mechanisms, and loose for many Gaussian releases.

Scopes. A budget applies to ``'database'`` (every release on the connection's
database) or to one table. A release must fit every budget that applies to it.
A table scope is the table's catalog identity, ``database.schema.table`` in
lower case, resolved as DuckDB resolves the name (:func:`resolve_scope`): the
connection's current database and schema, its search path (TEMP objects
first), quoted identifiers, case-insensitivity. So ``t``, ``"T"``, ``main.t``,
``memory.t`` and ``memory.main.t`` are one scope. A DuckDB database file is
named by its file (DuckDB's default name for it, ``events`` for
``events.duckdb``) whatever name it is attached under, so dbt's
``"events"."main"."t"`` and ``dpsql budget set events.duckdb --scope t`` meet.
A name that is no table or view (DuckDB reads it as a file) is the file's
absolute path with symbolic links resolved (a glob is its own scope).

Budgets. A budget is never set below what its scope has already spent (:meth:`Ledger.set_budget`
refuses it, changing nothing; equal closes the scope), so that ``remaining`` never hides a release
already made. Setting a budget from SQL, the shell and the command line goes through
:func:`dpsql.core.ledger_sql.set_scope_budget`, which also refuses views and says when a scope names
no table yet.

Scopes follow the data read (:mod:`dpsql.core.scopes`). A release is charged to the
base tables and files its table argument reads: through views (recursively),
the CTEs of the running statement, and the file readers (``read_parquet`` and
the like); what cannot be traced (a Python variable, an unknown table function,
a table macro) is refused. A release that reads several is charged to each of
their scopes -- it must fit every budget that applies, 'database' and each
scope -- and recorded once (``release_scopes`` lists its scopes; ``table``
shows them). A copy of the rows in another table is another scope: the
``'database'`` scope is the one that bounds an analyst.

Seeded connections. Releases made on a connection registered with a seed
(``dpsql.connect(seed=N)``) are NOT private: anyone who knows the seed can
subtract the noise. They are charged like private ones (the ledger must not
make a seeded run look free) and marked ``seeded``; :func:`budget` counts them
per scope (``seeded_releases``) so that a scope whose spending includes them
is visible as such.

Privacy units. Set-union and top-k are user-level (all of one user's rows); the
optimisation family is record-level (one universe element, stream or point
with all its rows); the PWS family (``dp_weighted_sample``,
``dp_sbh_histogram``) is element-level (one row). The ledger sums all kinds as
given and records the unit of each release; an element-level epsilon does not
bound a user's loss.

Storage. A SQLite file next to the database (``<database file>.dpsql-ledger``)
or, for an in-memory database, an in-memory ledger unless a path is given.
The ledger of the database that holds the data is charged: a table of another
DuckDB file attached to the connection is charged to that file's sidecar,
whatever the connection's own ledger is (:attr:`Ledger.homes`); a release
reading several databases checks and records in every ledger involved, all or
nothing. SQLite's ``BEGIN IMMEDIATE`` makes check-and-spend atomic across
threads and processes, including several processes that opened one DuckDB file
read-only (they could not write a table inside it); several ledger files are
attached to one SQLite connection, locked in the order of their paths and
committed at once. A missing ledger file is a new ledger (written whole); an
existing file that is empty, truncated, damaged or no dpsql ledger is an error
naming the file, never a new ledger (which would forget its budgets). DuckDB
cannot write to the database from inside the running query that makes the
release, which is the other reason the ledger is a sidecar. A connection keeps its ledger when dpsql is
registered on it again (:func:`ledger_for`). The ledger is a guard against
accidental overspending by people who work through dpsql; anyone who can
write files (DuckDB's ``COPY`` included) can delete it, so it is not a
security boundary.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, ContextManager, Iterable, Iterator, Literal, Mapping, Optional, Sequence, Union

import duckdb

# BudgetExceededError lives with the other exceptions; importable from here as before.
from dpsql.core.errors import BudgetError, BudgetExceededError, LedgerIOError
from dpsql.core.validation import DPParameterError, check_epsilon

__all__ = ["Release", "Budget", "ScopeStatus", "Ledger", "BudgetExceededError", "LEDGER_SUFFIX",
           "DATABASE_SCOPE", "NameContext", "basic_composition", "scope_key", "resolve_scope", "file_scope",
           "split_name", "looks_like_file", "database_alias", "sidecar_path", "database_path", "ledger_for",
           "ScopeSet", "iso_utc", "json_text"]

LEDGER_SUFFIX = ".dpsql-ledger"
DATABASE_SCOPE = "database"
UNITS = ("user", "element", "record")
# Budgets are compared with a relative slack so that, e.g., ten charges of 0.1 fit a budget of 1.0
# despite binary rounding; the slack is far below any meaningful epsilon.
_SLACK = 1e-9


@dataclass(frozen=True)
class Release:
    """One charged release (an immutable event, in the style of dp_accounting's DpEvent)."""

    id: int
    time: float           # seconds since the epoch (UTC)
    mechanism: str
    unit: str             # 'user', 'element' or 'record'
    table: str            # the scopes charged (catalog identities or file paths), comma-separated
    epsilon: float
    delta: float
    parameters: str       # the macro's other arguments, as JSON text ("" if none)
    calibration: str = ""  # the calibration the release used (noise scale, threshold, ...), as JSON text
    seeded: bool = False   # made on a seeded connection: reproducible noise, NOT private
    scopes: tuple[str, ...] = ()  # every scope charged in this ledger (``table`` lists them)

    def to_json(self) -> dict[str, Any]:
        """The release as a JSON document: ``released_at`` in ISO 8601 UTC, ``parameters`` and ``calibration``
        as JSON values (null when none was recorded), as ``dp_releases()`` returns them."""
        return {"id": self.id, "released_at": iso_utc(self.time), "mechanism": self.mechanism, "unit": self.unit,
                "table": self.table, "scopes": list(self.scopes), "epsilon": self.epsilon, "delta": self.delta,
                "parameters": _json_value(self.parameters), "calibration": _json_value(self.calibration),
                "seeded": self.seeded}


@dataclass(frozen=True)
class Budget:
    """A total (epsilon, delta) allowed for one scope."""

    scope: str
    epsilon: float
    delta: float


@dataclass(frozen=True)
class ScopeStatus:
    """Spent and remaining budget of one scope (remaining is None without a budget).

    ``seeded_releases`` of the ``releases`` were made on a seeded connection
    (NOT private); their epsilon is counted in the spending all the same.
    """

    scope: str
    epsilon_budget: Optional[float]
    delta_budget: Optional[float]
    epsilon_spent: float
    delta_spent: float
    releases: int
    seeded_releases: int = 0

    @property
    def epsilon_remaining(self) -> Optional[float]:
        return None if self.epsilon_budget is None else max(0.0, self.epsilon_budget - self.epsilon_spent)

    @property
    def delta_remaining(self) -> Optional[float]:
        return None if self.delta_budget is None else max(0.0, self.delta_budget - self.delta_spent)


def iso_utc(seconds: float) -> str:
    """A time in seconds since the epoch as ISO 8601 in UTC, to the microsecond: ``2025-01-31T12:00:00.000000Z``."""
    when = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def json_text(text: Optional[str]) -> Optional[str]:
    """A release's recorded parameters or calibration as strict JSON text (None when none was recorded).

    dpsql records them as JSON; a ledger written by an older dpsql holds DuckDB's text of a struct
    (``{'max_items': 10, 'user_col': user_id}``), which is read into the same JSON. Text that is neither is
    kept whole as a JSON string. JSON has no NaN or infinities: they become the strings ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"`` (as the shell's json mode writes them). Never raises: it runs in the charge.
    """
    if text is None or not text.strip():
        return None
    try:
        try:
            value = json.loads(text)
        except ValueError:
            value = _StructText(text).parse()
        return json.dumps(_finite(value))
    except (ValueError, RecursionError, _Unreadable):
        return json.dumps(text)


def _json_value(text: Optional[str]) -> Any:
    made = json_text(text)
    return None if made is None else json.loads(made)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


class _Unreadable(Exception):
    """Text that is not DuckDB's text of a value (:class:`_StructText`); never leaves this module."""


class _StructText:
    """Reads DuckDB's text of a STRUCT, LIST or scalar (``{'a': 1, 'b': [x, y], 'c': NULL}``) into Python values.

    DuckDB writes a string bare unless it holds one of ``,:{}[]'"`` or spaces at its ends, then between
    single quotes with ``\\`` escapes; the type of a bare value is lost, so ``10`` reads as a number,
    ``NULL`` as null, ``true``/``false`` as booleans, ``inf``/``nan`` as floats, anything else as a string.
    Raises :class:`_Unreadable` on text that is not in that form.
    """

    def __init__(self, text: str):
        self.text, self.i = text, 0

    def parse(self) -> Any:
        value = self.value()
        self.space()
        if self.i != len(self.text):
            raise _Unreadable("text after the value")
        return value

    def space(self) -> None:
        while self.i < len(self.text) and self.text[self.i] == " ":
            self.i += 1

    def value(self) -> Any:
        self.space()
        if self.i >= len(self.text):
            raise _Unreadable("missing value")
        ch = self.text[self.i]
        if ch == "{":
            return self.items("}", keyed=True)
        if ch == "[":
            return self.items("]", keyed=False)
        if ch == "'":
            return self.quoted()
        return self.bare()

    def items(self, close: str, keyed: bool) -> Any:
        self.i += 1
        out: Any = {} if keyed else []
        self.space()
        if self.text.startswith(close, self.i):
            self.i += 1
            return out
        while True:
            if keyed:
                self.space()
                key = self.quoted() if self.text.startswith("'", self.i) else self.bare(stop=":")
                self.space()
                if not self.text.startswith(":", self.i):
                    raise _Unreadable("missing ':'")
                self.i += 1
                out[str(key)] = self.value()
            else:
                out.append(self.value())
            self.space()
            if self.text.startswith(",", self.i):
                self.i += 1
                continue
            if self.text.startswith(close, self.i):
                self.i += 1
                return out
            raise _Unreadable(f"missing {close!r}")

    def quoted(self) -> str:
        self.i += 1
        buf = []
        while self.i < len(self.text):
            ch = self.text[self.i]
            if ch == "\\" and self.i + 1 < len(self.text):
                buf.append(self.text[self.i + 1])
                self.i += 2
                continue
            if ch == "'":
                self.i += 1
                return "".join(buf)
            buf.append(ch)
            self.i += 1
        raise _Unreadable("unterminated quote")

    def bare(self, stop: str = ",}]") -> Any:
        start = self.i
        while self.i < len(self.text) and self.text[self.i] not in stop:
            if self.text[self.i] in "{['":
                raise _Unreadable("unexpected bracket or quote")
            self.i += 1
        word = self.text[start:self.i].strip()
        if stop == ":":
            return word
        low = word.lower()
        if low == "null":
            return None
        if low in ("true", "false"):
            return low == "true"
        if low in ("inf", "infinity", "-inf", "-infinity", "nan"):
            return float(low)
        if _NUMBER.fullmatch(word):
            return int(word) if re.fullmatch(r"[+-]?\d+", word) else float(word)
        return word


def basic_composition(releases: Iterable[Release]) -> tuple[float, float]:
    """Basic composition: (sum of epsilons, sum of deltas) (Dwork & Roth 2014, Thm 3.16)."""
    releases = list(releases)
    return math.fsum(r.epsilon for r in releases), math.fsum(r.delta for r in releases)


# -- scopes: a table name's catalog identity ---------------------------------------------------------

# Suffixes DuckDB reads through a replacement scan (a name that is no table is then a file).
_FILE_SUFFIXES = {"parquet", "csv", "tsv", "tbl", "json", "jsonl", "ndjson", "txt", "gz", "zst", "zstd",
                  "arrow", "feather", "ipc", "xlsx", "avro", "orc"}
_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# The schemas DuckDB keeps in its system catalog whatever the search path.
_SYSTEM_SCHEMAS = ("information_schema", "pg_catalog")


def _name_error(name: str, problem: str) -> DPParameterError:
    return DPParameterError(f"table name {name!r} cannot be parsed ({problem}); quote a name that holds dots, "
                            f"spaces or quotes as \"name\" (a quote inside it doubled)")


def split_name(name: str) -> list[str]:
    """The components of a qualified name, parsed as DuckDB's ``query_table`` parses it.

    Components are separated by ``.``; a component may be double-quoted (``""``
    is a quote inside it); nothing is trimmed; one trailing ``.`` is ignored.
    Raises :class:`~dpsql.core.errors.ParameterError` (a ValueError) where DuckDB raises a parser error.
    """
    parts: list[str] = []
    i, n = 0, len(name)
    while True:
        if i < n and name[i] == '"':
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise _name_error(name, "unterminated quote")
                if name[j] == '"':
                    if j + 1 < n and name[j + 1] == '"':
                        buf.append('"')
                        j += 2
                        continue
                    break
                buf.append(name[j])
                j += 1
            part, i = "".join(buf), j + 1
            if not part:
                raise _name_error(name, "zero-length quoted identifier")
            if i < n and name[i] != ".":
                raise _name_error(name, "quote in the middle of a component")
        else:
            j = i
            while j < n and name[j] != ".":
                if name[j] == '"':
                    raise _name_error(name, "quote in the middle of a component")
                j += 1
            part, i = name[i:j], j
            if not part:
                raise _name_error(name, "zero-length identifier")
        parts.append(part)
        if i >= n:
            return parts
        i += 1  # the '.'
        if i == n:  # one trailing '.' is ignored, as DuckDB does
            return parts


def _quote(part: str) -> str:
    # Keys quote what a plain identifier cannot hold, so a key is itself a name that resolves to it.
    return part if _PLAIN_IDENTIFIER.fullmatch(part) else '"' + part.replace('"', '""') + '"'


def database_alias(path: Union[str, os.PathLike[str]]) -> str:
    """The name DuckDB gives a database file attached without ``AS``: ``events`` for ``events.duckdb``."""
    base = os.path.basename(os.fspath(path).rstrip("/\\")) or os.fspath(path)
    stem = base.split(".")[0] or base
    return (stem + "_db" if stem.lower() in ("main", "temp", "system") else stem).lower()


def file_scope(path: Union[str, os.PathLike[str]]) -> str:
    """Scope of a file DuckDB reads: its absolute path with symbolic links resolved (URLs as given)."""
    text = os.fspath(path)
    if _URL.match(text):
        return text
    return os.path.realpath(os.path.expanduser(text))


@dataclass(frozen=True)
class NameContext:
    """What resolving a table name needs from a connection (the SQL macro ``dp__catalog(tbl)`` reads it).

    ``relations`` holds the lower-case (database, schema, name) of tables and
    views that may match; None when the catalog is unknown (a ledger used
    without a connection): names then resolve where DuckDB would create them.
    ``view``: the (database, schema) of a view whose query is being resolved;
    DuckDB looks there after TEMP and before the session's search path.
    """

    database: str = "memory"             # current_database()
    schema: str = "main"                 # current_schema()
    search_path: str = ""                # current_setting('search_path')
    databases: tuple[tuple[str, Optional[str], Optional[str]], ...] = ()  # (name, path, type)
    relations: Optional[frozenset[tuple[str, str, str]]] = None
    view: Optional[tuple[str, str]] = None

    @classmethod
    def from_row(cls, row: Optional[Mapping[str, Any]]) -> "NameContext":
        """From the struct ``dp__catalog(tbl)`` returns."""
        if not row:
            return cls()
        return cls(database=row.get("database") or "memory", schema=row.get("schema") or "main",
                   search_path=row.get("search_path") or "",
                   databases=tuple((d["name"], d.get("path"), d.get("type")) for d in row.get("databases") or ()),
                   relations=frozenset((r["database"].lower(), r["schema"].lower(), r["name"].lower())
                                       for r in row.get("relations") or ()))

    def _alias(self, name: str) -> Optional[str]:
        """The attached database ``name`` denotes (its own name or its file's name), lower case."""
        low = name.lower()
        if low in (self.database.lower(), "temp", "system") or any(d[0].lower() == low for d in self.databases):
            return low
        for alias, path, kind in self.databases:
            if path and (kind or "duckdb") == "duckdb" and database_alias(path) == low:
                return alias.lower()
        return None

    def _key_of_database(self, alias: str) -> str:
        for name, path, kind in self.databases:
            if name.lower() == alias and path and (kind or "duckdb") == "duckdb":
                # A symbolic link is named by its target, as its ledger is (sidecar_path).
                return database_alias(os.path.realpath(path) if os.path.islink(path) else path)
        return alias

    def _search_entries(self) -> list[tuple[str, str]]:
        entries: list[tuple[str, str]] = []
        for entry in _split_search_path(self.search_path):
            try:
                parts = split_name(entry)
            except ValueError:
                continue
            if len(parts) == 1:
                db = self._alias(parts[0])
                entries.append((db, "main") if db else (self.database.lower(), parts[0].lower()))
            elif len(parts) == 2:
                entries.append((parts[0].lower(), parts[1].lower()))
        if not entries:
            entries = [(self.database.lower(), self.schema.lower())]
        return [("temp", "main")] + ([self.view] if self.view else []) + entries + \
            [("system", "main"), ("system", "pg_catalog")]

    def candidates(self, parts: Sequence[str]) -> tuple[tuple[str, str, str], list[tuple[str, str, str]]]:
        """Where DuckDB would create ``parts``, and the (database, schema, name) it looks up, in its order."""
        low = [p.lower() for p in parts]
        entries = self._search_entries()
        if len(low) == 1:
            return (self.database.lower(), self.schema.lower(), low[0]), [(c, s, low[0]) for c, s in entries]
        if len(low) == 2:
            db = self._alias(low[0])
            if db is not None:
                found = [(db, s, low[1]) for s in [s for c, s in entries if c == db] or ["main"]]
                return found[0], found
            if low[0] in _SYSTEM_SCHEMAS:
                return ("system", low[0], low[1]), [("system", low[0], low[1])]
            found = [(c, low[0], low[1]) for c in [c for c, s in entries if s == low[0]]]
            # A schema no search-path entry names is looked up in the default catalog: a view's own.
            default = (self.view[0] if self.view else self.database.lower(), low[0], low[1])
            return default, found or [default]
        db = self._alias(low[0])
        return (db or low[0], low[1], low[2]), [(db or low[0], low[1], low[2])]

    def key(self, database: str, schema: str, name: str) -> str:
        return ".".join(_quote(p) for p in (self._key_of_database(database), schema, name))


def _split_search_path(text: str) -> list[str]:
    out: list[str] = []
    buf: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            out.append("".join(buf).strip())
            buf = []
        else:
            buf.append(ch)
    out.append("".join(buf).strip())
    return [e for e in out if e]


def looks_like_file(text: str) -> bool:
    """Whether DuckDB reads ``text`` as a file when no table or view has that name (a path, glob, URL or
    a known file suffix)."""
    if any(c in text for c in "/\\*?[") or _URL.match(text):
        return True
    suffixes = text.lower().split(".")[1:]
    return any(s in _FILE_SUFFIXES for s in suffixes)


def scope_key(name: object, context: Optional[NameContext] = None) -> str:
    """The scope a table argument (or a scope name) charges: ``'database'``, a table's identity or a file path.

    Pure: ``context`` describes the connection (default: an in-memory database
    whose catalog is unknown). Resolving a key again returns it unchanged.
    """
    if not isinstance(name, str) or not name.strip():
        raise DPParameterError(f"scope must be 'database' or a table name (got {name!r})")
    if name.strip().lower() == DATABASE_SCOPE:
        return DATABASE_SCOPE
    context = context or NameContext()
    try:
        parts = split_name(name)
    except ValueError:
        if looks_like_file(name):
            return file_scope(name)
        raise DPParameterError(f"scope {name!r} is not a table name DuckDB can parse; quote a name that holds "
                               f"dots or spaces as \"name\"") from None
    joined = ".".join(parts)  # what DuckDB's replacement scan reads when no table has this name
    if len(parts) > 3:
        return file_scope(joined)
    default, lookups = context.candidates(parts)
    if context.relations is not None:
        for candidate in lookups:
            if candidate in context.relations:
                return context.key(*candidate)
    if looks_like_file(joined):
        return file_scope(joined)
    return context.key(*default)


def resolve_scope(con: duckdb.DuckDBPyConnection, name: object) -> str:
    """The scope ``name`` denotes on ``con`` (dpsql must be registered on it): see :func:`scope_key`."""
    if isinstance(name, str) and name.strip() and name.strip().lower() != DATABASE_SCOPE:
        (row,) = con.execute("SELECT dp__catalog(?)", [name]).fetchall()
        return scope_key(name, NameContext.from_row(row[0]))
    return scope_key(name)


def _alias_key(name: str) -> str:
    # Alias keys are the raw names a caller passes as tbl (e.g. the CLI's TEMP view), compared loosely.
    return name.strip().replace('"', "").lower()


def sidecar_path(database: Union[str, os.PathLike[str]]) -> Path:
    """The ledger file of a database (or data) file: ``<file>.dpsql-ledger``, beside the file a symbolic
    link points to (a link is one more name of its target, whose budgets must bound it)."""
    text = os.fspath(database)
    if os.path.islink(text):
        text = os.path.realpath(text)
    return Path(text + LEDGER_SUFFIX)


def _check_budget_delta(delta: object) -> float:
    # A budget's delta may be 0 (pure-DP releases only) but not >= 1.
    if delta is None or isinstance(delta, bool) or not isinstance(delta, (int, float)) \
            or not (0.0 <= float(delta) < 1.0):
        raise DPParameterError(f"delta budget must be a number with 0 <= delta < 1 (got {delta!r})")
    return float(delta)


def _check_release_delta(delta: object) -> float:
    # A release's delta is 0 for pure-DP mechanisms, else in (0, 1).
    if delta is None or isinstance(delta, bool) or not isinstance(delta, (int, float)) \
            or not (0.0 <= float(delta) < 1.0) or math.isnan(float(delta)):
        raise DPParameterError(f"delta must be a number with 0 <= delta < 1 (got {delta!r})")
    return float(delta)


# user_version 1: table scopes are catalog identities, releases have a seeded column.
# user_version 2: release_scopes lists every scope of a release (a release may read several tables). A
# release without rows there (recorded before, or by an older dpsql) has its tbl as its one scope.
_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (scope TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL);
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, mechanism TEXT NOT NULL, unit TEXT NOT NULL,
    tbl TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, parameters TEXT NOT NULL,
    calibration TEXT NOT NULL, seeded INTEGER NOT NULL DEFAULT 0);
"""
_SCOPES_TABLE = ("CREATE TABLE IF NOT EXISTS {s}.release_scopes (release_id INTEGER NOT NULL, scope TEXT NOT NULL, "
                 "PRIMARY KEY (release_id, scope))")
# The releases charged to a scope: those listing it, and those without a list whose tbl it is.
_SPENT = ("SELECT r.epsilon, r.delta FROM {s}.releases r WHERE EXISTS (SELECT 1 FROM {s}.release_scopes x "
          "WHERE x.release_id = r.id AND x.scope = ?) OR (r.tbl = ? AND NOT EXISTS (SELECT 1 FROM "
          "{s}.release_scopes x WHERE x.release_id = r.id))")
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _ledger_database(path: Optional[Path]) -> str:
    # The database a sidecar belongs to, named as DuckDB names it (an in-memory database is 'memory').
    if path is None:
        return "memory"
    name = path.name
    return database_alias(name[:-len(LEDGER_SUFFIX)] if name.endswith(LEDGER_SUFFIX) else name)


def _file_problem(path: Path) -> Optional[str]:
    """Why the bytes of an existing ledger file cannot be a ledger (None: SQLite may open it)."""
    size = path.stat().st_size
    if size == 0:
        return "empty (0 bytes; e.g. overwritten by the shell's .output or a > redirection)"
    with open(path, "rb") as f:
        head = f.read(100)
    if _SQLITE_MAGIC.startswith(head) or (head.startswith(_SQLITE_MAGIC) and len(head) < 100):
        return f"truncated ({size} bytes, less than a SQLite header)"
    if not head.startswith(_SQLITE_MAGIC):
        return "not a SQLite file, hence not a dpsql ledger (a data file, or overwritten)"
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    # The header's page count is valid when its change counter matches (SQLite file format, 1.3.8). A file
    # with a WAL or a hot journal beside it may lag them until SQLite opens it, so it is not held to it.
    logs = any(Path(os.fspath(path) + end).exists() for end in ("-wal", "-journal"))
    counted = head[24:28] == head[92:96] and pages > 0 and not logs
    if page_size < 512 or size % page_size or (counted and size < pages * page_size):
        return f"truncated ({size} bytes; its header records {pages * page_size})"
    return None


class ScopeSet(str):
    """The scopes one release reads (:func:`dpsql.core.scopes.trace`), each with the DuckDB file that holds it
    (None: the connection's own data), as :meth:`Ledger.charge` takes them.

    A str (its text lists the scopes), as :meth:`Ledger.charge` types ``scope`` as ``Optional[str]``.
    """

    sources: tuple[tuple[str, Optional[str]], ...]

    def __new__(cls, sources: Iterable[tuple[str, Optional[str]]]) -> "ScopeSet":
        items = tuple((str(scope), database) for scope, database in sources)
        made = super().__new__(cls, ", ".join(scope for scope, _ in items))
        made.sources = items
        return made


class Ledger:
    """Budgets and releases of one database, kept in a SQLite file or in memory.

    ``path=None`` keeps the ledger in memory (it lives as long as this object).
    ``database`` names the database the ledger belongs to, used to resolve a
    scope given without a connection (default: ``memory``, or DuckDB's name of
    the file whose sidecar ``path`` is). ``aliases`` maps a table argument (e.g.
    the CLI's TEMP view over its input) to the scope charged in its place.
    ``homes``: the real paths of the DuckDB files whose tables this ledger holds
    besides the one whose sidecar it is (:func:`ledger_for` adds the database of
    each connection registered with it); tables of other database files are
    charged to their own sidecars.
    """

    def __init__(self, path: Optional[Union[str, os.PathLike[str]]] = None, *,
                 aliases: Optional[dict[str, str]] = None, database: Optional[str] = None):
        self.path = None if path is None else Path(os.fspath(path))
        self.database = (database or _ledger_database(self.path)).lower()
        # Table names recorded in place of others (the CLI reads its input through a TEMP view and
        # records the input's table or file instead of the view's).
        self.aliases = {_alias_key(k): self.scope(v) for k, v in (aliases or {}).items()}
        self.homes: set[str] = set()
        self._lock = threading.Lock()
        # Entered around every charge while set (:meth:`gated`): the runner's Ctrl-C gate (dpsql.core.runner).
        self._gates: list[Callable[[], ContextManager[object]]] = []
        self._memory: Optional[sqlite3.Connection] = None
        self._ready = False  # the in-memory ledger's tables exist
        if self.path is None:
            self._memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        # A file ledger is created on first use, so registering dpsql on a database writes nothing.

    def __repr__(self) -> str:
        return f"Ledger({str(self.path) if self.path else 'in memory'})"

    def scope(self, name: object) -> str:
        """The scope ``name`` denotes without a connection: a table of this ledger's database, or a file."""
        return scope_key(name, NameContext(database=self.database))

    def owns(self, database: Union[str, os.PathLike[str]]) -> bool:
        """Whether the tables of the DuckDB file ``database`` are charged here (its sidecar, or a home)."""
        return os.path.realpath(database) in self.homes or _same_file(sidecar_path(database), self.path)

    # -- storage -------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        """The in-memory ledger's one connection, or a new connection to the ledger file."""
        if self._memory is not None:
            return self._memory
        assert self.path is not None, "a ledger without a file has its in-memory connection"
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves; timeout: wait for other writers.
        return sqlite3.connect(os.fspath(self.path), timeout=60.0, isolation_level=None)

    def _connect(self) -> sqlite3.Connection:
        """A connection to this ledger, checked and up to date.

        A missing file becomes a new ledger. An existing file must be one: an empty, truncated,
        damaged or foreign file is a :class:`LedgerIOError`, never a new ledger (which would
        silently forget every budget it held).
        """
        try:
            if self._memory is not None:
                if not self._ready:
                    self._memory.executescript(_SCHEMA + _SCOPES_TABLE.format(s="main") +
                                               f"; PRAGMA user_version = {_VERSION};")
                    self._ready = True
                return self._memory
            assert self.path is not None, "a ledger without a file has its in-memory connection"
            if not self.path.exists():
                self._create()
            problem = _file_problem(self.path)
            if problem is not None:
                raise self._broken(problem)
            db = self._open()
            try:
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
                if not {"budgets", "releases"} <= tables:
                    raise self._broken("a SQLite database without dpsql's tables (budgets, releases): not a dpsql "
                                       "ledger")
                self._prepare(db)
            except BaseException:
                db.close()
                raise
            return db
        except LedgerIOError:
            raise
        except (sqlite3.Error, OSError) as exc:
            raise self._error(exc) from exc

    def _create(self) -> None:
        """Write a new, empty ledger file whole: no process ever opens a half-made (empty) one."""
        assert self.path is not None, "only a file ledger is created"
        new = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.new")
        try:
            db = sqlite3.connect(os.fspath(new), isolation_level=None)
            try:
                db.executescript(_SCHEMA + _SCOPES_TABLE.format(s="main") + f"; PRAGMA user_version = {_VERSION};")
            finally:
                db.close()
            try:
                os.link(new, self.path)  # fails if another process made the ledger first: theirs is used
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links
                if not self.path.exists():
                    os.replace(new, self.path)
        finally:
            try:
                os.unlink(new)
            except FileNotFoundError:
                pass

    def _broken(self, problem: str) -> LedgerIOError:
        """The error of a ledger file that exists but is no (longer a) ledger: it names the file and the fix."""
        return LedgerIOError(
            f"dpsql: the privacy ledger {str(self.path)} is {problem}; nothing was released or charged. It held "
            f"this database's budgets and releases: restore it from a backup (or from where it was copied). To "
            f"start over instead, delete it: a new, empty ledger is then created, which forgets every budget and "
            f"release. If this file is not the ledger, pass ledger= the ledger file to dpsql.connect/register")

    def _error(self, exc: BaseException) -> LedgerIOError:
        """The error a SQLite or OS failure of the ledger file becomes: it names the file and the fix."""
        where = str(self.path) if self.path is not None else "(in memory)"
        if self.path is not None and os.path.isdir(self.path):
            fix = "It is a folder: pass ledger= a file path (e.g. data.duckdb.dpsql-ledger) to dpsql.connect/register"
        elif self.path is not None and not os.path.isdir(self.path.parent):
            fix = (f"Its folder {str(self.path.parent)!r} does not exist: create it, or pass ledger= a path in an "
                   f"existing folder to dpsql.connect/register")
        elif isinstance(exc, sqlite3.DatabaseError) and any(
                s in str(exc) for s in ("not a database", "malformed", "encrypted")):
            return self._broken(f"damaged or not a dpsql ledger ({exc})")
        else:
            fix = ("Make the file and its folder readable and writable, or pass ledger= a writable path to "
                   "dpsql.connect/register")
        return LedgerIOError(f"dpsql: cannot use the privacy ledger {where} ({exc}); nothing was released or "
                             f"charged. {fix}")

    def _prepare(self, db: sqlite3.Connection) -> None:
        """Bring a ledger file written by an older dpsql up to date (its releases and budgets kept)."""
        if db.execute("PRAGMA user_version").fetchone()[0] >= _VERSION:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]  # another process may have done it
            db.execute(_SCOPES_TABLE.format(s="main"))
            if version < 1:
                # Written before scopes were catalog identities: add the seeded column and re-key its table
                # scopes as this ledger's database resolves them, so that its budgets keep applying.
                columns = {r[1] for r in db.execute("PRAGMA table_info(releases)")}
                if "seeded" not in columns:
                    db.execute("ALTER TABLE releases ADD COLUMN seeded INTEGER NOT NULL DEFAULT 0")
                for table, column in (("releases", "tbl"), ("budgets", "scope")):
                    for (old,) in db.execute(f"SELECT DISTINCT {column} FROM {table}").fetchall():
                        new = old if old == DATABASE_SCOPE or looks_like_file(old) else self.scope(old)
                        if new != old:
                            db.execute(f"UPDATE {table} SET {column} = ? WHERE {column} = ?", (new, old))
            db.execute(f"PRAGMA user_version = {_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    class _Tx:
        """One write transaction on a ledger, and on the ``attached`` ledger files with it (one SQLite
        connection: BEGIN IMMEDIATE takes every file's write lock in attach order, COMMIT is atomic)."""

        def __init__(self, ledger: "Ledger", attached: Sequence["Ledger"] = ()):
            self.ledger, self.attached = ledger, attached

        def __enter__(self) -> sqlite3.Connection:
            self.ledger._lock.acquire()
            self.db: Optional[sqlite3.Connection] = None
            try:
                self.db = self.ledger._connect()
                for i, other in enumerate(self.attached, 1):
                    other._connect().close()  # checked and up to date on its own connection first
                    try:
                        self.db.execute(f"ATTACH DATABASE ? AS l{i}", (os.fspath(other.path or ""),))
                    except sqlite3.Error as exc:
                        raise other._error(exc) from exc
                # IMMEDIATE takes the write lock now: no other process can spend between our check and insert.
                self.db.execute("BEGIN IMMEDIATE")
            except LedgerIOError:
                self._close()
                raise
            except (sqlite3.Error, OSError) as exc:
                self._close()
                raise self.ledger._error(exc) from exc
            except BaseException:
                self._close()
                raise
            return self.db

        def _close(self) -> None:
            try:
                if self.db is not None and self.ledger._memory is None:
                    self.db.close()
            finally:
                self.ledger._lock.release()

        def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                     tb: Optional[TracebackType]) -> Literal[False]:
            try:
                assert self.db is not None, "__enter__ opened the connection"
                if exc_type is None:
                    try:
                        self.db.execute("COMMIT")
                    except (sqlite3.Error, OSError) as commit_error:
                        # A failed COMMIT (disk full, I/O error) must not leave a half-recorded release.
                        self._rollback()
                        raise self.ledger._error(commit_error) from commit_error
                else:
                    self._rollback()
                    if isinstance(exc, (sqlite3.Error, OSError)) and not isinstance(exc, LedgerIOError):
                        raise self.ledger._error(exc) from exc
            finally:
                self._close()
            return False

        def _rollback(self) -> None:
            try:
                if self.db is not None:
                    self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # no transaction left to undo: SQLite rolled it back itself

    def _transaction(self, attached: Sequence["Ledger"] = ()) -> "Ledger._Tx":
        return Ledger._Tx(self, attached)

    # -- budgets -------------------------------------------------------------------------------
    def set_budget(self, epsilon: float, delta: float, scope: str = DATABASE_SCOPE) -> Budget:
        """Set (replace) the total budget of ``scope``; releases already charged stay charged.

        ``scope`` is resolved without a connection (:meth:`scope`); :func:`set_budget`
        resolves it on the connection instead. A budget below what the scope has already spent is
        refused with a :class:`~dpsql.core.errors.ParameterError`, changing nothing: the releases are
        made, and a budget that claims otherwise would make the ledger's ``remaining`` a lie. A budget
        equal to the spending is allowed: it closes the scope (no further release fits). Setting the
        budget a scope already has is allowed whatever it has spent (it changes nothing; e.g. dbt sets
        its configured budget at every connection).
        """
        return self._set_budget(epsilon, delta, scope, write=True)

    def check_budget(self, epsilon: float, delta: float, scope: str = DATABASE_SCOPE) -> Budget:
        """The budget :meth:`set_budget` would set now, or its refusal; changes nothing (a check before
        setting several budgets, so that one refused leaves all unset)."""
        return self._set_budget(epsilon, delta, scope, write=False)

    def _set_budget(self, epsilon: float, delta: float, scope: str, write: bool) -> Budget:
        budget = Budget(self.scope(scope), check_epsilon(epsilon), _check_budget_delta(delta))
        with self._transaction() as db:
            # Checked inside the write transaction: no charge can slip in between the check and the write.
            current = db.execute("SELECT epsilon, delta FROM budgets WHERE scope = ?", (budget.scope,)).fetchone()
            if current is None or tuple(current) != (budget.epsilon, budget.delta):
                self._check_not_below_spent(db, budget)
            if write:
                db.execute("INSERT INTO budgets VALUES (?, ?, ?) ON CONFLICT(scope) DO UPDATE SET "
                           "epsilon = excluded.epsilon, delta = excluded.delta",
                           (budget.scope, budget.epsilon, budget.delta))
        return budget

    def _check_not_below_spent(self, db: sqlite3.Connection, budget: Budget) -> None:
        """Raise a ParameterError naming the parameter, the spending and the fix if ``budget`` is below it."""
        if budget.scope == DATABASE_SCOPE:
            spent = db.execute("SELECT epsilon, delta FROM releases").fetchall()
        else:
            spent = db.execute(_SPENT.format(s="main"), (budget.scope, budget.scope)).fetchall()
        eps_spent = math.fsum(r[0] for r in spent)
        delta_spent = math.fsum(r[1] for r in spent)
        # The slack of the charge's check (_check): a budget that the charges fit is never "below" them.
        below = [(name, value, used) for name, value, used in (("epsilon", budget.epsilon, eps_spent),
                                                                ("delta", budget.delta, delta_spent))
                 if used > value * (1 + _SLACK)]
        if not below:
            return
        # 12 significant digits: the amount said is one that passes (rounding stays within the slack).
        said = " and ".join(f"{name}={value:.12g} is below the {name} already spent ({used:.12g})"
                            for name, value, used in below)
        least = ", ".join(f"{name} >= {used:.12g}" for name, _, used in below)
        where = "" if self.path is None else f" (ledger {str(self.path)})"
        raise DPParameterError(
            f"dpsql: budget of scope '{budget.scope}'{where}: {said} by its {len(spent)} release"
            f"{'' if len(spent) == 1 else 's'}; a budget cannot undo releases already made, so nothing was "
            f"changed. Set at least what is spent ({least}; exactly that closes the scope: no further release "
            f"fits), or remove the budget to lift the limit")

    def remove_budget(self, scope: str = DATABASE_SCOPE) -> bool:
        """Remove the limit of ``scope`` (its releases stay recorded); whether it had one."""
        key = self.scope(scope)
        with self._transaction() as db:
            return db.execute("DELETE FROM budgets WHERE scope = ?", (key,)).rowcount > 0

    def budgets(self) -> list[Budget]:
        with self._transaction() as db:
            rows = db.execute("SELECT scope, epsilon, delta FROM budgets ORDER BY scope").fetchall()
        return [Budget(*r) for r in rows]

    def is_empty(self) -> bool:
        """No release recorded and no budget set."""
        with self._transaction() as db:
            return db.execute("SELECT (SELECT count(*) FROM releases) + (SELECT count(*) FROM budgets)"
                              ).fetchone()[0] == 0

    # -- releases ------------------------------------------------------------------------------
    @staticmethod
    def _scopes(db: sqlite3.Connection) -> dict[int, list[str]]:
        listed: dict[int, list[str]] = {}
        for release_id, scope in db.execute("SELECT release_id, scope FROM release_scopes ORDER BY rowid"):
            listed.setdefault(release_id, []).append(scope)
        return listed

    def releases(self) -> list[Release]:
        with self._transaction() as db:
            rows = db.execute("SELECT id, time, mechanism, unit, tbl, epsilon, delta, parameters, calibration, "
                              "seeded FROM releases ORDER BY id").fetchall()
            listed = self._scopes(db)
        # Parameters and calibration read as JSON text, whichever dpsql wrote them (json_text).
        return [Release(i, t, m, u, tbl, e, d, json_text(p) or "", json_text(c) or "", seeded=bool(s),
                        scopes=_release_scopes(listed, i, tbl))
                for i, t, m, u, tbl, e, d, p, c, s in rows]

    def status(self) -> list[ScopeStatus]:
        """One row per scope that has a budget or a release: 'database' first, then tables."""
        with self._transaction() as db:
            budgets = {s: (e, d) for s, e, d in db.execute("SELECT scope, epsilon, delta FROM budgets")}
            rows = db.execute("SELECT id, tbl, epsilon, delta, seeded FROM releases").fetchall()
            listed = self._scopes(db)
        spent: dict[str, list[Any]] = {DATABASE_SCOPE: [[], [], 0, 0]}
        for release_id, tbl, eps, delta, seeded in rows:
            for scope in dict.fromkeys((DATABASE_SCOPE, *_release_scopes(listed, release_id, tbl))):
                entry = spent.setdefault(scope, [[], [], 0, 0])
                entry[0].append(eps)
                entry[1].append(delta)
                entry[2] += 1
                entry[3] += int(bool(seeded))
        for scope in budgets:
            spent.setdefault(scope, [[], [], 0, 0])
        order = [DATABASE_SCOPE] + sorted(s for s in spent if s != DATABASE_SCOPE)
        return [ScopeStatus(s, budgets.get(s, (None, None))[0], budgets.get(s, (None, None))[1],
                            math.fsum(spent[s][0]), math.fsum(spent[s][1]), spent[s][2], spent[s][3])
                for s in order]

    @contextlib.contextmanager
    def gated(self, gate: Callable[[], ContextManager[object]]) -> Iterator[None]:
        """While the block runs, every :meth:`charge` of this ledger runs inside ``gate()``: entered before
        anything is checked or written (it may refuse the charge by raising), left after the commit.

        The hook of :mod:`dpsql.core.runner`, which orders Ctrl-C and the charge with it; the gate applies to
        every charge of this ledger meanwhile, from any thread or connection.
        """
        self._gates.append(gate)
        try:
            yield
        finally:
            self._gates.remove(gate)

    def charge(self, mechanism: str, unit: str, table: str, epsilon: float, delta: float,
               parameters: str = "", calibration: str = "", *, seeded: bool = False,
               scope: Optional[str] = None) -> Release:
        """Atomically check every applicable budget and record the release.

        ``table`` is the macro's table argument. ``scope``: a :class:`ScopeSet` (what the release
        reads, :func:`dpsql.core.scopes.trace`), or one scope name (resolved by :meth:`scope`; default:
        ``table``'s). An alias of ``table`` replaces them. Each scope is charged in the ledger of the
        database holding it: this ledger for its own databases and the files read by path, else that
        database file's sidecar. The release must fit every budget that applies ('database' and each
        scope, in each ledger involved); it is then recorded once in each of those ledgers, all or
        nothing (every ledger file's write lock is held, in the order of their paths, through one
        atomic commit). Raises :class:`BudgetExceededError` (recording nothing) if it does not fit,
        and a ``dpsql:`` error (recording nothing) if a ledger cannot be written. Returns the release
        as this ledger recorded it (as the first other ledger did, if it holds none of its data).
        """
        with contextlib.ExitStack() as gates:
            for gate in list(self._gates):
                gates.enter_context(gate())
            return self._charge(mechanism, unit, table, epsilon, delta, parameters, calibration, seeded, scope)

    def check_charge(self, mechanism: str, table: str, epsilon: float, delta: float, *,
                     scope: Optional[str] = None) -> None:
        """Raise :class:`BudgetExceededError` if :meth:`charge` of this release would be refused now; record
        nothing. For a front end that must refuse before it starts work it cannot take back (a Spark job);
        the charge itself checks again, atomically, since another release may spend the budget meanwhile."""
        epsilon = check_epsilon(epsilon)
        delta = _check_release_delta(delta)
        with self._locked(self._plan(table, scope)) as (plan, where):
            for led, keys in plan:
                led._check(*where[id(led)], keys, mechanism, epsilon, delta, self)

    @contextlib.contextmanager
    def _locked(self, plan: list[tuple["Ledger", list[str]]]) \
            -> Iterator[tuple[list[tuple["Ledger", list[str]]], dict[int, tuple[sqlite3.Connection, str]]]]:
        """Every ledger of ``plan`` in one transaction (the in-memory one first, then the files in the order of
        their paths): ``plan`` and, per ledger, the connection and schema holding it."""
        files = sorted((led for led, _ in plan if led.path is not None),
                       key=lambda led: os.path.realpath(led.path or ""))
        with contextlib.ExitStack() as stack:
            where: dict[int, tuple[sqlite3.Connection, str]] = {}
            for led, _ in plan:
                if led.path is None:  # the in-memory ledger (ours): its lock is taken before any file's
                    where[id(led)] = (stack.enter_context(led._transaction()), "main")
            if files:
                db = stack.enter_context(files[0]._transaction(attached=files[1:]))
                for i, led in enumerate(files):
                    where[id(led)] = (db, "main" if i == 0 else f"l{i}")
            yield plan, where

    def _charge(self, mechanism: str, unit: str, table: str, epsilon: float, delta: float, parameters: str,
                calibration: str, seeded: bool, scope: Optional[str]) -> Release:
        if unit not in UNITS:
            raise DPParameterError(f"unit must be one of {UNITS} (got {unit!r})")
        epsilon = check_epsilon(epsilon)
        delta = _check_release_delta(delta)
        seeded = bool(seeded)
        now = time.time()
        with self._locked(self._plan(table, scope)) as (plan, where):
            for led, keys in plan:
                led._check(*where[id(led)], keys, mechanism, epsilon, delta, self)
            recorded = [led._record(*where[id(led)], keys, now, mechanism, unit, epsilon, delta, parameters,
                                    calibration, seeded) for led, keys in plan]
        return recorded[0]

    def _plan(self, table: object, scope: Optional[str]) -> list[tuple["Ledger", list[str]]]:
        """The ledgers a release is charged to, each with its scopes; this ledger first if involved."""
        raw = _alias_key(table) if isinstance(table, str) else None
        if raw is not None and raw in self.aliases:
            return [(self, [self.aliases[raw]])]
        if not isinstance(scope, ScopeSet):
            key = self.scope(table) if scope is None else self.scope(scope)
            return [(self, [self.aliases.get(key, key)])]
        groups: dict[Optional[str], dict[str, None]] = {}
        for key, database in scope.sources:
            owner = None if database is None or self.owns(database) else os.fspath(sidecar_path(database))
            groups.setdefault(owner, {})[self.aliases.get(key, key)] = None
        if not groups:  # the release reads no table or file (constants, range()): 'database' only
            groups[None] = {}
        return [(self if owner is None else Ledger(owner), list(keys))
                for owner, keys in sorted(groups.items(), key=lambda g: (g[0] is not None, g[0] or ""))]

    def _check(self, db: sqlite3.Connection, schema: str, keys: Sequence[str], mechanism: str, epsilon: float,
               delta: float, charging: "Ledger") -> None:
        """Raise :class:`BudgetExceededError` unless the release fits this ledger's budgets that apply."""
        for scope_name in dict.fromkeys((DATABASE_SCOPE, *keys)):
            row = db.execute(f"SELECT epsilon, delta FROM {schema}.budgets WHERE scope = ?", (scope_name,)).fetchone()
            if row is None:
                continue
            if scope_name == DATABASE_SCOPE:
                spent = db.execute(f"SELECT epsilon, delta FROM {schema}.releases").fetchall()
            else:
                spent = db.execute(_SPENT.format(s=schema), (scope_name, scope_name)).fetchall()
            eps_spent = math.fsum(r[0] for r in spent)
            delta_spent = math.fsum(r[1] for r in spent)
            if eps_spent + epsilon > row[0] * (1 + _SLACK) or delta_spent + delta > row[1] * (1 + _SLACK):
                ledger = "" if self is charging else f" in the ledger {str(self.path)} (the database holding it)"
                raise BudgetExceededError(
                    f"dpsql: privacy budget of scope '{scope_name}' exceeded: {mechanism} on "
                    f"{', '.join(keys) or 'no table'} needs epsilon={epsilon:g}, delta={delta:g}, but only "
                    f"epsilon={max(0.0, row[0] - eps_spent):g}, delta={max(0.0, row[1] - delta_spent):g} remain of "
                    f"({row[0]:g}, {row[1]:g}){ledger}; nothing was released. Raise the budget with "
                    f"dpsql.set_budget, dp_set_budget() in SQL or 'dpsql budget set' if that is intended.")

    def _record(self, db: sqlite3.Connection, schema: str, keys: Sequence[str], now: float, mechanism: str,
                unit: str, epsilon: float, delta: float, parameters: str, calibration: str,
                seeded: bool) -> Release:
        """Record one release with its scopes (a release of no table has tbl 'database' and none)."""
        text = ", ".join(keys) or DATABASE_SCOPE
        parameters, calibration = json_text(parameters) or "", json_text(calibration) or ""
        cur = db.execute(f"INSERT INTO {schema}.releases (time, mechanism, unit, tbl, epsilon, delta, parameters, "
                         f"calibration, seeded) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (now, mechanism, unit, text, epsilon, delta, parameters, calibration, int(seeded)))
        assert cur.lastrowid is not None, "an INSERT sets lastrowid"
        for key in keys:
            db.execute(f"INSERT INTO {schema}.release_scopes VALUES (?, ?)", (cur.lastrowid, key))
        return Release(cur.lastrowid, now, mechanism, unit, text, epsilon, delta, parameters, calibration, seeded,
                       tuple(keys))


def _release_scopes(listed: Mapping[int, list[str]], release_id: int, tbl: str) -> tuple[str, ...]:
    # A release recorded without a scope list (before version 2) has its tbl as its one scope.
    if release_id in listed:
        return tuple(listed[release_id])
    return () if tbl == DATABASE_SCOPE else (tbl,)


# -- connections ----------------------------------------------------------------------------------

# Which ledger a connection charges is per-connection state (dpsql.core.state); cursors share their
# connection's UDFs and therefore its ledger.


def database_path(con: duckdb.DuckDBPyConnection) -> Optional[str]:
    """File of the connection's current database, or None for an in-memory one."""
    rows = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    path = rows[0][0] if rows else None
    return path or None


def _same_file(a: Optional[Path], b: Optional[Path]) -> bool:
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def ledger_for(con: duckdb.DuckDBPyConnection,
               ledger: Union[None, str, os.PathLike[str], Ledger] = None,
               current: Optional[Ledger] = None) -> Ledger:
    """The ledger a connection that dpsql is (re)registered on charges (``current``: the one it has).

    ``ledger`` may be a :class:`Ledger`, a file path, or None. A connection
    that already has a ledger keeps it when ``ledger`` is None, the same
    object, or its file; another ledger is refused while the current one holds
    releases or budgets (switching would silently restart the spending), and
    replaces it when empty. A new connection gets ``ledger``, else the sidecar
    of its database file, else an in-memory ledger. The connection's own database
    file (the one it opened) becomes a home of the ledger (:attr:`Ledger.homes`):
    its tables are charged there, whichever file the ledger is.
    """
    chosen = _choose_ledger(con, ledger, current)
    rows = con.execute("SELECT path FROM duckdb_databases() WHERE NOT internal ORDER BY database_oid LIMIT 1"
                       ).fetchall()  # the database the connection opened is the first one DuckDB attached
    if rows and rows[0][0]:
        chosen.homes.add(os.path.realpath(rows[0][0]))
    return chosen


def _choose_ledger(con: duckdb.DuckDBPyConnection, ledger: Union[None, str, os.PathLike[str], Ledger],
                   current: Optional[Ledger]) -> Ledger:
    if ledger is None and current is not None:
        return current
    if isinstance(ledger, Ledger):
        wanted = ledger
    elif ledger is not None:
        path = Path(os.fspath(ledger))
        if current is not None and _same_file(current.path, path):
            return current
        wanted = Ledger(path, database=_current_database(con))
    else:
        database = database_path(con)
        return Ledger(sidecar_path(database)) if database else Ledger(None)
    if current is not None and wanted is not current and not _same_file(current.path, wanted.path) \
            and not _holds_nothing(current):
        raise DPParameterError(
            f"dpsql: this connection already charges its releases to {current!r}, which holds releases or "
            f"budgets; registering it again with ledger={wanted!r} would restart its spending from zero. "
            f"Register again without ledger= (or with the same ledger) to keep it, or open a new connection "
            f"for another ledger")
    return wanted


def _holds_nothing(ledger: Ledger) -> bool:
    # A file ledger whose file was never written holds nothing (and checking must not create it).
    try:
        missing = ledger.path is not None and not ledger.path.exists()
    except OSError as exc:  # e.g. a folder on the path that may not be searched
        raise ledger._error(exc) from exc
    return missing or ledger.is_empty()


def _current_database(con: duckdb.DuckDBPyConnection) -> str:
    rows = con.execute("SELECT current_database(), path FROM duckdb_databases() "
                       "WHERE database_name = current_database()").fetchall()
    if not rows:
        return "memory"
    name, path = rows[0]
    return database_alias(path) if path else name
