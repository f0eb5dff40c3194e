"""SQL text, read one way: DuckDB's tokens of any SQL, and the shipped macro files.

**Any SQL** (the shell's input, the statements the scope tracer reads): :func:`tokens` is DuckDB's own
tokenizer (``duckdb.tokenize``, the parser's lexer), so quotes, ``E'...'`` escapes, dollar-quoted
strings and nested comments mean here what they mean to DuckDB. It reports byte offsets; the tokens
here carry character offsets (a name such as ``"vé"`` would otherwise shift every later token).
:func:`split_statements` and :func:`is_complete` are built on it.

**The shipped macro files** (``sql/**/*.sql``, :func:`sql_files`, loaded in path order). Every statement
of a file is a ``CREATE OR REPLACE TEMP MACRO name(params) AS ...`` with its header written by hand
(the shared stages, the internal helpers), or a declared mechanism's **body** under a marker line::

    -- dpsql:body dp__body_set_union_weighted_gaussian
    WITH dp__cal AS (...)
    SELECT item FROM ...;

The body's header, ``CREATE OR REPLACE TEMP MACRO dp__body_...(params) AS TABLE``, is generated from
the mechanism's declaration by the rule of its releasing macro (:func:`dpsql.core.release.signature`:
names, order, types, defaults), so each default is written once, in the declaration. The marker is a
line of its own among the comments above the query; the body is everything below it up to the ``;``.
A marker that names no declared body, and a declared body written with a header of its own, are
errors. :func:`macro` is any macro by name (header and body, generated headers included), :func:`script`
the text registration runs, and :func:`marks` the ``-- dpsql:portable <name>`` export marks that
:mod:`dpsql.frontends.portable` translates.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterator, Optional, Sequence

import duckdb

from dpsql.core.errors import DpsqlError

__all__ = ["Token", "tokens", "words", "split_statements", "is_complete", "called", "release_macros", "CHARGE",
           "Parameter", "parameters",
           "BODY_MARKER", "PORTABLE_MARKER", "SqlTextError", "Macro", "Mark", "SqlFile",
           "sql_dir", "sql_files", "parse", "files", "macros", "macro", "marks", "script"]


# -- tokens of any SQL ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Token:
    """One token: its character offset, its text (without the whitespace after it) and DuckDB's kind
    (``keyword``, ``identifier``, ``operator``, ``numeric_const``, ``string_const`` or ``comment``)."""

    start: int
    text: str
    kind: str

    @property
    def end(self) -> int:
        return self.start + len(self.text)


def tokens(sql: str) -> list[Token]:
    """The tokens of ``sql`` by DuckDB's tokenizer, positioned in characters.

    An unterminated quote or comment is one token up to the end of the text.
    """
    # DuckDB takes UTF-8: a lone surrogate (from undecodable input) becomes '?', one character for one.
    safe = sql if sql.isascii() else sql.encode("utf-8", "replace").decode("utf-8")
    found = duckdb.tokenize(safe)
    if safe.isascii():
        starts = [pos for pos, _ in found]
    else:  # DuckDB's offsets count bytes
        data, starts, chars, previous = safe.encode("utf-8"), [], 0, 0
        for pos, _ in found:
            chars += len(data[previous:pos].decode("utf-8"))
            previous = pos
            starts.append(chars)
    ends = starts[1:] + [len(sql)]
    return [Token(start, sql[start:end].rstrip(), kind.name) for start, end, (_, kind) in zip(starts, ends, found)]


def words(sql: str) -> frozenset[str]:
    """The names written in ``sql`` (identifiers, and keywords, which DuckDB also accepts as names: a CTE may
    be called ``data``), unquoted and in lower case; not its strings, numbers, operators or comments."""
    out = set()
    for tok in tokens(sql):
        if tok.kind in ("identifier", "keyword"):
            text = tok.text
            out.add((text[1:-1].replace('""', '"') if text.startswith('"') and len(text) > 1 else text).lower())
    return frozenset(out)


def _closed(comment: str) -> bool:
    """Whether a comment token is closed: a ``--`` comment always is, a ``/* */`` one when its nesting is."""
    if not comment.startswith("/*"):
        return True
    depth, i = 0, 0
    while i < len(comment):
        if comment.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif comment.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return True
        else:
            i += 1
    return False


def _significant(token: Token) -> bool:
    """A token that makes a statement: anything but a closed comment (an open one runs to the end)."""
    return token.kind != "comment" or not _closed(token.text)


def _pieces(sql: str) -> list[tuple[int, int, list[Token]]]:
    """``(start, end, tokens)`` of each ``;``-separated piece of ``sql`` (the ``;`` excluded)."""
    out: list[tuple[int, int, list[Token]]] = []
    start = 0
    current: list[Token] = []
    for tok in tokens(sql):
        if tok.kind == "operator" and tok.text == ";":
            out.append((start, tok.start, current))
            start, current = tok.end, []
        else:
            current.append(tok)
    out.append((start, len(sql), current))
    return out


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` without their terminating ``;``.

    Semicolons inside quotes, dollar-quoted strings and comments do not split. Pieces that hold only
    whitespace or comments are dropped; a last statement without ``;`` is kept, and so is the rest of
    the text after an unterminated quote or comment (one invalid statement).
    """
    return [text[start:end].strip() for start, end, toks in _pieces(text) if any(map(_significant, toks))]


