"""The ``dpsql`` command line: ``shell``, the releases (``set-union``, ``top-k``, ``hitting-set``,
``weighted-sample``, ``group-by``), ``budget``, ``evaluate`` and ``demo``.

Exit codes: 0 success; 1 a failure while running (an engine or I/O error);
2 a bad argument, parameter or input description (the message names it).
Every error is one ``Error: ...`` line on stderr, never a traceback; a warning (weak privacy
parameters) is one ``dpsql: warning: ...`` line. Only
released items and public calibration numbers are ever printed, except by
``evaluate``, which prints NON-PRIVATE statistics of the raw input and says so.

Charged means delivered. A release command checks everything it can before the
release is charged: the parameters, the columns, the output file (its format
is known from its name and a zero-row file of the released column's type is
written next to it), and the input itself, which is copied into a TEMP table
first so that an unreadable row, a CSV type the sniffer guessed wrong or a
NULL user fails with nothing charged. Once charged, the released rows reach the
user: if writing ``--output`` fails anyway, they are printed on stdout instead
(exit code 1, and stderr says so).

A flag left out takes the default of the SQL macro's parameter (from its declaration), so
the command line and SQL agree. Ctrl-C stops a release that is not charged yet (exit code 130,
nothing recorded); once it is charged the release is finished and delivered, then exit code 130.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional, Sequence, TextIO

import duckdb
import pyarrow as pa

import dpsql
from dpsql.core import ledger as ledger_mod, runner
from dpsql.core.errors import NOT_SHOWN, InputError, ParameterError, from_engine, quotes_data
from dpsql.core import registry
from dpsql.core.ledger import Ledger
from dpsql.core.mechanism import Param
from dpsql.core.release import sorted_release
from dpsql.frontends import shell as shell_mod
from dpsql.frontends.shell import error_line
from dpsql.core.validation import WeakPrivacyWarning, check_identifier, sql_string

__all__ = ["main", "UsageError"]

SEED_WARNING = ("WARNING: --seed makes noise and sampling reproducible: this result is NOT differentially "
                "private. Use --seed only for tests and demos.")

_VIEW = "dpsql_input"      # the TEMP table a release reads (a copy of the needed input columns)
_RAW = "dpsql_raw_input"   # the TEMP view over the input file or table
_SOURCE_DB = "dpsql_source"
# --output suffix -> format; any other name is refused before the release. JSON holds the rows as
# objects named by their columns, as CSV and Parquet hold them (and as --json's "rows" does).
OUTPUT_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".parq": "parquet", ".json": "json",
                  ".jsonl": "ndjson", ".ndjson": "ndjson"}


class UsageError(Exception):
    """A bad command-line argument or input description (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become one ``Error:`` line and exit code 2 (see :func:`main`)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'



# --------------------------------------------------------------------------
# Reading the input
# --------------------------------------------------------------------------

JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
_CSV_FLAGS = ("--delimiter", "--csv-types", "--sample-size", "--all-varchar")
_CSV_HINT = ("DuckDB's CSV reader options are --delimiter, --csv-types COL=TYPE,..., --sample-size -1 "
             "(sniff the whole file) and --all-varchar")


def _input_kind(path: Path) -> str:
    """``parquet`` or ``duckdb`` from the file's magic bytes (extensions are often wrong), else
    ``json`` for a *.json / *.jsonl / *.ndjson name, else ``csv``."""
    with open(path, "rb") as f:
        head = f.read(12)
    if head[:4] == b"PAR1":
        return "parquet"
    if head[8:12] == b"DUCK":
        return "duckdb"
    if path.name.lower().endswith(JSON_SUFFIXES):
        return "json"
    return "csv"


# What makes a path a glob for DuckDB's readers.
_GLOB_CHARS = ("*", "?", "[")
# A folder is read as DuckDB's readers read it: FOLDER/**/*.parquet (hive partitions included), or
# FOLDER/**/*.csv, FOLDER/**/*.json for a folder without Parquet files.
_FOLDER_SUFFIXES = (".parquet", ".csv", ".json")


@dataclasses.dataclass(frozen=True)
class _Source:
    """An input as DuckDB's readers take it: a file, a glob or a folder (``location``), the files it
    names (in DuckDB's order: a multi-file CSV is sniffed on the first) and their kind."""

    location: str
    files: tuple[Path, ...]
    kind: str

    @property
    def first(self) -> Path:
        return self.files[0]

    @property
    def home(self) -> Path:
        """The file, or the folder of a folder or a glob (the part before its first wildcard)."""
        if len(self.files) == 1 and self.files[0] == Path(self.location):
            return self.files[0]
        fixed = []
        for part in Path(self.location).parts:
            if any(c in part for c in _GLOB_CHARS):
                break
            fixed.append(part)
        return Path(os.path.abspath(Path(*fixed) if fixed else Path(".")))


def _glob(pattern: str) -> tuple[Path, ...]:
    """The files DuckDB's readers read for ``pattern`` (DuckDB's own glob, so ``**`` means what it means there)."""
    con = duckdb.connect()
    try:
        return tuple(Path(f) for (f,) in con.execute("SELECT file FROM glob(?) ORDER BY file", [pattern]).fetchall())
    except duckdb.Error as exc:
        raise UsageError(f"cannot list the files of {pattern!r} ({error_line(exc)[len('Error: '):]})") from None
    finally:
        con.close()


def _source(flag: str, text: str) -> _Source:
    """The input ``text`` given to ``flag``: a file, a glob (``'dir/*.parquet'``, ``'dir/**/*.parquet'``) or a
    folder (of Parquet files, hive-partitioned or not), checked before anything is read.

    The readers are given ``text`` itself, as ``read_parquet(text)`` would be in SQL, so the ledger
    scope is the one SQL's file tracing gives the same read (:func:`dpsql.core.ledger.file_scope`: a glob or
    a folder is its own scope)."""
    path = Path(text)
    if path.is_file():
        return _Source(text, (path,), _input_kind(path))
    if path.is_dir():
        for suffix in _FOLDER_SUFFIXES:
            files = _glob(str(path / "**" / f"*{suffix}"))
            if files:
                return _Source(text, files, _input_kind(files[0]))
        raise UsageError(f"{flag} {text!r} is a folder without *.parquet, *.csv or *.json files (in it or its "
                         f"subfolders); name the files with a glob, e.g. '{path / '*.parquet'}'")
    if any(c in text for c in _GLOB_CHARS):
        files = _glob(text)
        if not files:
            raise UsageError(f"{flag} {text!r} matches no file")
        kind = _input_kind(files[0])
        if kind == "duckdb":
            raise UsageError(f"{flag} {text!r} matches DuckDB databases; a glob or a folder must name Parquet, CSV "
                             f"or JSON files: give one database with --table")
        return _Source(text, files, kind)
    if flag == "INPUT":
        raise UsageError(f"input file {text!r} does not exist")
    raise UsageError(f"{flag} file {text!r} does not exist")


@dataclasses.dataclass(frozen=True)
class _Reader:
    """How a text input is read: DuckDB ``read_csv`` options given on the command line."""

    delimiter: Optional[str] = None
    types: tuple[tuple[str, str], ...] = ()
    sample_size: Optional[int] = None
    all_varchar: bool = False

    def given(self) -> list[str]:
        """The CSV flags that were given."""
        return [flag for flag, value in zip(_CSV_FLAGS, (self.delimiter, self.types, self.sample_size,
                                                         self.all_varchar)) if value]

    def csv_options(self, whole_file: bool = False) -> str:
        """``, name=value`` options of read_csv (``whole_file``: sniff every row, unless --sample-size says)."""
        parts = []
        if self.delimiter is not None:
            parts.append(f"delim={sql_string(self.delimiter)}")
        if self.types:
            parts.append("types={" + ", ".join(f"{sql_string(c)}: {sql_string(t)}" for c, t in self.types) + "}")
        if self.sample_size is not None:
            parts.append(f"sample_size={self.sample_size}")
        elif whole_file:
            parts.append("sample_size=-1")
        if self.all_varchar:
            parts.append("all_varchar=true")
        return "".join(", " + p for p in parts)


def _split_types(text: str) -> list[str]:
    """Split ``a=INT,b=DECIMAL(10,2)`` at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _reader(args: argparse.Namespace, kind: str) -> _Reader:
    """The CSV reader options of ``args``, checked; refused for an input that is not read as CSV."""
    delimiter = args.delimiter
    if delimiter is not None:
        if delimiter in ("\\t", "tab", "TAB"):  # a tab is hard to type in a shell
            delimiter = "\t"
        if not delimiter or "\n" in delimiter or "\r" in delimiter:
            raise UsageError(f"--delimiter must be one or more characters other than a line break "
                             f"(got {args.delimiter!r}), e.g. --delimiter ';' or --delimiter '\\t'")
    types = []
    for text in args.csv_types or []:
        for pair in _split_types(text):
            column, sep, type_name = pair.partition("=")
            if not sep or not column.strip() or not type_name.strip():
                raise UsageError(f"--csv-types takes COLUMN=TYPE pairs separated by commas "
                                 f"(got {text!r}), e.g. --csv-types user_id=VARCHAR,item=BIGINT")
            types.append((column.strip(), type_name.strip()))
    if args.sample_size is not None and args.sample_size < 1 and args.sample_size != -1:
        raise UsageError(f"--sample-size must be a number of rows >= 1, or -1 for the whole file "
                         f"(got {args.sample_size})")
    reader = _Reader(delimiter, tuple(types), args.sample_size, bool(args.all_varchar))
    if kind != "csv" and reader.given():
        raise UsageError(f"{reader.given()[0]} applies to a CSV input; {args.input!r} is read as {kind}")
    return reader


def _source_tables(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """(schema, name) of every table and view of the attached database."""
    return con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? "
        "UNION ALL SELECT schema_name, view_name FROM duckdb_views() WHERE database_name = ? AND NOT internal "
        "ORDER BY 1, 2", [_SOURCE_DB, _SOURCE_DB]).fetchall()


def _pick_table(tables: list[tuple[str, str]], wanted: Optional[str], input_name: str) -> tuple[str, str]:
    def label(schema: str, name: str) -> str:
        return name if schema == "main" else f"{schema}.{name}"

    listing = ", ".join(label(*t) for t in tables) or "none"
    if wanted is None:
        if len(tables) == 1:
            return tables[0]
        raise UsageError(f"{input_name} is a DuckDB database with tables {listing}; choose one with --table")
    matches = [t for t in tables
               if wanted.lower() in (t[1].lower(), f"{t[0]}.{t[1]}".lower())]
    if len(matches) != 1:
        problem = "does not exist" if not matches else "is ambiguous"
        raise UsageError(f"--table {wanted!r} {problem} in {input_name}; its tables are {listing}")
    return matches[0]


def _open_input(con: duckdb.DuckDBPyConnection, source: _Source, table: Optional[str], input_name: str,
                view: str = _VIEW, whole_csv: bool = False, reader: _Reader = _Reader()) -> None:
    """Create the TEMP view ``view`` over the input (a DuckDB file is attached read-only).

    ``whole_csv``: the CSV sniffer reads every row instead of a sample (slow, and again on each
    use of the view), so that a column whose values change type after the sample gets a type
    that fits them all.
    """
    location, kind = sql_string(source.location), source.kind
    if kind == "duckdb":
        con.execute(f"ATTACH {location} AS {_SOURCE_DB} (READ_ONLY)")
        schema, name = _pick_table(_source_tables(con), table, input_name)
        read = f"{_SOURCE_DB}.{_quote_ident(schema)}.{_quote_ident(name)}"
    elif kind == "parquet":
        read = f"read_parquet({location})"
    elif kind == "json":
        read = f"read_json({location})"
    else:
        read = f"read_csv({location}{reader.csv_options(whole_csv)})"
    con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {read}")


def _check_not_empty(source: _Source, input_name: str) -> None:
    """A text input with nothing but white space has no header (DuckDB would invent a column ``column0``).

    Of several files, the first is checked: DuckDB takes the columns from it."""
    with open(source.first, "rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return
    what = "a header line naming the columns (e.g. user_id,item)" if source.kind == "csv" else "JSON records"
    which = input_name if len(source.files) == 1 else f"the first file of {input_name} ({str(source.first)!r})"
    raise UsageError(f"dpsql: {which} is empty; it needs {what}; nothing was released or charged")


def _first_ragged_line(path: Path, delimiter: str) -> Optional[str]:
    """Where a CSV stops having the header's number of fields (or has an unclosed quote), as 'line N ...'."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            lines = csv.reader(f, delimiter=delimiter, strict=True)
            width = None
            for fields in lines:
                if width is None:
                    width = len(fields)
                elif fields and len(fields) != width:
                    return f"line {lines.line_num} has {len(fields)} fields, the header {width}"
    except csv.Error:
        return f"a quote is not closed or is misplaced near line {lines.line_num}"
    return None


def _csv_shape_problem(path: Path, present: Sequence[str], reader: _Reader, input_name: str) -> Optional[str]:
    """Why DuckDB's sniffer made up the columns ``present`` of a CSV input, or None if it did not."""
    if present and all(re.fullmatch(r"column\d+", c) for c in present):
        return (f"dpsql: {input_name} has no header line (DuckDB named its columns {', '.join(present)}); "
                f"add a first line naming the columns, e.g. user_id,item; nothing was released or charged")
    if len(present) == 1 and reader.delimiter is None:
        seen = [d for d in (",", ";", "\t", "|") if d in present[0]]
        if seen:
            where = _first_ragged_line(path, seen[0])
            return (f"dpsql: {input_name} is not a well-formed CSV file: no delimiter splits all of its lines "
                    f"into the same number of fields{f' ({where})' if where else ''}, so DuckDB read each line "
                    f"as one column. Fix the file (or name the delimiter with --delimiter to see DuckDB's own "
                    f"error); nothing was released or charged")
    return None


def _check_input_columns(con: duckdb.DuckDBPyConnection, columns: Sequence[tuple[str, str]], input_name: str,
                         view: str = _VIEW, csv_path: Optional[Path] = None, reader: _Reader = _Reader()) -> None:
    """Name the CLI flag when a column is missing (the library would name its internal view)."""
    schema = con.execute(f"SELECT name, type FROM pragma_table_info('{view}')").fetchall()
    present = [row[0] for row in schema]
    lowered = {c.lower() for c in present}
    for flag, col in columns:
        if col.lower() not in lowered:
            problem = _csv_shape_problem(csv_path, present, reader, input_name) if csv_path is not None else None
            # DuckDB takes the first line of a CSV whose columns are all text for its header: in a file
            # without one, those names are a row of data.
            if problem is None and csv_path is not None and all(str(t).upper() == "VARCHAR" for _, t in schema):
                problem = (f"{flag} {col!r} is not a column of {input_name}; DuckDB read its first line as the "
                           f"header ({len(present)} fields, all text: not shown, as without a header line they "
                           f"are data). Name the column as that line does with {flag}, or add a header line "
                           f"naming the columns, e.g. user_id,item")
            raise UsageError(problem or f"{flag} {col!r} is not a column of {input_name}; its columns are "
                                        f"{', '.join(present)}")
    if len({col.lower() for _, col in columns}) < len(columns):
        raise UsageError(f"{' and '.join(flag for flag, _ in columns)} must name different columns")


# DuckDB's reader errors quote the private input: the CSV reader the whole line ("Original Line: ..."),
# the JSON reader and casts the value. The CLI shows where (line, column) and the fix, never that text.
_CSV_LINE = re.compile(r"^[\w ]*Error: CSV Error on Line: (\d+)")
_CSV_COLUMN = re.compile(r'Error when converting column "([^"\n]*)"')
_JSON_LINE = re.compile(r'^[\w ]*Error: (JSON transform error|Malformed JSON) in file ".*?",(?: at byte \d+)? '
                        r'in (line|record/value) (\d+)')
# What a CSV line that DuckDB cannot read has, from DuckDB's wording (the numbers are counts, not data),
# and the fix.
_CSV_PROBLEMS = ((r"Expected Number of Columns: (\d+) Found: (\d+)", "has {1} fields, the header {0}",
                  "fix that line, or name the delimiter with --delimiter"),
                 (r"Invalid unicode", "is not UTF-8 text", "convert the file to UTF-8 (e.g. with iconv)"),
                 (r"Maximum line size", "is longer than DuckDB's maximum line size", "fix that line"),
                 (r"unterminated quote", "has a quote that is not closed", "fix that line"))


def _column_type(con: duckdb.DuckDBPyConnection, view: str, column: str) -> Optional[str]:
    """The type ``view`` gives ``column`` (read from its schema, no rows), or None."""
    try:
        rows = con.execute(f"SELECT column_type FROM (DESCRIBE {view}) WHERE lower(column_name) = lower(?)",
                           [column]).fetchall()
    except duckdb.Error:
        return None
    return str(rows[0][0]) if rows else None


def _failing_column(con: duckdb.DuckDBPyConnection, view: str, columns: Sequence[str]) -> Optional[str]:
    """The first of ``columns`` that ``view`` cannot read on its own (DuckDB's readers read only the
    columns a query selects, so only the column with the bad value fails), or None."""
    for column in columns:
        try:
            con.execute(f"SELECT count({_quote_ident(column)}) FROM {view}").fetchall()
        except duckdb.InterruptException:
            raise
        except duckdb.Error:
            return column
    return None


def _input_error(con: duckdb.DuckDBPyConnection, exc: duckdb.Error, input_name: str, kind: str,
                 columns: Sequence[str], reader: _Reader, view: str = _RAW) -> UsageError:
    """Why DuckDB could not read the input ``view`` over, as one line that names the line, the column
    and the fix, and never quotes the data (DuckDB's messages quote the line or the value)."""
    text = str(exc)
    csv_line, json_line = _CSV_LINE.match(text), _JSON_LINE.match(text)
    if csv_line is None and json_line is None and not quotes_data(exc):
        # An error about the options or the file's structure, not a row: DuckDB's text says it best.
        cause = re.split(r" Possible (?:solutions|fixes)| file = ", error_line(exc)[len("Error: "):])[0].strip()
        if reader.types and (isinstance(exc, duckdb.CatalogException) or "COLUMN_TYPES" in cause):
            return UsageError(f"--csv-types: {cause}; nothing was released or charged")
        hint = f"; {_CSV_HINT}" if kind == "csv" else ""
        return UsageError(f"{input_name} could not be read completely ({cause}){hint}; "
                          f"nothing was released or charged")
    if csv_line is not None:
        where = f"line {csv_line.group(1)}"
    elif json_line is not None:
        where = f"{'line' if json_line.group(2) == 'line' else 'record'} {json_line.group(3)}"
    else:
        where = "a line DuckDB's message does not name"
    wanted = {c.lower(): c for c in columns}
    # The column DuckDB names (the last mention: the quoted line comes first), if it is one we read.
    named = [wanted[c.lower()] for c in _CSV_COLUMN.findall(text) if c.lower() in wanted]
    cast = bool(named) or isinstance(exc, duckdb.ConversionException) or re.search(
        r"Could not convert|Could not parse|Failed to cast|JSON transform error", text) is not None
    column = named[-1] if named else (_failing_column(con, view, columns)
                                      if cast and not isinstance(exc, duckdb.InterruptException) else None)
    if json_line is not None and json_line.group(1) == "Malformed JSON":
        said, fix = f"{where} is not valid JSON", "fix the file"
    elif cast:
        kind_of = _column_type(con, view, column) if column is not None else None
        said = (f"{where}{f', column {column!r}' if column is not None else ''}: a value does not fit the "
                f"column's type{f' {kind_of}' if kind_of else ''}")
        given = {c.lower(): t for c, t in reader.types}
        col = column or "COLUMN"
        if kind != "csv":
            fix = ("give that field one type in every record (e.g. quote its numbers), or convert the file to "
                   "Parquet or a DuckDB table with the type you need")
        elif col.lower() in given:
            fix = f"--csv-types {col}={given[col.lower()]} does not fit it: read it as text with --csv-types {col}=VARCHAR"
        else:
            fix = f"read that column as text with --csv-types {col}=VARCHAR (or every column with --all-varchar)"
            if reader.sample_size not in (None, -1):
                fix += ", or let the type sniffer read the whole file with --sample-size -1"
    else:
        said, fix = f"{where} cannot be read", f"fix that line; {_CSV_HINT}"
        for pattern, has, remedy in _CSV_PROBLEMS:
            found = re.search(pattern, text[csv_line.end():] if csv_line else text)
            if found:
                said, fix = f"{where} {has.format(*found.groups())}", remedy
                break
    return UsageError(f"dpsql: {input_name}: {said}; {fix}. {NOT_SHOWN}; nothing was released or charged")


def _copy_input(con: duckdb.DuckDBPyConnection, source: _Source, table: Optional[str], input_name: str,
                columns: Sequence[tuple[str, str]], reader: _Reader = _Reader()) -> list[str]:
    """Copy ``columns`` (flag, name) of the input into the TEMP table ``dpsql_input``; their quoted names.

    The whole input is read once here, so an unreadable row or a value that does not fit its
    column's type fails now, with a message that names the line and the column, never the data.
    """
    wanted, kind = [col for _, col in columns], source.kind
    if kind in ("csv", "json"):
        _check_not_empty(source, input_name)
    try:
        # The CSV sniffer reads a sample here.
        _open_input(con, source, table, input_name, view=_RAW, reader=reader)
    except duckdb.Error as exc:
        raise _input_error(con, exc, input_name, kind, wanted, reader) from None
    _check_input_columns(con, columns, input_name, view=_RAW, csv_path=source.first if kind == "csv" else None,
                         reader=reader)
    names = [_quote_ident(col) for col in wanted]
    copy = f"CREATE OR REPLACE TEMP TABLE {_VIEW} AS SELECT {', '.join(names)} FROM {_RAW}"
    try:
        con.execute(copy)
    except duckdb.Error as exc:
        if kind != "csv" or reader.sample_size is not None or reader.all_varchar \
                or isinstance(exc, duckdb.InterruptException):
            raise _input_error(con, exc, input_name, kind, wanted, reader) from None
        # Most often a type the sniffer guessed from its sample that later rows do not fit:
        # sniff the whole file and read it again.
        try:
            _open_input(con, source, table, input_name, view=_RAW, whole_csv=True, reader=reader)
        except duckdb.Error:  # the whole file defeats the sniffer: the first failure names the line
            raise _input_error(con, exc, input_name, kind, wanted, reader) from None
        try:
            con.execute(copy)
        except duckdb.Error as again:
            # With types that fit every value, what is left is the line's own problem (or --csv-types).
            raise _input_error(con, again, input_name, kind, wanted, reader) from None
    return names


def _load_input(con: duckdb.DuckDBPyConnection, source: _Source, table: Optional[str], input_name: str,
                columns: Sequence[tuple[str, str]], reader: _Reader = _Reader(),
                nullable: Sequence[str] = ()) -> None:
    """Copy ``columns`` (flag, name) of the input into the TEMP table ``dpsql_input``, checked.

    Runs before the release: the whole input is read once here (:func:`_copy_input`), so an
    unreadable row or a value that does not fit its column's type fails now, and so does a NULL
    in any of the columns but those of the flags ``nullable`` (a NULL the macro skips, as
    dp_group_by skips a NULL value). Nothing has been charged when this raises.
    """
    names = _copy_input(con, source, table, input_name, columns, reader)
    nulls = con.execute("SELECT " + ", ".join(f"bool_or({n} IS NULL)" for n in names) + f" FROM {_VIEW}").fetchall()
    for (flag, col), has_null in zip(columns, nulls[0]):
        if has_null and flag not in nullable:
            raise UsageError(f"{flag} {col!r} contains NULL in {input_name}; filter those rows out first "
                             f"(e.g. a view WHERE {col} IS NOT NULL); nothing was released or charged")


@dataclasses.dataclass(frozen=True)
class _Output:
    """A checked ``--output`` file and its format."""

    path: Path
    format: str  # 'csv', 'parquet', 'json' (an array of row objects) or 'ndjson' (one row object a line)


def _output_path(output: Optional[str], source: _Source) -> Optional[_Output]:
    """The --output file, checked before anything is read: known format, writable, not the input."""
    if output is None:
        return None
    path = Path(output)
    fmt = OUTPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(f"--output {output!r}: unknown format; name the file *.parquet, *.csv or *.json")
    if not path.parent.is_dir():
        raise UsageError(f"--output {output!r}: folder {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise UsageError(f"--output {output!r} is a folder; name a file")
    if path.exists() and path.resolve() in {f.resolve() for f in source.files}:
        raise UsageError("--output must not be the input file" if len(source.files) == 1 else
                         "--output must not be one of the input files")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"--output {output!r} exists and is not writable")
    return _Output(path, fmt)


def _write(rows: pa.Table, output: _Output, metadata: Optional[dict[str, str]] = None) -> None:
    """Write ``rows`` in their order: Parquet (zstd, with ``metadata`` as key-value metadata), CSV or JSON.

    DuckDB writes every column type (lists, structs, blobs included; CSV shows them as text, JSON
    as arrays and objects).
    """
    con = duckdb.connect()
    try:
        con.register("dpsql_released", rows)
        if output.format == "csv":
            options = "FORMAT csv, HEADER true"
        elif output.format in ("json", "ndjson"):
            options = "FORMAT json" + (", ARRAY true" if output.format == "json" else "")
        else:
            kv = ", ".join(f"{_quote_ident(k)}: {sql_string(v)}" for k, v in (metadata or {}).items())
            options = "FORMAT parquet, COMPRESSION zstd" + (f", KV_METADATA {{{kv}}}" if kv else "")
        con.execute(f"COPY (FROM dpsql_released) TO {sql_string(str(output.path))} ({options})")
    finally:
        con.close()


def _probe_output(con: duckdb.DuckDBPyConnection, query: str, output: _Output) -> None:
    """Write the zero-row result of ``query`` next to --output with :func:`_write`, then delete it.

    Proves, before the release, that the folder is writable and that the format can hold the
    released columns' types (the rows are then written by the same code).
    """
    empty = con.sql(query).to_arrow_table()
    fd, probe = tempfile.mkstemp(prefix=".dpsql-probe-", suffix=output.path.suffix, dir=output.path.parent)
    os.close(fd)
    try:
        _write(empty, _Output(Path(probe), output.format))
    except Exception as exc:
        raise UsageError(f"--output {str(output.path)!r}: cannot write {output.format} there "
                         f"({error_line(exc)[len('Error: '):]}); nothing was released or charged") from None
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass


def _ordered(rows: pa.Table) -> pa.Table:
    """The released rows in an order that depends only on their values.

    The macros already end with ORDER BY their released columns; sorting again here only guards
    that order. Types Arrow cannot sort (lists, structs) keep the macro's order: a release is
    never lost to sorting.
    """
    try:
        return sorted_release(rows)
    except (pa.ArrowException, TypeError, ValueError):
        return rows


def _safe_reason(exc: BaseException) -> str:
    """Why writing failed, without data values (the release is already charged): OS and I/O text only."""
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, (duckdb.IOException, duckdb.PermissionException)):
        return error_line(exc)[len("Error: "):]
    return type(exc).__name__


