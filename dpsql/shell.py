"""``dpsql shell``: an SQL prompt on a DuckDB connection with dpsql registered.

Input is read line by line. A line starting with ``.`` at the start of a
statement is a dot command (``.help``, ``.tables``, ``.quit``); anything else
accumulates until a statement ends with ``;`` outside quotes and comments, and
then every statement of the input runs in order. Non-interactive input (``-c``
or piped stdin) stops at the first error and exits non-zero; the prompt prints
the error and carries on.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, TextIO

import duckdb

import dpsql

__all__ = ["split_statements", "is_complete", "error_line", "Shell", "run_shell"]

HISTORY_FILE = ".dpsql_history"
PROMPT = "dpsql> "
CONTINUATION = "   ...> "

HELP = """\
Enter SQL statements terminated by ';'. A statement may span several lines.
dpsql's macros are registered on this connection, for example:
  SELECT * FROM dp_set_union('my_table', method := 'weighted_gaussian',
                             epsilon := 1.0, delta := 1e-5, max_items := 100);
Methods: {methods}.
Table names are strings ('my_table'). Every release is charged to the privacy ledger:
  SELECT * FROM dp_budget();     -- spent and remaining (epsilon, delta) per scope
  SELECT * FROM dp_releases();   -- one row per release
(set budgets with dpsql.set_budget(...) or 'dpsql budget set DATABASE --epsilon E --delta D').
Dot commands (at the start of a line):
  .help           show this text
  .tables         list tables and views
  .quit, .exit    leave (Ctrl-D also works)"""


# --------------------------------------------------------------------------
# Splitting SQL text into statements
# --------------------------------------------------------------------------

_IDENT_CHAR = re.compile(r"[A-Za-z0-9_$\x80-\U0010ffff]")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")


def _scan(text: str) -> Iterator[tuple[int, str]]:
    """Yield ``(position, kind)`` for each top-level ``;`` (kind ``";"``) and each
    significant character outside quotes and comments (kind ``"x"``); finally
    ``(len(text), "open")`` if a quote or comment is still open at the end.

    Covers what DuckDB's parser accepts: '...' and "..." with doubled quotes,
    E'...' with backslash escapes, $tag$...$tag$, -- line comments and nested
    /* */ block comments.
    """
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n\f\v":
            i += 1
        elif c == ";":
            yield i, ";"
            i += 1
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            if depth:
                yield n, "open"
                return
        elif c in "'\"":
            yield i, "x"
            backslash = c == "'" and i > 0 and text[i - 1] in "eE" and (i < 2 or not _IDENT_CHAR.match(text[i - 2]))
            i += 1
            while True:
                if i >= n:
                    yield n, "open"
                    return
                if backslash and text[i] == "\\":
                    i += 2
                elif text[i] == c:
                    if text.startswith(c, i + 1):  # doubled quote: an escaped quote
                        i += 2
                    else:
                        i += 1
                        break
                else:
                    i += 1
        elif c == "$" and (i == 0 or not _IDENT_CHAR.match(text[i - 1])) and _DOLLAR_TAG.match(text, i):
            yield i, "x"
            tag = _DOLLAR_TAG.match(text, i).group(0)
            end = text.find(tag, i + len(tag))
            if end < 0:
                yield n, "open"
                return
            i = end + len(tag)
        else:
            yield i, "x"
            i += 1


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` without their terminating ``;``.

    Semicolons inside quotes, dollar-quoted strings and comments do not split.
    Pieces that hold only whitespace or comments are dropped; a last statement
    without ``;`` is kept.
    """
    pieces, start, significant = [], 0, False
    for pos, kind in _scan(text):
        if kind == ";":
            if significant:
                pieces.append(text[start:pos])
            start, significant = pos + 1, False
        elif kind == "x":
            significant = True
        else:  # an unterminated quote or comment: the rest is one (invalid) statement
            significant = significant or bool(text[start:].strip())
            break
    if significant:
        pieces.append(text[start:])
    return [p.strip() for p in pieces]


def is_complete(text: str) -> bool:
    """Whether ``text`` ends with a statement's ``;`` (outside quotes and comments)."""
    last = None
    for _, kind in _scan(text):
        last = kind
    return last == ";"


# --------------------------------------------------------------------------
# Running statements
# --------------------------------------------------------------------------