def is_complete(text: str) -> bool:
    """Whether ``text`` ends with a statement's ``;`` (outside quotes and comments)."""
    last: Optional[Token] = None
    for tok in tokens(text):
        if _significant(tok):
            last = tok
    return last is not None and last.kind == "operator" and last.text == ";"


# -- calls of releases ------------------------------------------------------------------------------------

# The charge every release makes (sql/00_core/05_ledger.sql): a macro that calls it, or calls a macro that
# does, releases something.
CHARGE = "dp__charge"


def _string_value(text: str) -> Optional[str]:
    """The value of a string token written ``'...'`` or ``E'...'`` (None for other forms: dollar quotes)."""
    body = text[1:] if text[:1] in "eE" else text
    if len(body) > 1 and body.startswith("'") and body.endswith("'"):
        return body[1:-1].replace("''", "'")
    return None


def _calls(sql: str) -> Iterator[str]:
    """The names ``sql`` calls (a name, quoted or not, before ``(``), in lower case and in order; a string
    literal is read as SQL too."""
    toks = tokens(sql)
    for i, tok in enumerate(toks):
        if tok.kind == "string_const":
            inner = _string_value(tok.text)
            if inner:
                yield from _calls(inner)
        elif tok.kind in ("identifier", "keyword") and i + 1 < len(toks) and toks[i + 1].text == "(":
            yield _unquote(tok.text).lower()


def called(sql: str, names: frozenset[str]) -> Optional[str]:
    """The first of ``names`` (lower case) that ``sql`` calls (a name, quoted or not, before ``(``), or None.

    A string literal is read as SQL too, because ``query('...')`` runs the SQL in a string: a release
    named there counts as called.
    """
    return next((name for name in _calls(sql) if name in names), None)


