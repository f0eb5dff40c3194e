"""`dpsql shell`: statement splitting, -c, piped stdin, errors, dot commands, flags and the ledger rule.

The end-to-end runs go through `python -m dpsql shell` in subprocesses started
together; one runs it in a real terminal (tmux); the rest calls
``dpsql.frontends.shell.run_shell`` or ``dpsql.frontends.cli.main`` in this process.
"""
from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

import dpsql
import dpsql.frontends.shell as shell_mod
from dpsql.frontends.cli import main as cli_main
from dpsql.core.ledger import Ledger
from dpsql.frontends.shell import is_complete, run_shell, split_statements

# Every user holds all 7 items: weight 300/sqrt(7) ~ 113 against a threshold near 19.
SETUP = ("CREATE TABLE t AS SELECT 'u' || u AS user_id, 'w' || w AS item "
         "FROM range(300) a(u), range(7) b(w);")
MACRO = ("SELECT count(*) AS n_released FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5, max_items := 10);")


def dpsql_cmd(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "dpsql", *args], input=stdin, capture_output=True,
                          text=True, encoding="utf-8", cwd=cwd, env=env, timeout=300)


def shell(sql: str | None = None, *, stdin: str = "", database: str | None = None, **options) -> SimpleNamespace:
    """``dpsql shell`` in this process, with ``-c sql`` or with ``stdin`` piped in."""
    out, err = io.StringIO(), io.StringIO()
    code = run_shell(database, sql, stdin=io.StringIO(stdin), out=out, err=err, **options)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    folder = tmp_path_factory.mktemp("shell")
    commands = {
        "c_flag": (["shell", "-c", f"{SETUP} SELECT 41 + 1 AS answer; {MACRO}"], None),
        "stdin": (["shell", "db.duckdb"], f"{SETUP}\nSELECT count(*)\n  AS n_rows\nFROM t;\n.tables\n"),
        "error": (["shell", "-c", "SELECT 1 AS first_one; SELECT * FROM no_such_table; SELECT 3 AS never_run;"],
                  None),
        "stdin_error": (["shell"], "SELEC 1;\nSELECT 2 AS after_error;\nSELEC 3;\n"),
        "stdin_bail": (["shell", "-bail"], "SELEC 1;\nSELECT 2 AS never_run;\n"),
        "csv_flag": (["shell", "-csv", "-c", "SELECT 1 AS a, 'x,y' AS b;"], None),
        "json_flag": (["shell", "-json", "-c", "SELECT 1 AS a, 'x' AS b;"], None),
    }
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        futures = {name: pool.submit(dpsql_cmd, *argv, cwd=folder, stdin=stdin)
                   for name, (argv, stdin) in commands.items()}
        return {name: future.result() for name, future in futures.items()}


def assert_clean(result) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "leaked" not in result.stderr, result.stderr


# ---------------------------------------------------------------- subprocesses

def test_c_runs_several_statements_including_a_macro(runs):
    r = runs["c_flag"]
    assert_clean(r)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "answer" in r.stdout and "42" in r.stdout
    assert "n_released" in r.stdout and re.search(r"│\s+7\s+│", r.stdout)  # all 7 items pass
    assert "Count" not in r.stdout  # CREATE TABLE prints nothing


def test_piped_stdin(runs):
    r = runs["stdin"]
    assert_clean(r)
    assert r.returncode == 0, r.stderr
    assert "n_rows" in r.stdout and "2100" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1] == "t"  # .tables


@pytest.mark.parametrize("name", ["error", "stdin_bail"])
def test_error_is_one_line_with_duckdbs_excerpt_and_stops(runs, name):
    r = runs[name]
    assert_clean(r)
    assert r.returncode != 0
    lines = r.stderr.rstrip().splitlines()
    # One line, then DuckDB's excerpt of the statement and a ^ under the error's place, as in DuckDB's CLI.
    assert len(lines) == 3 and lines[0].startswith("Error: ") and lines[1].startswith("LINE 1: ")
    place = "no_such_table" if name == "error" else "SELEC"
    assert lines[2][lines[1].index(place):].startswith("^" * len(place)), r.stderr
    assert "never_run" not in r.stdout


def test_piped_script_goes_on_after_an_error_unless_bail(runs):
    r = runs["stdin_error"]
    assert_clean(r)
    assert r.returncode == 1  # the script had errors
    assert "after_error" in r.stdout
    errors = [line for line in r.stderr.splitlines() if not line.startswith(("LINE ", " "))]
    assert len(errors) == 2 and all(line.startswith("Error: ") for line in errors)


def test_csv_and_json_flags(runs):
    assert (runs["csv_flag"].returncode, runs["csv_flag"].stdout) == (0, 'a,b\n1,"x,y"\n')
    assert runs["json_flag"].returncode == 0
    assert json.loads(runs["json_flag"].stdout) == [{"a": 1, "b": "x"}]


def test_error_names_the_problem(runs):
    r = runs["error"]
    assert "first_one" in r.stdout  # statements before the error ran
    assert "no_such_table" in r.stderr


# ---------------------------------------------------------------- in process

