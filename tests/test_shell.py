"""`dpsql shell`: statement splitting, -c, piped stdin, errors and dot commands.

The end-to-end runs go through `python -m dpsql shell` in subprocesses started
together; the rest calls ``dpsql.shell.run_shell`` in this process.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from dpsql.shell import is_complete, run_shell, split_statements

# Every user holds all 7 items: weight 300/sqrt(7) ~ 113 against a threshold near 19.
SETUP = ("CREATE TABLE t AS SELECT 'u' || u AS user_id, 'w' || w AS item "
         "FROM range(300) a(u), range(7) b(w);")
MACRO = ("SELECT count(*) AS n_released FROM dp_set_union('t', epsilon := 1.0, delta := 1e-5, max_items := 10);")


def dpsql_cmd(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "dpsql", *args], input=stdin, capture_output=True,
                          text=True, encoding="utf-8", cwd=cwd, env=env, timeout=300)


def shell(sql: str | None = None, *, stdin: str = "", database: str | None = None) -> SimpleNamespace:
    """``dpsql shell`` in this process, with ``-c sql`` or with ``stdin`` piped in."""
    out, err = io.StringIO(), io.StringIO()
    code = run_shell(database, sql, stdin=io.StringIO(stdin), out=out, err=err)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    folder = tmp_path_factory.mktemp("shell")
    commands = {
        "c_flag": (["shell", "-c", f"{SETUP} SELECT 41 + 1 AS answer; {MACRO}"], None),
        "stdin": (["shell", "db.duckdb"], f"{SETUP}\nSELECT count(*)\n  AS n_rows\nFROM t;\n.tables\n"),
        "error": (["shell", "-c", "SELECT 1 AS first_one; SELECT * FROM no_such_table; SELECT 3 AS never_run;"],
                  None),
        "stdin_error": (["shell"], "SELEC 1;\nSELECT 2 AS never_run;\n"),
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


@pytest.mark.parametrize("name", ["error", "stdin_error"])
def test_error_is_one_line_and_stops(runs, name):
    r = runs[name]
    assert_clean(r)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert "never_run" not in r.stdout


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


def test_dpsql_macros_and_parameter_errors():
    r = shell(f"{SETUP} SELECT * FROM dp_set_union('t', epsilon := -1);")
    assert r.returncode == 1
    assert r.stderr.strip().startswith("Error: ") and "epsilon" in r.stderr
    assert "\n" not in r.stderr.strip()


def test_quit_and_unknown_dot_command():
    r = shell(stdin="SELECT 1 AS one;\n.quit\nSELECT 2 AS two;\n")
    assert r.returncode == 0 and "one" in r.stdout and "two" not in r.stdout
    r = shell(stdin=".nope\n")
    assert r.returncode == 1 and "Error: unknown command '.nope'" in r.stderr


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


def test_bare_table_identifier_gets_a_hint_and_ledger_is_readable(tmp_path):
    r = shell(f"{SETUP} SELECT * FROM dp_set_union(t);")
    assert r.returncode == 1 and "quote it: dp_set_union('events'" in r.stderr
    assert "\n" not in r.stderr.strip()
    db = str(tmp_path / "b.duckdb")
    r = shell(f"{SETUP} SELECT count(*) >= 0 AS ok FROM dp_set_union('t'); "
              "SELECT scope, epsilon_spent FROM dp_budget();", database=db)
    assert r.returncode == 0, r.stderr
    assert "database" in r.stdout and "1.0" in r.stdout
    assert (tmp_path / "b.duckdb.dpsql-ledger").is_file()