_UDF_PREFIX = "Python exception occurred while executing the UDF: "


_UNBOUND_NAME = re.compile(r'Referenced (column|table) "[^"]+" (was )?not found')


def error_line(exc: BaseException) -> str:
    """One line for an error: its message up to the source excerpt DuckDB appends, whitespace collapsed."""
    message = str(exc).strip() or type(exc).__name__
    kept = []
    for line in message.splitlines():
        if line.startswith("LINE ") or line.lstrip().startswith("^"):
            break
        kept.append(line.strip())
    text = " ".join(part for part in kept if part)
    # A dpsql parameter error raised inside a UDF is clearer without the engine's wrapper text.
    if _UDF_PREFIX in text:
        text = text.split(_UDF_PREFIX, 1)[1]
    if _UNBOUND_NAME.search(text):
        # The usual cause with dpsql: a table passed to a macro as a bare identifier, which the
        # binder takes for a column. Macros take the table's name as a string (the ledger records it).
        text += " (if this names a table passed to a dpsql macro, quote it: dp_set_union('events', ...))"
    missing = _MISSING_COLUMN.search(text)
    if missing:
        text = (f"dpsql: no column named {missing.group('name')} in the input (check the *_col parameters); "
                f"its columns are {missing.group('cols')}")
    return f"Error: {text}"


# The macros pick columns with COLUMNS(lambda c: lower(c) = lower(<name parameter>)); a name that matches no
# column fails while DuckDB binds the query, before any dpsql check can run, with this message.
_MISSING_COLUMN = re.compile(
    r"""Star expression "COLUMNS\(list_filter\(.*?list_value\((?P<cols>.*?)\), \(lambda (?P<v>\w+): """
    r"""\(lower\((?P=v)\) = lower\((?:CAST\()*(?P<name>'(?:[^']|'')*'|NULL)(?: AS VARCHAR\))*\)\)\)\)\)" """
    r"""resulted in an empty set of columns""", re.S)


# Statements whose result is the engine's bare report ("Count" or "Success"),
# not rows the user asked for: nothing is printed for them, as in DuckDB's CLI.
_REPORT_COLUMNS = (["Count"], ["Success"])


def _query_only(statement: duckdb.Statement) -> bool:
    return list(statement.expected_result_type) == [duckdb.ExpectedResultType.QUERY_RESULT]


def run_statement(con: duckdb.DuckDBPyConnection, sql: str, out: TextIO) -> None:
    """Run one statement and print its rows as a table (nothing for DDL and DML)."""
    parsed = duckdb.extract_statements(sql)
    if not parsed:  # only comments
        return
    relation = con.sql(sql)
    if relation is None:
        return
    if not _query_only(parsed[-1]) and relation.columns in _REPORT_COLUMNS:
        return
    if parsed[-1].type == duckdb.StatementType.EXPLAIN and relation.columns == ["explain_key", "explain_value"]:
        # A plan is drawn text; inside a table cell its line breaks would show as "\n".
        for _, plan in relation.fetchall():
            out.write(str(plan).rstrip("\n") + "\n")
        out.flush()
        return
    # Rendering runs a lazy SELECT once; it is never rendered twice (noise would differ).
    out.write(str(relation).rstrip("\n") + "\n")
    out.flush()


TABLES_SQL = """
SELECT CASE WHEN table_catalog = current_database() AND table_schema = current_schema() THEN table_name
            ELSE table_catalog || '.' || table_schema || '.' || table_name END AS name,
       CASE table_type WHEN 'VIEW' THEN 'view' ELSE 'table' END AS kind
FROM information_schema.tables
WHERE table_schema NOT IN ('information_schema', 'pg_catalog')
ORDER BY table_catalog = current_database() DESC, name
"""


