"""The ``dpsql`` command line: ``shell``, ``set-union`` and ``demo``.

Exit codes: 0 success; 1 a failure while running (an engine or I/O error);
2 a bad argument, parameter or input description (the message names it).
Every error is one ``Error: ...`` line on stderr, never a traceback. Only
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
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO

import duckdb
import pyarrow as pa

import dpsql
from dpsql import ledger as ledger_mod
from dpsql.ledger import Ledger
from dpsql.release import sorted_release
from dpsql.shell import error_line, run_shell
from dpsql.validation import DPParameterError, check_identifier, sql_string

__all__ = ["main", "UsageError"]

SEED_WARNING = ("WARNING: --seed makes noise and sampling reproducible: this result is NOT differentially "
                "private. Use --seed only for tests and demos.")

_VIEW = "dpsql_input"      # the TEMP table a release reads (a copy of the needed input columns)
_RAW = "dpsql_raw_input"   # the TEMP view over the input file or table
_SOURCE_DB = "dpsql_source"
# --output suffix -> format; any other name is refused before the release.
OUTPUT_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".parq": "parquet"}


class UsageError(Exception):
    """A bad command-line argument or input description (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become one ``Error:`` line and exit code 2 (see :func:`main`)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'



# --------------------------------------------------------------------------
# set-union
# --------------------------------------------------------------------------

def _input_kind(path: Path) -> str:
    """``parquet``, ``duckdb`` or ``csv``, from the file's magic bytes (extensions are often wrong)."""
    with open(path, "rb") as f:
        head = f.read(12)
    if head[:4] == b"PAR1":
        return "parquet"
    if head[8:12] == b"DUCK":
        return "duckdb"
    return "csv"


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


def _open_input(con: duckdb.DuckDBPyConnection, path: Path, kind: str, table: Optional[str], input_name: str,
                view: str = _VIEW, whole_csv: bool = False) -> None:
    """Create the TEMP view ``view`` over the input (a DuckDB file is attached read-only).

    ``whole_csv``: the CSV sniffer reads every row instead of a sample (slow, and again on each
    use of the view), so that a column whose values change type after the sample gets a type
    that fits them all.
    """
    location = sql_string(str(path))
    if kind == "duckdb":
        con.execute(f"ATTACH {location} AS {_SOURCE_DB} (READ_ONLY)")
        schema, name = _pick_table(_source_tables(con), table, input_name)
        source = f"{_SOURCE_DB}.{_quote_ident(schema)}.{_quote_ident(name)}"
    elif kind == "parquet":
        source = f"read_parquet({location})"
    else:
        source = f"read_csv({location}{', sample_size=-1' if whole_csv else ''})"
    con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {source}")


def _check_input_columns(con: duckdb.DuckDBPyConnection, columns: Sequence[tuple[str, str]], input_name: str,
                         view: str = _VIEW) -> None:
    """Name the CLI flag when a column is missing (the library would name its internal view)."""
    present = [row[0] for row in con.execute(f"SELECT name FROM pragma_table_info('{view}')").fetchall()]
    lowered = {c.lower() for c in present}
    for flag, col in columns:
        if col.lower() not in lowered:
            raise UsageError(f"{flag} {col!r} is not a column of {input_name}; its columns are {', '.join(present)}")
    if len({col.lower() for _, col in columns}) < len(columns):
        raise UsageError(f"{' and '.join(flag for flag, _ in columns)} must name different columns")


def _load_input(con: duckdb.DuckDBPyConnection, path: Path, kind: str, table: Optional[str], input_name: str,
                columns: Sequence[tuple[str, str]]) -> None:
    """Copy ``columns`` (flag, name) of the input into the TEMP table ``dpsql_input``, checked.

    Runs before the release: the whole input is read once here, so an unreadable row or a value
    that does not fit its column's type fails now, and so does a NULL in any of the columns.
    Nothing has been charged when this raises.
    """
    def unreadable(exc: duckdb.Error) -> UsageError:
        # DuckDB's CSV errors go on with reader options the command line does not take: keep the cause.
        cause = re.split(r" Possible (?:solutions|fixes)| file = ", error_line(exc)[len("Error: "):])[0]
        return UsageError(f"{input_name} could not be read completely ({cause.strip()}); "
                          f"nothing was released or charged")

    try:
        _open_input(con, path, kind, table, input_name, view=_RAW)  # the CSV sniffer reads a sample here
    except duckdb.Error as exc:
        raise unreadable(exc) from None
    _check_input_columns(con, columns, input_name, view=_RAW)
    names = [_quote_ident(col) for _, col in columns]
    copy = f"CREATE OR REPLACE TEMP TABLE {_VIEW} AS SELECT {', '.join(names)} FROM {_RAW}"
    try:
        con.execute(copy)
    except duckdb.Error as exc:
        if kind != "csv":
            raise unreadable(exc) from None
        # Most often a type the sniffer guessed from its sample that later rows do not fit:
        # sniff the whole file and read it again.
        try:
            _open_input(con, path, kind, table, input_name, view=_RAW, whole_csv=True)
            con.execute(copy)
        except duckdb.Error:
            raise unreadable(exc) from None
    nulls = con.execute("SELECT " + ", ".join(f"bool_or({n} IS NULL)" for n in names) + f" FROM {_VIEW}").fetchall()
    for (flag, col), has_null in zip(columns, nulls[0]):
        if has_null:
            raise UsageError(f"{flag} {col!r} contains NULL in {input_name}; filter those rows out first "
                             f"(e.g. a view WHERE {col} IS NOT NULL); nothing was released or charged")


@dataclasses.dataclass(frozen=True)
class _Output:
    """A checked ``--output`` file and its format."""

    path: Path
    format: str  # 'csv' or 'parquet'


def _output_path(output: Optional[str], input_path: Path) -> Optional[_Output]:
    """The --output file, checked before anything is read: known format, writable, not the input."""
    if output is None:
        return None
    path = Path(output)
    fmt = OUTPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(f"--output {output!r}: unknown format; name the file *.parquet or *.csv")
    if not path.parent.is_dir():
        raise UsageError(f"--output {output!r}: folder {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise UsageError(f"--output {output!r} is a folder; name a file")
    if path.exists() and path.resolve() == input_path.resolve():
        raise UsageError("--output must not be the input file")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"--output {output!r} exists and is not writable")
    return _Output(path, fmt)


def _write(rows: pa.Table, output: _Output, metadata: Optional[dict[str, str]] = None) -> None:
    """Write ``rows`` in their order: Parquet (zstd, with ``metadata`` as key-value metadata) or CSV.

    DuckDB writes every column type (lists, structs, blobs included; CSV shows them as text).
    """
    con = duckdb.connect()
    try:
        con.register("dpsql_released", rows)
        if output.format == "csv":
            options = "FORMAT csv, HEADER true"
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
    tty = err.isatty()

    def report(pct: float) -> None:
        # Called while the release runs: an exception here would abandon a charged release.
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
        return dpsql.connect(seed=seed, ledger=ledger)


def _input_ledger(args: argparse.Namespace, input_path: Path, kind: str) -> Ledger:
    """The ledger a release from INPUT is charged to: --ledger, else the sidecar of the input file.

    The release reads the input through the TEMP table ``dpsql_input``; the ledger records the
    DuckDB table (--table, as a table of that database) or the input file (its absolute path)
    instead, so that 'dpsql budget set INPUT --scope' can name it.
    """
    path = Path(args.ledger) if args.ledger else ledger_mod.sidecar_path(input_path)
    if args.ledger and not path.parent.is_dir():
        raise UsageError(f"--ledger {args.ledger!r}: folder {str(path.parent)!r} does not exist")
    if kind == "duckdb" and args.table:
        # A table scope is a catalog identity: the table of the input database, whatever the ledger's name.
        return Ledger(path, aliases={_VIEW: args.table}, database=ledger_mod.database_alias(input_path))
    return Ledger(path, aliases={_VIEW: str(input_path.resolve())})


def _input_file(args: argparse.Namespace) -> tuple[Path, str, Optional[_Output]]:
    """INPUT, its kind and the --output file, all checked before anything is read."""
    input_path = Path(args.input)
    if not input_path.exists():
        raise UsageError(f"input file {args.input!r} does not exist")
    if not input_path.is_file():
        raise UsageError(f"input {args.input!r} is not a file")
    kind = _input_kind(input_path)
    if args.table is not None and kind != "duckdb":
        raise UsageError(f"--table applies to a DuckDB database input; {args.input!r} is a {kind} file")
    return input_path, kind, _output_path(args.output, input_path)


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


def cmd_set_union(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Release items of INPUT; print them, write them, or print a JSON summary."""
    cal = dpsql.calibrate(args.method, args.epsilon, args.delta, args.max_items)
    user_col = check_identifier("--user-col", args.user_col)
    item_col = check_identifier("--item-col", args.item_col)
    input_path, kind, output = _input_file(args)
    if args.seed is not None:
        print(SEED_WARNING, file=err, flush=True)

    con = _connect(args.seed, _input_ledger(args, input_path, kind))
    try:
        _load_input(con, input_path, kind, args.table, f"{args.input!r} (read as {kind})",
                    [("--user-col", user_col), ("--item-col", item_col)])
        if output is not None:
            _probe_output(con, f"SELECT {_quote_ident(item_col)} AS item FROM {_VIEW} LIMIT 0", output)
        started = time.perf_counter()
        released = dpsql.set_union(con, _VIEW, args.method, epsilon=args.epsilon, delta=args.delta,
                                   max_items=args.max_items, user_col=user_col, item_col=item_col,
                                   progress=_progress_printer(err) if args.progress else None,
                                   alpha=args.alpha, passes=args.passes)
        elapsed = time.perf_counter() - started
    finally:
        con.close()

    # Charged: from here on nothing may stop the rows from reaching the user.
    released = _ordered(released)
    written = _deliver(released, output, _file_metadata(args, dpsql.METHODS[args.method].macro), err)
    if args.json:
        doc = {
            "method": args.method,
            "epsilon": float(args.epsilon),
            "delta": float(args.delta),
            "max_items": int(args.max_items),
            "input": args.input,
            "table": args.table,
            "user_col": user_col,
            "item_col": item_col,
            "n_released": released.num_rows,
            "calibration": {"noise": cal.noise, "scale": cal.scale, "threshold": cal.threshold},
            # Adaptive / multi-round methods: every round's budget share, noise scale, release
            # threshold and (MAD) truncation level; "calibration" then holds the last round's.
            **({"calibration_rounds": [dataclasses.asdict(r) for r in cal.rounds]} if cal.rounds else {}),
            **_privacy_fields(args),
            **{k: v for k, v in (("alpha", args.alpha), ("passes", args.passes)) if v is not None},
        }
        if output is not None and written:
            doc["output"] = str(output.path)
        else:
            doc["items"] = released.column("item").to_pylist()
            if output is not None:
                doc["output_failed"] = str(output.path)
        out.write(json.dumps(doc, indent=2, default=str) + "\n")
    elif output is None or not written:
        for item in released.column("item").to_pylist():
            out.write(f"{item}\n")
    out.flush()
    if args.progress:
        _say(err, f"dpsql: {args.method} released {released.num_rows} items in {elapsed:.2f} s")
    return 0 if written else 1


# --------------------------------------------------------------------------
# evaluate (NON-PRIVATE)
# --------------------------------------------------------------------------

EVALUATE_NOTE = ("NON-PRIVATE evaluation: computed from the raw input, not differentially private; "
                 "do not publish these numbers.")


def _open_released(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """TEMP view ``dpsql_released`` over a Parquet or CSV file of released items (column ``item``)."""
    location = sql_string(str(path))
    reader = "read_parquet" if _input_kind(path) == "parquet" else "read_csv"
    con.execute(f"CREATE TEMP VIEW dpsql_released AS SELECT * FROM {reader}({location})")


def cmd_evaluate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Missing mass, hits and coverage of a released item file against the raw INPUT (NON-PRIVATE)."""
    from dpsql import metrics

    user_col = check_identifier("--user-col", args.user_col)
    item_col = check_identifier("--item-col", args.item_col)
    if args.k is not None and args.k < 1:
        raise UsageError(f"--k must be >= 1 (got {args.k})")
    paths = {}
    for flag, value in (("INPUT", args.input), ("--released", args.released)):
        path = Path(value)
        if not path.is_file():
            raise UsageError(f"{flag} file {value!r} does not exist")
        paths[flag] = path
    con = _connect(None)
    try:
        kind = _input_kind(paths["INPUT"])
        _open_input(con, paths["INPUT"], kind, args.table, repr(args.input))
        _check_input_columns(con, [("--user-col", user_col), ("--item-col", item_col)],
                             f"{args.input!r} (read as {kind})")
        _open_released(con, paths["--released"])
        names = [r[0].lower() for r in con.execute("SELECT name FROM pragma_table_info('dpsql_released')").fetchall()]
        if args.released_col.lower() not in names:
            raise UsageError(f"--released-col {args.released_col!r} is not a column of {args.released!r}")
        doc = metrics.evaluate(con, _VIEW, "dpsql_released", k=args.k, user_col=user_col, item_col=item_col,
                               released_col=args.released_col)
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

    eps, delta, tau, scheme, power = pws.check_pws_parameters(args.epsilon, args.delta, args.tau, args.scheme,
                                                              args.power)
    key_col = check_identifier("--key-col", args.key_col)
    freq_col = None if args.freq_col is None else check_identifier("--freq-col", args.freq_col)
    input_path, kind, output = _input_file(args)
    if args.seed is not None:
        print(SEED_WARNING, file=err, flush=True)
    con = _connect(args.seed, _input_ledger(args, input_path, kind))
    try:
        columns = [("--key-col", key_col)] + ([("--freq-col", freq_col)] if freq_col is not None else [])
        _load_input(con, input_path, kind, args.table, f"{args.input!r} (read as {kind})", columns)
        if output is not None:
            token = ", 0::BIGINT AS token" if args.with_frequencies else ""
            _probe_output(con, f"SELECT {_quote_ident(key_col)} AS key{token} FROM {_VIEW} LIMIT 0", output)
        released = pws.weighted_sample(con, _VIEW, eps, delta, tau=tau, scheme=scheme, power=power,
                                       with_frequencies=args.with_frequencies, key_col=key_col, freq_col=freq_col)
    finally:
        con.close()

    # Charged: from here on nothing may stop the rows from reaching the user.
    if not args.with_frequencies:
        released = released.select(["key"])
    released = _ordered(released)
    written = _deliver(released, output, _file_metadata(args, "dp_weighted_sample"), err)
    if args.json:
        doc = {"mechanism": "pws", "privacy_unit": "element (one input row), NOT user", "epsilon": eps,
               "delta": delta, "tau": tau, "scheme": scheme, "power": power,
               "with_frequencies": bool(args.with_frequencies), "input": args.input, "key_col": key_col,
               "freq_col": freq_col, "n_released": released.num_rows, "L": pws.L_value(eps, delta),
               **_privacy_fields(args)}
        if output is not None and written:
            doc["output"] = str(output.path)
        else:
            doc["keys"] = released.to_pylist()
            if output is not None:
                doc["output_failed"] = str(output.path)
        out.write(json.dumps(doc, indent=2, default=str) + "\n")
    elif output is None or not written:
        for row in released.to_pylist():
            out.write("\t".join(str(v) for v in row.values()) + "\n")
    out.flush()
    return 0 if written else 1


def _add_weighted_sample_parser(sub) -> None:
    ws = sub.add_parser("weighted-sample", help="private weighted sample / histogram (ELEMENT-level privacy)",
                        description="Release keys of INPUT (and, with --with-frequencies, sanitized frequency "
                                    "tokens) under ELEMENT-level (epsilon, delta)-DP: one input row is protected, "
                                    "NOT one user. Without --tau: private histogram; with --tau: private "
                                    "threshold sample (Cohen et al., private weighted sampling).")
    ws.add_argument("input", metavar="INPUT", help="Parquet file, CSV file, or DuckDB database (with --table)")
    ws.add_argument("--epsilon", type=float, required=True, help="privacy parameter epsilon > 0")
    ws.add_argument("--delta", type=float, required=True, help="privacy parameter 0 < delta < 1")
    ws.add_argument("--tau", type=float, help="sampling threshold > 0 (default: no sampling)")
    ws.add_argument("--scheme", default="ppswor", help="ppswor (default) or priority")
    ws.add_argument("--power", type=float, default=1.0, help="sampling weight f(i) = i^power (default 1)")
    ws.add_argument("--with-frequencies", action="store_true", help="also release sanitized frequency tokens")
    ws.add_argument("--key-col", default="key", help="key column (default: key)")
    ws.add_argument("--freq-col", help="frequency column of an aggregated input (default: one row = one element)")
    ws.add_argument("--table", help="table or view to read when INPUT is a DuckDB database")
    ws.add_argument("--output", metavar="FILE", help="write the sample to FILE: *.csv (CSV) or *.parquet (Parquet)")
    ws.add_argument("--json", action="store_true", help="print one JSON object with parameters and sample")
    ws.add_argument("--ledger", metavar="FILE", help="privacy ledger to charge (default: INPUT.dpsql-ledger)")
    ws.add_argument("--seed", type=int, help="reproducible noise for tests: the result is NOT private")
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


def _seeded(release) -> bool:
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


def _release_doc(release) -> dict:
    doc = dataclasses.asdict(release) if dataclasses.is_dataclass(release) else dict(vars(release))
    doc["seeded"] = _seeded(release)
    doc["private"] = not doc["seeded"]
    return doc


SEEDED_NOTE = ("seeded releases used reproducible noise (--seed / seed=): they are NOT differentially private, "
               "and the budget counts them like any other release")


def cmd_budget(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Set or show the privacy budget of a database (or data file) and list its releases."""
    ledger = _target_ledger(args.target)
    if args.action == "set":
        if args.epsilon is None or args.delta is None:
            raise UsageError("budget set needs --epsilon and --delta")
        ledger.set_budget(args.epsilon, args.delta, args.scope)
    elif args.action == "remove":
        ledger.remove_budget(args.scope)
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
        out.write("id  released at (UTC)      unit     epsilon     delta        private      table  mechanism\n")
        for r in releases:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.time))
            private = "NO (seeded)" if _seeded(r) else "yes"
            out.write(f"{r.id:<3} {when}  {r.unit:<8} {r.epsilon:<11.6g} {r.delta:<12.6g} {private:<12} "
                      f"{r.table}  {r.mechanism}\n")
        if any(_seeded(r) for r in releases):
            out.write(f"NOT PRIVATE: {SEEDED_NOTE}\n")
    else:
        out.write(f"ledger: {ledger.path} (basic composition: sums)\n")
        out.write("scope                epsilon spent / budget     delta spent / budget   releases  "
                  "seeded (NOT private)\n")
        for s in status:
            out.write(f"{s.scope:<20} {_fmt(s.epsilon_spent):>10} / {_fmt(s.epsilon_budget):<10}  "
                      f"{_fmt(s.delta_spent):>10} / {_fmt(s.delta_budget):<10} {s.releases:>6}  "
                      f"{seeded[s.scope]:>6}\n")
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
    bp.add_argument("--scope", default="database", help="'database' (default) or a table name")
    bp.add_argument("--json", action="store_true", help="print one JSON object")
    bp.set_defaults(func=cmd_budget)


# --------------------------------------------------------------------------
# shell and demo
# --------------------------------------------------------------------------

def cmd_shell(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the SQL shell."""
    return run_shell(args.database, args.command, out=out, err=err)


def cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run every method on the embedded dataset and print the report."""
    from dpsql import demo

    if args.seed is not None:
        print(SEED_WARNING, file=err, flush=True)
    rows = demo.run_demo(seed=args.seed)
    demo.print_demo(rows, demo.dataset_summary(), as_json=args.json, seeded=args.seed is not None, out=out,
                    top_k=demo.run_top_k(seed=args.seed))
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
    shell.add_argument("database", nargs="?", metavar="DATABASE", help="DuckDB database file (default: in memory)")
    shell.add_argument("-c", dest="command", metavar="SQL", help="run SQL and exit")
    shell.set_defaults(func=cmd_shell)

    su = sub.add_parser("set-union", help="release items of a table under user-level differential privacy",
                        description="Release the items of INPUT under user-level (epsilon, delta)-DP. Prints the "
                                    "released items one per line, unless --output or --json is given.")
    su.add_argument("input", metavar="INPUT", help="Parquet file, CSV file, or DuckDB database (with --table)")
    su.add_argument("--method", choices=list(dpsql.METHODS), default=dpsql.DEFAULT_METHOD,
                    help=f"set-union mechanism (default: {dpsql.DEFAULT_METHOD})")
    su.add_argument("--epsilon", type=float, required=True, help="privacy parameter epsilon > 0")
    su.add_argument("--delta", type=float, required=True, help="privacy parameter 0 < delta < 1, e.g. 1e-5")
    su.add_argument("--max-items", type=int, required=True,
                    help="items kept per user (a uniform sample of larger sets)")
    su.add_argument("--user-col", default="user_id", help="user column (default: user_id)")
    su.add_argument("--item-col", default="item", help="item column (default: item)")
    su.add_argument("--table", help="table or view to read when INPUT is a DuckDB database")
    su.add_argument("--output", metavar="FILE", help="write the items to FILE: *.csv (CSV) or *.parquet (Parquet)")
    su.add_argument("--json", action="store_true", help="print one JSON object with the parameters, "
                                                        "calibration and items")
    su.add_argument("--progress", action="store_true", help="report progress and timing on stderr")
    su.add_argument("--alpha", type=float, help="cutoff multiplier of policy_laplace, policy_gaussian (default 5) "
                                                "and greedy_update (default 3)")
    su.add_argument("--passes", type=int, help="passes over the users of policy_laplace/policy_gaussian (default 1)")
    su.add_argument("--ledger", metavar="FILE", help="privacy ledger to charge (default: INPUT.dpsql-ledger)")
    su.add_argument("--seed", type=int, help="reproducible noise for tests: the result is NOT private")
    su.set_defaults(func=cmd_set_union)

    _add_weighted_sample_parser(sub)
    _add_budget_parser(sub)
    demo = sub.add_parser("demo", help="compare every method on the embedded r/AskReddit sample",
                          description="Run every set-union method on the embedded r/AskReddit sample at "
                                      "epsilon=1, delta=1e-5, max_items=100 and report (non-privately) "
                                      "how much of the data each released set covers.")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.add_argument("--seed", type=int, help="reproducible noise: the result is NOT private")
    demo.set_defaults(func=cmd_demo)

    ev = sub.add_parser("evaluate", help="NON-PRIVATE: missing mass, hits and coverage of released items",
                        description="Compare a file of released items with the raw INPUT: missing mass MM_p "
                                    "(p = 0, 1, 2, inf), top-k missing mass (--k), users hit, and items per "
                                    "frequency bucket. Reads the raw data: the numbers are NOT private.")
    ev.add_argument("input", metavar="INPUT", help="Parquet file, CSV file, or DuckDB database (with --table)")
    ev.add_argument("--released", required=True, metavar="FILE", help="Parquet or CSV file of released items")
    ev.add_argument("--released-col", default="item", help="item column of --released (default: item)")
    ev.add_argument("--k", type=int, help="also report the top-k missing mass (at most k released items)")
    ev.add_argument("--user-col", default="user_id", help="user column (default: user_id)")
    ev.add_argument("--item-col", default="item", help="item column (default: item)")
    ev.add_argument("--table", help="table or view to read when INPUT is a DuckDB database")
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
    except (UsageError, DPParameterError) as exc:
        print(f"Error: {exc}", file=err, flush=True)
        return 2
    except KeyboardInterrupt:
        print("Error: interrupted", file=err, flush=True)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python from
        # complaining about the unflushable stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:  # every other failure is one line, never a traceback
        print(error_line(exc), file=err, flush=True)
        return 1