def _deliver(rows: pa.Table, output: Optional[_Output], metadata: dict[str, str], err: TextIO) -> bool:
    """Write charged rows to --output; False (and a line on stderr) if that failed, so the caller prints them."""
    if output is None:
        return True
    try:
        _write(rows, output, metadata)
        return True
    except Exception as exc:  # the release is charged: never lose its rows
        _say(err, f"Error: could not write --output {str(output.path)!r} ({_safe_reason(exc)}); the release "
                  f"was charged, so its {rows.num_rows} rows are printed on stdout instead")
        return False


def _say(stream: TextIO, line: str) -> None:
    """A line on ``stream`` that never raises (stderr may be closed: the rows matter more)."""
    try:
        stream.write(line + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass


def _progress_printer(err: TextIO) -> Callable[[float], None]:
    """--progress: each percentage :func:`dpsql.core.runner.run` passes on, as a line on ``err`` (one line
    redrawn on a terminal)."""
    tty = err.isatty()

    def report(pct: float) -> None:
        # A closed stderr does not stop progress with a warning (dpsql.core.runner): it is silently skipped.
        try:
            if tty:
                err.write(f"\rprogress: {pct:3.0f}%" + ("\n" if pct >= 100 else ""))
            else:
                err.write(f"progress: {pct:.0f}%\n")
            err.flush()
        except (OSError, ValueError):
            pass

    return report


def _connect(seed: Optional[int], ledger: Optional[Ledger] = None) -> duckdb.DuckDBPyConnection:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the caller prints SEED_WARNING itself, without a source line
        con = dpsql.connect(seed=seed, ledger=ledger)
    # DuckDB draws its progress bar on stdout after 2 s, into the released items; --progress has its own.
    con.execute("SET enable_progress_bar_print = false")
    return con


def _interrupts(err: TextIO) -> runner.Interrupts:
    """The Ctrl-C scope of a release command (dpsql.core.runner): a late Ctrl-C is said on stderr."""
    return runner.Interrupts(notice=functools.partial(_say, err))


def _input_ledger(args: argparse.Namespace, source: _Source) -> Ledger:
    """The ledger a release from INPUT is charged to: --ledger, else the sidecar of the input file (of
    the folder, for a folder or a glob: ``dpsql budget show FOLDER`` shows it).

    The release reads the input through the TEMP table ``dpsql_input``; the ledger records the
    DuckDB table (--table, as a table of that database) or the scope SQL gives a read of the input
    file, glob or folder (``read_parquet('INPUT')``: its absolute path, :func:`dpsql.core.ledger.file_scope`)
    instead, so that 'dpsql budget set INPUT --scope' can name it and SQL meets the same budget.
    """
    path = Path(args.ledger) if args.ledger else ledger_mod.sidecar_path(source.home)
    if args.ledger and not path.parent.is_dir():
        raise UsageError(f"--ledger {args.ledger!r}: folder {str(path.parent)!r} does not exist")
    if source.kind == "duckdb" and args.table:
        # A table scope is a catalog identity: the table of the input database, whatever the ledger's name.
        return Ledger(path, aliases={_VIEW: args.table}, database=ledger_mod.database_alias(source.first))
    return Ledger(path, aliases={_VIEW: ledger_mod.file_scope(source.location)})


def _input_file(args: argparse.Namespace) -> tuple[_Source, Optional[_Output], _Reader]:
    """INPUT, the --output file and the CSV reader options, all checked before anything is read."""
    source = _source("INPUT", args.input)
    if args.table is not None and source.kind != "duckdb":
        raise UsageError(f"--table applies to a DuckDB database input; {args.input!r} is a {source.kind} file")
    return source, _output_path(args.output, source), _reader(args, source.kind)


def _file_metadata(args: argparse.Namespace, mechanism: str) -> dict[str, str]:
    """Parquet key-value metadata of a released file: what produced it, and whether it is private."""
    meta = {"dpsql_mechanism": mechanism, "dpsql_epsilon": repr(float(args.epsilon)),
            "dpsql_delta": repr(float(args.delta)), "dpsql_private": "false" if args.seed is not None else "true"}
    if args.seed is not None:
        meta["dpsql_warning"] = SEED_WARNING
    return meta


def _privacy_fields(args: argparse.Namespace) -> dict:
    """JSON fields saying whether the result is private (a --seed run is NOT)."""
    return {"private": args.seed is None, **({"warning": SEED_WARNING} if args.seed is not None else {})}


# --------------------------------------------------------------------------
# Plain output
# --------------------------------------------------------------------------

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Control characters, and the code points that str.splitlines() and many tools take for line breaks.
_NEEDS_ESCAPE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_text(text: str) -> str:
    r"""``text`` on one line: ``\\``, ``\n``, ``\r``, ``\t``, and ``\xHH`` / ``\uHHHH`` for other control characters."""
    def one(match: re.Match) -> str:
        ch = match.group()
        if ch in _ESCAPES:
            return _ESCAPES[ch]
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"

    return _NEEDS_ESCAPE.sub(one, text)


_UNESCAPES = {v: k for k, v in _ESCAPES.items()}
_ESCAPED = re.compile(r"\\(?:[\\nrt]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4})")


def unescape_text(text: str) -> str:
    """The text :func:`escape_text` made ``text`` from."""
    return _ESCAPED.sub(lambda m: _UNESCAPES.get(m.group()) or chr(int(m.group()[2:], 16)), text)


def _text_columns(rows: pa.Table) -> list[list[str]]:
    """Each column of ``rows`` as text, as DuckDB casts it to VARCHAR, which is what its CSV writer writes.

    So a number reads the same on stdout and in --output *.csv. Values are then escaped with
    :func:`escape_text` (one value per line), except BLOBs, whose DuckDB text is already escaped
    (``\\xHH``). NULL is empty, as in CSV. The rows are charged: if DuckDB fails, Python's ``str``
    is used instead.
    """
    def duckdb_text(name: str) -> list:
        con = duckdb.connect()
        try:
            con.register("dpsql_released", rows.select([name]))
            return [v for (v,) in con.execute(f"SELECT {_quote_ident(name)}::VARCHAR FROM dpsql_released").fetchall()]
        finally:
            con.close()

    columns = []
    for field in rows.schema:
        try:
            values = duckdb_text(field.name)
        except Exception:
            values = [None if v is None else str(v) for v in rows.column(field.name).to_pylist()]
        raw = pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type) \
            or pa.types.is_fixed_size_binary(field.type)
        columns.append(["" if v is None else (v if raw else escape_text(v)) for v in values])
    return columns