class Shell:
    """Feeds lines of input to a connection; ``interactive`` decides whether errors stop it."""

    def __init__(self, con: duckdb.DuckDBPyConnection, *, interactive: bool,
                 out: TextIO = sys.stdout, err: TextIO = sys.stderr):
        self.con = con
        self.interactive = interactive
        self.out = out
        self.err = err
        self.buffer: list[str] = []
        self.failed = False
        self.done = False

    @property
    def pending(self) -> bool:
        """Whether an unfinished statement is waiting for more lines."""
        return bool(self.buffer)

    def feed(self, line: str) -> None:
        """Take one line; run the buffered statements once they end with ``;``."""
        if not self.buffer and line.strip().startswith("."):
            self.dot_command(line.strip())
            return
        if not self.buffer and not line.strip():
            return
        self.buffer.append(line)
        text = "\n".join(self.buffer)
        if is_complete(text):
            self.buffer = []
            self.run(text)

    def finish(self) -> None:
        """At the end of input run what is left, even without a final ``;``."""
        text = "\n".join(self.buffer)
        self.buffer = []
        if text.strip():
            self.run(text)

    def cancel(self) -> None:
        """Forget an unfinished statement (Ctrl-C at the prompt)."""
        self.buffer = []

    def run(self, text: str) -> bool:
        """Run every statement of ``text`` in order, stopping at the first error."""
        for sql in split_statements(text):
            try:
                run_statement(self.con, sql, self.out)
            except KeyboardInterrupt:
                self._error("Error: interrupted")
                return False
            except Exception as exc:  # every failure is reported as one line, never a traceback
                self._error(error_line(exc))
                return False
        return True

    def _error(self, line: str) -> None:
        self.out.flush()
        print(line, file=self.err, flush=True)
        self.failed = True
        if not self.interactive:
            self.done = True

    def dot_command(self, line: str) -> None:
        """Handle ``.help``, ``.tables``, ``.quit`` and ``.exit``."""
        command = line.split()[0].lower()
        if command in (".quit", ".exit", ".q"):
            self.done = True
        elif command == ".help":
            print(HELP.format(methods=", ".join(dpsql.METHODS)), file=self.out, flush=True)
        elif command == ".tables":
            try:
                names = self.con.sql(TABLES_SQL).fetchall()
            except Exception as exc:
                self._error(error_line(exc))
                return
            for name, kind in names:
                print(name if kind == "table" else f"{name} (view)", file=self.out)
            self.out.flush()
        else:
            self._error(f"Error: unknown command {command!r}; enter .help for the list")


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

def _setup_readline() -> Optional[Callable[[], None]]:
    """Enable line editing and load the history file; return a function that saves it, if possible."""
    try:
        import readline
    except ImportError:  # e.g. Windows without pyreadline: plain input() still works
        return None
    try:
        path = Path.home() / HISTORY_FILE
    except (RuntimeError, KeyError):  # no resolvable home directory
        return None
    try:
        readline.read_history_file(path)
    except (FileNotFoundError, PermissionError, OSError):
        pass
    readline.set_history_length(1000)

    def save() -> None:
        try:
            readline.write_history_file(path)
        except OSError:  # an unwritable home is not an error for a prompt
            pass

    return save


def _interactive(shell: Shell, database: str) -> None:
    save_history = _setup_readline()
    print(f"dpsql {dpsql.__version__} (DuckDB {duckdb.__version__}) on {database}. "
          "Enter .help for help, .quit or Ctrl-D to leave.", file=shell.out, flush=True)
    try:
        while not shell.done:
            try:
                line = input(CONTINUATION if shell.pending else PROMPT)
            except EOFError:
                print(file=shell.out)
                break
            except KeyboardInterrupt:  # Ctrl-C drops the statement being typed, as in other SQL shells
                print(file=shell.out)
                shell.cancel()
                continue
            shell.feed(line)
    finally:
        if save_history is not None:
            save_history()


def _script(shell: Shell, lines: Iterable[str]) -> None:
    for line in lines:
        shell.feed(line.rstrip("\r\n"))
        if shell.done:
            return
    shell.finish()


def run_shell(database: Optional[str] = None, command: Optional[str] = None, *,
              stdin: TextIO = sys.stdin, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the shell on ``database`` (in memory if None) and return the exit code.

    With ``command``, run that SQL; else read stdin to its end when it is not a
    terminal; else prompt.
    """
    database = database or ":memory:"
    try:
        con = dpsql.connect(database)
    except Exception as exc:
        print(error_line(exc), file=err, flush=True)
        return 1
    try:
        interactive = command is None and stdin.isatty()
        shell = Shell(con, interactive=interactive, out=out, err=err)
        if command is not None:
            _script(shell, command.splitlines())
        elif interactive:
            _interactive(shell, database)
        else:
            _script(shell, stdin)
        return 1 if shell.failed and not interactive else 0
    finally:
        con.close()

