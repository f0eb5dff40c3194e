"""The examples of README.md and docs/*.md run, so that they cannot drift from the code.

Every fenced block is run by the language it declares:

* ``sql``: each statement on a dpsql connection to ``events.duckdb``; a block with dot commands
  (``.mode``, ``.budget``, ...) is piped to ``dpsql shell events.duckdb`` instead. A statement whose
  comment starts with a number (``-- 0.063360``) must return that number, to the digits written.
* ``python``: executed; a block that uses ``dpspark`` runs in :func:`test_spark_block_runs` on a local
  Spark session, with ``df`` a DataFrame of ``events.parquet``.
* plain (no language): every ``dpsql ...`` line but ``dpsql shell``, in order, in one folder (optional
  ``[--flags]`` dropped); a block that opens with ``-- models/NAME.sql`` must be that dbt model of
  examples/dbt/.
* ``ipython``: docs/notebook.md's notebook session, run by tests/frontends/test_notebook.py.
* ``yaml``: dbt profile fragments: they parse, and every ``module:`` they name exists.

Each block runs in a fresh folder holding ``events.duckdb`` (tables ``user_items(user_id, item)``,
``events(url)``, ``counts(url, n)``), the same pairs as ``data.parquet`` and ``searches.csv``, and
``events.parquet`` (``user_id, item, spend``). Numbers in README's table of thresholds are checked against
the calibration.
"""
from __future__ import annotations

import importlib.util
import io
import math
import os
import re
import shlex
import shutil
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.frontends import cli
from dpsql.frontends.shell import run_shell
from doc_blocks import README, ROOT, blocks_of, documents, label as _label

# Languages of the blocks, and who runs them (a new language must be added here, with its runner).
LANGUAGES = {"sql": "test_sql_block_runs", "python": "test_python_block_runs / test_spark_block_runs",
             "": "test_command_block_runs", "ipython": "tests/frontends/test_notebook.py",
             "yaml": "test_yaml_block_names_existing_modules"}


# Pages whose blocks need data of their own, run by the tests of what they document (which read the page).
RUN_ELSEWHERE = {"docs/bigquery_syntax.md": ROOT / "tests" / "frontends" / "test_dp_syntax.py"}


def blocks(language: str) -> list[tuple[str, str]]:
    """("file:line", text) of every block of ``language`` in the documents (but RUN_ELSEWHERE's)."""
    return [(f"{_label(p)}:{line}", text) for p in documents() for kind, line, text in blocks_of(p)
            if kind == language and _label(p) not in RUN_ELSEWHERE]


def test_pages_run_elsewhere_are_read_by_their_tests():
    for page, runner in RUN_ELSEWHERE.items():
        assert (ROOT / page).is_file() and page.split("/")[-1] in runner.read_text(encoding="utf-8"), (page, runner)


def _ids(value):
    return value if isinstance(value, str) and ":" in value and "\n" not in value else ""


def _commands(text: str) -> list[str]:
    """The `dpsql ...` lines of a plain block (continuation lines joined, optional [--flags] dropped)."""
    text = re.sub(r"\\\n\s*", " ", text)
    return [re.sub(r"\s*\[[^\]]*\]", "", line).strip() for line in text.splitlines()
            if line.startswith("dpsql ") and not line.startswith("dpsql shell")]


def _setup(folder: Path) -> None:
    con = duckdb.connect(str(folder / "events.duckdb"))
    # 2,000 users; user u holds items w0 .. w(u % 40): popularity falls from 2,000 users to 50.
    con.execute("""CREATE TABLE user_items AS
        SELECT u AS user_id, 'w' || j AS item FROM range(2000) a(u), range(40) b(j) WHERE j <= u % 40""")
    con.execute("CREATE TABLE events AS SELECT 'site' || (i % 97) || '.org' AS url FROM range(20000) r(i)")
    con.execute("CREATE TABLE counts AS SELECT url, count(*) AS n FROM events GROUP BY url")
    con.execute(f"COPY user_items TO '{folder / 'data.parquet'}' (FORMAT parquet)")
    con.execute(f"COPY user_items TO '{folder / 'searches.csv'}' (HEADER)")
    con.execute(f"COPY (SELECT user_id, item, (user_id % 50)::DOUBLE AS spend FROM user_items) "
                f"TO '{folder / 'events.parquet'}' (FORMAT parquet)")
    con.close()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    _setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_documents_have_examples():
    if not README.is_file():
        pytest.skip("README.md is not next to the tests")
    assert blocks("sql") and blocks("python") and any(_commands(t) for _, t in blocks(""))
    assert {_label(p) for p in documents()} >= {"README.md", "docs/notebook.md", "docs/ledger.md"}


def test_every_block_has_a_runner():
    unknown = [(f"{_label(p)}:{line}", kind) for p in documents() for kind, line, _ in blocks_of(p)
               if kind not in LANGUAGES]
    assert unknown == [], f"blocks in a language nothing runs: {unknown} (runners: {LANGUAGES})"
    notebooks = {label.split(":")[0] for label, _ in blocks("ipython")}
    assert notebooks <= {"docs/notebook.md"}, "an ipython session outside docs/notebook.md is run by no test"


# ---------------------------------------------------------------------------------------------- SQL

def _statements(block: str) -> list[tuple[str, list[str]]]:
    """(statement, its comments) for each statement of a block (README's SQL comments hold no strings)."""
    out, code, comments = [], [], []
    for line in block.splitlines():
        text, _, comment = line.partition("--")
        code.append(text)
        if comment:
            comments.append(comment.strip())
        if text.rstrip().endswith(";"):
            out.append(("\n".join(code), comments))
            code, comments = [], []
    if "".join(code).strip():
        out.append(("\n".join(code), comments))
    return out