def _print_rows(rows: pa.Table, out: TextIO) -> None:
    """One line per row, columns separated by tabs (see :func:`_text_columns`), under a header line of
    the column names when there are several (one column, an item or a key a line, needs none)."""
    columns = _text_columns(rows)
    if rows.num_columns > 1:
        out.write("\t".join(escape_text(name) for name in rows.column_names) + "\n")
    for i in range(rows.num_rows):
        out.write("\t".join(col[i] for col in columns) + "\n")


# --------------------------------------------------------------------------
# Releases: set-union, top-k, hitting-set
# --------------------------------------------------------------------------

def _params(macro: str) -> dict[str, Param]:
    """The parameters of the releasing macro ``macro``, as declared (the macro's header is generated from
    the declaration, so a flag left out means what leaving the parameter out of the SQL call means).

    ``dp_set_union`` takes ``method`` and the default method's declaration of the common parameters
    (:func:`dpsql.union.public_dispatch_sql`).
    """
    if macro == "dp_set_union":
        default = dpsql.METHODS[dpsql.union.DEFAULT_METHOD]
        return {"method": Param("method", "VARCHAR", dpsql.union.DEFAULT_METHOD),
                **{n: default.param(n) for n in dpsql.union.COMMON_PARAMS}}
    return {p.name: p for p in registry.by_macro()[macro].params}


