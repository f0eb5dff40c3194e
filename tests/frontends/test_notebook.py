"""jupysql's ``%sql`` magic on a dpsql connection (docs/notebook.md), driven through IPython's shell.

jupysql runs each statement on a new cursor of the connection it is given; dpsql's macros are TEMP, one
cursor's own, so the page's adapter registers each cursor. The tests run the page's own adapter and
notebook session, check that a release made through ``%sql`` is dpsql's release (the same rows as
``dpsql.set_union`` from an identically seeded connection, one ledger row), and pin down each place
where jupysql runs a statement again: every such run is another release, charged again, which is what
the page's table says. Without the ``notebook`` extra (jupysql, IPython) they skip.
"""
from __future__ import annotations

import warnings

import pytest

import dpsql
from dpsql.core.ledger import Ledger
from doc_blocks import DOCS, blocks_of

pytest.importorskip("IPython", reason="IPython (the notebook extra) is not installed")
pytest.importorskip("sql.magic", reason="jupysql (the notebook extra) is not installed")

PAGE = DOCS / "notebook.md"
RELEASE = "SELECT * FROM dp_set_union('user_items', epsilon := 1.0, delta := 1e-6)"
# 4,400 users holding one item each; item i<j> is held by 10 + j % 25 users: weights from 10 to 34 around
# a threshold near 21, so which items pass depends on the noise draws (and two seeds differ).
USER_ITEMS = ("CREATE TABLE user_items AS SELECT u * 200 + j AS user_id, 'i' || j AS item "
              "FROM range(200) a(j), range(35) b(u) WHERE u < 10 + j % 25")


def _page_blocks(language: str) -> list[str]:
    return [text for kind, _, text in blocks_of(PAGE) if kind == language]


@pytest.fixture
def shell(tmp_path, monkeypatch):
    """IPython's shell with jupysql loaded, in a folder of its own; no usage statistics, no version check."""
    monkeypatch.setenv("PLOOMBER_STATS_ENABLED", "false")
    monkeypatch.setenv("PLOOMBER_VERSION_CHECK_DISABLED", "1")
    monkeypatch.chdir(tmp_path)
    from IPython.core.interactiveshell import InteractiveShell

    ipython = InteractiveShell.instance()
    ipython.run_line_magic("load_ext", "sql")  # once per process; again, a no-op
    _reset(ipython)
    yield ipython
    _reset(ipython)
    from sql.connection import ConnectionManager

    ConnectionManager.close_all()


def _reset(ipython) -> None:
    for option in ("autopandas", "autopolars"):
        ipython.run_line_magic("config", f"SqlMagic.{option} = False")


def run(ipython, cell: str):
    """Run one cell; its error, if any, is raised here (IPython would only print it)."""
    result = ipython.run_cell(cell)
    if result.error_before_exec is not None:
        raise result.error_before_exec
    if result.error_in_exec is not None:
        raise result.error_in_exec
    return result.result


def _adapter():
    """The adapter class of docs/notebook.md, executed from the page."""
    if not PAGE.is_file():
        pytest.skip("docs/notebook.md is not next to the tests")
    (code,) = [text for text in _page_blocks("python") if "class NotebookConnection" in text]
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace["NotebookConnection"]


