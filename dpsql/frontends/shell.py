"""``dpsql shell``: an SQL prompt on a DuckDB connection with dpsql registered.

A person at a terminal types at a prompt (:mod:`dpsql.frontends.prompt`: editing, whole-statement history,
Tab completion); ``-c``, ``-cmd``, ``-init`` and piped standard input are read as plain lines. A line
starting with ``.`` at the start of a statement is a dot command (DuckDB's everyday ones: ``.mode``,
``.output``, ``.once``, ``.headers``, ``.nullvalue``, ``.separator``, ``.print``, ``.echo``, ``.timer``,
``.schema``, ``.tables``, ``.databases``, ``.open``, ``.read``, ``.import``, ``.dump``, ``.maxrows``,
``.bail``, ``.help``, ``.quit``; and dpsql's ``.budget``); anything else accumulates until a statement
ends with ``;`` outside quotes and comments, and then every statement of the input runs in order.
Errors are one ``Error: ...`` line on stderr, followed, for an error DuckDB places in the SQL text
(parser, binder, catalog), by its ``LINE n: ...`` excerpt and ``^`` marker. ``-c SQL`` stops at the
first error; a script on standard input goes on after an error unless ``-bail``; both exit 1 if
anything failed. The prompt reports errors and carries on.

Output modes (``.mode``, or the flags ``-csv``, ``-json``, ``-markdown``, ``-line``, ``-list``,
``-table``, ``-box``): duckbox (default), box, table, csv, list, tabs, json, jsonlines, markdown, line.
Each result is read once and held, then drawn: a release is never run twice to be shown. duckbox shows
``.maxrows`` rows (default 40), except for a release (a statement that charged the ledger), which is
shown whole, or as CSV when it is too long for a box, so that no released row is lost; every other mode
shows every row. Ctrl-C stops a running statement (nothing is charged if it comes before the charge);
once a statement has charged a release it finishes and its rows are shown. Ctrl-C ends a script.

Ledger rule, the same as the other commands': a session charges ``--ledger
FILE`` if given, else the sidecar ``DATABASE.dpsql-ledger`` of the database it
opens (what ``dpsql budget show DATABASE`` reads; ``.open FILE`` follows the same rule), else, with no database, an
in-memory ledger forgotten at exit. ``dpsql set-union data.parquet`` charges
``data.parquet.dpsql-ledger`` because that is the file it opens; to charge the
same ledger from an in-memory shell, pass ``--ledger data.parquet.dpsql-ledger``
(the shell says so when an in-memory session releases from a file).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Sequence, TextIO

import duckdb

import dpsql
from dpsql.core import ledger as ledger_mod, runner, state
from dpsql.core.errors import LedgerIOError, ParameterError, data_error, from_engine, quotes_data
# Statements are split by DuckDB's own tokenizer: quotes, E'...' escapes, $tag$ strings and nested
# comments split where DuckDB's parser would.
from dpsql.core.sqltext import called, is_complete, release_macros, split_statements
from dpsql.groupby import bigquery

if TYPE_CHECKING:
    from dpsql.frontends.prompt import SqlCompleter

__all__ = ["split_statements", "is_complete", "error_line", "error_text", "Shell", "run_shell", "add_arguments", "run_args",
           "MODES"]

HISTORY_FILE = ".dpsql_history"
PROMPT = "dpsql> "
CONTINUATION = "   ...> "
MODES = ("duckbox", "box", "table", "csv", "list", "tabs", "json", "jsonlines", "markdown", "line")
# The column separator each mode starts with (.mode resets it; .separator changes it).
_SEPARATORS = {"csv": ",", "list": "|", "tabs": "\t"}
DEFAULT_MAXROWS = 40
# The box renderer draws at most this many rows; a longer release is printed as CSV instead.
_BOX_ROWS = 9999
_HUGE = 10**6
_MAX_READ_DEPTH = 16
_SQLITE_MAGIC = b"SQLite format 3\x00"

HELP = """\
Enter SQL statements terminated by ';'. A statement may span several lines: Enter runs it once it ends
with ';' (Alt-Enter runs it as it is); Up recalls a whole statement; Tab completes keywords, tables,
columns and functions (dp_...); Ctrl-C clears the input.
dpsql's macros are registered on this connection, for example:
  SELECT * FROM dp_set_union('my_table', epsilon := 1.0, delta := 1e-5, max_items := 100);
Methods (method := '...'; default {default}): {methods}.
BigQuery's SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...) ... GROUP BY ... runs as one dp_group_by release.
Table names are strings ('my_table'). Every release is charged to the privacy ledger:
  SELECT * FROM dp_budget();     -- spent and remaining (epsilon, delta) per scope
  SELECT * FROM dp_releases();   -- one row per release
  SELECT dp_set_budget('my_table', 1.0, 1e-5);   -- or .budget set my_table 1.0 1e-5
Ledger of this session: {ledger}.
  The rule: --ledger FILE if given, else DATABASE.dpsql-ledger next to the database file,
  else (no database) an in-memory ledger forgotten at exit. 'dpsql set-union data.parquet'
  charges data.parquet.dpsql-ledger: pass --ledger data.parquet.dpsql-ledger to charge it here.