def release_macros(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """Names of the functions and macros registered on ``con`` that make a release when called.

    Read from DuckDB's catalog: :data:`CHARGE` and every macro whose definition calls it or calls
    another such macro (so dispatchers like ``dp_set_union`` are included). Each definition is read once.
    """
    rows = con.execute("SELECT DISTINCT lower(function_name), coalesce(macro_definition, '') "
                       "FROM duckdb_functions() WHERE function_type IN ('macro', 'table_macro')").fetchall()
    calls: dict[str, set[str]] = {}
    for name, body in rows:  # a macro with overloads has one row each
        calls.setdefault(name, set()).update(_calls(body))
    releasing = {CHARGE}
    grew = True
    while grew:
        new = {name for name, callees in calls.items() if name not in releasing and callees & releasing}
        releasing |= new
        grew = bool(new)
    return frozenset(releasing)


# -- parameter lists --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Parameter:
    """One parameter of a macro header: its name, its type (``""`` if untyped) and its default (SQL text)."""

    name: str
    type: str
    default: Optional[str]


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if len(name) > 1 and name.startswith('"') and name.endswith('"') else name


def parameters(signature: str) -> list[Parameter]:
    """The parameters of a macro's parameter list ``signature`` (the text between its parentheses)."""
    out: list[Parameter] = []
    depth = 0
    part: list[Token] = []
    for tok in tokens(signature) + [Token(len(signature), ",", "operator")]:
        if tok.kind == "comment":
            continue
        if tok.kind == "operator" and tok.text == "," and depth == 0:
            if part:
                text = signature[part[0].start:part[-1].end]
                assign = next((t for t in part if t.kind == "operator" and t.text == ":="), None)
                head = text if assign is None else signature[part[0].start:assign.start]
                default = None if assign is None else signature[assign.end:part[-1].end].strip()
                out.append(Parameter(_unquote(part[0].text), head[len(part[0].text):].strip(), default))
            part = []
            continue
        if tok.kind == "operator":
            depth += tok.text.count("(") + tok.text.count("[") + tok.text.count("{")
            depth -= tok.text.count(")") + tok.text.count("]") + tok.text.count("}")
        part.append(tok)
    return out


# -- the shipped macro files --------------------------------------------------------------------------------

BODY_MARKER = "-- dpsql:body"
PORTABLE_MARKER = "-- dpsql:portable"
_BODY = re.compile(r"-- dpsql:body (\w+)")
_PORTABLE = re.compile(r"-- dpsql:portable (\w+)")
_HEAD = ("CREATE", "OR", "REPLACE", "TEMP", "MACRO")


class SqlTextError(DpsqlError):
    """A shipped macro file does not have the form this module reads (a packaging or editing error)."""


@dataclass(frozen=True)
class Macro:
    """A macro of the shipped files: ``CREATE OR REPLACE TEMP MACRO name(signature) AS [TABLE] body``.

    ``line`` is the line of its header, or of its body marker when ``generated`` (the header is then
    generated from the mechanism's declaration); ``body`` spans the lines ``body_line`` to ``end_line``
    of ``file``.
    """

    name: str
    signature: str
    table: bool
    body: str
    file: str
    line: int
    body_line: int
    end_line: int
    generated: bool = False

    @cached_property
    def params(self) -> tuple[str, ...]:
        """The parameter names, in order."""
        return tuple(p.name for p in parameters(self.signature))

    @property
    def header(self) -> str:
        # a line comment ending the parameter list must not swallow the closing parenthesis
        close = "\n)" if "--" in self.signature.rsplit("\n", 1)[-1] else ")"
        return f"CREATE OR REPLACE TEMP MACRO {self.name}({self.signature}{close} AS{' TABLE' if self.table else ''}"

    @property
    def sql(self) -> str:
        """The statement that creates the macro."""
        return f"{self.header}\n{self.body};\n"

    def renamed(self, name: str, body: Optional[str] = None) -> "Macro":
        """The same macro under another name (and body): a variant built from the shipped text."""
        return replace(self, name=name, body=self.body if body is None else body)


@dataclass(frozen=True)
class Mark:
    """A ``-- dpsql:portable <name>`` line: the macro it marks (and the CTE, for a stage inside a body).

    ``macro`` is None when the line is not directly above the definition of a macro or CTE named ``name``
    (or is not a well-formed mark).
    """

    file: str
    line: int
    name: str
    macro: Optional[str]
    cte: Optional[str] = None


@dataclass(frozen=True)
class SqlFile:
    """One shipped file: its name (relative to :func:`sql_dir`), text, macros in order and export marks."""

    name: str
    text: str
    macros: tuple[Macro, ...]
    marks: tuple[Mark, ...]

    @property
    def sql(self) -> str:
        """The file as DuckDB runs it: each macro's statement, marked bodies under their generated headers."""
        return "".join(m.sql for m in self.macros)


def sql_dir() -> Path:
    """Folder of the macro files: ``dpsql/sql`` inside an installed package.

    A source checkout keeps them at the repository root (``sql/``); that location is used only when
    the package folder has none.
    """
    packaged = Path(str(resources.files("dpsql"))) / "sql"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "sql"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("dpsql's SQL macro files are missing from the installation (dpsql/sql/*.sql)")


def sql_files() -> list[Path]:
    """The macro files in load order: the core's folder, then each family's (paths sort in dependency order),
    then those of the families added from outside the package (:func:`dpsql.core.registry.add_family`)."""
    from dpsql.core import registry  # the declarations import the families, which import the core

    root = sql_dir()
    return sorted(root.rglob("*.sql"), key=lambda p: p.relative_to(root).as_posix()) + registry.sql_files()


def _declared_bodies() -> dict[str, str]:
    """Body macro name -> its generated signature, for every declared mechanism."""
    from dpsql.core import registry, release  # the declarations import the families, which import the core

    return {release.body_macro(m): release.signature(m.params) for m in registry.all_mechanisms().values()}


def _name(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name


class _Lines:
    """Line numbers (from 1) of character offsets in one text."""

    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)


def _macro(name: str, text: str, toks: list[Token], end: int, lines: _Lines, bodies: dict[str, str]) -> Macro:
    """The macro a statement creates: a marked body (generated header) or a hand-written header."""
    where = f"{name}:{lines.of(toks[0].start)}"
    comments = [t for t in toks if t.kind == "comment"]
    code = [t for t in toks if t.kind != "comment"]
    if not code:
        raise SqlTextError(f"{where}: a comment is not closed")
    for c in comments:
        if c.text.lstrip().startswith(BODY_MARKER) and not _BODY.fullmatch(c.text):
            raise SqlTextError(f"{name}:{lines.of(c.start)}: a body marker is the line '{BODY_MARKER} <macro name>'")
    markers = [(c, found.group(1)) for c in comments if (found := _BODY.fullmatch(c.text))]
    if markers:
        marker, body_name = markers[0]
        at = f"{name}:{lines.of(marker.start)}"
        if len(markers) > 1 or marker.start > code[0].start:
            raise SqlTextError(f"{at}: {BODY_MARKER} {body_name} must be the only body marker of its statement, "
                               f"above its query")
        if [t.text.upper() for t in code[:len(_HEAD)]] == list(_HEAD):
            raise SqlTextError(f"{at}: the body {body_name} is written with a header; its header is generated "
                               f"from the declaration: remove the CREATE ... AS TABLE lines")
        if body_name not in bodies:
            raise SqlTextError(f"{at}: {BODY_MARKER} {body_name} names no declared mechanism's body "
                               f"(dp__body_<macro without dp_>); declare the mechanism, or write a helper's header")
        first = text.index("\n", marker.start) + 1
        return Macro(body_name, bodies[body_name], True, text[first:end].strip(), name, lines.of(marker.start),
                     lines.of(first), lines.of(end), generated=True)
    if [t.text.upper() for t in code[:len(_HEAD)]] != list(_HEAD) or len(code) < len(_HEAD) + 2 \
            or code[len(_HEAD)].kind != "identifier" or code[len(_HEAD) + 1].text != "(":
        raise SqlTextError(f"{where}: every statement of a macro file is CREATE OR REPLACE TEMP MACRO name(...) "
                           f"or a body under '{BODY_MARKER} <name>'")
    macro_name = _unquote(code[len(_HEAD)].text)
    if macro_name in bodies:
        raise SqlTextError(f"{where}: {macro_name} is a declared mechanism's body: its header is generated from "
                           f"the declaration; write '{BODY_MARKER} {macro_name}' above its query instead")
    opened = code[len(_HEAD) + 1]
    depth, i = 0, len(_HEAD) + 1
    while i < len(code):
        t = code[i]
        if t.kind == "operator":
            depth += t.text.count("(") + t.text.count("[") - t.text.count(")") - t.text.count("]")
            if depth == 0:
                break
        i += 1
    rest = code[i + 1:]
    if not rest or rest[0].text.upper() != "AS":
        raise SqlTextError(f"{where}: {macro_name}: expected AS after the parameter list")
    table = len(rest) > 1 and rest[1].text.upper() == "TABLE"
    after = rest[1] if table else rest[0]
    return Macro(macro_name, text[opened.end:code[i].start].strip(), table, text[after.end:end].strip(), name,
                 lines.of(code[0].start), lines.of(after.end), lines.of(end))


def _cte_head(line: str) -> Optional[str]:
    """The CTE a line starts to define (``[WITH] name AS [NOT] [MATERIALIZED] (``), if any."""
    code = [t for t in tokens(line) if t.kind != "comment"]
    words = [t.text.upper() for t in code]
    if words[:1] == ["WITH"]:
        code, words = code[1:], words[1:]
    if len(code) < 3 or code[0].kind != "identifier" or words[1] != "AS":
        return None
    rest = words[2:]
    if rest[:2] == ["NOT", "MATERIALIZED"] or rest[:1] == ["MATERIALIZED"]:
        rest = rest[rest.index("MATERIALIZED") + 1:]
    return _unquote(code[0].text) if rest[:1] == ["("] else None


def _marks(name: str, text: str, macros: Sequence[Macro]) -> tuple[Mark, ...]:
    lines = text.splitlines()
    starts = {m.line: m for m in macros}
    found = []
    for i, line in enumerate(lines, 1):
        if not line.lstrip().startswith(PORTABLE_MARKER):
            continue
        mark = _PORTABLE.fullmatch(line.rstrip())
        if mark is None:  # malformed (indented, two names, ...): reported, never silently ignored
            found.append(Mark(name, i, line.strip()[len(PORTABLE_MARKER):].strip(), None))
            continue
        stage: str = mark.group(1)
        below = lines[i] if i < len(lines) else ""
        macro = starts.get(i + 1)
        if macro is not None and macro.name == stage:
            found.append(Mark(name, i, stage, stage))
            continue
        inside = next((m for m in macros if m.body_line <= i + 1 <= m.end_line), None)
        if inside is not None and _cte_head(below) == stage:
            found.append(Mark(name, i, stage, inside.name, stage))
        else:
            found.append(Mark(name, i, stage, None))
    return tuple(found)


def parse(text: str, name: str = "<text>") -> SqlFile:
    """The macros and export marks of a macro file's ``text`` (``name`` is how errors cite it)."""
    lines = _Lines(text)
    bodies = _declared_bodies()
    macros = tuple(_macro(name, text, toks, end, lines, bodies) for _, end, toks in _pieces(text)
                   if any(map(_significant, toks)))
    return SqlFile(name, text, macros, _marks(name, text, macros))


@lru_cache(maxsize=64)
def _read(path: str, name: str, mtime: int, size: int) -> SqlFile:
    del mtime, size  # the cache key: a file edited in a running process is read again
    return parse(Path(path).read_text(encoding="utf-8"), name)


def files() -> list[SqlFile]:
    """The shipped macro files, read, in load order."""
    out, root = [], sql_dir()
    for path in sql_files():
        stat = path.stat()
        out.append(_read(str(path), _name(path, root), stat.st_mtime_ns, stat.st_size))
    return out


def macros() -> dict[str, Macro]:
    """Every macro of the shipped files, by name (a name defined twice is an error)."""
    found: dict[str, Macro] = {}
    for f in files():
        for m in f.macros:
            if m.name in found:
                raise SqlTextError(f"{m.file}:{m.line}: {m.name} is defined twice (also {found[m.name].file}:"
                                   f"{found[m.name].line})")
            found[m.name] = m
    return found


def macro(name: str) -> Macro:
    """The shipped macro ``name``: its header (written, or generated for a mechanism's body) and body."""
    found = macros().get(name)
    if found is None:
        raise SqlTextError(f"no macro named {name} in the shipped SQL files")
    return found


def marks() -> list[Mark]:
    """Every ``-- dpsql:portable`` line of the shipped files, in file order."""
    return [mark for f in files() for mark in f.marks]


def script() -> str:
    """Every shipped macro's statement in load order, each declared body under its generated header.

    Registration runs it before the releasing macros (a table macro binds the macros that exist when
    it is created). A declared mechanism without its body in the files is an error.
    """
    defined = macros()
    missing = sorted(set(_declared_bodies()) - set(defined))
    if missing:
        raise SqlTextError(f"no body in the shipped SQL files for {', '.join(missing)}: write its query under "
                           f"'{BODY_MARKER} <name>' in its family's SQL file")
    return "".join(m.sql for m in defined.values())