def _connect(ipython, *, seed: int | None = None, name: str = "nb"):
    """A dpsql connection with USER_ITEMS, handed to jupysql through the page's adapter; the raw one back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a seeded connection warns that it is not private
        con = dpsql.connect(seed=seed)
    con.execute(USER_ITEMS)
    ipython.user_ns[name] = _adapter()(con)
    run(ipython, f"%sql {name}")
    return con


def _charges(con) -> int:
    return len(dpsql.releases(con))


def _items(rows) -> list:
    return [row[0] for row in rows]


def test_the_page_notebook_session_runs_and_charges_one_release(shell, tmp_path):
    import duckdb

    con = duckdb.connect(str(tmp_path / "events.duckdb"))
    con.execute(USER_ITEMS)
    con.close()
    shell.user_ns["NotebookConnection"] = _adapter()
    shell.user_ns["dpsql"] = dpsql
    (session,) = _page_blocks("ipython")
    outputs = [run(shell, cell) for cell in session.strip().split("\n\n")]
    ledger = Ledger(tmp_path / "events.duckdb.dpsql-ledger")
    (release,) = ledger.releases()
    assert (release.mechanism, release.epsilon, release.delta) == ("dp_set_union_sips_cumulative", 1.0, 1e-6)
    shown, budget = outputs[-2], outputs[-1]  # SELECT * FROM released; the budget per scope
    stored = shell.user_ns["con"].execute("SELECT item FROM released ORDER BY item").fetchall()
    assert sorted(_items(shown)) == _items(stored) and len(stored) > 0
    assert {row[0]: (row[1], row[2]) for row in budget}["database"] == (1.0, 1e-6)
    shell.user_ns["con"].close()


def test_a_plain_dpsql_connection_has_no_macros_on_jupysqls_cursors(shell):
    con = dpsql.connect()
    con.execute(USER_ITEMS)
    shell.user_ns["raw"] = con
    run(shell, "%sql raw")
    with pytest.raises(Exception, match="dp_set_union does not exist"):
        run(shell, f"%sql {RELEASE}")
    assert _charges(con) == 0


def test_a_release_through_sql_magic_is_dpsqls_release_charged_once(shell):
    con = _connect(shell, seed=11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(shell, f"%sql rows << {RELEASE}")
        twin = dpsql.connect(seed=11)
        twin.execute(USER_ITEMS)
        expected = dpsql.set_union(twin, "user_items", epsilon=1.0, delta=1e-6).column("item").to_pylist()
        other = dpsql.connect(seed=12)
        other.execute(USER_ITEMS)
        elsewhere = dpsql.set_union(other, "user_items", epsilon=1.0, delta=1e-6).column("item").to_pylist()
    got = _items(shell.user_ns["rows"])
    assert got == expected and got != elsewhere  # the same draws give the same release; other draws another
    (release,) = dpsql.releases(con)
    (twin_release,) = dpsql.releases(twin)
    assert (release.mechanism, release.epsilon, release.delta, release.seeded) == \
        (twin_release.mechanism, 1.0, 1e-6, True)
    for c in (con, twin, other):
        c.close()


def test_reading_a_result_again_does_not_run_the_release_again(shell):
    con = _connect(shell)
    result = run(shell, f"%sql {RELEASE}")
    assert _charges(con) == 1
    shown = str(result)  # what the notebook displays
    rows = list(result)
    assert len(result) == len(rows) > 10 and "item" in shown
    assert [d["item"] for d in result.dicts()] == _items(rows)
    assert result.csv().splitlines() == ["item", *_items(rows)]
    run(shell, f"%%sql\n{RELEASE}")  # a cell: one more statement, one more release
    assert _charges(con) == 2
    run(shell, f"%sql EXPLAIN {RELEASE}")  # plans, runs nothing
    assert _charges(con) == 2
    con.close()


def test_converting_a_release_to_a_data_frame_runs_it_again(shell):
    pytest.importorskip("pandas", reason="pandas is not installed")
    con = _connect(shell)
    result = run(shell, f"%sql {RELEASE}")
    assert _charges(con) == 1
    frame = result.DataFrame()
    assert list(frame.columns) == ["item"] and _charges(con) == 2  # a second release, with fresh noise
    con.close()


def test_autopandas_charges_every_release_statement_twice(shell):
    pytest.importorskip("pandas", reason="pandas is not installed")
    con = _connect(shell)
    shell.run_line_magic("config", "SqlMagic.autopandas = True")
    frame = run(shell, f"%sql {RELEASE}")
    assert list(frame.columns) == ["item"] and _charges(con) == 2
    # the page's way: store the release once, then read the table as often as one likes
    run(shell, f"%sql CREATE TABLE released AS {RELEASE}")
    assert _charges(con) == 3
    stored = run(shell, "%sql SELECT * FROM released")
    again = run(shell, "%sql SELECT * FROM released")
    assert _charges(con) == 3 and list(stored["item"]) == list(again["item"])
    con.close()


def test_a_saved_snippet_of_a_release_runs_it_at_every_use(shell):
    con = _connect(shell)
    run(shell, f"%sql --save later --no-execute {RELEASE}")
    assert _charges(con) == 0
    run(shell, f"%sql --save snippet {RELEASE}")  # saved and run
    assert _charges(con) == 1
    run(shell, "%sql SELECT count(*) FROM snippet")  # jupysql inlines the snippet: the release runs again
    run(shell, "%sql SELECT count(*) FROM later")
    assert _charges(con) == 3
    con.close()