def _default(macro: str, name: str, cast: Callable[[Any], object]):
    """The declared default of ``macro``'s parameter ``name``; None if it has none (the flag is then required)."""
    param = _params(macro).get(name)
    return None if param is None or param.required or param.default is None else cast(param.default)


def _whole(text: str) -> int:
    return int(float(text))


def _fill_defaults(args: argparse.Namespace, macro: str, names: Sequence[tuple[str, Callable]]) -> None:
    """Give every flag left out the SQL default of ``macro``'s parameter; refuse those that have none."""
    missing = []
    for name, cast in names:
        if getattr(args, name) is None:
            value = _default(macro, name, cast)
            if value is None:
                missing.append(name)
            setattr(args, name, value)
    if missing:
        flags = " and ".join(f"--{name.replace('_', '-')}" for name in missing)
        # epsilon and delta never have a default: a default would spend budget nobody typed.
        why = ("; say how much privacy budget this release may spend" if {"epsilon", "delta"} & set(missing)
               else "")
        raise UsageError(f"{flags} {'is' if len(missing) == 1 else 'are'} required (the SQL macro {macro} "
                         f"has no default for {' or '.join(missing)}){why}")


def _release(args: argparse.Namespace, err: TextIO, interrupts: runner.Interrupts,
             columns: Sequence[tuple[str, str]], probe_sql: str,
             run: Callable[[duckdb.DuckDBPyConnection], pa.Table],
             nullable: Sequence[str] = ()) -> tuple[pa.Table, Optional[_Output], float]:
    """Check, load INPUT, probe --output, then ``run`` the release (charged), interruptible with Ctrl-C.

    ``probe_sql`` selects zero rows of the released columns' types from ``dpsql_input``; ``nullable``:
    the flags of ``columns`` whose NULLs the release skips (:func:`_load_input`).
    Returns the released rows in value order, the output and the seconds the release took.

    With --progress (every release command has it: :func:`_add_release_options`), the release's progress
    is printed on ``err`` while it runs (:func:`_progress_printer`): the rounds done of a multi-round
    method, the users a policy has processed, else DuckDB's percentage (:func:`dpsql.core.runner.run`).
    """
    source, output, reader = _input_file(args)
    if args.seed is not None:
        print(SEED_WARNING, file=err, flush=True)
    con = _connect(args.seed, _input_ledger(args, source))
    printer = _progress_printer(err) if args.progress else None

    def work() -> tuple[pa.Table, float]:
        if printer is not None:
            _say(err, f"dpsql: reading {args.input!r}")
        _load_input(con, source, args.table, f"{args.input!r} (read as {source.kind})", columns, reader, nullable)
        interrupts.check()
        if output is not None:
            _probe_output(con, probe_sql, output)
        interrupts.check()
        started = time.perf_counter()
        if printer is None:
            released = run(con)
        else:  # in this worker: the outer run's Ctrl-C scope covers the connection
            con.execute("SET enable_progress_bar = true")  # DuckDB reports progress only with it (never drawn)
            released = runner.run(con, lambda: run(con), progress=printer)
        return released, time.perf_counter() - started

    # A warning (weak privacy parameters) is one line on stderr, as errors are, not Python's report with
    # a source line; "always": each run says it, even when an earlier one in this process did.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", WeakPrivacyWarning)
        try:
            released, elapsed = runner.run(con, work, interrupts=interrupts)
        finally:
            con.close()
            _say_warnings(err, caught)
    return _ordered(released), output, elapsed


def _say_warnings(err: TextIO, caught: Sequence[warnings.WarningMessage]) -> None:
    """Each distinct warning as one ``dpsql: warning: ...`` line on ``err``."""
    said = set()
    for w in caught:
        text = " ".join(str(w.message).split())
        text = text[len("dpsql: "):] if text.startswith("dpsql: ") else f"{w.category.__name__}: {text}"
        if text not in said:
            said.add(text)
            _say(err, f"dpsql: warning: {text}")


def _finish(args: argparse.Namespace, released: pa.Table, output: Optional[_Output], mechanism: str,
            doc: dict, rows_key: str, rows_json: Callable[[pa.Table], list], out: TextIO, err: TextIO,
            interrupts: runner.Interrupts, plain: Optional[Sequence[str]] = None, elapsed: float = 0.0) -> int:
    """Deliver charged rows: --output, then the JSON document or plain lines (the columns ``plain``,
    default all); the exit code. One summary line on stderr when the rows went to --output, or with
    --progress (then with the seconds the release took, ``elapsed``)."""
    # Charged: from here on nothing may stop the rows from reaching the user.
    written = _deliver(released, output, _file_metadata(args, mechanism), err)
    if args.json:
        doc = {**doc, "n_released": released.num_rows, **_privacy_fields(args)}
        if output is not None and written:
            doc["output"] = str(output.path)
        else:
            doc[rows_key] = rows_json(released)
            if output is not None:
                doc["output_failed"] = str(output.path)
        out.write(json.dumps(doc, indent=2, default=str) + "\n")
    elif output is None or not written:
        _print_rows(released if plain is None else released.select(list(plain)), out)
    named = f"method={doc['method']}" if "method" in doc else f"mechanism={mechanism}"
    k = f", k={doc['k']}" if "k" in doc else ""
    what = f"(epsilon={float(args.epsilon):g}, delta={float(args.delta):g}, {named}{k})"
    took = f" in {elapsed:.2f} s" if args.progress else ""
    if output is not None and written and not args.json:
        # the rows are in the file: say so, as the JSON document would ("output", "n_released")
        seeded = "; seeded: NOT private" if args.seed is not None else ""
        _say(err, f"dpsql: released {released.num_rows} {rows_key} to {output.path} {what}{took}{seeded}")
    elif args.progress:
        _say(err, f"dpsql: released {released.num_rows} {rows_key} {what}{took}")
    out.flush()
    if interrupts.requested:
        _say(err, "dpsql: interrupted; the release was charged before Ctrl-C, so it was finished and delivered")
        return 130
    return 0 if written else 1


class _Null:
    """An option given as NULL on the command line (SQL NULL: e.g. ``--drop-margin NULL``)."""

    def __repr__(self) -> str:
        return "NULL"


_NULL = _Null()


def _float_or_null(text: str) -> object:
    if text.strip().upper() == "NULL":
        return _NULL
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or NULL (got {text!r})") from None


_OPTION_TYPES: dict[str, Callable[[str], object]] = {"DOUBLE": _float_or_null, "VARCHAR": str}


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, e.g. 0.1,0.9 (got {text!r})") \
            from None


def _add_method_options(parser: argparse.ArgumentParser) -> None:
    """One flag per set-union method parameter beyond the common ones, from the declarations."""
    takers: dict[str, list[str]] = {}
    for name in dpsql.METHODS:
        for opt in dpsql.union.options_of(name):
            takers.setdefault(opt, []).append(name)
    for opt, methods in takers.items():
        params = [dpsql.METHODS[m].param(opt) for m in methods]
        kind = _float_list if params[0].sql_type.endswith("[]") else _OPTION_TYPES.get(params[0].sql_type, str)
        defaults = ", ".join(f"{m} {p.sql_default()}" for m, p in zip(methods, params))
        parser.add_argument(f"--{opt.replace('_', '-')}", dest=f"option_{opt}", type=kind, default=None,
                            help=f"{params[0].doc} (for {', '.join(methods)}; default {defaults})")


def _method_options(args: argparse.Namespace) -> dict[str, object]:
    """The method options given on the command line; the method's declaration says which apply."""
    return {k[len("option_"):]: None if v is _NULL else v for k, v in vars(args).items()
            if k.startswith("option_") and v is not None}


