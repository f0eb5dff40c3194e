"""The dbt-duckdb plugin (dpsql.dbt) and the example dbt project in examples/dbt.

Skipped when dbt-core / dbt-duckdb are not installed (``pip install dpsql[dbt]``).
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "dbt"


def _plugin_base():
    pytest.importorskip("dbt.adapters.duckdb", reason="dbt-duckdb is not installed")
    from dbt.adapters.duckdb.plugins import BasePlugin

    return BasePlugin


def _dbt_executable() -> str:
    _plugin_base()
    exe = shutil.which("dbt", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("no dbt executable next to the Python interpreter")
    return exe


def test_import_dpsql_does_not_load_dbt():
    code = "import sys, dpsql; sys.exit(any(m == 'dbt' or m.startswith('dbt.') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_plugin_registers_macros_on_cursors():
    base = _plugin_base()
    plugin = base.create("dpsql.dbt", config={})  # as dbt-duckdb does for `module: dpsql.dbt`
    con = duckdb.connect()
    plugin.configure_connection(con)
    con.execute("CREATE TABLE user_items AS SELECT i AS user_id, 'common' AS item FROM range(2000) t(i)")

    bare = con.cursor()  # TEMP macros do not reach a cursor by themselves...
    with pytest.raises(duckdb.CatalogException):
        bare.execute("SELECT * FROM dp_set_union_weighted_gaussian('user_items')").fetchall()

    cursor = con.cursor()  # ...configure_cursor creates them there
    plugin.configure_cursor(cursor)
    rows = cursor.execute("SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 1.0)").fetchall()
    assert rows == [("common",)]


def test_plugin_budget_config_limits_releases(tmp_path):
    base = _plugin_base()
    plugin = base.create("dpsql.dbt", config={"ledger": str(tmp_path / "l.dpsql-ledger"),
                                              "budget": {"epsilon": 1.5, "delta": 1e-4}})
    con = duckdb.connect()
    plugin.configure_connection(con)
    con.execute("CREATE TABLE user_items AS SELECT i AS user_id, 'common' AS item FROM range(200) t(i)")
    con.execute("SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 1.0)").fetchall()
    with pytest.raises(duckdb.Error, match="exceeded"):
        con.execute("SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 1.0)").fetchall()
    with pytest.raises(ValueError, match="budget must be a mapping"):
        base.create("dpsql.dbt", config={"budget": {"epsilon": 1.0}})


def test_example_project_seeds_and_runs(tmp_path):
    if not EXAMPLE.is_dir():
        pytest.skip("examples/dbt is not next to the tests folder")
    dbt = _dbt_executable()
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("target", "logs", "*.duckdb*", ".user.yml"))
    env = dict(os.environ, DBT_SEND_ANONYMOUS_USAGE_STATS="false")
    for command in ("seed", "run"):
        done = subprocess.run([dbt, command, "--profiles-dir", str(project), "--project-dir", str(project)],
                              cwd=project, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"dbt {command} failed:\n{done.stdout}\n{done.stderr}"

    with (project / "seeds" / "user_items.csv").open(newline="", encoding="utf-8") as f:
        seed_items = {row["item"] for row in csv.DictReader(f)}
    con = duckdb.connect(str(project / "dpsql_example.duckdb"), read_only=True)  # plain DuckDB, no dpsql
    try:
        columns = [row[0] for row in con.execute("DESCRIBE released_items").fetchall()]
        released = [row[0] for row in con.execute("SELECT item FROM released_items").fetchall()]
    finally:
        con.close()
    assert columns == ["item"]
    # the one releasing model was charged once, to the sidecar ledger of the dbt database
    from dpsql.ledger import Ledger, sidecar_path
    charged = Ledger(sidecar_path(project / "dpsql_example.duckdb")).releases()
    assert [(r.mechanism, r.epsilon, r.delta) for r in charged] == [("dp_set_union_weighted_gaussian", 1.0, 1e-5)]
    assert "common" in released
    assert len(released) == len(set(released))
    assert set(released) <= seed_items