def _documented_number(comments: list[str]) -> tuple[float, int] | None:
    """The number a statement's comment says it returns (and its decimals), if any."""
    for comment in comments:
        match = re.match(r"(-?[\d,]*\.?\d+)(?![\w.])", comment)
        if match:
            digits = match.group(1).replace(",", "")
            return float(digits), len(digits.partition(".")[2])
    return None


@pytest.mark.parametrize("where, block", blocks("sql"), ids=_ids)
def test_sql_block_runs(folder, where, block):
    if any(line.lstrip().startswith(".") for line in block.splitlines()):  # dot commands: the shell's
        out, err = io.StringIO(), io.StringIO()
        code = run_shell("events.duckdb", stdin=io.StringIO(block), bail=True, out=out, err=err)
        assert code == 0, f"{where}: dpsql shell exited with {code}\n{err.getvalue()}"
        return
    con = dpsql.connect("events.duckdb")
    con.execute("PRAGMA disable_progress_bar")
    try:
        for statement, comments in _statements(block):
            rows = con.execute(statement).fetchall()
            documented = _documented_number(comments)
            if documented is not None:
                value, decimals = documented
                assert round(rows[0][0], decimals) == pytest.approx(value), (where, statement, rows)
    finally:
        con.close()


# ------------------------------------------------------------------------------------------- Python

def _is_spark(block: str) -> bool:
    return "dpspark" in block


@pytest.mark.parametrize("where, block", [b for b in blocks("python") if not _is_spark(b[1])], ids=_ids)
def test_python_block_runs(folder, where, block, capsys):
    namespace = {"existing_connection": duckdb.connect()}
    exec(compile(block, where, "exec"), namespace)
    if "refused" in block:  # the ledger example: the second release is refused, naming its scope
        assert "privacy budget of scope 'events.main.user_items' exceeded" in capsys.readouterr().out


@pytest.fixture(scope="module")
def spark():
    if os.environ.get("DPSQL_REQUIRE_SPARK") != "1":
        pytest.importorskip("pyspark", reason="pyspark (the spark extra) is not installed")
        pytest.importorskip("sqlglot", reason="sqlglot (the spark extra) is not installed")
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            pytest.skip("no java: the Spark blocks need Java 17+")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("dpsql-docs")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.mark.slow
@pytest.mark.xdist_group("spark")  # one JVM at a time beside the Spark tests
@pytest.mark.parametrize("where, block", [b for b in blocks("python") if _is_spark(b[1])], ids=_ids)
def test_spark_block_runs(folder, spark, where, block):
    from dpsql.frontends import spark as dpspark

    namespace = {"spark": spark, "dpspark": dpspark, "df": spark.read.parquet(str(folder / "events.parquet"))}
    exec(compile(block, where, "exec"), namespace)


# ----------------------------------------------------------------------------------- command lines

@pytest.mark.parametrize("where, block", [b for b in blocks("") if _commands(b[1])], ids=_ids)
def test_command_block_runs(folder, where, block):
    for command in _commands(block):
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(shlex.split(command)[1:], out=out, err=err)
        assert code == 0, f"{where}: {command}\n{err.getvalue()}"


@pytest.mark.parametrize("where, block", [b for b in blocks("") if b[1].startswith("-- models/")], ids=_ids)
def test_dbt_model_block_is_the_example_model(where, block):
    first, *lines = block.strip().splitlines()
    model = ROOT / "examples" / "dbt" / first.removeprefix("-- ").strip()
    text = model.read_text(encoding="utf-8").splitlines()
    assert any(text[i:i + len(lines)] == lines for i in range(len(text))), f"{where} is not {model}"


@pytest.mark.parametrize("where, block", blocks("yaml"), ids=_ids)
def test_yaml_block_names_existing_modules(where, block):
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (dbt brings it)")
    yaml.safe_load(block)
    modules = re.findall(r"module:\s*([\w.]+)", block)
    assert modules, where
    for module in modules:
        assert importlib.util.find_spec(module) is not None, (where, module)


# ------------------------------------------------------------------------ README's table of thresholds

def _threshold_table() -> list[list[str]]:
    rows, inside = [], False
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("| ε | δ | max_items | ρ | σ |"):
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif inside and not line.startswith("|"):
            break
    return rows


def test_readme_thresholds_are_the_calibration():
    if not README.is_file():
        pytest.skip("README.md is not next to the tests")
    rows = _threshold_table()
    assert len(rows) >= 5, "README's table of thresholds is gone"
    for epsilon, delta, max_items, rho, sigma, count_rho in rows:
        args = (float(epsilon), float(delta), int(max_items.replace(",", "")))
        weighted, count = dpsql.calibrate("weighted_gaussian", *args), dpsql.calibrate("count_gaussian", *args)
        assert (round(weighted.threshold, 1), round(weighted.scale, 1), round(count.threshold, 1)) == \
            (float(rho), float(sigma), float(count_rho)), (epsilon, delta, max_items)
        assert math.isclose(weighted.scale, count.scale / math.sqrt(args[2]), rel_tol=1e-9)


# ------------------------------------------------------------------------------------------------ links

def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of ``path`` (lower case, punctuation dropped, spaces as '-')."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def test_links_reach_files_and_headings():
    broken = []
    for page in documents():
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
                broken.append(f"{_label(page)}: {target}")
    assert broken == []