def cmd_set_union(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Release items of INPUT; print them, write them, or print a JSON summary."""
    macro = dpsql.METHODS[args.method].macro
    _fill_defaults(args, macro, [("epsilon", float), ("delta", float)])
    if args.max_items is None:  # a method without a cap parameter: validate the dispatcher's default
        args.max_items = _default(macro, "max_items", _whole) or _default("dp_set_union", "max_items", _whole)
    cal = dpsql.calibrate(args.method, epsilon=args.epsilon, delta=args.delta, max_items=args.max_items)
    user_col = check_identifier("--user-col", args.user_col)
    item_col = check_identifier("--item-col", args.item_col)
    options = _method_options(args)
    if "max_items" not in dpsql.METHODS[args.method].param_names:
        max_items_given = None  # a method without a cap
    else:
        max_items_given = args.max_items

    def run(con: duckdb.DuckDBPyConnection) -> pa.Table:
        return dpsql.set_union(con, _VIEW, args.method, epsilon=args.epsilon, delta=args.delta,
                               max_items=max_items_given, user_col=user_col, item_col=item_col,
                               progress=None, **options)  # --progress: _release reports it, as for every command

    with _interrupts(err) as interrupts:
        released, output, elapsed = _release(
            args, err, interrupts, [("--user-col", user_col), ("--item-col", item_col)],
            f"SELECT {_quote_ident(item_col)} AS item FROM {_VIEW} LIMIT 0", run)
        doc = {
            "method": args.method,
            "epsilon": float(args.epsilon),
            "delta": float(args.delta),
            "max_items": int(args.max_items),
            "input": args.input,
            "table": args.table,
            "user_col": user_col,
            "item_col": item_col,
            "calibration": {"noise": cal.noise, "scale": cal.scale, "threshold": cal.threshold},
            # Adaptive / multi-round methods: every round's budget share, noise scale, release
            # threshold and (MAD) truncation level; "calibration" then holds the last round's.
            **({"calibration_rounds": [dataclasses.asdict(r) for r in cal.rounds]} if cal.rounds else {}),
            # How the rounds compose: the accountant and the total (epsilon, delta) it computes.
            **({"accounting": dataclasses.asdict(cal.accounting)} if cal.accounting else {}),
            **options,
        }
        return _finish(args, released, output, macro, doc, "items",
                       lambda rows: rows.column("item").to_pylist(), out, err, interrupts, elapsed=elapsed)


def _cmd_ranked(macro: str, function: Callable[..., pa.Table], args: argparse.Namespace, out: TextIO,
                err: TextIO) -> int:
    """top-k / hitting-set: at most k items of INPUT in rank order (unknown domain, user-level DP)."""
    from dpsql import topk

    _fill_defaults(args, macro, [("epsilon", float), ("delta", float), ("max_items", _whole),
                                 ("domain_method", str)])
    cal = topk.top_k_calibration(args.k, args.epsilon, args.delta, args.max_items, args.domain_method)
    user_col = check_identifier("--user-col", args.user_col)
    item_col = check_identifier("--item-col", args.item_col)

    def run(con: duckdb.DuckDBPyConnection) -> pa.Table:
        return function(con, _VIEW, cal.k, epsilon=args.epsilon, delta=args.delta, max_items=args.max_items,
                        domain_method=args.domain_method, user_col=user_col, item_col=item_col)

    with _interrupts(err) as interrupts:
        released, output, elapsed = _release(
            args, err, interrupts, [("--user-col", user_col), ("--item-col", item_col)],
            f"SELECT 0::BIGINT AS rank, {_quote_ident(item_col)} AS item FROM {_VIEW} LIMIT 0", run)
        doc = {"mechanism": macro, "k": cal.k, "epsilon": float(args.epsilon), "delta": float(args.delta),
               "max_items": int(args.max_items), "domain_method": args.domain_method, "input": args.input,
               "table": args.table, "user_col": user_col, "item_col": item_col,
               "calibration": dataclasses.asdict(cal)}
        # Plain output: the items in rank order (the rank is the line number).
        return _finish(args, released, output, macro, doc, "items",
                       lambda rows: rows.column("item").to_pylist(), out, err, interrupts, plain=["item"],
                       elapsed=elapsed)


def cmd_top_k(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Unknown-domain top-k of INPUT (``dp_top_k``)."""
    return _cmd_ranked("dp_top_k", dpsql.top_k, args, out, err)


def cmd_hitting_set(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Unknown-domain k-hitting set of INPUT (``dp_hitting_set``)."""
    return _cmd_ranked("dp_hitting_set", dpsql.hitting_set, args, out, err)


# --------------------------------------------------------------------------
# group-by: one flag per parameter of the dp_group_by declaration
# --------------------------------------------------------------------------

# INPUT stands for dp_group_by's tbl and --items FILE for its items_tbl; every other parameter of the
# declaration is the flag of its name (- for _), typed by its SQL type and helped by its doc and default,
# so a parameter the declaration gains is a flag here. dp_group_by_public (a public list without --delta)
# takes a subset of them.
_GROUP_BY_FILES = ("tbl", "items_tbl")
# What a flag's help says beyond the declaration: --delta's meaning changes with --items.
_GROUP_BY_HELP = {"delta": "privacy parameter 0 < delta < 1 (required without --items; with --items, optional: "
                           "Gaussian noise at (epsilon, delta), else Laplace at (epsilon, 0))",
                  "noise": "noise of the aggregates (default: gaussian, as in SQL; laplace with --items and no "
                           "--delta)"}


def _name_list(text: str) -> list[str]:
    """A comma-separated list of names (an SQL ``VARCHAR[]`` parameter)."""
    return [a.strip() for a in text.split(",") if a.strip()]


def _number(text: str) -> object:
    """A number (an SQL ``DOUBLE`` parameter): a whole one as an int, so the declaration's check of a whole
    number (max_items, max_rows, ...) sees what was typed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number (got {text!r})") from None
    return int(value) if value.is_integer() and abs(value) < 2 ** 53 else value


def _flag_type(param: Param) -> Callable[[str], object]:
    return _name_list if param.sql_type.endswith("[]") else _number if param.sql_type == "DOUBLE" else str


def _group_by_choices(name: str) -> Optional[list[str]]:
    """The values a flag takes when they are a declared set (argparse lists them and refuses others)."""
    from dpsql import groupby

    # selection: every rule dp_group_by takes (check_selection), among them those its NULL default may name
    return {"selection": [*groupby.SELECTIONS, *dpsql.METHODS], "noise": list(groupby.NOISES)}.get(name)


def _group_by_params() -> list[Param]:
    """dp_group_by's declared parameters that are flags of their own name."""
    return [p for p in _params("dp_group_by").values() if p.name not in _GROUP_BY_FILES]


def _add_group_by_options(p: argparse.ArgumentParser) -> None:
    for param in _group_by_params():
        listed = param.sql_type.endswith("[]")
        default = ("required" if param.required else "NULL" if param.default is None
                   else ",".join(param.default) if listed else str(param.default))
        p.add_argument(f"--{param.name.replace('_', '-')}", dest=param.name, type=_flag_type(param),
                       choices=_group_by_choices(param.name),
                       metavar=f"{param.name.upper()},..." if listed else None,
                       help=_GROUP_BY_HELP.get(param.name)
                       or f"{param.doc}{' (comma-separated)' if listed else ''} "
                          f"({default if param.required else f'default: {default}, as in SQL'})")
    p.add_argument("--items", metavar="FILE", help="public list of groups (Parquet/CSV with the item column, or the "
                                                   "--group-cols columns): no selection, every listed group gets a "
                                                   "row")


def cmd_group_by(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Private GROUP BY of INPUT (``dp_group_by``, or ``dp_group_by_public`` with --items and no --delta).

    The flags given are the call's parameters; the declaration fills and checks the rest (:meth:`validate`),
    and its calibration is what --json reports.
    """
    # a public list without --delta: dp_group_by_public, Laplace at (epsilon, 0); with it, dp_group_by's aggregates
    macro = "dp_group_by_public" if args.items is not None and args.delta is None else "dp_group_by"
    mech = registry.by_macro()[macro]
    _fill_defaults(args, macro, [("epsilon", float)] + ([("delta", float)] if args.items is None else []))
    given = {p.name: getattr(args, p.name) for p in _group_by_params() if getattr(args, p.name) is not None}
    other = [name for name in given if name not in mech.param_names]
    if other:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in other)
        raise UsageError(f"{flags} {'does' if len(other) == 1 else 'do'} not apply to a public list without --delta "
                         f"({macro}: Laplace noise at (epsilon, 0), no selection); give --delta for Gaussian noise "
                         f"at (epsilon, delta), or leave {flags} out")
    if "group_cols" in given and "item_col" in given:
        raise UsageError("--item-col and --group-cols: give one (--group-cols groups by several columns instead of "
                         "the item column)")
    if args.items is not None and not Path(args.items).is_file():
        raise UsageError(f"--items file {args.items!r} does not exist")
    # every parameter checked once, by the declaration (defaults filled in); nothing has been read
    values = mech.validate(tbl=_VIEW, **given, **({} if args.items is None else {"items_tbl": args.items}))
    assert mech.calibrate is not None  # every group-by declaration has its calibration
    cal = mech.calibrate(**values)
    user_col, group_cols, item_col = values["user_col"], values["group_cols"], values["item_col"]
    keys = [("--group-cols", g) for g in group_cols] if group_cols is not None else [("--item-col", item_col)]
    columns = [("--user-col", user_col), *keys]
    if values["value_col"] is not None:
        columns.append(("--value-col", values["value_col"]))

    def run(con: duckdb.DuckDBPyConnection) -> pa.Table:
        return dpsql.group_by(con, _VIEW, **{k: v for k, v in values.items() if k != "tbl"})

    # zero rows of the released columns' types: the groups' columns, then per aggregate its value, noise scale
    # (none for the derived mean, variance and stddev) and interval half-width
    probe = ([_quote_ident(g) for g in group_cols] if group_cols is not None
             else [f"{_quote_ident(item_col)} AS item"])
    for agg in values["aggregates"]:
        kind = "BIGINT" if agg in ("count", "rows") else "DOUBLE"
        probe += [f"0::{kind} AS {_quote_ident(agg)}"]
        probe += [f"0.0::DOUBLE AS {agg}_scale"] if agg not in ("mean", "variance", "stddev") else []
        probe.append(f"0.0::DOUBLE AS {agg}_ci")
    with _interrupts(err) as interrupts:
        # A NULL value is skipped by the sum and the mean, as in SQL and Python (dp_group_by); a NULL user
        # or group is refused there too.
        released, output, elapsed = _release(args, err, interrupts, columns,
                                             f"SELECT {', '.join(probe)} FROM {_VIEW} LIMIT 0", run,
                                             nullable=["--value-col"])
        args.epsilon = values["epsilon"]
        # what dp_group_by_public charges without a delta (the file metadata records it)
        args.delta = values.get("delta") or 0.0
        doc = {"mechanism": macro, **{k: v for k, v in values.items() if k not in _GROUP_BY_FILES},
               "epsilon": float(args.epsilon), "delta": float(args.delta),
               **({} if args.items is None else {"items": args.items}), "input": args.input, "table": args.table,
               "calibration": dataclasses.asdict(cal)}
        return _finish(args, released, output, macro, doc, "rows", lambda rows: rows.to_pylist(), out, err,
                       interrupts, elapsed=elapsed)


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """INPUT, --table and DuckDB's CSV reader options (for an input read as CSV)."""
    p.add_argument("input", metavar="INPUT",
                   help="Parquet file, CSV file, JSON file (*.json, *.jsonl, *.ndjson), DuckDB database "
                        "(with --table), or several files as SQL's readers take them: a glob ('data/*.parquet', "
                        "'data/**/*.parquet', quoted) or a folder of Parquet files (hive partitions included)")
    p.add_argument("--table", help="table or view to read when INPUT is a DuckDB database")
    csv = p.add_argument_group("CSV input (DuckDB's read_csv options)")
    csv.add_argument("--delimiter", metavar="CHAR", help="field separator, e.g. ';' or '\\t' (default: sniffed)")
    csv.add_argument("--csv-types", metavar="COL=TYPE,...", action="append",
                     help="column types, e.g. user_id=VARCHAR,item=BIGINT (default: sniffed)")
    csv.add_argument("--sample-size", type=int, metavar="ROWS",
                     help="rows the type sniffer reads, -1 for the whole file (default: DuckDB's sample, "
                          "then the whole file if a later row does not fit)")
    csv.add_argument("--all-varchar", action="store_true", help="read every column as text")


def _add_release_options(p: argparse.ArgumentParser, *, rows: str) -> None:
    """--output, --json, --ledger and --seed of a release command."""
    p.add_argument("--output", metavar="FILE", help=f"write the {rows} to FILE: *.csv (CSV), *.parquet (Parquet) "
                                                    f"or *.json (a JSON array of row objects; *.jsonl: one a line)")
    p.add_argument("--json", action="store_true", help=f"print one JSON object with the parameters, "
                                                       f"calibration and {rows}")
    p.add_argument("--ledger", metavar="FILE", help="privacy ledger to charge (default: INPUT.dpsql-ledger; for a "
                                                    "glob or a folder, FOLDER.dpsql-ledger beside its folder)")
    p.add_argument("--seed", type=int, help="reproducible noise for tests: the result is NOT private")
    p.add_argument("--progress", action="store_true",
                   help="report progress on stderr while the release runs (the rounds done of a multi-round "
                        "method), then one line with what was released and how long it took")


def _default_help(macro: str, name: str) -> str:
    param = _params(macro).get(name)
    return "required" if param is None or param.required else \
        f"default: {str(param.sql_default()).strip(chr(39))}, as in SQL"


PLAIN_OUTPUT = ("Plain output is one value per line (columns separated by tabs, under a header line of column "
                "names when there are several); numbers are written as in CSV output, and a backslash, line "
                "break, tab or other control character in a value as \\\\, \\n, \\t, \\xHH. --output "
                "says on stderr what it wrote.")


def _add_ranked_parser(sub, name: str, macro: str, func: Callable, summary: str, description: str) -> None:
    p = sub.add_parser(name, help=summary, description=description + " " + PLAIN_OUTPUT)
    _add_input_options(p)
    p.add_argument("--k", type=int, required=True, help="number of items to release (at most)")
    p.add_argument("--epsilon", type=float, help=f"privacy parameter epsilon > 0 ({_default_help(macro, 'epsilon')})")
    p.add_argument("--delta", type=float, help=f"privacy parameter 0 < delta < 1 ({_default_help(macro, 'delta')})")
    p.add_argument("--max-items", type=int, help=f"items kept per user in the domain step "
                                                  f"({_default_help(macro, 'max_items')})")
    p.add_argument("--domain-method", choices=list(dpsql.METHODS),
                   help=f"set-union method of the domain step ({_default_help(macro, 'domain_method')})")
    p.add_argument("--user-col", default=_default(macro, "user_col", str),
                   help=f"user column ({_default_help(macro, 'user_col')})")
    p.add_argument("--item-col", default=_default(macro, "item_col", str),
                   help=f"item column ({_default_help(macro, 'item_col')})")
    _add_release_options(p, rows="items")
    p.set_defaults(func=func)


# --------------------------------------------------------------------------
# evaluate (NON-PRIVATE)
# --------------------------------------------------------------------------

EVALUATE_NOTE = ("NON-PRIVATE evaluation: computed from the raw input, not differentially private; "
                 "do not publish these numbers.")


def _header_names(path: Path, column: str) -> Optional[list[str]]:
    """The columns of a text file of released rows if its first line is a header naming ``column``, as
    DuckDB's CSV sniffer reads it; None for a file without one (or that is no CSV file DuckDB can sniff)."""
    con = duckdb.connect()
    try:
        names = [r[0] for r in con.execute(f"SELECT column_name FROM (DESCRIBE SELECT * FROM "
                                           f"read_csv({sql_string(str(path))}))").fetchall()]
    except duckdb.Error:
        return None
    finally:
        con.close()
    return names if column.lower() in (n.lower() for n in names) else None


def _open_released(con: duckdb.DuckDBPyConnection, source: _Source, column: str, item_type: Optional[str]) -> None:
    """TEMP view ``dpsql_released`` over the released rows: Parquet, JSON or CSV files as DuckDB reads them,
    or the plain output of a release command.

    A text file is plain output unless its first line is a header naming ``column`` without tabs (a CSV
    file, e.g. one --output wrote): one escaped value a line (:func:`escape_text`), or tab-separated under
    a header line of column names. A plain value is read as the input's item type ``item_type``, from the
    text DuckDB gave it (a text item is unescaped first). A one-column output whose first value is
    ``column``'s own name reads as a CSV file with that header.
    """
    location = sql_string(source.location)
    if source.kind == "duckdb":
        raise UsageError(f"--released {source.location!r} is a DuckDB database; give the Parquet, CSV or JSON "
                         f"file a release wrote (--output), or its plain output")
    first = ""
    if source.kind == "csv" and len(source.files) == 1:
        with source.first.open(encoding="utf-8", errors="replace", newline="") as f:
            first = f.readline().rstrip("\r\n")
    tabbed = "\t" in first and column.lower() in (unescape_text(f).lower() for f in first.split("\t"))
    if source.kind != "csv" or len(source.files) > 1 or (not tabbed and _header_names(source.first, column)):
        reader = {"parquet": "read_parquet", "json": "read_json"}.get(source.kind, "read_csv")
        con.execute(f"CREATE TEMP VIEW dpsql_released AS SELECT * FROM {reader}({location})")
        return
    lines = source.first.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if tabbed:
        names = [unescape_text(f).lower() for f in lines[0].split("\t")]
        at = names.index(column.lower())
        texts = [line.rstrip("\r").split("\t")[at] for line in lines[1:]]
    else:
        texts = [line.rstrip("\r") for line in lines]
    text_item = item_type is None or item_type.upper() == "VARCHAR"
    values = [unescape_text(t) if text_item else t for t in texts]
    con.register("dpsql_released_text", pa.table({column: pa.array(values, pa.string())}))
    name = _quote_ident(column)
    cast = "" if text_item else f"::{item_type}"
    con.execute(f"CREATE TEMP VIEW dpsql_released AS SELECT {name}{cast} AS {name} FROM dpsql_released_text")


def _top_k_released(con: duckdb.DuckDBPyConnection, args: argparse.Namespace, names: Sequence[str]) -> str:
    """The released rows the top-k missing mass compares (at most --k items): all of them, or the first k
    by rank of a ranked release (top-k and hitting-set --output write a column ``rank``)."""
    released_col = sql_string(args.released_col)
    [(count,)] = con.execute(f"SELECT count(*) FROM dp__eval_released_items('dpsql_released', "
                             f"released_col := {released_col})").fetchall()
    if count <= args.k:
        return "dpsql_released"
    if "rank" in names and args.released_col.lower() != "rank":
        con.execute(f"CREATE TEMP VIEW dpsql_released_top AS FROM dpsql_released ORDER BY rank LIMIT {int(args.k)}")
        return "dpsql_released_top"
    raise UsageError(f"dpsql: --k {args.k}: --released {args.released!r} holds {count} items and no rank column; "
                     f"the top-k missing mass compares at most k released items with the k most frequent, and an "
                     f"unranked release (set-union) does not say which k to take. Leave --k out, give --k {count} "
                     f"or more, or evaluate a ranked release (dpsql top-k --output FILE writes rank, item: its "
                     f"first k are taken)")


def cmd_evaluate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Missing mass, hits and coverage of a released item file against the raw INPUT (NON-PRIVATE)."""
    from dpsql.tools import metrics

    user_col = check_identifier("--user-col", args.user_col)
    item_col = check_identifier("--item-col", args.item_col)
    released_col = check_identifier("--released-col", args.released_col)
    if args.k is not None and args.k < 1:
        raise UsageError(f"--k must be >= 1 (got {args.k})")
    source, released = _source("INPUT", args.input), _source("--released", args.released)
    con = _connect(None)
    try:
        kind = source.kind
        reader = _reader(args, kind)
        input_name = f"{args.input!r} (read as {kind})"
        # A TEMP table of the two columns: read once (the metrics scan it many times), and a row
        # DuckDB cannot read is reported by line and column, never quoted.
        _copy_input(con, source, args.table, input_name, [("--user-col", user_col), ("--item-col", item_col)],
                    reader)
        _open_released(con, released, released_col, _column_type(con, _VIEW, item_col))
        names = [r[0].lower() for r in con.execute("SELECT name FROM pragma_table_info('dpsql_released')").fetchall()]
        if released_col.lower() not in names:
            raise UsageError(f"--released-col {released_col!r} is not a column of {args.released!r}")
        doc = metrics.evaluate(con, _VIEW, "dpsql_released", user_col=user_col, item_col=item_col,
                               released_col=released_col)
        if args.k is not None:
            top = _top_k_released(con, args, names)
            [(_, _, value)] = con.execute(
                f"FROM dp_eval_top_k_missing_mass({sql_string(_VIEW)}, {sql_string(top)}, {float(args.k)!r}, "
                f"user_col := {sql_string(user_col)}, item_col := {sql_string(item_col)}, "
                f"released_col := {sql_string(released_col)})").fetchall()
            doc["top_k_missing_mass"], doc["k"] = value, int(args.k)
    finally:
        con.close()
    doc = {"input": args.input, "released": args.released, "private": False, "note": EVALUATE_NOTE, **doc}
    if args.json:
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        mm = doc["missing_mass_p"]
        lines = [EVALUATE_NOTE, "",
                 f"released items: {doc['released_items']:,}",
                 f"missing mass (p=1): {mm['1']:.6f}   p=2: {mm['2']:.6f}   p=inf: {mm['inf']:.6f}   "
                 f"items missed (p=0): {int(mm['0']):,}",
                 f"users hit: {doc['hits']:,} of {doc['users']:,}"]
        if "top_k_missing_mass" in doc:
            lines.append(f"top-{doc['k']} missing mass: {doc['top_k_missing_mass']:.6f}")
        lines += ["", "frequency      items  released"]
        for b in doc["coverage_by_frequency"]:
            lines.append(f"{b['min_frequency']:>6}-{b['max_frequency']:<7} {b['items']:>6}  {b['released_items']:>8}")
        out.write("\n".join(lines) + "\n")
    out.flush()
    return 0


# --------------------------------------------------------------------------
# weighted-sample (ELEMENT-level privacy: one row of the input, not one user)
# --------------------------------------------------------------------------

def cmd_weighted_sample(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Private weighted sample / private histogram of INPUT (element-level DP); print keys (and tokens)."""
    from dpsql import pws

    _fill_defaults(args, "dp_weighted_sample", [("epsilon", float), ("delta", float), ("scheme", str),
                                                ("power", float), ("key_col", str)])
    eps, delta, tau, scheme, power = pws.check_pws_parameters(args.epsilon, args.delta, args.tau, args.scheme,
                                                              args.power)
    key_col = check_identifier("--key-col", args.key_col)
    freq_col = None if args.freq_col is None else check_identifier("--freq-col", args.freq_col)
    columns = [("--key-col", key_col)] + ([("--freq-col", freq_col)] if freq_col is not None else [])
    token = ", 0::BIGINT AS token" if args.with_frequencies else ""

    def run(con: duckdb.DuckDBPyConnection) -> pa.Table:
        released = pws.weighted_sample(con, _VIEW, epsilon=eps, delta=delta, tau=tau, scheme=scheme, power=power,
                                       with_frequencies=args.with_frequencies, key_col=key_col, freq_col=freq_col)
        return released if args.with_frequencies else released.select(["key"])

    with _interrupts(err) as interrupts:
        released, output, elapsed = _release(args, err, interrupts, columns,
                                             f"SELECT {_quote_ident(key_col)} AS key{token} FROM {_VIEW} LIMIT 0",
                                             run)
        doc = {"mechanism": "pws", "privacy_unit": "element (one input row), NOT user", "epsilon": eps,
               "delta": delta, "tau": tau, "scheme": scheme, "power": power,
               "with_frequencies": bool(args.with_frequencies), "input": args.input, "key_col": key_col,
               "freq_col": freq_col, "L": pws.L_value(eps, delta)}
        return _finish(args, released, output, "dp_weighted_sample", doc, "keys", lambda rows: rows.to_pylist(),
                       out, err, interrupts, elapsed=elapsed)


def _add_weighted_sample_parser(sub) -> None:
    macro = "dp_weighted_sample"
    ws = sub.add_parser("weighted-sample", help="private weighted sample / histogram (ELEMENT-level privacy)",
                        description="Release keys of INPUT (and, with --with-frequencies, sanitized frequency "
                                    "tokens) under ELEMENT-level (epsilon, delta)-DP: one input row is protected, "
                                    "NOT one user. Without --tau: private histogram; with --tau: private "
                                    "threshold sample (Cohen et al., private weighted sampling). " + PLAIN_OUTPUT)
    _add_input_options(ws)
    ws.add_argument("--epsilon", type=float, required=True,
                    help="privacy parameter epsilon > 0 (required, as in SQL)")
    ws.add_argument("--delta", type=float, required=True, help="privacy parameter 0 < delta < 1 (required, as in SQL)")
    ws.add_argument("--tau", type=float, help="sampling threshold > 0 (default: no sampling)")
    ws.add_argument("--scheme", help=f"ppswor or priority ({_default_help(macro, 'scheme')})")
    ws.add_argument("--power", type=float, help=f"sampling weight f(i) = i^power ({_default_help(macro, 'power')})")
    ws.add_argument("--with-frequencies", action="store_true", help="also release sanitized frequency tokens")
    ws.add_argument("--key-col", help=f"key column ({_default_help(macro, 'key_col')})")
    ws.add_argument("--freq-col", help="frequency column of an aggregated input (default: one row = one element)")
    _add_release_options(ws, rows="sample")
    ws.set_defaults(func=cmd_weighted_sample)


# --------------------------------------------------------------------------
# budget (the privacy ledger)
# --------------------------------------------------------------------------

def _target_ledger(target: str) -> Ledger:
    """TARGET is a ledger file, or a database / data file whose sidecar ledger is meant."""
    path = Path(target)
    if path.name.endswith(ledger_mod.LEDGER_SUFFIX):
        if not path.exists():
            raise UsageError(f"ledger {target!r} does not exist")
        return Ledger(path)
    if not path.exists():
        raise UsageError(f"{target!r} does not exist; give a DuckDB database, a data file or a "
                         f"*{ledger_mod.LEDGER_SUFFIX} file")
    return Ledger(ledger_mod.sidecar_path(path))


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.6g}"


def _seeded(release: object) -> bool:
    """True for a release made with reproducible (seeded) noise: NOT private."""
    return bool(getattr(release, "seeded", False))


def _seeded_per_scope(status, releases) -> dict[str, int]:
    """Seeded (NOT private) releases per scope: the ledger's count, else counted from the releases."""
    counts = {}
    for s in status:
        counted = getattr(s, "seeded_releases", None)
        if counted is None:
            counted = sum(1 for r in releases
                          if _seeded(r) and (s.scope == ledger_mod.DATABASE_SCOPE or r.table == s.scope))
        counts[s.scope] = int(counted)
    return counts


def _release_doc(release: ledger_mod.Release) -> dict[str, Any]:
    """One release as JSON: released_at in ISO 8601 UTC, parameters and calibration as JSON values."""
    if isinstance(release, ledger_mod.Release):
        doc = release.to_json()
    else:  # a release-like object from elsewhere: its fields as they are
        doc = dataclasses.asdict(release) if dataclasses.is_dataclass(release) else dict(vars(release))
    doc["seeded"] = _seeded(release)
    doc["private"] = not doc["seeded"]
    return doc


SEEDED_NOTE = ("seeded releases used reproducible noise (--seed / seed=): they are NOT differentially private, "
               "and the budget counts them like any other release")


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A plain text table whose column widths come from its cells (a scope name may be any length)."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip() + "\n"

    return line(headers) + "".join(line(r) for r in rows)


def _spent_of(spent: Sequence[str], budget: Sequence[str]) -> list[str]:
    """``spent / budget`` cells whose slashes line up."""
    ws, wb = max(map(len, spent), default=0), max(map(len, budget), default=0)
    return [f"{a:>{ws}} / {b:<{wb}}".rstrip() for a, b in zip(spent, budget)]


def _status_table(status: Sequence[ledger_mod.ScopeStatus], seeded: dict[str, int]) -> str:
    eps = _spent_of([_fmt(s.epsilon_spent) for s in status], [_fmt(s.epsilon_budget) for s in status])
    delta = _spent_of([_fmt(s.delta_spent) for s in status], [_fmt(s.delta_budget) for s in status])
    # the spent / budget cells are left-aligned (their slashes line up); the counts are right-aligned
    rows = [(s.scope, e, d, str(s.releases), str(seeded[s.scope])) for s, e, d in zip(status, eps, delta)]
    return _text_table(("scope", "epsilon spent / budget", "delta spent / budget", "releases", "seeded (NOT private)"),
                       rows, right=(3, 4))


def _releases_table(releases: Sequence[ledger_mod.Release]) -> str:
    rows = [(str(r.id), time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.time)), r.unit, f"{r.epsilon:.6g}",
             f"{r.delta:.6g}", "NO (seeded)" if _seeded(r) else "yes", r.table, r.mechanism) for r in releases]
    return _text_table(("id", "released at (UTC)", "unit", "epsilon", "delta", "private", "table", "mechanism"),
                       rows, right=(0,))