Dot commands (at the start of a line):
  .help               show this text
  .tables             list tables and views
  .schema [PATTERN]   CREATE statements of tables, views and indexes (names matching PATTERN, LIKE)
  .databases          the attached databases and their files
  .open [-readonly] [FILE]
                      go on with the database FILE (no FILE: a new in-memory one); its ledger by the rule
                      above (--ledger FILE if given, else FILE.dpsql-ledger)
  .mode [MODE]        output mode: {modes} (no MODE: show it)
  .headers on|off     the names line of csv, list and tabs
  .nullvalue [TEXT]   how NULL is shown (no TEXT: the mode's own, an empty field in csv, list and tabs)
  .separator COL [ROW]
                      the separators of csv, list and tabs (\\t, \\n read as tab and newline); .mode resets them
  .output [FILE]      send results to FILE (no FILE: back to stdout)
  .once FILE          send the next command's results to FILE
  .print TEXT         write TEXT
  .echo on|off        write each command before running it
  .maxrows [N]        rows duckbox shows (default {maxrows}); a release is always shown whole
  .timer on|off       print the run time of each statement
  .read FILE          run the SQL and dot commands of FILE
  .import FILE TABLE  load a CSV, Parquet or JSON file (DuckDB's readers, by the file's extension) into TABLE,
                      created if it does not exist
  .dump [PATTERN]     SQL that rebuilds this database's tables (CREATE TABLE and an INSERT per row) and views,
                      those matching PATTERN (LIKE); not indexes, sequences, macros, types or other databases
  .bail on|off        stop a script (-c, standard input, .read) at its first error
  .budget [show]      spent and remaining (epsilon, delta) per scope of this session's ledger
  .budget set SCOPE EPSILON DELTA
                      set the total budget of SCOPE ('database', a table, a file); refused below what
                      it has spent (equal closes it); a table that does not exist yet is warned about
  .budget remove SCOPE
                      remove the budget of SCOPE (its releases stay charged)
  .quit, .exit [CODE] leave, with exit code CODE if given (Ctrl-D also works; Ctrl-C stops a running statement, except a release
                      already charged: that one finishes so that its rows are shown)
Flags: -c SQL (repeatable), -cmd COMMAND (repeatable, before the input), -init FILE, -csv, -json, -markdown, -line,
-list, -table, -box, -readonly, -bail, --ledger FILE ('dpsql shell --help')."""


# --------------------------------------------------------------------------
# Running statements
# --------------------------------------------------------------------------

_UDF_PREFIX = "Python exception occurred while executing the UDF: "


_UNBOUND_NAME = re.compile(r'Referenced (column|table) "[^"]+" (was )?not found')
_DPSQL_SIGNATURE = re.compile(r"Macro dp_\w+\(\) does not support the supplied arguments")


def error_line(exc: BaseException) -> str:
    """One line for an error: its message up to the source excerpt DuckDB appends, whitespace collapsed.

    An engine error that carries a dpsql error (raised in a UDF or by SQL's error(), or DuckDB's refusal
    of a non-constant release parameter) is shown as that ``dpsql:`` message, once.
    """
    exc = from_engine(exc)
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
    elif text.startswith("Invalid Input Error: dpsql:"):  # a dpsql check raised by SQL's error()
        text = text[len("Invalid Input Error: "):]
    if _UNBOUND_NAME.search(text):
        # The usual cause with dpsql: a table passed to a macro as a bare identifier, which the
        # binder takes for a column. Macros take the table's name as a string (the ledger records it).
        text += " (if this names a table passed to a dpsql macro, quote it: dp_set_union('events', ...))"
    elif _DPSQL_SIGNATURE.search(text):
        # The binder matched no typed signature: a parameter of the wrong type or a missing
        # required one (epsilon and delta have no default).
        text += (" (dpsql: pass tables and columns as quoted strings, numbers such as epsilon := 1.0 unquoted,"
                 " and always epsilon and delta)")
    return f"Error: {text}"


def error_text(exc: BaseException) -> str:
    """:func:`error_line`, followed by the ``LINE n: ...`` excerpt and its ``^`` marker when DuckDB gave one
    (a parser, binder or catalog error points at the SQL text the user typed). A dpsql error is one line."""
    line = error_line(exc)
    if from_engine(exc) is not exc:
        return line
    lines = str(exc).splitlines()
    start = next((i for i, text in enumerate(lines) if text.startswith("LINE ")), None)
    if start is None:
        return line
    excerpt = [text.rstrip() for text in lines[start:start + 2]]
    return "\n".join([line, *excerpt])


# Errors found while binding a statement: DuckDB's relation API reports them without the excerpt that
# running the same text as a statement adds.
_BIND_ERRORS = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException)
_CONTEXT_PREFIX = "PREPARE dpsql_shell_error_context AS\n"
_LINE_NUMBER = re.compile(r"^LINE (\d+):", re.M)


def _with_context(exc: duckdb.Error, con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Error:
    """``exc`` with DuckDB's excerpt of ``sql`` where the error is, found by preparing ``sql`` again.

    Only called for an error raised while binding: nothing has run. PREPARE binds and never executes; its
    own line is the first, so the excerpt's line numbers are shifted back by one.
    """
    try:
        prepared = duckdb.extract_statements(sql)
    except duckdb.Error:
        return exc
    if len(prepared) != 1:
        return exc
    try:
        con.execute(_CONTEXT_PREFIX + sql)
    except duckdb.Error as again:
        text = str(again)
        head = str(exc).split("\n", 1)[0]
        found = _LINE_NUMBER.search(text)
        if text.split("\n", 1)[0] != head or found is None or int(found.group(1)) < 2:
            return exc
        excerpt = _LINE_NUMBER.sub(lambda m: f"LINE {int(m.group(1)) - 1}:", text[found.start():])
        return type(exc)(f"{exc}\n\n{excerpt}")
    else:  # binding succeeded this time: keep the error as it came
        with contextlib.suppress(duckdb.Error):
            con.execute("DEALLOCATE dpsql_shell_error_context")
    return exc


# --------------------------------------------------------------------------
# Drawing results
# --------------------------------------------------------------------------

# Statements whose result is the engine's bare report ("Count" or "Success"),
# not rows the user asked for: nothing is printed for them, as in DuckDB's CLI.
_REPORT_COLUMNS = (["Count"], ["Success"])


def _query_only(statement: duckdb.Statement) -> bool:
    return list(statement.expected_result_type) == [duckdb.ExpectedResultType.QUERY_RESULT]


def _texts(rows: duckdb.DuckDBPyRelation) -> list[tuple[Any, ...]]:
    """Every value as DuckDB writes it (None for NULL), so numbers read as in duckbox and in COPY."""
    return rows.select("CAST(COLUMNS(*) AS VARCHAR)").fetchall()


def _csv_field(value: Optional[str]) -> str:
    # NULL is an empty field and '' a quoted one, as DuckDB's COPY writes them.
    if value is None:
        return ""
    if value == "" or any(c in value for c in ',"\r\n'):
        return '"' + value.replace('"', '""') + '"'
    return value


def _json_value(text: Optional[str]) -> str:
    if text is None:
        return "null"
    # JSON has no NaN or infinities: keep them as strings rather than write invalid JSON.
    return json.dumps(text) if text in ("NaN", "Infinity", "-Infinity") else text


def _json_objects(rows: duckdb.DuckDBPyRelation, names: list[str]) -> list[str]:
    keys = [json.dumps(name) for name in names]
    return ["{" + ",".join(f"{k}:{_json_value(v)}" for k, v in zip(keys, row)) + "}"
            for row in rows.select("to_json(COLUMNS(*))").fetchall()]


def _markdown_cell(value: Optional[str]) -> str:
    text = "NULL" if value is None else value
    return text.replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def _grid_cell(value: Optional[str], null: str) -> str:
    # A line break inside a cell would break the grid: shown as \n, as in markdown's <br>.
    return null if value is None else value.replace("\r\n", "\\n").replace("\n", "\\n")


def _grid(names: list[str], values: list[tuple[Any, ...]], null: str, box: bool) -> str:
    """``table`` (ASCII) or ``box`` (line drawing) mode: every row, names centred, values left-aligned."""
    cells = [[_grid_cell(v, null) for v in line] for line in values]
    widths = [max([len(h), *(len(line[i]) for line in cells)]) for i, h in enumerate(names)]
    if box:
        top, middle, bottom, bar = ("┌", "┬", "┐", "─"), ("├", "┼", "┤", "─"), ("└", "┴", "┘", "─"), "│"
    else:
        top = middle = bottom = ("+", "+", "+", "-")
        bar = "|"

    def rule(left: str, cross: str, right: str, line: str) -> str:
        return left + cross.join(line * (w + 2) for w in widths) + right

    def row(texts: list[str], center: bool = False) -> str:
        return bar + bar.join(" " + (t.center(w) if center else t.ljust(w)) + " " for t, w in zip(texts, widths)) + bar

    lines = [rule(*top), row(names, center=True), rule(*middle), *(row(line) for line in cells), rule(*bottom)]
    return "\n".join(lines) + "\n"


def render(rows: duckdb.DuckDBPyRelation, names: list[str], mode: str, *, max_rows: int,
           max_width: Optional[int] = None, headers: bool = True, null: Optional[str] = None,
           separator: Optional[str] = None, row_separator: str = "\n") -> str:
    """The text of a held result in ``mode`` (one of :data:`MODES`); duckbox shows ``max_rows`` rows.

    ``headers``: the names line of csv, list and tabs. ``null``: how NULL is written (default: an empty
    field in csv, list and tabs, else NULL). ``separator`` and ``row_separator``: between the fields and
    after the rows of csv, list and tabs (default: the mode's, see ``.separator``).
    """
    if mode == "duckbox":
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):  # the renderer prints; keep its text for our stream
            rows.show(max_rows=max_rows, max_width=max_width, max_col_width=max_width,
                      null_value="NULL" if null is None else null)
        return buffer.getvalue().rstrip("\n") + "\n"
    if mode == "json":
        objects = _json_objects(rows, names)
        return "[" + ",\n".join(objects) + "]\n"
    if mode == "jsonlines":
        return "".join(o + "\n" for o in _json_objects(rows, names))
    values = _texts(rows)
    if mode in _SEPARATORS:
        sep = _SEPARATORS[mode] if separator is None else separator
        lines = [tuple(names), *values] if headers else values
        if mode == "csv":
            def field(v: Optional[str]) -> str:
                if v is None:
                    return "" if null is None else null
                # quoted when it holds the separator, a quote or a line break (COPY's rule, any separator)
                if v == "" or sep in v or any(c in v for c in '"\r\n'):
                    return '"' + v.replace('"', '""') + '"'
                return v
        else:
            def field(v: Optional[str]) -> str:
                return ("" if null is None else null) if v is None else v
        return "".join(sep.join(field(v) for v in line) + row_separator for line in lines)
    shown = "NULL" if null is None else null
    if mode in ("table", "box"):
        return _grid(names, values, shown, box=mode == "box")
    if mode == "markdown":
        cells = [[_markdown_cell(shown if v is None else v) for v in line] for line in values]
        heads = [_markdown_cell(n) for n in names]
        widths = [max([3, len(h), *(len(line[i]) for line in cells)]) for i, h in enumerate(heads)]
        table = ["| " + " | ".join(h.center(w) for h, w in zip(heads, widths)) + " |",
                 "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        table += ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in cells]
        return "\n".join(table) + "\n"
    if mode == "line":
        width = max([5, *(len(n) for n in names)])
        blocks = ["".join(f"{n:>{width}} = {shown if v is None else v}\n" for n, v in zip(names, line))
                  for line in values]
        return "\n".join(blocks)
    raise ParameterError(f"unknown output mode {mode!r}; use one of {', '.join(MODES)}")


# --------------------------------------------------------------------------
# The shell
# --------------------------------------------------------------------------

TABLES_SQL = """
SELECT CASE WHEN table_catalog = current_database() AND table_schema = current_schema() THEN table_name
            ELSE table_catalog || '.' || table_schema || '.' || table_name END AS name,
       CASE table_type WHEN 'VIEW' THEN 'view' ELSE 'table' END AS kind
FROM information_schema.tables
WHERE table_schema NOT IN ('information_schema', 'pg_catalog')
ORDER BY table_catalog = current_database() DESC, name
"""

SCHEMA_SQL = """
SELECT sql FROM (
    SELECT database_name AS d, schema_name AS s, table_name AS n, 0 AS k, sql FROM duckdb_tables()
    WHERE NOT internal AND ($1 IS NULL OR table_name ILIKE $1)
    UNION ALL
    SELECT database_name, schema_name, view_name, 1, sql FROM duckdb_views()
    WHERE NOT internal AND ($1 IS NULL OR view_name ILIKE $1)
    UNION ALL
    SELECT database_name, schema_name, table_name, 2, sql FROM duckdb_indexes()
    WHERE sql IS NOT NULL AND ($1 IS NULL OR table_name ILIKE $1 OR index_name ILIKE $1))
WHERE sql IS NOT NULL
ORDER BY d = current_database() DESC, d, s, n, k
"""


class Shell:
    """Feeds lines of input to a connection and draws the results.

    ``interactive``: a person at a prompt (errors never end the session).
    ``bail``: a script (-c, standard input, ``.read``) stops at its first error.
    ``width``: returns the terminal's width for duckbox (asked at each result, as the window may
    change), or None for the renderer's default.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, *, interactive: bool, bail: bool = False,
                 mode: str = "duckbox", out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                 width: Optional[Callable[[], int]] = None, ledger_file: Optional[Path] = None):
        self.con = con
        self.ledger_file = ledger_file  # --ledger: the ledger every database .open opens is charged to
        self.headers = True
        self.null: Optional[str] = None        # .nullvalue (None: the mode's own)
        self.separator: Optional[str] = None   # .separator (None: the mode's own)
        self.row_separator = "\n"
        self.echo = False
        self._once: Optional[int] = None        # .once: the .read depth whose next command ends it
        self.interactive = interactive
        self.bail = bail
        self.mode = mode
        self.maxrows = DEFAULT_MAXROWS
        self.timer = False
        self.width = width
        self.stdout = out
        self.out = out            # where results go (.output FILE changes it)
        self.output_name: Optional[str] = None
        self.err = err
        self.ledger = state.ledger_of(con)
        self.buffer: list[str] = []
        self.errors = 0
        self.interrupted = False
        self.done = False
        self.exit_code: Optional[int] = None  # .exit CODE / .quit CODE: the process's exit code
        self._depth = 0
        self._noted_files: set[str] = set()
        # The prompt's completer (interactive sessions): told when a statement may have changed the catalog.
        self.completer: Optional["SqlCompleter"] = None

    @property
    def failed(self) -> bool:
        return self.errors > 0

    @property
    def pending(self) -> bool:
        """Whether an unfinished statement is waiting for more lines."""
        return bool(self.buffer)

    # -- input --------------------------------------------------------------------------------
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
            self._end_once()

    @staticmethod
    def leaves_pending(text: str) -> bool:
        """Whether feeding ``text`` line by line would leave an unfinished statement (the prompt's Enter rule)."""
        buffer: list[str] = []
        for line in text.split("\n"):
            if not buffer and (not line.strip() or line.strip().startswith(".")):
                continue
            buffer.append(line)
            if is_complete("\n".join(buffer)):
                buffer = []
        return bool(buffer)

    def feed_entry(self, text: str) -> None:
        """Take one entry of the prompt (one or more lines); run it all, an unfinished last statement too."""
        for line in text.split("\n"):
            self.feed(line)
            if self.done:
                self.buffer = []
                return
        self.finish()

    def feed_all(self, lines: Iterable[str]) -> None:
        """Feed a script's lines; stop at ``.quit``, an interrupt, or (with bail) its first error."""
        errors = self.errors
        for line in lines:
            self.feed(line.rstrip("\r\n"))
            if self.done or (self.bail and self.errors > errors):
                self.buffer = []
                return
        self.finish()

    def finish(self) -> None:
        """At the end of input run what is left, even without a final ``;``."""
        text = "\n".join(self.buffer)
        self.buffer = []
        if text.strip():
            self.run(text)
            self._end_once()

    def cancel(self) -> None:
        """Forget an unfinished statement (Ctrl-C at the prompt)."""
        self.buffer = []

    # -- statements ---------------------------------------------------------------------------
    def run(self, text: str) -> bool:
        """Run every statement of ``text`` in order, stopping at the first error."""
        for sql in split_statements(text):
            try:
                self.execute(sql)
            except KeyboardInterrupt:
                self._interrupted()
                return False
            except Exception as exc:  # every failure is reported as one line, never a traceback
                if _is_interrupt(exc):
                    self._interrupted()
                else:
                    self._error(self._error_text(sql, exc))
                return False
        return True

    def _error_text(self, sql: str, exc: BaseException) -> str:
        """:func:`error_text`, except for a release (a statement that calls one) failing on a value of the data
        (a view's cast, a file's line): then its kind only, as dpsql's Python functions show it. A statement
        that releases nothing shows DuckDB's message whole, as the DuckDB CLI does."""
        if isinstance(exc, duckdb.Error) and quotes_data(exc):
            try:
                releases = bigquery.is_dp_query(sql) or called(sql, release_macros(self.con)) is not None
            except Exception:  # the catalog cannot be read (e.g. the connection is gone): hide it
                releases = True
            if releases:
                return f"Error: {data_error(exc)}"
        return error_text(exc)

    def _interrupted(self) -> None:
        self.interrupted = True
        self._error("Error: interrupted")
        if not self.interactive:  # Ctrl-C ends a script, -bail or not
            self.done = True

    def execute(self, sql: str) -> None:
        """Run one statement and draw its rows (nothing for DDL and DML)."""
        if self.echo:
            self._emit(sql + ";\n", charged=False)
        # BigQuery's SELECT WITH DIFFERENTIAL_PRIVACY is no DuckDB statement: translated, it runs as one release
        dp = bigquery.is_dp_query(sql)
        parsed = [] if dp else duckdb.extract_statements(sql)
        if not dp and not parsed:  # only comments
            return
        started, cpu = time.perf_counter(), os.times()
        try:
            # Ctrl-C while the statement runs and its rows are drawn is recorded, not raised: before the
            # charge it stops the statement (nothing charged), after it the release is finished and shown.
            with runner.Interrupts(notice=self._say) as ctrl_c:
                held = runner.run(self.con, (lambda: self._compute_dp(sql)) if dp else
                                  (lambda: self._compute(sql, parsed[-1])), interrupts=ctrl_c)
                if held is not None:
                    self._show(held, charged=ctrl_c.charged)
            if ctrl_c.requested and not self.interactive:  # Ctrl-C came as the statement ended: the script stops
                self.interrupted = self.done = True
        finally:
            if self.completer is not None and parsed and parsed[-1].type not in _KEEPS_CATALOG:
                self.completer.invalidate()
            if self.timer:
                self._print_timer(started, cpu)

    def _show(self, held: tuple[Any, ...], charged: bool) -> None:
        if held[0] == "plan":
            self._emit(held[1], charged=False)
            return
        _, names, rows = held
        try:
            text = self._draw(rows, names, charged)
        except Exception:
            if not charged:
                raise
            # A charged release must reach the user; the engine's message could quote a value.
            self._error(f"Error: dpsql: the release could not be drawn in {self.mode} mode; its rows "
                        f"follow as plain CSV")
            text = "".join(",".join(_csv_field(None if v is None else str(v)) for v in line) + "\n"
                           for line in [tuple(names), *rows.fetchall()])
        self._emit(text, charged=charged)
        if charged:
            self._note_file_releases()

    def _compute(self, sql: str, last: duckdb.Statement) -> Optional[tuple[Any, ...]]:
        """Run ``sql`` and hold its rows (in the worker thread): None, ("plan", text) or ("rows", names, rows)."""
        try:
            relation = self.con.sql(sql)
        except _BIND_ERRORS as exc:
            if "\nLINE " in str(exc):
                raise
            raise _with_context(exc, self.con, sql) from exc
        if relation is None or (not _query_only(last) and relation.columns in _REPORT_COLUMNS):
            return None
        if last.type == duckdb.StatementType.EXPLAIN and relation.columns == ["explain_key", "explain_value"]:
            # A plan is drawn text; inside a table cell its line breaks would show as "\n".
            return "plan", "".join(str(plan).rstrip("\n") + "\n" for _, plan in relation.fetchall())
        names = list(relation.columns)
        # Read once and hold: every drawing reads the held rows, never the query again.
        return "rows", names, relation.materialize()

    def _compute_dp(self, sql: str) -> Optional[tuple[Any, ...]]:
        """Run a differential-privacy statement (:mod:`dpsql.groupby.bigquery`) and hold its released rows."""
        table = bigquery.sql(self.con, sql)
        return "rows", list(table.column_names), self.con.from_arrow(table)

    def _draw(self, rows: duckdb.DuckDBPyRelation, names: list[str], charged: bool) -> str:
        if self.mode != "duckbox" or not charged:
            return render(rows, names, self.mode, max_rows=self.maxrows,
                          max_width=self.width() if self.width else None, headers=self.headers, null=self.null,
                          separator=self.separator, row_separator=self.row_separator)
        # A release is shown whole (its rows exist once: running it again would be another release).
        count = rows.shape[0]
        if count > _BOX_ROWS:
            self._say(f"dpsql: this release has {count} rows, more than a box can show: printed as CSV so "
                      f"that none is lost (use .mode csv and .output FILE for large releases)")
            return render(rows, names, "csv", max_rows=count)
        return render(rows, names, "duckbox", max_rows=max(count, 1), max_width=_HUGE, null=self.null)

    def _note_file_releases(self) -> None:
        """Say once per file when an in-memory ledger took a release that read a file (see the module doc)."""
        if self.ledger.path is not None:
            return
        for release in self.ledger.releases():
            scope = release.table
            if os.path.isabs(scope) and scope not in self._noted_files:
                self._noted_files.add(scope)
                self._say(f"dpsql: note: this release read {scope} and was charged to this session's "
                          f"in-memory ledger, which is forgotten at exit. 'dpsql set-union' charges "
                          f"{scope}{ledger_mod.LEDGER_SUFFIX}; start the shell with --ledger "
                          f"{scope}{ledger_mod.LEDGER_SUFFIX} to charge that ledger")

    def _print_timer(self, started: float, cpu: os.times_result) -> None:
        now = os.times()
        self.stdout.write(f"Run Time (s): real {time.perf_counter() - started:.3f} "
                          f"user {now.user - cpu.user:.6f} sys {now.system - cpu.system:.6f}\n")
        self.stdout.flush()

    def _emit(self, text: str, *, charged: bool) -> None:
        """Write a result; a release whose --output write fails is printed on stdout instead."""
        try:
            self.out.write(text)
            self.out.flush()
        except OSError as exc:
            if self.out is self.stdout:
                raise
            name = self.output_name
            self._close_output()
            self._error(f"Error: dpsql: could not write to .output {name!r} ({exc.strerror or exc}); "
                        f"results go to stdout again" + ("; the release is printed there" if charged else ""))
            if charged:
                self.stdout.write(text)
                self.stdout.flush()

    def _say(self, line: str) -> None:
        self.out.flush()
        print(line, file=self.err, flush=True)

    def _error(self, line: str) -> None:
        self._say(line)
        self.errors += 1

    # -- dot commands -------------------------------------------------------------------------
    def dot_command(self, line: str) -> None:
        """Handle one dot command (see HELP)."""
        if self.echo:
            self._emit(line + "\n", charged=False)
        command, _, rest = line.partition(" ")
        command, arg = command.lower(), rest.strip()
        handler = _DOT_COMMANDS.get(command)
        if handler is None:
            self._error(f"Error: dpsql: unknown command {command!r}; enter .help for the list")
            return
        once = self._once == self._depth
        handler(self, arg)
        if once:  # the command after .once has written its output
            self._end_once()

    def _end_once(self) -> None:
        if self._once == self._depth:
            self._once = None
            self._close_output()

    @staticmethod
    def dot_command_names() -> list[str]:
        return sorted(_DOT_COMMANDS)

    def _quit(self, arg: str) -> None:
        # As the DuckDB CLI: `.exit CODE` leaves with that exit code (an integer 0-255).
        if arg:
            try:
                code = int(arg)
            except ValueError:
                code = -1
            if not 0 <= code <= 255:
                self._error(f"Error: dpsql: .exit takes an exit code, an integer from 0 to 255 (got {arg!r})")
                return
            self.exit_code = code
        self.done = True

    def _help(self, arg: str) -> None:
        ledger = str(self.ledger.path) if self.ledger.path else "in memory, forgotten at exit"
        print(HELP.format(methods=", ".join(dpsql.METHODS), default=dpsql.DEFAULT_METHOD, ledger=ledger,
                          modes=", ".join(MODES), maxrows=DEFAULT_MAXROWS), file=self.stdout, flush=True)

    def _tables(self, arg: str) -> None:
        try:
            names = self.con.sql(TABLES_SQL).fetchall()
        except Exception as exc:
            self._error(error_line(exc))
            return
        self._emit("".join((name if kind == "table" else f"{name} (view)") + "\n" for name, kind in names),
                   charged=False)

    def _schema(self, arg: str) -> None:
        pattern = _unquote(arg) if arg else None
        try:
            statements = self.con.execute(SCHEMA_SQL, [pattern]).fetchall()
        except Exception as exc:
            self._error(error_line(exc))
            return
        if pattern is not None and not statements:
            self._error(f"Error: dpsql: .schema: no table, view or index matches {pattern!r} "
                        f"(a LIKE pattern; .tables lists them)")
            return
        self._emit("".join(sql.rstrip().rstrip(";") + ";\n" for (sql,) in statements), charged=False)

    def _mode(self, arg: str) -> None:
        if not arg:
            print(f"current output mode: {self.mode}", file=self.stdout, flush=True)
            return
        mode = arg.split()[0].lower()
        if mode not in MODES:
            self._error(f"Error: dpsql: .mode {mode!r} is not supported; use one of {', '.join(MODES)}")
            return
        self.mode = mode
        self.separator, self.row_separator = None, "\n"  # each mode starts with its own separators

    def _output(self, arg: str, command: str = ".output") -> bool:
        if not arg:
            self._close_output()
            return False
        name = _unquote(arg)
        if self._is_ledger(name):
            # Opening it for writing would empty it: every budget and release it holds would be lost.
            self._error(f"Error: dpsql: {command} {name!r} is a privacy ledger (a *{ledger_mod.LEDGER_SUFFIX} file, "
                        f"this session's ledger, or a file holding one); writing results there would destroy its "
                        f"budgets and releases. Name another file; results still go to "
                        f"{self.output_name or 'stdout'}")
            return False
        try:
            stream = open(name, "w", encoding="utf-8", newline="")
        except OSError as exc:
            self._error(f"Error: dpsql: {command}: cannot write {name!r} ({exc.strerror or exc}); "
                        f"results still go to {self.output_name or 'stdout'}")
            return False
        self._close_output()
        self.out, self.output_name = stream, name
        return True

    def _once_to(self, arg: str) -> None:
        if not arg:
            self._error("Error: dpsql: .once needs a FILE, e.g. .once result.csv (the next command's output goes there)")
            return
        if self._output(arg, ".once"):
            self._once = self._depth

    def _nullvalue(self, arg: str) -> None:
        # .nullvalue alone: back to each mode's own (an empty field in csv, list and tabs, NULL elsewhere)
        self.null = _unescape(_unquote(arg)) if arg else None

    def _separator(self, arg: str) -> None:
        words = _words(arg)
        if not 1 <= len(words) <= 2:
            self._error(r"Error: dpsql: .separator takes a COLUMN separator and optionally a ROW one, e.g. "
                        r".separator ';' or .separator '\t' '\n'")
            return
        self.separator = _unescape(words[0])
        if len(words) == 2:
            self.row_separator = _unescape(words[1])

    def _print(self, arg: str) -> None:
        self._emit(" ".join(_unescape(word) for word in _words(arg)) + "\n", charged=False)

    def _databases(self, arg: str) -> None:
        try:
            found = self.con.sql("SELECT database_name, path, readonly FROM duckdb_databases() WHERE NOT internal "
                                 "ORDER BY database_name = current_database() DESC, database_name").fetchall()
        except Exception as exc:
            self._error(error_line(exc))
            return
        self._emit("".join(name + (f": {path}" if path else "") + (" (read-only)" if readonly else "") + "\n"
                           for name, path, readonly in found), charged=False)

    def _open(self, arg: str) -> None:
        """``.open [-readonly] [FILE]``: the session goes on with FILE (no FILE: a new in-memory database),
        dpsql registered on it, charging the ledger the rule of the module docstring gives."""
        words = _words(arg)
        readonly = bool(words) and words[0].lower() in ("-readonly", "--readonly")
        if readonly:
            words = words[1:]
        if len(words) > 1:
            self._error("Error: dpsql: .open takes one FILE (quote a name with spaces), e.g. .open events.duckdb")
            return
        database = _unquote(words[0]) if words else ":memory:"
        if readonly and database == ":memory:":
            self._error("Error: dpsql: .open -readonly needs a FILE (an in-memory database is always writable)")
            return
        if database != ":memory:" and self._is_ledger(database):
            self._error(f"Error: dpsql: .open {database!r} is a privacy ledger, not a database; open the "
                        f"database it belongs to")
            return
        try:
            con = dpsql.connect(database, read_only=readonly, ledger=session_ledger(database, self.ledger_file))
        except Exception as exc:  # the session stays on the database it had
            self._error(error_line(exc))
            return
        old, self.con = self.con, con
        with contextlib.suppress(duckdb.Error):
            old.close()
        self.ledger = state.ledger_of(con)
        self._noted_files = set()
        if self.completer is not None:
            self.completer.invalidate(con)
        if self.interactive:
            ledger = self.ledger.path or "an in-memory ledger, forgotten at exit"
            self._say(f"dpsql: opened {database}; releases are charged to {ledger}")

    def _import(self, arg: str) -> None:
        """``.import FILE TABLE``: FILE's rows (DuckDB's CSV, Parquet or JSON reader, by its extension) into
        TABLE, created from the file if it does not exist."""
        words = _words(arg)
        if len(words) != 2:
            self._error("Error: dpsql: .import takes FILE TABLE, e.g. .import events.csv events")
            return
        name, table = _unquote(words[0]), words[1]
        if not os.path.exists(name) and not any(c in name for c in "*?["):
            self._error(f"Error: dpsql: .import: no file {name!r}")
            return
        lower = name.lower()
        reader = ("read_parquet" if lower.endswith(".parquet") else
                  "read_json_auto" if lower.endswith((".json", ".jsonl", ".ndjson")) else "read_csv")
        source = f"{reader}({_string_literal(name)})"
        target = table if _QUALIFIED_NAME.fullmatch(table) else _identifier(_unquote(table))
        try:  # bound, never run: TABLE could be a view over a release
            self.con.sql(f"FROM {target}")
            exists = True
        except duckdb.Error:
            exists = False
        self.run(f"INSERT INTO {target} SELECT * FROM {source};" if exists else
                 f"CREATE TABLE {target} AS SELECT * FROM {source};")

    def _dump(self, arg: str) -> None:
        """``.dump [PATTERN]``: SQL that rebuilds this database's tables (CREATE TABLE, then one INSERT per
        row) and views, those whose names match the LIKE ``PATTERN``."""
        pattern = _unquote(arg) if arg else None
        try:
            objects = self.con.execute(_DUMP_SQL, [pattern]).fetchall()
            self._emit("BEGIN TRANSACTION;\n", charged=False)
            for kind, schema, name, sql in objects:
                self._emit(sql.rstrip().rstrip(";") + ";\n", charged=False)
                if kind != "table":
                    continue
                columns = self.con.execute(
                    "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
                    "AND schema_name = ? AND table_name = ? ORDER BY column_index", [schema, name]).fetchall()
                values = " || ', ' || ".join(_literal_sql(column, data_type) for column, data_type in columns)
                target = _identifier(name) if schema == "main" else f"{_identifier(schema)}.{_identifier(name)}"
                result = self.con.execute(f"SELECT {_string_literal('INSERT INTO ' + target + ' VALUES(')} || "
                                          f"{values} || ');' FROM {target}")
                while batch := result.fetchmany(10_000):
                    self._emit("".join(line + "\n" for (line,) in batch), charged=False)
            self._emit("COMMIT;\n", charged=False)
        except duckdb.Error as exc:
            self._error(error_line(exc))

    def _is_ledger(self, name: str) -> bool:
        """Whether ``name`` is a ledger (or one of its SQLite journals): by its name, as this session's
        ledger under any path (a link to it included), or by its content (a dpsql ledger's tables)."""
        suffix = re.compile(re.escape(ledger_mod.LEDGER_SUFFIX) + r"(-journal|-wal|-shm)?$", re.IGNORECASE)
        if suffix.search(name) or suffix.search(os.path.realpath(name)):
            return True
        own = self.ledger.path
        if own is not None and os.path.realpath(name) == os.path.realpath(own):
            return True
        try:
            if own is not None and os.path.samefile(name, own):
                return True
            with open(name, "rb") as f:
                if f.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
                    return False
            db = sqlite3.connect(Path(name).resolve().as_uri() + "?mode=ro", uri=True)
            try:
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            finally:
                db.close()
            return {"budgets", "releases"} <= tables
        except (OSError, sqlite3.Error):  # no such file (yet), or no SQLite database: not a ledger
            return False

    def _close_output(self) -> None:
        if self.out is not self.stdout:
            try:
                self.out.close()
            except OSError:
                pass
        self.out, self.output_name = self.stdout, None

    def _maxrows(self, arg: str) -> None:
        if not arg:
            print(f"current max rows: {self.maxrows}", file=self.stdout, flush=True)
            return
        try:
            value = int(arg)
        except ValueError:
            value = 0
        if value < 1:
            self._error(f"Error: dpsql: .maxrows needs a whole number of rows >= 1 (got {arg!r}), "
                        f"e.g. .maxrows 100")
            return
        self.maxrows = value

    def _switch(self, name: str, arg: str) -> Optional[bool]:
        value = {"on": True, "off": False, "1": True, "0": False, "true": True, "false": False}.get(arg.lower())
        if value is None:
            self._error(f"Error: dpsql: {name} needs on or off (got {arg!r})")
        return value

    def _set_switch(self, attr: str, arg: str) -> None:
        """``.<attr> on|off`` (.headers, .echo, .timer, .bail): set the shell's ``attr``."""
        value = self._switch("." + attr, arg)
        if value is not None:
            setattr(self, attr, value)

    def _read(self, arg: str) -> None:
        if not arg:
            self._error("Error: dpsql: .read needs a FILE, e.g. .read setup.sql")
            return
        name = _unquote(arg)
        if self._depth >= _MAX_READ_DEPTH:
            self._error(f"Error: dpsql: .read {name!r}: files read each other more than {_MAX_READ_DEPTH} "
                        f"levels deep; is a file reading itself?")
            return
        try:
            with open(name, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._error(f"Error: dpsql: .read: cannot read {name!r} ({reason})")
            return
        saved, self.buffer = self.buffer, []
        self._depth += 1
        try:
            self.feed_all(text.splitlines())
        finally:
            self._depth -= 1
            self.buffer = saved


    def _budget(self, arg: str) -> None:
        """``.budget [show] | set SCOPE EPSILON DELTA | remove SCOPE``: through dp_budget(), dp_set_budget() and
        dp_remove_budget(), so the checks and the ledger are those of SQL (the ledger this session charges)."""
        words = _words(arg)
        action = words[0].lower() if words else "show"
        usage = ("Error: dpsql: .budget takes show, set SCOPE EPSILON DELTA or remove SCOPE, e.g. "
                 ".budget set my_table 1.0 1e-5 (a SCOPE with spaces or dots in one name: \"My Table\")")
        if action == "show" and len(words) <= 1:
            self.run("FROM dp_budget();")
            return
        if action == "set" and len(words) == 4:
            try:
                epsilon, delta = float(words[2]), float(words[3])
            except ValueError:
                self._error(f"Error: dpsql: .budget set: EPSILON and DELTA must be numbers (got {words[2]!r}, "
                            f"{words[3]!r}), e.g. .budget set my_table 1.0 1e-5")
                return
            self._budget_change("SELECT dp_set_budget(?, ?, ?)", [words[1], epsilon, delta], "set")
            return
        if action == "remove" and len(words) == 2:
            self._budget_change("SELECT dp_remove_budget(?)", [words[1]], "removed")
            return
        self._error(usage)

    def _budget_change(self, sql: str, params: list[Any], done: str) -> None:
        try:
            ((change,),) = self.con.execute(sql, params).fetchall()
        except Exception as exc:
            self._error(error_line(exc))
            return
        if change["note"]:
            self._say(f"dpsql: warning: {change['note']}")
        if done == "removed" and change["note"]:
            return  # it had no budget: the warning says so
        ledger = change["ledger"] or "the in-memory ledger"
        releases = f"{change['releases']} release" + ("" if change["releases"] == 1 else "s")
        if done == "set":
            text = (f"budget of scope '{change['scope']}' set to epsilon={change['epsilon_budget']:g}, "
                    f"delta={change['delta_budget']:g} in {ledger}: spent epsilon={change['epsilon_spent']:g}, "
                    f"delta={change['delta_spent']:g} ({releases}); remaining "
                    f"epsilon={change['epsilon_remaining']:g}, delta={change['delta_remaining']:g}\n")
        else:
            text = f"budget of scope '{change['scope']}' removed from {ledger} ({releases} stay charged)\n"
        self._emit(text, charged=False)


def _switch_command(attr: str) -> Callable[[Shell, str], None]:
    return lambda shell, arg: shell._set_switch(attr, arg)


_DOT_COMMANDS: dict[str, Callable[[Shell, str], Any]] = {
    ".quit": Shell._quit, ".exit": Shell._quit, ".q": Shell._quit,
    ".help": Shell._help, ".tables": Shell._tables, ".schema": Shell._schema, ".mode": Shell._mode,
    ".output": Shell._output, ".once": Shell._once_to, ".maxrows": Shell._maxrows,
    ".timer": _switch_command("timer"), ".bail": _switch_command("bail"), ".read": Shell._read,
    ".budget": Shell._budget, ".headers": _switch_command("headers"), ".header": _switch_command("headers"),
    ".nullvalue": Shell._nullvalue, ".separator": Shell._separator, ".print": Shell._print,
    ".echo": _switch_command("echo"), ".databases": Shell._databases, ".open": Shell._open,
    ".import": Shell._import, ".dump": Shell._dump,
}

# A table name .import uses as written: a plain or dotted name (schema.table); anything else is quoted.
_QUALIFIED_NAME = re.compile(r'(?:[A-Za-z_]\w*|"(?:[^"]|"")+")(?:\.(?:[A-Za-z_]\w*|"(?:[^"]|"")+"))*')

_DUMP_SQL = """
SELECT kind, s, n, sql FROM (
    SELECT 'table' AS kind, schema_name AS s, table_name AS n, 0 AS k, sql FROM duckdb_tables()
    WHERE NOT internal AND NOT temporary AND database_name = current_database()
      AND ($1 IS NULL OR table_name ILIKE $1)
    UNION ALL
    SELECT 'view', schema_name, view_name, 1, sql FROM duckdb_views()
    WHERE NOT internal AND NOT temporary AND database_name = current_database()
      AND ($1 IS NULL OR view_name ILIKE $1))
WHERE sql IS NOT NULL
ORDER BY k, s, n
"""

# .dump writes numbers and booleans as they are, every other value as a string literal that DuckDB casts back
# to the column's type on INSERT (dates, lists, structs, ...), and NaN and infinities as strings too.
_NUMERIC = re.compile(r"TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|UTINYINT|USMALLINT|UINTEGER|UBIGINT|UHUGEINT"
                      r"|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\)|BOOLEAN")


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _string_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _literal_sql(column: str, data_type: str) -> str:
    """SQL for the text of ``column``'s value as a literal of an INSERT statement."""
    value = _identifier(column)
    text = f"CAST({value} AS VARCHAR)"
    quoted = f"'''' || replace({text}, '''', '''''') || ''''"
    if _NUMERIC.fullmatch(data_type):
        quoted = f"CASE WHEN {text} IN ('nan', 'inf', '-inf') THEN {quoted} ELSE {text} END"
    return f"CASE WHEN {value} IS NULL THEN 'NULL' ELSE {quoted} END"


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}


