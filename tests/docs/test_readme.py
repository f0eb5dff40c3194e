"""README's examples run: every ```sql and ```python block, and every `dpsql ...` command line.

Each block runs in a fresh folder holding `events.duckdb` (tables `user_items`, `events`, `counts`)
and `data.parquet`, so that the examples cannot drift from the code. Spark blocks run in
tests/frontends/test_spark.py's session-dependent tests instead, and need a DataFrame `df`: they are skipped.
"""
from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.frontends import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def _blocks(language: str) -> list[tuple[int, str]]:
    """(line number, text) of README's fenced blocks of ``language`` ("" = no language given)."""
    if not README.is_file():
        return []
    blocks, current, start = [], None, 0
    for number, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current, start, kind = [], number, line[3:].strip()
            else:
                if kind == language:
                    blocks.append((start, "\n".join(current) + "\n"))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _commands() -> list[tuple[int, str]]:
    """`dpsql ...` lines of the plain blocks (continuation lines joined, optional [--flags] dropped)."""
    out = []
    for line_no, block in _blocks(""):
        text = re.sub(r"\\\n\s*", " ", block)
        for offset, line in enumerate(text.splitlines()):
            if line.startswith("dpsql ") and " shell" not in line[:12]:
                out.append((line_no + 1 + offset, re.sub(r"\s*\[[^\]]*\]", "", line).strip()))
    return out


def _setup(folder: Path) -> None:
    con = duckdb.connect(str(folder / "events.duckdb"))
    # 2,000 users; user u holds items w0 .. w(u % 40): popularity falls from 2,000 users to 50.
    con.execute("""CREATE TABLE user_items AS
        SELECT u AS user_id, 'w' || j AS item, u AS uid, 'w' || j AS query
        FROM range(2000) a(u), range(40) b(j) WHERE j <= u % 40""")
    con.execute("CREATE TABLE events AS SELECT 'site' || (i % 97) || '.org' AS url FROM range(20000) r(i)")
    con.execute("CREATE TABLE counts AS SELECT url, count(*) AS n FROM events GROUP BY url")
    con.execute(f"COPY (SELECT user_id, item FROM user_items) TO '{folder / 'data.parquet'}' (FORMAT parquet)")
    con.close()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    _setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_has_examples():
    if not README.is_file():
        pytest.skip("README.md is not next to the tests")
    assert _blocks("sql") and _blocks("python") and _commands()


@pytest.mark.parametrize("line_no, block", _blocks("sql"), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_sql_block_runs(folder, line_no, block):
    con = dpsql.connect("events.duckdb")
    con.execute("PRAGMA disable_progress_bar")
    code = re.sub(r"--[^\n]*", "", block)  # README's SQL comments hold no strings
    for statement in [s for s in code.split(";") if s.strip()]:
        con.execute(statement).fetchall()
    con.close()


@pytest.mark.parametrize("line_no, block", _blocks("python"), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_python_block_runs(folder, line_no, block, capsys):
    if "spark" in block:
        pytest.skip("Spark blocks need a SparkSession and a DataFrame (tests/frontends/test_spark.py)")
    namespace = {"dpsql": dpsql, "existing_connection": duckdb.connect()}
    exec(compile(block, f"README.md:{line_no}", "exec"), namespace)
    if "refused" in block:  # the ledger example: the second release is refused, naming its scope
        assert "privacy budget of scope 'events.main.user_items' exceeded" in capsys.readouterr().out


@pytest.mark.parametrize("line_no, command", _commands(), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_command_line_runs(folder, line_no, command):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(shlex.split(command)[1:], out=out, err=err)
    assert code == 0, f"README.md:{line_no}: {command}\n{err.getvalue()}"