def _budget_database(target: str) -> tuple[Optional[Path], str]:
    """The DuckDB database TARGET names, to check a scope against: the database file itself, or the one beside a
    ``*.dpsql-ledger`` TARGET; else None and why there is none."""
    path = Path(target)
    if path.name.endswith(ledger_mod.LEDGER_SUFFIX):
        database = path.with_name(path.name[:-len(ledger_mod.LEDGER_SUFFIX)])
        if not database.is_file():
            return None, f"{target} is a ledger file with no database file {database.name} beside it"
    else:
        database = path
    try:
        kind = _input_kind(database)
    except OSError as exc:
        return None, f"{str(database)} could not be read ({exc.strerror or exc})"
    if kind != "duckdb":
        return None, (f"{database.name} is a {kind} file, without tables; its releases are charged to 'database' "
                      f"and to '{ledger_mod.file_scope(database)}', the scope --scope {str(database)} names")
    return database, ""


def _set_target_budget(ledger: Ledger, args: argparse.Namespace, err: TextIO) -> None:
    """``budget set``: checked against the database, as dpsql.set_budget and dp_set_budget() check it (a view
    is refused, a table that does not exist yet is warned about), and against the scope's spending (a budget
    below it is refused, changing nothing)."""
    # Imported here: the rest of the command line does not need them.
    from dpsql.core import ledger_sql
    from dpsql.core.scopes import Catalog

    if args.scope.strip().lower() == ledger_mod.DATABASE_SCOPE:
        ledger.set_budget(args.epsilon, args.delta, args.scope)
        return
    database, why = _budget_database(args.target)
    catalog = None
    if database is not None:
        try:
            con = dpsql.connect(str(database), read_only=True)
        except Exception as exc:  # e.g. another process holds it for writing
            why = f"{str(database)} could not be opened to check it ({error_line(exc)[len('Error: '):]})"
        else:
            try:
                ((row,),) = con.execute("SELECT dp__catalog(NULL)").fetchall()
                catalog = Catalog.from_row(row)
            finally:
                con.close()
    change = ledger_sql.set_scope_budget(ledger, args.scope, args.epsilon, args.delta, catalog, unchecked=why)
    if change.note:
        print(f"dpsql: warning: {change.note}", file=err, flush=True)