def _unescape(text: str) -> str:
    r"""A dot command's argument with the escapes \t, \n, \r and \\ read, as DuckDB's CLI reads them."""
    return re.sub(r"\\([tnr\\])", lambda m: _ESCAPES[m.group(1)], text)


# Statements after which the prompt's completion names need not be read again.
_KEEPS_CATALOG = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.INSERT,
                            duckdb.StatementType.UPDATE, duckdb.StatementType.DELETE})


def _is_interrupt(exc: Exception) -> bool:
    # Ctrl-C while the engine runs comes back as the engine's interrupt error, not as KeyboardInterrupt.
    return isinstance(exc, duckdb.InterruptException) or str(exc).strip() == "Query interrupted"


# A dot command's arguments: words separated by spaces; '...' is one word without its quotes, and a "..."
# part is kept with its quotes (a quoted identifier: "My Table", "d.e" is one name, as in SQL).
_WORDS = re.compile(r"""'([^']*)'|((?:"(?:[^"]|"")*"|[^\s"'])+)""")


def _words(text: str) -> list[str]:
    return [m.group(1) if m.group(1) is not None else m.group(2) for m in _WORDS.finditer(text)]


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

def banner(shell: Shell, database: str) -> str:
    """The first lines of an interactive session: versions, database, and the ledger it charges."""
    if shell.ledger.path is None:
        ledger = ("Releases are charged to an in-memory ledger, forgotten at exit "
                  "(--ledger FILE keeps one; .help explains the rule).")
    else:
        ledger = f"Releases are charged to the ledger {shell.ledger.path}."
    return (f"dpsql {dpsql.__version__} (DuckDB {duckdb.__version__}) on {database}.\n{ledger}\n"
            "Enter .help for help, .quit or Ctrl-D to leave.")