def test_ddl_prints_nothing():
    r = shell("CREATE TABLE a (x INTEGER); INSERT INTO a VALUES (1), (2); UPDATE a SET x = 3; "
              "CREATE VIEW v AS SELECT * FROM a; DROP VIEW v; SET threads = 2;")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_tables_lists_tables_and_views():
    r = shell(stdin="CREATE TABLE b (x INTEGER);\nCREATE TABLE a (x INTEGER);\nCREATE VIEW v AS SELECT 1;\n.tables\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["a", "b", "v (view)"]


def test_database_file_persists(tmp_path):
    db = str(tmp_path / "x.duckdb")
    assert shell("CREATE TABLE kept AS SELECT 5 AS five;", database=db).returncode == 0
    r = shell("SELECT five FROM kept;", database=db)
    assert r.returncode == 0 and "5" in r.stdout


@pytest.mark.parametrize("sql, line, place", [
    ("SELECT a FROM (SELECT 1 AS b);", "LINE 1: SELECT a FROM (SELECT 1 AS b)", "a FROM"),  # binder (a query)
    ("SELECT 1,\n  no_such_function(2);", "LINE 2:   no_such_function(2)", "no_such"),  # catalog, line 2
    ("CREATE TABLE c AS SELECT zz;", "LINE 1: CREATE TABLE c AS SELECT zz", "zz"),  # binder (not a query)
    ("SELECT 1 +;", "LINE 1: SELECT 1 +", ""),  # parser: at the end
])
def test_duckdb_errors_show_the_line_and_place(sql, line, place):
    r = shell(stdin=sql)
    head, *excerpt = r.stderr.rstrip("\n").splitlines()
    assert r.returncode == 1 and head.startswith("Error: ") and excerpt[0] == line, r.stderr
    caret = excerpt[1].index("^")
    assert excerpt[0][caret:].startswith(place) if place else caret >= len(excerpt[0]) - 1


def test_dpsql_macros_and_parameter_errors():
    r = shell(f"{SETUP} SELECT * FROM dp_set_union('t', epsilon := -1, delta := 1e-5);")
    assert r.returncode == 1
    assert r.stderr.strip().startswith("Error: ") and "epsilon" in r.stderr
    assert "\n" not in r.stderr.strip()


@pytest.mark.parametrize("release", [
    "SELECT * FROM dp_set_union('v', epsilon := 1.0, delta := 1e-5)",
    "SELECT count(*) FROM \"DP_TOP_K\"('v', 2, epsilon := 1.0, delta := 1e-5)",  # quoted, any case
    "SELECT * FROM query('SELECT * FROM dp_group_by(''v'', epsilon := 1.0, delta := 1e-5)')",  # SQL in a string
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5, max_groups_contributed=1, "
    "privacy_unit_column=user_id) "
    "item, COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM v GROUP BY item",  # BigQuery's syntax
])
def test_a_release_failing_on_a_value_of_the_data_does_not_show_it(release, tmp_path):
    # The view's own cast fails inside DuckDB while the release reads it: the message would quote the value.
    setup = ("CREATE TABLE raw AS SELECT i AS user_id, CASE WHEN i = 5 THEN 'SECRET_9173' ELSE '1' END AS s "
             "FROM range(100) t(i); CREATE VIEW v AS SELECT user_id, CAST(s AS INTEGER) AS item FROM raw;")
    ledger = tmp_path / "l.dpsql-ledger"
    r = shell(stdin=f"{setup}\n{release};\nSELECT CAST(s AS INTEGER) FROM raw;\n", ledger=str(ledger))
    first, second = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert "SECRET_9173" not in first and first.startswith("Error: dpsql: DuckDB could not read or convert a value"), r.stderr
    assert "ConversionException" in first
    # a statement that releases nothing shows DuckDB's message whole, as the DuckDB CLI does
    assert "SECRET_9173" in second and second.startswith("Error: Conversion Error"), r.stderr
    assert Ledger(str(ledger)).releases() == []


def test_budget_and_non_constant_parameter_errors_are_dpsql_messages_once(tmp_path):
    # An over-budget release prints dpsql's message once (not "BudgetExceededError: dpsql: ..."); a
    # parameter that is not a constant is DuckDB's binder refusal, shown as dpsql's explanation.
    db = str(tmp_path / "s.duckdb")
    from dpsql.core.ledger import sidecar_path
    Ledger(sidecar_path(db)).set_budget(0.5, 1e-4)  # the 'database' scope of s.duckdb
    r = shell(f"{SETUP} SELECT * FROM dp_set_union('t', epsilon := 1, delta := 1e-5);", database=db)
    line = r.stderr.strip()
    assert r.returncode == 1 and line.startswith("Error: dpsql: privacy budget") and line.count("dpsql:") == 1
    r = shell(f"{SETUP} SELECT * FROM dp_set_union('t', epsilon := random() + 1, delta := 1e-5);")
    line = r.stderr.strip()
    assert r.returncode == 1 and line.startswith("Error: dpsql: every parameter of a release must be a constant")


def test_quit_and_unknown_dot_command():
    r = shell(stdin="SELECT 1 AS one;\n.quit\nSELECT 2 AS two;\n")
    assert r.returncode == 0 and "one" in r.stdout and "two" not in r.stdout
    r = shell(stdin=".nope\n")
    assert r.returncode == 1 and "Error: dpsql: unknown command '.nope'" in r.stderr


@pytest.mark.parametrize("command, code", [(".exit 3", 3), (".quit 0", 0), (".exit", 0), (".exit 255", 255)])
def test_exit_with_a_code_leaves_with_it(command, code):
    r = shell(stdin=f"SELECT 1 AS one;\n{command}\nSELECT 2 AS two;\n")
    assert r.returncode == code and "one" in r.stdout and "two" not in r.stdout, r.stderr
    r = shell(f"SELECT 1 AS one;\n{command}")  # -c (a dot command on its own line, as in the DuckDB CLI)
    assert r.returncode == code, r.stderr


@pytest.mark.parametrize("arg", ["x", "-1", "256", "1.5"])
def test_exit_with_a_bad_code_is_an_error_and_does_not_leave(arg):
    r = shell(stdin=f".exit {arg}\nSELECT 2 AS two;\n")
    assert r.returncode == 1 and "two" in r.stdout
    assert f"Error: dpsql: .exit takes an exit code, an integer from 0 to 255 (got '{arg}')" in r.stderr


def test_help_mentions_the_macros():
    r = shell(".help")
    assert r.returncode == 0 and "dp_set_union" in r.stdout and ".tables" in r.stdout


def test_last_statement_needs_no_semicolon_and_comments_are_skipped():
    r = shell(stdin="-- a comment\nSELECT 'x;y' AS s; /* ; */\nSELECT 2 AS two -- end\n")
    assert r.returncode == 0, r.stderr
    assert "x;y" in r.stdout and "two" in r.stdout


@pytest.mark.parametrize("sql, expected", [
    ("select 1; select 2", ["select 1", "select 2"]),
    ("select 'a;b'; select \"c;d\";", ["select 'a;b'", 'select "c;d"']),
    ("select 'it''s;';", ["select 'it''s;'"]),
    ("select E'it\\'s;'; select 2", ["select E'it\\'s;'", "select 2"]),
    ("select $$a;b$$; select $t$;$t$;", ["select $$a;b$$", "select $t$;$t$"]),
    ("select 1; -- c; d\nselect 2;", ["select 1", "-- c; d\nselect 2"]),
    ("/* a; /* b; */ c; */ select 1;", ["/* a; /* b; */ c; */ select 1"]),
    (";; select 1 ;;", ["select 1"]),
    ("-- only a comment", []),
    ("select 'open;", ["select 'open;"]),
])
def test_split_statements(sql, expected):
    assert split_statements(sql) == expected


@pytest.mark.parametrize("sql, complete", [
    ("select 1;", True),
    ("select 1", False),
    ("select ';'", False),
    ("select 1; -- done", True),
    ("select 1 /* ; */", False),
    ("select $$;$$;", True),
    ("select 'a;\nb';", True),
])
def test_is_complete(sql, complete):
    assert is_complete(sql) is complete


@pytest.mark.parametrize("call", [
    "dp_set_union('t', epsilon := '1', delta := 1e-5)",   # a string epsilon
    "dp_set_union('t', epsilon := 1.0)",                   # delta left out
    "dp_top_k('t', epsilon := 1.0, delta := 1e-5, k := 'ten')",
])
def test_wrong_typed_or_missing_parameter_gets_a_dpsql_hint(call):
    r = shell(f"{SETUP} SELECT * FROM {call};")
    assert r.returncode == 1 and "does not support the supplied arguments" in r.stderr
    assert "(dpsql: pass tables and columns as quoted strings" in r.stderr
    assert "\n" not in r.stderr.strip()


def test_bare_table_identifier_gets_a_hint_and_ledger_is_readable(tmp_path):
    r = shell(f"{SETUP} SELECT * FROM dp_set_union(t, epsilon := 1.0, delta := 1e-5);")
    first, *excerpt = r.stderr.rstrip().splitlines()
    assert r.returncode == 1 and "quote it: dp_set_union('events'" in first
    assert excerpt[0] == "LINE 1: SELECT * FROM dp_set_union(t, epsilon := 1.0, delta := 1e-5)"
    assert excerpt[0][excerpt[1].index("^"):].startswith("dp_set_union(t,")
    db = str(tmp_path / "b.duckdb")
    r = shell(f"{SETUP} SELECT count(*) >= 0 AS ok FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5); "
              "SELECT scope, epsilon_spent FROM dp_budget();", database=db)
    assert r.returncode == 0, r.stderr
    assert "database" in r.stdout and "1.0" in r.stdout
    assert (tmp_path / "b.duckdb.dpsql-ledger").is_file()


# ---------------------------------------------------------------- output modes

MODE_QUERY = "SELECT 1 AS a, 'x|y,z' AS b, NULL AS c UNION ALL SELECT 2, '', 3 ORDER BY a;"


@pytest.mark.parametrize("mode, expected", [
    ("csv", 'a,b,c\n1,"x|y,z",\n2,"",3\n'),
    ("json", '[{"a":1,"b":"x|y,z","c":null},\n{"a":2,"b":"","c":3}]\n'),
    ("jsonlines", '{"a":1,"b":"x|y,z","c":null}\n{"a":2,"b":"","c":3}\n'),
    ("markdown", "|  a  |   b    |  c   |\n|-----|--------|------|\n| 1   | x\\|y,z | NULL |\n"
                 "| 2   |        | 3    |\n"),
    ("line", "    a = 1\n    b = x|y,z\n    c = NULL\n\n    a = 2\n    b = \n    c = 3\n"),
])
def test_mode(mode, expected):
    r = shell(stdin=f".mode {mode}\n{MODE_QUERY}\n.mode\n")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == expected + f"current output mode: {mode}\n"


def test_default_mode_is_duckbox_and_json_is_valid_for_nested_and_empty_results():
    r = shell(MODE_QUERY)
    assert r.stdout.startswith("┌") and "│ x|y,z" in r.stdout
    r = shell("SELECT [1, 2] AS l, {'k': 'v'} AS s, 'nan'::DOUBLE AS d; SELECT 1 AS a WHERE false;", mode="json")
    first, second = r.stdout.splitlines()
    assert json.loads(first) == [{"l": [1, 2], "s": {"k": "v"}, "d": "NaN"}]
    assert json.loads(second) == []


def test_mode_flags_and_unknown_mode():
    out, err = io.StringIO(), io.StringIO()
    assert cli_main(["shell", "-markdown", "-c", "SELECT 7 AS seven;"], out=out, err=err) == 0
    assert out.getvalue() == "| seven |\n|-------|\n| 7     |\n"
    out = io.StringIO()
    assert cli_main(["shell", "-line", "-c", "SELECT 7 AS seven;"], out=out, err=err) == 0
    assert out.getvalue() == "seven = 7\n"
    r = shell(stdin=".mode html\nSELECT 1 AS one;\n")
    assert r.returncode == 1 and "Error: dpsql: .mode 'html' is not supported; use one of duckbox, box" in r.stderr
    assert "one" in r.stdout  # the mode stayed duckbox and the script went on


def test_maxrows_limits_duckbox_but_a_release_is_shown_whole():
    r = shell(stdin=f"{SETUP}\n.maxrows 3\nSELECT * FROM range(50) ORDER BY 1;\n.maxrows\n"
                    "SELECT item FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5, max_items := 10);\n")
    assert r.returncode == 0, r.stderr
    numbers = re.findall(r"│\s+(\d+) │", r.stdout)
    assert len(numbers) < 50 and "49" in numbers and "50 rows" in r.stdout
    assert "current max rows: 3" in r.stdout
    assert re.findall(r"│ (w\d)\s+│", r.stdout) == [f"w{i}" for i in range(7)]  # all 7 released items
    r = shell(stdin=".maxrows 0\n.maxrows many\n")
    assert r.returncode == 1 and r.stderr.count("Error: dpsql: .maxrows needs a whole number") == 2


def test_a_release_too_long_for_a_box_is_printed_as_csv(monkeypatch):
    monkeypatch.setattr(shell_mod, "_BOX_ROWS", 5)
    r = shell(f"{SETUP} SELECT item FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5, max_items := 10);")
    assert r.returncode == 0
    assert r.stdout == "item\n" + "".join(f"w{i}\n" for i in range(7))
    assert "this release has 7 rows, more than a box can show: printed as CSV" in r.stderr


# ---------------------------------------------------------------- dot commands

def test_output_to_a_file_and_back(tmp_path):
    target = tmp_path / "out.csv"
    r = shell(stdin=f".mode csv\n.output '{target}'\nSELECT 1 AS a;\nSELECT 2 AS b;\n.output\nSELECT 3 AS c;\n")
    assert (r.returncode, r.stderr) == (0, "")
    assert target.read_text() == "a\n1\nb\n2\n"
    assert r.stdout == "c\n3\n"
    r = shell(stdin=f".output {tmp_path / 'no' / 'dir.csv'}\nSELECT 4 AS d;\n")
    assert r.returncode == 1 and "Error: dpsql: .output: cannot write" in r.stderr and "d" in r.stdout


def test_output_that_fails_prints_a_release_on_stdout():
    class Full(io.StringIO):
        def write(self, text):
            raise OSError(28, "No space left on device")

    sh = shell_mod.Shell(dpsql.connect(), interactive=False, out=io.StringIO(), err=io.StringIO())
    sh.feed(SETUP)
    sh.out, sh.output_name = Full(), "full.csv"
    sh.feed("SELECT item FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5, max_items := 10);")
    assert "w6" in sh.stdout.getvalue()
    assert "could not write to .output 'full.csv' (No space left on device)" in sh.err.getvalue()
    assert "the release is printed there" in sh.err.getvalue() and sh.out is sh.stdout


def test_timer():
    r = shell(stdin=".timer on\nSELECT 1 AS one;\nCREATE TABLE x (i INTEGER);\n.timer off\nSELECT 2 AS two;\n")
    assert r.returncode == 0
    assert len(re.findall(r"^Run Time \(s\): real \d+\.\d{3} user \d+\.\d+ sys \d+\.\d+$", r.stdout, re.M)) == 2
    r = shell(stdin=".timer maybe\n")
    assert r.returncode == 1 and "Error: dpsql: .timer needs on or off" in r.stderr


def test_schema():
    r = shell(stdin="CREATE TABLE b (x INTEGER);\nCREATE TABLE a (y VARCHAR);\nCREATE VIEW v AS SELECT x FROM b;\n"
                    "CREATE INDEX bx ON b (x);\n.schema\n.schema b\n.schema nothing\n")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[:4] == ["CREATE TABLE a(y VARCHAR);", "CREATE TABLE b(x INTEGER);", "CREATE INDEX bx ON b(x);",
                         "CREATE VIEW v AS SELECT x FROM b;"]
    assert lines[4:] == ["CREATE TABLE b(x INTEGER);", "CREATE INDEX bx ON b(x);"]
    assert "Error: dpsql: .schema: no table, view or index matches 'nothing'" in r.stderr


def test_read(tmp_path):
    inner = tmp_path / "inner.sql"
    inner.write_text("CREATE TABLE r AS SELECT 5 AS five;\nSELEC oops;\nSELECT five + 1 AS six FROM r\n")
    outer = tmp_path / "outer.sql"
    outer.write_text(f".read {inner}\nSELECT 'outer' AS o;\n")
    r = shell(stdin=f".read {outer}\nSELECT five FROM r;\n")
    assert r.returncode == 1  # the error in inner.sql
    assert "six" in r.stdout and "outer" in r.stdout and "five" in r.stdout
    r = shell(stdin=f".read {outer}\nSELECT 'never' AS never_run;\n", bail=True)
    assert r.returncode == 1 and "six" not in r.stdout and "never_run" not in r.stdout
    loop = tmp_path / "loop.sql"
    loop.write_text(f".read {loop}\n")
    r = shell(stdin=f".read {loop}\n.read {tmp_path / 'missing.sql'}\n")
    assert "files read each other more than" in r.stderr
    assert "Error: dpsql: .read: cannot read" in r.stderr and "missing.sql" in r.stderr


def test_bail_dot_command():
    r = shell(stdin=".bail on\nSELEC 1;\nSELECT 'never' AS never_run;\n")
    assert r.returncode == 1 and "never_run" not in r.stdout


def test_help_states_the_ledger_rule(tmp_path):
    r = shell(".help")
    assert "Ledger of this session: in memory, forgotten at exit" in r.stdout
    assert "--ledger data.parquet.dpsql-ledger" in r.stdout and ".maxrows" in r.stdout
    db = tmp_path / "h.duckdb"
    assert f"Ledger of this session: {db}.dpsql-ledger." in shell(".help", database=str(db)).stdout


# ---------------------------------------------------------------- flags and the ledger rule

def test_readonly(tmp_path):
    db = str(tmp_path / "ro.duckdb")
    assert shell(SETUP, database=db).returncode == 0
    out, err = io.StringIO(), io.StringIO()
    assert cli_main(["shell", db, "-readonly", "-c", "CREATE TABLE z (i INTEGER);"], out=out, err=err) == 1
    assert "read-only" in err.getvalue()
    r = shell("SELECT count(*) AS n FROM dp_set_union('t', epsilon := 0.5, delta := 1e-5);", database=db, readonly=True)
    assert r.returncode == 0, r.stderr
    assert Ledger(db + ".dpsql-ledger").status()[0].epsilon_spent == 0.5  # a read-only database is charged
    r = shell("SELECT 1;", readonly=True)
    assert r.returncode == 2 and r.stderr.startswith("Error: dpsql: -readonly needs a DATABASE file")


def test_in_memory_shell_reading_a_file_uses_an_in_memory_ledger_and_says_so(tmp_path):
    data = tmp_path / "f.parquet"
    assert shell(f"{SETUP} COPY t TO '{data}';").returncode == 0
    release = f"SELECT count(*) AS n FROM dp_set_union('{data}', epsilon := 0.5, delta := 1e-5);"
    r = shell(release + release)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("dpsql: note: this release read") == 1  # once per file
    assert f"--ledger {data.resolve()}.dpsql-ledger" in r.stderr
    assert not list(tmp_path.glob("*.dpsql-ledger"))


def test_ledger_flag_charges_the_file_the_cli_charges(tmp_path):
    data = tmp_path / "f.parquet"
    assert shell(f"{SETUP} COPY t TO '{data}';").returncode == 0
    sidecar = f"{data}.dpsql-ledger"
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(["shell", "--ledger", sidecar, "-c",
                     f"SELECT count(*) AS n FROM dp_set_union('{data}', epsilon := 0.5, delta := 1e-5);"], out=out, err=err)
    assert (code, err.getvalue()) == (0, "")
    releases = Ledger(sidecar).releases()
    # The scope the CLI records for a file input: its absolute path.
    assert [(r.table, r.epsilon) for r in releases] == [(str(data.resolve()), 0.5)]


def test_ledger_flag_is_checked_before_anything_runs(tmp_path):
    data = tmp_path / "d.duckdb"
    assert shell("CREATE TABLE k AS SELECT 1 AS i;", database=str(data)).returncode == 0
    size = data.stat().st_size
    r = shell("SELECT 1;", ledger=str(data))
    assert r.returncode == 2 and "is not a dpsql ledger (a data file?)" in r.stderr
    assert data.stat().st_size == size
    r = shell("SELECT 1;", ledger=str(tmp_path / "nope" / "x.dpsql-ledger"))
    assert r.returncode == 2 and "Error: dpsql: --ledger" in r.stderr and "does not exist" in r.stderr


def test_banner_names_the_ledger():
    con = dpsql.connect()
    try:
        text = shell_mod.banner(shell_mod.Shell(con, interactive=True), ":memory:")
    finally:
        con.close()
    assert "in-memory ledger, forgotten at exit" in text


# ---------------------------------------------------------------- a real terminal

class Terminal:
    """``dpsql shell`` in a tmux window of its own: keys typed, the screen read, the exit status kept."""

    def __init__(self, tmp_path: Path):
        self.server = ["tmux", "-L", f"dpsql-test-{os.getpid()}"]  # a private tmux server, killed at the end
        self.env = dict(os.environ, PYTHONIOENCODING="utf-8", TERM="xterm", HOME=str(tmp_path))
        self.exit_file = tmp_path / "exit-status"
        # tmux runs the command with sh: the shell's exit status is written to a file when it ends.
        command = f"{shlex.quote(sys.executable)} -m dpsql shell; echo $? > {shlex.quote(str(self.exit_file))}"
        self.tmux("new-session", "-d", "-s", "s", "-x", "120", "-y", "50", "-c", str(tmp_path), command)
        self.tmux("set-option", "-t", "s", "remain-on-exit", "on")  # the last screen stays readable

    def tmux(self, *args: str) -> str:
        return subprocess.run([*self.server, *args], capture_output=True, text=True, check=True, env=self.env,
                              timeout=10).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "s")

    def wait_for(self, pattern: str, timeout: float = 8.0, count: int = 1) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if len(re.findall(pattern, text, re.M)) >= count:
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} did not appear {count} time(s); the screen shows:\n{text}")
            time.sleep(0.1)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "s", "-l", text)

    def keys(self, *names: str) -> None:
        self.tmux("send-keys", "-t", "s", *names)

    def type_line(self, text: str) -> None:
        # A tmux argument ending in ';' separates tmux commands: a trailing space keeps it literal.
        self.type(text + " ")
        self.keys("Enter")

    def exit_status(self) -> str:
        deadline = time.monotonic() + 8
        while not self.exit_file.exists() or not self.exit_file.read_text().strip():
            assert time.monotonic() < deadline, self.screen()
            time.sleep(0.1)
        return self.exit_file.read_text().strip()

    def close(self) -> None:
        subprocess.run([*self.server, "kill-server"], capture_output=True, env=self.env, timeout=10)