def cmd_budget(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Set or show the privacy budget of a database (or data file) and list its releases."""
    ledger = _target_ledger(args.target)
    if args.action == "set":
        if args.epsilon is None or args.delta is None:
            raise UsageError("budget set needs --epsilon and --delta")
        _set_target_budget(ledger, args, err)
    elif args.action == "remove":
        if not ledger.remove_budget(args.scope):
            print(f"dpsql: warning: scope {args.scope!r} ('{ledger.scope(args.scope)}') had no budget in "
                  f"{str(ledger.path)}; nothing was removed ('dpsql budget show' lists the scopes)", file=err,
                  flush=True)
    status, releases = ledger.status(), ledger.releases()
    seeded = _seeded_per_scope(status, releases)
    if args.json:
        doc = {"ledger": str(ledger.path), "composition": "basic (sums of epsilon and delta)",
               "scopes": [{**dataclasses.asdict(s), "epsilon_remaining": s.epsilon_remaining,
                           "delta_remaining": s.delta_remaining, "seeded_releases": seeded[s.scope],
                           # False when any release charged to the scope used a seed (NOT private)
                           "private": seeded[s.scope] == 0} for s in status]}
        if any(seeded.values()):
            doc["note"] = SEEDED_NOTE
        if args.action == "releases":
            doc["releases"] = [_release_doc(r) for r in releases]
        out.write(json.dumps(doc, indent=2) + "\n")
    elif args.action == "releases":
        out.write(_releases_table(releases))
        if any(_seeded(r) for r in releases):
            out.write(f"NOT PRIVATE: {SEEDED_NOTE}\n")
    else:
        out.write(f"ledger: {ledger.path} (basic composition: sums)\n")
        out.write(_status_table(status, seeded))
        if any(seeded.values()):
            out.write(f"NOT PRIVATE: {SEEDED_NOTE}\n")
    out.flush()
    return 0


def _add_budget_parser(sub) -> None:
    bp = sub.add_parser("budget", help="set or show the privacy budget (ledger) of a database or data file",
                        description="The privacy ledger of TARGET (a DuckDB database, a Parquet/CSV file, or a "
                                    "*.dpsql-ledger file): 'show' spent and remaining budget per scope, 'set' a "
                                    "budget, 'remove' one, list 'releases'. Composition is basic: sums. "
                                    "Releases made with --seed (reproducible noise) are counted and marked "
                                    "NOT private.")
    bp.add_argument("action", choices=["show", "set", "remove", "releases"])
    bp.add_argument("target", metavar="TARGET", help="DuckDB database, data file, or ledger file")
    bp.add_argument("--epsilon", type=float, help="total epsilon of the scope (set)")
    bp.add_argument("--delta", type=float, help="total delta of the scope, 0 <= delta < 1 (set)")
    bp.add_argument("--scope", default="database",
                    help="'database' (default), a table name (checked against the DuckDB database: a view is "
                         "refused, a table that does not exist yet is warned about) or a file path")
    bp.add_argument("--json", action="store_true", help="print one JSON object")
    bp.set_defaults(func=cmd_budget)


# --------------------------------------------------------------------------
# shell and demo
# --------------------------------------------------------------------------

def cmd_shell(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the SQL shell (its options are defined in dpsql.frontends.shell)."""
    return shell_mod.run_args(args, out, err)


def cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run every method on the embedded dataset and print the report."""
    from dpsql.tools import demo

    if args.seed is not None:
        print(SEED_WARNING, file=err, flush=True)
    rows = demo.run_demo(seed=args.seed)
    demo.print_demo(rows, demo.dataset_summary(), as_json=args.json, seeded=args.seed is not None, out=out,
                    top_k=demo.run_top_k(seed=args.seed))
    return 0


# --------------------------------------------------------------------------
# mechanisms
# --------------------------------------------------------------------------

def cmd_mechanisms(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """List every registered mechanism (:mod:`dpsql.core.registry`): one a line, or JSON."""
    from dpsql.core import registry

    declared = list(registry.all_mechanisms().values())
    if args.json:
        print(json.dumps([{"name": m.name, "family": m.family, "macro": m.macro, "unit": m.unit,
                           "parameters": list(m.param_names), "proof": m.proof, "description": m.description}
                          for m in declared]), file=out)
        return 0
    columns = ("mechanism", "family", "unit", "macro")
    rows = [columns] + [(m.name, m.family, m.unit, m.macro) for m in declared]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip(), file=out)
    return 0


# --------------------------------------------------------------------------
# Parser and entry point
# --------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``dpsql`` command."""
    parser = _Parser(prog="dpsql", description="Differentially private set union as SQL inside DuckDB.")
    parser.add_argument("--version", action="version", version=f"dpsql {dpsql.__version__}")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")

    shell = sub.add_parser("shell", help="SQL prompt on a DuckDB database with dpsql's macros",
                           description="SQL prompt on a DuckDB database with dpsql's functions and macros. "
                                       "Reads SQL from -c, from stdin when it is not a terminal, or interactively.")
    shell_mod.add_arguments(shell)
    shell.set_defaults(func=cmd_shell)

    su = sub.add_parser("set-union", help="release items of a table under user-level differential privacy",
                        description="Release the items of INPUT under user-level (epsilon, delta)-DP. Prints the "
                                    "released items one per line, unless --output or --json is given. A flag "
                                    "left out takes the SQL macro's default. " + PLAIN_OUTPUT)
    _add_input_options(su)
    su.add_argument("--method", choices=list(dpsql.METHODS), default=_default("dp_set_union", "method", str),
                    help=f"set-union mechanism ({_default_help('dp_set_union', 'method')})")
    su.add_argument("--epsilon", type=float,
                    help=f"privacy parameter epsilon > 0 ({_default_help('dp_set_union', 'epsilon')})")
    su.add_argument("--delta", type=float,
                    help=f"privacy parameter 0 < delta < 1 ({_default_help('dp_set_union', 'delta')})")
    su.add_argument("--max-items", type=int, help=f"items kept per user, a uniform sample of larger sets "
                                                  f"({_default_help('dp_set_union', 'max_items')})")
    su.add_argument("--user-col", default=_default("dp_set_union", "user_col", str),
                    help=f"user column ({_default_help('dp_set_union', 'user_col')})")
    su.add_argument("--item-col", default=_default("dp_set_union", "item_col", str),
                    help=f"item column ({_default_help('dp_set_union', 'item_col')})")
    _add_method_options(su)
    _add_release_options(su, rows="items")
    su.set_defaults(func=cmd_set_union)

    _add_ranked_parser(sub, "top-k", "dp_top_k", cmd_top_k,
                       "release the (about) k items most users hold, user-level DP, unknown domain",
                       "Release at most k items of INPUT, in rank order, under user-level (epsilon, delta)-DP "
                       "(dp_top_k: a set-union release at (epsilon/2, delta/2) is the domain, then k-fold peeling "
                       "at (epsilon/2, delta/2)). Prints the items one per line in rank order, unless --output "
                       "(columns rank, item) or --json is given. A flag left out takes the SQL macro's default.")
    from dpsql.groupby import AGGREGATES

    gb = sub.add_parser("group-by", help=f"private GROUP BY of one or several columns: {', '.join(AGGREGATES)} per "
                                         f"group, user-level DP",
                        description="Release, per group of INPUT (a value of the item column, or of the --group-cols "
                                    "columns), the noisy --aggregates: count (users), rows (rows, counting up to "
                                    "--max-rows per user), and the sum, mean, variance, stddev and median of each "
                                    "user's total of --value-col clamped to [--lower, --upper], under user-level "
                                    "(epsilon, delta)-DP (dp_group_by: a set-union selection, then granular Gaussian "
                                    "(or --noise laplace) aggregates, composed to (epsilon, delta)); with --items, "
                                    "every group of that public list, at (epsilon, delta) or, without --delta, "
                                    "(epsilon, 0) with Laplace noise (dp_group_by_public). Each value comes with its "
                                    "noise scale and the half-width of a --confidence interval. The flags are "
                                    "dp_group_by's parameters; a flag left out takes the SQL macro's default. "
                                    + PLAIN_OUTPUT)
    _add_input_options(gb)
    _add_group_by_options(gb)
    _add_release_options(gb, rows="rows")
    gb.set_defaults(func=cmd_group_by)
    _add_ranked_parser(sub, "hitting-set", "dp_hitting_set", cmd_hitting_set,
                       "release k items that together hit many users, user-level DP, unknown domain",
                       "Release at most k items of INPUT, in the order they were picked, that together are held "
                       "by as many users as possible, under user-level (epsilon, delta)-DP (dp_hitting_set: a "
                       "set-union release at (epsilon/2, delta/2) is the domain, then user peeling at "
                       "(epsilon/2, delta/2)). Prints the items one per line in rank order, unless --output "
                       "(columns rank, item) or --json is given. A flag left out takes the SQL macro's default.")
    _add_weighted_sample_parser(sub)
    _add_budget_parser(sub)
    demo = sub.add_parser("demo", help="compare every method on the embedded r/AskReddit sample",
                          description="Run every set-union method on the embedded r/AskReddit sample at "
                                      "epsilon=1, delta=1e-5, max_items=100 and report (non-privately) "
                                      "how much of the data each released set covers.")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.add_argument("--seed", type=int, help="reproducible noise: the result is NOT private")
    demo.set_defaults(func=cmd_demo)

    mechs = sub.add_parser("mechanisms", help="list every mechanism: name, family, privacy unit, SQL macro",
                           description="List every mechanism dpsql has registered (its declarations): name, "
                                       "family, privacy unit and the SQL macro that releases it.")
    mechs.add_argument("--json", action="store_true", help="print a JSON list with parameters and descriptions")
    mechs.set_defaults(func=cmd_mechanisms)

    ev = sub.add_parser("evaluate", help="NON-PRIVATE: missing mass, hits and coverage of released items",
                        description="Compare a file of released items with the raw INPUT: missing mass MM_p "
                                    "(p = 0, 1, 2, inf), top-k missing mass (--k), users hit, and items per "
                                    "frequency bucket. Reads the raw data: the numbers are NOT private.")
    _add_input_options(ev)
    ev.add_argument("--released", required=True, metavar="FILE",
                    help="Parquet, CSV or JSON file of released items (as --output writes them), or a release's "
                         "plain output")
    ev.add_argument("--released-col", default="item", help="item column of --released (default: item)")
    ev.add_argument("--k", type=int, help="also report the top-k missing mass: of the first k items by rank of a "
                                          "ranked release (top-k, hitting-set --output), or of an unranked one "
                                          "holding at most k items")
    ev.add_argument("--user-col", default="user_id", help="user column (default: user_id)")
    ev.add_argument("--item-col", default="item", help="item column (default: item)")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.set_defaults(func=cmd_evaluate)
    return parser


def main(argv: Optional[Sequence[str]] = None, *, out: Optional[TextIO] = None,
         err: Optional[TextIO] = None) -> int:
    """Run the ``dpsql`` command with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "func", None) is None:
            build_parser().print_help(err)
            return 2
        return args.func(args, out, err)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    except (KeyboardInterrupt, duckdb.InterruptException):  # runner.Interrupted included
        print("Error: dpsql: interrupted (Ctrl-C); nothing was released or charged", file=err, flush=True)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python from
        # complaining about the unflushable stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:  # every failure is one line, never a traceback
        # dpsql's own exception when DuckDB wrapped one ("...UDF: BudgetExceededError: dpsql: ..."), so
        # that its message is printed once and a bad parameter or input exits with 2.
        shown = from_engine(exc)
        if isinstance(shown, (UsageError, ParameterError, InputError)):
            print(f"Error: {shown}", file=err, flush=True)
            return 2
        print(_error_line(shown), file=err, flush=True)
        return 1


def _error_line(exc: BaseException) -> str:
    """:func:`dpsql.frontends.shell.error_line`, except for an engine error that may quote the data (a value that
    could not be converted, a line of a file): then only its kind."""
    line = error_line(exc)
    if quotes_data(exc):
        kind = line[len("Error: "):].split(":", 1)[0]
        csv_line, json_line = _CSV_LINE.match(str(exc)), _JSON_LINE.match(str(exc))
        at = (f" on line {csv_line.group(1)} of a CSV file" if csv_line else
              f" in {json_line.group(2).replace('/value', '')} {json_line.group(3)} of a JSON file" if json_line else "")
        return f"Error: {kind}: DuckDB could not read or convert a value{at}; {NOT_SHOWN}"
    return line