def _interactive(shell: Shell, database: str) -> None:
    from dpsql.frontends import prompt  # prompt_toolkit is imported only for a person at a terminal

    print(banner(shell, database), file=shell.stdout, flush=True)
    prompt.read_entries(shell, HISTORY_FILE, PROMPT, CONTINUATION)
    if not shell.done:  # Ctrl-D: end the prompt's line, as a terminal shell does
        print(file=shell.stdout)


def _ledger_path(ledger: Optional[str]) -> Optional[Path]:
    """The --ledger file, checked: its folder exists and it is no data file (a typo must not clobber data)."""
    if ledger is None:
        return None
    path = Path(ledger)
    if not path.parent.is_dir():
        raise ParameterError(f"dpsql: --ledger {ledger!r}: folder {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise ParameterError(f"dpsql: --ledger {ledger!r} is a folder; name a ledger file, e.g. "
                             f"{str(path / ('data' + ledger_mod.LEDGER_SUFFIX))!r}")
    try:
        head = b""
        if path.is_file() and path.stat().st_size > 0:
            with open(path, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise LedgerIOError(f"dpsql: --ledger {ledger!r} cannot be read ({exc.strerror or exc}); make it readable "
                            f"or name another ledger file") from exc
    if head and head != _SQLITE_MAGIC:
        raise ParameterError(f"dpsql: --ledger {ledger!r} is not a dpsql ledger (a data file?); pass the "
                             f"ledger file, e.g. {ledger + ledger_mod.LEDGER_SUFFIX!r}")
    return path


def _terminal_width() -> int:
    return shutil.get_terminal_size().columns


def session_ledger(database: str, ledger: Optional[Path]) -> ledger_mod.Ledger:
    """The ledger a session charges (the rule of the module docstring)."""
    in_memory = database in ("", ":memory:")
    if ledger is not None:
        return ledger_mod.Ledger(ledger, database="memory" if in_memory else ledger_mod.database_alias(database))
    return ledger_mod.Ledger(None if in_memory else ledger_mod.sidecar_path(database))


def run_shell(database: Optional[str] = None, command: "Optional[str | Sequence[str]]" = None, *,
              mode: str = "duckbox", readonly: bool = False, bail: bool = False, ledger: Optional[str] = None,
              init: Optional[str] = None, commands_first: Sequence[str] = (),
              stdin: TextIO = sys.stdin, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the shell on ``database`` (in memory if None) and return the exit code.

    First the SQL and dot commands of the file ``init`` (``-init``), then each of ``commands_first``
    (``-cmd``); then, with ``command`` (``-c``: one SQL text or several, run in order), that SQL
    (stopping at its first error); else stdin to its end when it is not a terminal (going on after errors
    unless ``bail``); else prompt. Exit code: 0, 1 if a script had an error, 2 for a bad option,
    130 if interrupted. ``ledger``: see the module docstring.
    """
    database = database or ":memory:"
    commands = [command] if isinstance(command, str) else None if command is None else list(command)
    try:
        if mode not in MODES:
            raise ParameterError(f"dpsql: unknown output mode {mode!r}; use one of {', '.join(MODES)}")
        if readonly and database == ":memory:":
            raise ParameterError("dpsql: -readonly needs a DATABASE file (an in-memory database is always writable)")
        if init is not None and not os.path.isfile(init):
            raise ParameterError(f"dpsql: -init {init!r}: no such file; name a file of SQL and dot commands")
        ledger_path = _ledger_path(ledger)
    except ParameterError as exc:
        print(f"Error: {exc}", file=err, flush=True)
        return 2
    except LedgerIOError as exc:
        print(f"Error: {exc}", file=err, flush=True)
        return 1
    try:
        con = dpsql.connect(database, read_only=readonly, ledger=session_ledger(database, ledger_path))
    except Exception as exc:
        print(error_line(exc), file=err, flush=True)
        return 1
    shell = None
    try:
        interactive = commands is None and stdin.isatty()
        shell = Shell(con, interactive=interactive, bail=bail or commands is not None, mode=mode, out=out, err=err,
                      width=_terminal_width if interactive and out.isatty() else None, ledger_file=ledger_path)
        # -init and -cmd come first, as in DuckDB's CLI; with -bail (or -c) their first error ends the session.
        for first in ([None] if init is not None else []) + list(commands_first):
            before = shell.errors
            if first is None:
                shell._read(init or "")
            else:
                shell.feed_all(first.splitlines())
            if shell.done or (shell.bail and shell.errors > before):
                return _exit_code(shell, interactive)
        if commands is not None:
            for text in commands:  # each -c in order; one that fails ends the run
                shell.feed_all(text.splitlines())
                if shell.done or shell.failed:
                    break
        elif interactive:
            _interactive(shell, database)
        else:
            shell.feed_all(stdin)
        return _exit_code(shell, interactive)
    finally:
        if shell is not None:
            shell._close_output()
            con = shell.con  # .open may have replaced the connection
        con.close()


def _exit_code(shell: Shell, interactive: bool) -> int:
    if shell.exit_code is not None:
        return shell.exit_code
    if interactive:
        return 0
    return 130 if shell.interrupted else (1 if shell.failed else 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``dpsql shell`` options (DuckDB's CLI spellings: ``-csv``, ``-json``, ``-readonly``, ``-bail``)."""
    parser.add_argument("database", nargs="?", metavar="DATABASE", help="DuckDB database file (default: in memory)")
    parser.add_argument("-c", dest="command", metavar="SQL", action="append",
                        help="run SQL and exit (stops at the first error); repeat it to run several, in order")
    parser.add_argument("-cmd", dest="cmd", metavar="COMMAND", action="append", default=[],
                        help="run COMMAND (SQL or a dot command) before reading input; repeatable")
    parser.add_argument("-init", dest="init", metavar="FILE",
                        help="run the SQL and dot commands of FILE first (before -cmd)")
    parser.add_argument("-readonly", "--readonly", action="store_true", help="open DATABASE read-only "
                        "(releases are still charged to its ledger)")
    parser.add_argument("-bail", "--bail", action="store_true",
                        help="stop a script read from standard input at its first error")
    for mode in ("csv", "json", "markdown", "line", "list", "table", "box"):
        parser.add_argument(f"-{mode}", f"--{mode}", dest="mode", action="store_const", const=mode,
                            help=f"output mode {mode} (.mode {mode})")
    parser.set_defaults(mode="duckbox")
    parser.add_argument("--ledger", metavar="FILE",
                        help="privacy ledger to charge (default: DATABASE.dpsql-ledger; with no DATABASE an "
                             "in-memory ledger, forgotten at exit)")


def run_args(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the shell with the options :func:`add_arguments` parsed."""
    return run_shell(args.database, args.command, mode=args.mode, readonly=args.readonly, bail=args.bail,
                     ledger=args.ledger, init=args.init, commands_first=args.cmd, out=out, err=err)