@pytest.fixture
def terminal(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    term = Terminal(tmp_path)
    try:
        yield term
    finally:
        term.close()


def test_in_a_real_terminal(terminal):
    """What a person sees: the banner, a dot command, a release, Ctrl-C on a long query, .quit."""
    t = terminal
    t.wait_for(r"^dpsql> ?$")
    assert "in-memory ledger, forgotten at exit" in t.screen()
    t.type_line(".mode markdown")
    t.type_line("SELECT 41 + 1 AS answer;")
    t.wait_for(r"^\| 42 +\|$")
    t.type_line(".mode duckbox")
    t.type_line(SETUP)
    t.type_line("SELECT item FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5,")
    t.wait_for(r"^   \.\.\.> ?$")  # a statement continues on the next line
    t.type_line("max_items := 10);")
    text = t.wait_for(r"│ w6 +│")
    assert re.findall(r"│ (w\d) +│", text) == [f"w{i}" for i in range(7)]
    t.type_line("SELECT count(*) FROM range(30000000000) a WHERE hash(a.range) % 7 = 3;")
    time.sleep(1.0)
    started = time.monotonic()
    t.keys("C-c")
    t.wait_for(r"^(\^C)?Error: interrupted$")
    assert time.monotonic() - started < 5
    t.type_line("SELECT 'still here' AS s;")
    t.wait_for(r"│ still here │")
    t.type_line(".quit")
    assert t.exit_status() == "0", t.screen()
    assert "Traceback" not in t.screen()


def test_prompt_in_a_real_terminal(terminal, tmp_path):
    """The prompt: a multi-line statement runs and comes back whole with Up, Tab completes a table and a dp_
    function, Ctrl-C clears what is typed, Ctrl-D leaves; the history file holds the statement as one entry."""
    t = terminal
    t.wait_for(r"^dpsql> ?$")
    t.type_line("CREATE TABLE user_events AS SELECT 'u1' AS user_id, 'a' AS item;")
    t.type_line("SELECT 6 *")
    t.wait_for(r"^   \.\.\.> ?$")  # Enter in an unfinished statement starts a new line of it
    t.type_line("7 AS answer;")
    t.wait_for(r"│\s+42 │\n└─+┘\ndpsql> ?$")  # keys go to the prompt once it is drawn again
    t.keys("Up")  # the whole statement comes back, both lines, and runs again as one
    t.wait_for(r"^   \.\.\.> 7 AS answer; ?$", count=2)
    t.keys("Enter")
    t.wait_for(r"│\s+42 │\n└─+┘\ndpsql> ?$")
    assert len(re.findall(r"│\s+42 │", t.screen())) == 2
    t.type("SELECT count(*) AS n_events FROM user_ev")
    t.keys("Tab")
    t.wait_for(r"^dpsql> SELECT count\(\*\) AS n_events FROM user_events ?$")
    t.type_line(";")
    t.wait_for(r"│\s+1 │")
    t.type("SELECT round(dp_gaussian_sig")
    t.keys("Tab")
    t.wait_for(r"^dpsql> SELECT round\(dp_gaussian_sigma ?$")
    t.type_line("(1.0, 1e-5), 3) AS sigma;")
    t.wait_for(r"│\s+3\.731 │\n└─+┘\ndpsql> ?$")  # Ctrl-C below must reach the prompt, not a statement
    t.type("SELECT 'discarded' AS")
    t.keys("C-c")  # clears the input: what follows is a statement of its own
    t.type_line("SELECT 'kept' AS k;")
    t.wait_for(r"│ kept    │\n└─+┘\ndpsql> ?$")
    assert "discarded │" not in t.screen() and "Error" not in t.screen()
    t.keys("C-d")
    assert t.exit_status() == "0", t.screen()
    assert "Traceback" not in t.screen()
    history = (tmp_path / ".dpsql_history").read_text(encoding="utf-8")
    assert "\n+SELECT 6 * \n+7 AS answer; \n" in history  # one entry of two lines


# ---------------------------------------------------------------- Ctrl-C and the charge

def _ctrl_c_while(work_before, work_after, charge: bool):
    """Run a statement body as the shell runs it (dpsql.core.runner, the shell's notice); it sends Ctrl-C to this
    process between two steps."""
    import signal

    from dpsql.core import runner

    sh = shell_mod.Shell(dpsql.connect(ledger=shell_mod.session_ledger(":memory:", None)), interactive=True,
                         out=io.StringIO(), err=io.StringIO())

    def work():
        time.sleep(0.3)  # the main thread is waiting by now
        work_before(sh)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        if charge:
            sh.ledger.charge("test_release", "user", "t", 0.5, 1e-6)
        return work_after(sh)

    try:
        with runner.Interrupts(notice=sh._say) as ctrl_c:
            return sh, runner.run(sh.con, work, interrupts=ctrl_c)
    except KeyboardInterrupt:
        return sh, "interrupted"


def test_ctrl_c_before_the_charge_stops_and_charges_nothing():
    sh, result = _ctrl_c_while(lambda sh: None, lambda sh: "rows", charge=True)
    assert result == "interrupted"  # the charge after Ctrl-C was refused
    assert sh.ledger.releases() == []


def test_ctrl_c_after_the_charge_finishes_the_release():
    sh, result = _ctrl_c_while(lambda sh: sh.ledger.charge("test_release", "user", "t", 0.5, 1e-6),
                               lambda sh: "rows", charge=False)
    assert result == "rows"
    assert len(sh.ledger.releases()) == 1
    assert "interrupted after the release was charged; finishing it" in sh.err.getvalue()


def test_ctrl_c_stops_a_piped_script(tmp_path):
    import signal

    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    script = tmp_path / "script.sql"
    script.write_text(".mode csv\nSELECT 'started' AS s;\n"
                      "SELECT count(*) FROM range(30000000000) a WHERE hash(a.range) % 7 = 3;\n"
                      "SELECT 'never' AS never_run;\n")
    with open(script) as stdin:
        proc = subprocess.Popen([sys.executable, "-m", "dpsql", "shell"], stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        assert proc.stdout.readline() == "s\n" and proc.stdout.readline() == "started\n"
        time.sleep(0.5)  # inside the long query
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip() == "Error: interrupted" and "never_run" not in out


def test_budget_dot_command_sets_shows_and_removes_in_the_session_ledger(tmp_path):
    from dpsql.core.ledger import sidecar_path

    db = str(tmp_path / "s.duckdb")
    sidecar = sidecar_path(db)
    r = shell(stdin=f"{SETUP}\n{MACRO}\n.budget set t 2 1e-4\n.budget set 'Later' 1 1e-5\n.budget remove later\n"
                    f".mode csv\n.budget\n.budget show\n", database=db)
    assert r.returncode == 0, r.stderr
    assert (f"budget of scope 's.main.t' set to epsilon=2, delta=0.0001 in {sidecar}: spent epsilon=1, "
            f"delta=1e-05 (1 release); remaining epsilon=1, delta=9e-05") in r.stdout
    assert "budget of scope 's.main.later' removed" in r.stdout
    # a table that does not exist yet: set, and said on stderr with the scope it was stored under
    assert r.stderr.startswith("dpsql: warning: scope 'Later' names no table or view of this database yet")
    assert "'s.main.later'" in r.stderr and "Error" not in r.stderr
    assert r.stdout.count("s.main.t,2.0,0.0001,1.0,1e-05,1.0,9e-05,1,0\n") == 2  # .budget and .budget show
    assert [(b.scope, b.epsilon, b.delta) for b in Ledger(sidecar).budgets()] == [("s.main.t", 2.0, 1e-4)]
    # below what is spent: refused (one dpsql message), nothing changed; equal closes the scope
    r = shell(stdin=".budget set t 0.5 1e-4\n", database=db)
    line = r.stderr.strip()
    assert r.returncode == 1 and line.startswith("Error: dpsql: budget of scope 's.main.t'") and line.count("dpsql:") == 1
    assert "epsilon=0.5 is below the epsilon already spent (1)" in line
    assert [(b.epsilon, b.delta) for b in Ledger(sidecar).budgets()] == [(2.0, 1e-4)]
    r = shell(stdin=f".budget set \"T\" 1 1e-5\n{MACRO}\n", database=db)
    assert r.returncode == 1 and "privacy budget of scope 's.main.t' exceeded" in r.stderr
    assert [(b.epsilon, b.delta) for b in Ledger(sidecar).budgets()] == [(1.0, 1e-5)]


def test_budget_dot_command_usage_errors_name_the_fix():
    r = shell(stdin=".budget set t one 1e-5\n.budget frob\n.budget set t 1\n.budget remove\n")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 4
    assert lines[0] == ("Error: dpsql: .budget set: EPSILON and DELTA must be numbers (got 'one', '1e-5'), "
                        "e.g. .budget set my_table 1.0 1e-5")
    assert all(line.startswith("Error: dpsql: .budget takes show, set SCOPE EPSILON DELTA or remove SCOPE")
               for line in lines[1:])


def test_budget_dot_command_is_in_the_help():
    r = shell(".help")
    assert ".budget set SCOPE EPSILON DELTA" in r.stdout and "dp_set_budget(" in r.stdout


# ---------------------------------------------------------------- the prompt (prompt_toolkit)

@pytest.mark.parametrize("text, pending", [
    ("SELECT 1;", False),
    ("SELECT 1", True),
    ("SELECT 1,\n  2;", False),
    ("SELECT ';'", True),
    (".tables", False),
    ("SELECT 1;\n.tables", False),
    ("", False),
    ("SELECT 1; -- done", False),
])
def test_enter_runs_only_complete_input(text, pending):
    assert shell_mod.Shell.leaves_pending(text) is pending


def test_a_prompt_entry_runs_whole_and_an_unfinished_one_on_alt_enter():
    sh = shell_mod.Shell(dpsql.connect(), interactive=True, out=io.StringIO(), err=io.StringIO(), mode="csv")
    sh.feed_entry("SELECT 1 AS a,\n  2 AS b;\n.mode line\nSELECT 3 AS c")
    assert sh.out.getvalue() == "a,b\n1,2\n    c = 3\n" and not sh.pending


def test_completion_of_keywords_tables_columns_and_dp_functions():
    from prompt_toolkit.completion import CompleteEvent
    from prompt_toolkit.document import Document

    from dpsql.frontends.prompt import SqlCompleter

    sh = shell_mod.Shell(dpsql.connect(), interactive=True, out=io.StringIO(), err=io.StringIO())
    completer = sh.completer = SqlCompleter(sh.con, sh.dot_command_names())

    def complete(text: str) -> list[str]:
        return [c.text for c in completer.get_completions(Document(text), CompleteEvent())]

    assert complete("SELECT * FROM dp_set_union_w") == ["dp_set_union_weighted_gaussian",
                                                        "dp_set_union_weighted_laplace"]
    assert not any(name.startswith("dp__") for name in complete("SELECT dp_"))  # dpsql's helpers are not offered
    assert complete("SEL") == ["SELECT"] and complete("sel") == ["select"]
    assert complete("FROM user_ev") == []
    sh.feed("CREATE TABLE user_events AS SELECT 1 AS visitor_id;")  # a new table: the names are read again
    assert complete("FROM user_ev") == ["user_events"]
    assert complete("SELECT visitor") == ["visitor_id"]
    assert complete(".ta") == [".tables"]
    sh.feed("SELECT 1 AS unrelated_name;")
    assert not completer.stale  # a query does not make the completer read the catalog again
    sh.feed("DROP TABLE user_events;")
    assert complete("FROM user_ev") == []


# ---------------------------------------------------------------- DuckDB CLI's everyday commands and flags

def test_several_c_options_all_run_in_order_and_cmd_and_init_run_first(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    assert cli_main(["shell", "-csv", "-c", "SELECT 1 AS a;", "-c", "SELECT 2 AS b;"], out=out, err=err) == 0
    assert out.getvalue() == "a\n1\nb\n2\n"
    init = tmp_path / "init.sql"
    init.write_text(".mode csv\nCREATE TABLE seen AS SELECT 'init' AS step;\n")
    out = io.StringIO()
    code = cli_main(["shell", "-init", str(init), "-cmd", "INSERT INTO seen VALUES ('cmd1');", "-cmd",
                     ".headers off", "-c", "SELECT string_agg(step, ' ') FROM seen;"], out=out, err=err)
    assert (code, out.getvalue(), err.getvalue()) == (0, "init cmd1\n", "")
    out = io.StringIO()  # a failing -c ends the run: the next does not run
    assert cli_main(["shell", "-c", "SELEC 1;", "-c", "SELECT 'never' AS never_run;"], out=out, err=err) == 1
    assert "never_run" not in out.getvalue()
    r = shell("SELECT 1;", init=str(tmp_path / "missing.sql"))
    assert r.returncode == 2 and r.stderr.startswith("Error: dpsql: -init") and "no such file" in r.stderr


def test_cmd_runs_before_piped_input():
    r = shell(stdin="SELECT 1 AS a, NULL AS b;\n", commands_first=[".mode list", ".nullvalue (null)"])
    assert (r.returncode, r.stdout) == (0, "a|b\n1|(null)\n")


LIST_QUERY = "SELECT 1 AS a, 'x|y' AS b, NULL AS c UNION ALL SELECT 22, 'z', 3 ORDER BY a;"


@pytest.mark.parametrize("mode, expected", [
    ("list", "a|b|c\n1|x|y|\n22|z|3\n"),
    ("tabs", "a\tb\tc\n1\tx|y\t\n22\tz\t3\n"),
    ("table", "+----+-----+------+\n| a  |  b  |  c   |\n+----+-----+------+\n| 1  | x|y | NULL |\n"
              "| 22 | z   | 3    |\n+----+-----+------+\n"),
    ("box", "┌────┬─────┬──────┐\n│ a  │  b  │  c   │\n├────┼─────┼──────┤\n│ 1  │ x|y │ NULL │\n"
            "│ 22 │ z   │ 3    │\n└────┴─────┴──────┘\n"),
])
def test_list_tabs_table_and_box_modes(mode, expected):
    r = shell(stdin=f".mode {mode}\n{LIST_QUERY}\n")
    assert (r.returncode, r.stderr, r.stdout) == (0, "", expected)


def test_headers_nullvalue_and_separator():
    r = shell(stdin=f".mode list\n.headers off\n.nullvalue NIL\n{LIST_QUERY}\n.separator ', ' ';\\n'\n{LIST_QUERY}\n"
                    f".mode csv\n.headers on\n{LIST_QUERY}\n.nullvalue\n.separator ;\n{LIST_QUERY}\n")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == ("1|x|y|NIL\n22|z|3\n"            # list, no headers, NULL as NIL
                        "1, x|y, NIL;\n22, z, 3;\n"       # separators with escapes
                        'a,b,c\n1,x|y,NIL\n22,z,3\n'      # .mode csv: its own separator again
                        'a;b;c\n1;x|y;\n22;z;3\n')        # NULL back to csv's empty field; ';' separated
    r = shell(stdin=".headers maybe\n.separator\n")
    assert r.returncode == 1 and "Error: dpsql: .headers needs on or off" in r.stderr
    assert "Error: dpsql: .separator takes a COLUMN separator" in r.stderr
    r = shell(stdin=".nullvalue ∅\nSELECT NULL AS n;\n")  # duckbox too
    assert "∅" in r.stdout


def test_once_sends_only_the_next_result_to_a_file(tmp_path):
    target = tmp_path / "once.csv"
    r = shell(stdin=f".mode csv\n.once '{target}'\nSELECT 1 AS a;\nSELECT 2 AS b;\n.once {target}.tables\n.tables\n"
                    "CREATE TABLE tt (i INTEGER);\n")
    assert (r.returncode, r.stderr) == (0, "")
    assert target.read_text() == "a\n1\n" and r.stdout == "b\n2\n"
    assert Path(f"{target}.tables").read_text() == ""  # .tables ran before the table existed
    r = shell(stdin=".once\n.once x.dpsql-ledger\n")
    assert r.returncode == 1 and "Error: dpsql: .once needs a FILE" in r.stderr
    assert "Error: dpsql: .once 'x.dpsql-ledger' is a privacy ledger" in r.stderr


def test_print_and_echo():
    r = shell(stdin=".print 'hello there' world\\tend\n.echo on\nSELECT 1 AS one;\n.echo off\nSELECT 2 AS two;\n",
              mode="csv")
    assert r.stdout == "hello there world\tend\nSELECT 1 AS one;\none\n1\n.echo off\ntwo\n2\n"


def test_open_and_databases_follow_the_ledger_rule(tmp_path):
    db = tmp_path / "opened.duckdb"
    r = shell(stdin=f".databases\nCREATE TABLE gone (i INTEGER);\n.open {db}\n{SETUP}\n{MACRO}\n.databases\n"
                    ".tables\n.open\n.tables\n.open -readonly\n.open a b\n")
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "memory" and f"opened: {db}" in lines and lines.count("t") == 1 and "gone" not in lines
    assert "Error: dpsql: .open -readonly needs a FILE" in r.stderr and "Error: dpsql: .open takes one FILE" in r.stderr
    # the release after .open was charged to the sidecar of the file it opened
    assert [(x.table, x.epsilon) for x in Ledger(f"{db}.dpsql-ledger").releases()] == [("opened.main.t", 1.0)]
    r = shell(stdin=f".open -readonly {db}\nCREATE TABLE z (i INTEGER);\n.databases\n.open {db}.dpsql-ledger\n")
    assert "read-only" in r.stderr and f"opened: {db} (read-only)" in r.stdout
    assert "is a privacy ledger, not a database" in r.stderr


def test_import_csv_and_parquet_creates_or_appends(tmp_path):
    data = tmp_path / "in.csv"
    data.write_text("user_id,item\nu1,a\nu2,b\n")
    parquet = tmp_path / "in.parquet"
    assert shell(f"COPY (SELECT 'u3' AS user_id, 'c' AS item) TO '{parquet}';").returncode == 0
    r = shell(stdin=f".import {data} events\n.import {parquet} events\n.import {data} \"Other Name\"\n.mode csv\n"
                    "SELECT user_id, item FROM events ORDER BY 1;\nSELECT count(*) AS n FROM \"Other Name\";\n"
                    f".import {tmp_path / 'missing.csv'} x\n.import only_one\n")
    assert r.returncode == 1
    assert r.stdout == "user_id,item\nu1,a\nu2,b\nu3,c\nn\n2\n"
    assert "Error: dpsql: .import: no file" in r.stderr and "Error: dpsql: .import takes FILE TABLE" in r.stderr


def test_dump_rebuilds_tables_and_views():
    setup = ("CREATE TABLE d (i INTEGER, s VARCHAR, l INTEGER[], dt DATE, x DOUBLE, b BOOLEAN); "
             "INSERT INTO d VALUES (1, 'it''s', [1, 2], DATE '2024-01-02', 'nan', true), (NULL, NULL, NULL, NULL, "
             "1.5, NULL); CREATE VIEW dv AS SELECT i FROM d; CREATE TEMP TABLE scratch (i INTEGER);")
    r = shell(f"{setup}\n.dump\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "BEGIN TRANSACTION;",
        "CREATE TABLE d(i INTEGER, s VARCHAR, l INTEGER[], dt DATE, x DOUBLE, b BOOLEAN);",
        "INSERT INTO \"d\" VALUES(1, 'it''s', '[1, 2]', '2024-01-02', 'nan', true);",
        "INSERT INTO \"d\" VALUES(NULL, NULL, NULL, NULL, 1.5, NULL);",
        "CREATE VIEW dv AS SELECT i FROM d;",
        "COMMIT;"]
    again = shell(f"{r.stdout}\n.mode csv\nSELECT * FROM d ORDER BY i;\nSELECT * FROM dv;\n")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "i,s,l,dt,x,b\n1,it's,\"[1, 2]\",2024-01-02,nan,true\n,,,,1.5,\ni\n1\n\n"
    assert shell(f"{setup}\n.dump dv\n").stdout.splitlines()[1:-1] == ["CREATE VIEW dv AS SELECT i FROM d;"]


def test_help_names_every_dot_command_and_flag():
    text = shell(".help").stdout
    for command in shell_mod.Shell.dot_command_names():
        if command not in (".q", ".header"):  # aliases
            assert re.search(rf"^  {re.escape(command)}\b|[ ,]{re.escape(command)}\b", text, re.M), command
    for flag in ("-cmd", "-init", "-list", "-table", "-box", "-c SQL (repeatable)"):
        assert flag in text, flag
