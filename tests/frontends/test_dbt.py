"""The dbt-duckdb plugin (dpsql.frontends.dbt) and the example dbt project in examples/dbt.

Skipped when dbt-core / dbt-duckdb are not installed (``pip install ".[dbt]"`` in the checkout).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dbt"

# the dbt project is built once for the file: its tests stay on one xdist worker
pytestmark = pytest.mark.xdist_group('dbt')


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
    plugin = base.create("dpsql.frontends.dbt", config={})  # as dbt-duckdb does for `module: dpsql.frontends.dbt`
    con = duckdb.connect()
    plugin.configure_connection(con)
    con.execute("CREATE TABLE user_items AS SELECT i AS user_id, 'common' AS item FROM range(2000) t(i)")

    bare = con.cursor()  # TEMP macros do not reach a cursor by themselves...
    with pytest.raises(duckdb.CatalogException):
        bare.execute("SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 1.0, delta := 1e-5)").fetchall()

    cursor = con.cursor()  # ...configure_cursor creates them there
    plugin.configure_cursor(cursor)
    rows = cursor.execute("SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 1.0, delta := 1e-5)").fetchall()
    assert rows == [("common",)]


def test_plugin_budget_config_limits_releases(tmp_path):
    base = _plugin_base()
    plugin = base.create("dpsql.frontends.dbt", config={"ledger": str(tmp_path / "l.dpsql-ledger"),
                                              "budget": {"epsilon": 1.5, "delta": 1e-4}})
    con = duckdb.connect()
    plugin.configure_connection(con)
    con.execute("CREATE TABLE user_items AS SELECT i AS user_id, 'common' AS item FROM range(200) t(i)")
    con.execute("SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 1.0, delta := 1e-5)").fetchall()
    with pytest.raises(duckdb.Error, match="exceeded"):
        con.execute("SELECT * FROM dp_set_union_weighted_gaussian('user_items', epsilon := 1.0, delta := 1e-5)").fetchall()
    with pytest.raises(ValueError, match="budget must be a mapping"):
        base.create("dpsql.frontends.dbt", config={"budget": {"epsilon": 1.0}})


def test_plugin_budget_scope_is_the_table_identity(tmp_path):
    """``budget: {scope: user_items}`` limits the table dbt's models name as "events"."main"."user_items"."""
    base = _plugin_base()
    plugin = base.create("dpsql.frontends.dbt", config={"budget": {"epsilon": 1.0, "delta": 1e-4, "scope": "user_items"}})
    con = duckdb.connect(str(tmp_path / "events.duckdb"))
    try:
        plugin.configure_connection(con)
        for table in ("user_items", "other_items"):
            con.execute(f"CREATE TABLE {table} AS SELECT i AS user_id, 'common' AS item FROM range(200) t(i)")
        release = "SELECT * FROM dp_set_union_weighted_gaussian('{}', epsilon := 1.0, delta := 1e-5)"
        con.execute(release.format('"events"."main"."user_items"')).fetchall()  # as ref('user_items') renders
        with pytest.raises(duckdb.Error, match="scope 'events.main.user_items' exceeded"):
            con.execute(release.format("user_items")).fetchall()
        con.execute(release.format("other_items")).fetchall()  # another scope
    finally:
        con.close()


# Models added to a copy of the example project: each stores a release as a query (refused), or
# reads released rows (allowed). ``name: (materialization, sql)``.
EXTRA_MODELS = {
    "release_view": ("view", "select * from dp_set_union_weighted_gaussian('{{ ref(\"user_items\") }}', "
                             "epsilon := 1.0, delta := 1e-5)"),
    "release_function": ("table_function",
                         "select * from dp_set_union('{{ ref(\"user_items\") }}', method := 'weighted_gaussian', "
                         "epsilon := 1.0, delta := 1e-5)"),
    "release_ephemeral": ("ephemeral",
                          "select * from dp_set_union_count_gaussian('{{ ref(\"user_items\") }}', epsilon := 0.5, delta := 1e-5)"),
    "from_ephemeral": ("table", "select * from {{ ref('release_ephemeral') }}"),
    "released_view": ("view", "select item from {{ ref('released_items') }}  -- dp_top_k( in a comment"),
    # supported: the released rows are stored once
    "release_incremental": ("incremental",
                            "select * from dp_set_union_weighted_laplace('{{ ref(\"user_items\") }}', epsilon := 0.5, delta := 1e-5)"),
    "release_external": ("external",
                         "select * from dp_set_union_count_laplace('{{ ref(\"user_items\") }}', epsilon := 0.25, delta := 1e-5, "
                         "max_items := 3)"),
    # a dbt source over the seed's table: the same relation, hence the same scope as ref('user_items')
    "release_from_source": ("table", "select * from dp_set_union_count_gaussian("
                                     "'{{ source(\"raw\", \"user_items\") }}', epsilon := 0.125, delta := 1e-5)"),
}
SOURCES = "version: 2\nsources:\n  - name: raw\n    schema: main\n    tables:\n      - name: user_items\n"
# `dpsql budget set dpsql_example.duckdb --scope user_items` before `dbt run`: the models that read
# ref('user_items') or the source charge that scope, dpsql_example.main.user_items.
SCOPE, SCOPE_EPSILON = "dpsql_example.main.user_items", 1.9
CHARGED = [("dp_set_union_count_gaussian", 0.125), ("dp_set_union_count_laplace", 0.25),
           ("dp_set_union_weighted_gaussian", 1.0), ("dp_set_union_weighted_laplace", 0.5)]

REFUSED = {"release_view": "view", "release_function": "table_function", "from_ephemeral": "release_ephemeral"}


@pytest.fixture(scope="module")
def dbt_run(tmp_path_factory) -> SimpleNamespace:
    """``dbt seed`` and ``dbt run`` of the example project plus EXTRA_MODELS, in a copy."""
    if not EXAMPLE.is_dir():
        pytest.skip("examples/dbt is not next to the tests folder")
    dbt = _dbt_executable()
    project = tmp_path_factory.mktemp("dbt") / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("target", "logs", "*.duckdb*", ".user.yml"))
    for name, (materialized, sql) in EXTRA_MODELS.items():
        (project / "models" / f"{name}.sql").write_text(f"{{{{ config(materialized='{materialized}') }}}}\n{sql}\n")
    (project / "models" / "sources.yml").write_text(SOURCES)
    env = dict(os.environ, DBT_SEND_ANONYMOUS_USAGE_STATS="false")
    done = {}
    for command in ("seed", "budget", "run"):
        if command == "budget":  # as a user would, between loading the data and running the models
            args = [sys.executable, "-m", "dpsql", "budget", "set", "dpsql_example.duckdb", "--scope", "user_items",
                    "--epsilon", str(SCOPE_EPSILON), "--delta", "1e-4", "--json"]
        else:
            args = [dbt, command, "--profiles-dir", str(project), "--project-dir", str(project)]
        done[command] = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=600)
        assert command == "run" or done[command].returncode == 0, \
            f"{command} failed:\n{done[command].stdout}\n{done[command].stderr}"
    results = json.loads((project / "target" / "run_results.json").read_text())
    status = {r["unique_id"].split(".")[-1]: (r["status"], r["message"] or "") for r in results["results"]}
    return SimpleNamespace(project=project, run=done["run"], budget=done["budget"], status=status)


def test_example_project_seeds_and_runs(dbt_run):
    project = dbt_run.project
    assert dbt_run.status["released_items"][0] == "success", dbt_run.run.stdout
    with (project / "seeds" / "user_items.csv").open(newline="", encoding="utf-8") as f:
        seed_items = {row["item"] for row in csv.DictReader(f)}
    con = duckdb.connect(str(project / "dpsql_example.duckdb"), read_only=True)  # plain DuckDB, no dpsql
    try:
        columns = [row[0] for row in con.execute("DESCRIBE released_items").fetchall()]
        released = [row[0] for row in con.execute("SELECT item FROM released_items").fetchall()]
        via_view = [row[0] for row in con.execute("SELECT item FROM released_view").fetchall()]
    finally:
        con.close()
    assert columns == ["item"]
    assert "common" in released
    assert len(released) == len(set(released))
    assert set(released) <= seed_items
    # a view over the released table is allowed: reading it reads stored rows, no release
    assert dbt_run.status["released_view"][0] == "success"
    assert sorted(via_view) == sorted(released)


def test_view_ephemeral_and_table_function_releases_are_refused(dbt_run):
    assert dbt_run.run.returncode == 1  # the refused models fail the run
    for model, what in REFUSED.items():
        state, message = dbt_run.status[model]
        assert state == "error", (model, state, message)
        assert message.count("dpsql:") == 1 and what in message and "nothing was released or charged" in message
        assert "materialized='table'" in message
    # nothing of the refused models exists in the database
    con = duckdb.connect(str(dbt_run.project / "dpsql_example.duckdb"), read_only=True)
    try:
        names = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name "
                                           "FROM duckdb_views() UNION ALL SELECT function_name FROM "
                                           "duckdb_functions() WHERE NOT internal").fetchall()}
    finally:
        con.close()
    assert names.isdisjoint({"release_view", "release_function", "release_ephemeral", "from_ephemeral"})
    # only the table, incremental and external models were charged, once each, to the sidecar ledger
    from dpsql.core.ledger import Ledger, sidecar_path
    charged = Ledger(sidecar_path(dbt_run.project / "dpsql_example.duckdb")).releases()
    assert sorted((r.mechanism, r.epsilon) for r in charged) == CHARGED


def test_models_charge_the_scope_budget_set_names(dbt_run):
    """ref('user_items') and source('raw', 'user_items') charge the scope that
    `dpsql budget set DB --scope user_items` sets."""
    budget_set = {s["scope"]: s for s in json.loads(dbt_run.budget.stdout)["scopes"]}
    assert budget_set[SCOPE]["epsilon_budget"] == SCOPE_EPSILON  # the name the CLI resolved user_items to
    from dpsql.core.ledger import Ledger, sidecar_path
    database = dbt_run.project / "dpsql_example.duckdb"
    charged = Ledger(sidecar_path(database)).releases()
    assert {r.table for r in charged} == {SCOPE} and len(charged) == len(CHARGED)
    assert dbt_run.status["release_from_source"][0] == "success", dbt_run.status["release_from_source"]
    show = subprocess.run([sys.executable, "-m", "dpsql", "budget", "show", str(database), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert show.returncode == 0, show.stderr
    scopes = {s["scope"]: s for s in json.loads(show.stdout)["scopes"]}
    assert scopes[SCOPE]["epsilon_spent"] == sum(e for _, e in CHARGED) and scopes[SCOPE]["releases"] == len(CHARGED)
    # the same scope refuses the next release however the table is named: 1.875 + 0.1 > 1.9
    import dpsql
    con = dpsql.connect(str(database))
    try:
        for name in ("user_items", '"dpsql_example"."main"."user_items"'):
            with pytest.raises(dpsql.BudgetExceededError, match=f"scope '{SCOPE}' exceeded"):
                dpsql.set_union(con, name, "weighted_gaussian", epsilon=0.1, delta=1e-5)
    finally:
        con.close()
    assert len(Ledger(sidecar_path(database)).releases()) == len(CHARGED)


def test_table_incremental_and_external_materializations_release_once(dbt_run):
    for model in ("released_items", "release_incremental", "release_external"):
        assert dbt_run.status[model][0] == "success", (model, dbt_run.status[model])
    con = duckdb.connect(str(dbt_run.project / "dpsql_example.duckdb"), read_only=True)  # plain DuckDB
    try:
        # external: the rows were written once to a file (dbt's view over it names it relative to the project)
        external = str(dbt_run.project / "release_external.parquet").replace("'", "''")
        for source in ("release_incremental", f"read_parquet('{external}')"):
            rows = con.execute(f"SELECT item FROM {source}").fetchall()
            assert ("common",) in rows and len(rows) == len(set(rows))
    finally:
        con.close()


RELEASES = frozenset({"dp__charge", "dp_set_union", "dp_top_k"})


@pytest.mark.parametrize("sql, refused", [
    ("create view v as (select * from dp_set_union('t'))", "a view"),
    ('/* {"app": "dbt"} */\n  CREATE OR REPLACE TEMPORARY VIEW v AS SELECT * FROM "DP_TOP_K"(\'t\', 3)', "a view"),
    ("create or replace function f() as table (select * from main.dp_set_union('t'))", "function"),
    ("create macro m() as dp__charge('x', 'user', 't', 1, 0, '', '')", "macro"),
    ("create table t2 as (with __dbt__cte__eph as (\nselect * from dp_top_k('t', (1 + 2))\n) "
     "select * from __dbt__cte__eph)", "ephemeral model eph"),
    ("create table t2 as (with __dbt__cte__eph as (select ')' as p, * from t) "
     "select * from dp_top_k('__dbt__cte__eph'))", None),  # a parenthesis in a string does not end the ephemeral model's CTE
    ("create table t2 as (select * from dp_set_union('t'))", None),  # table: stored rows
    ("create view v as (select * from released)  -- dp_set_union( in a comment", None),
    # query('...') runs the SQL in a string, so a release named in a string counts as a call
    ("create view v as (select * from query('select * from dp_set_union(''t'')'))", "a view"),
    ("create view v as (select 'dp_set_union' as s, ')' as p from t)", None),
    ("create view v as (select my_dp_set_union(1) from t)", None),
    ("create table t2 as (with __dbt__cte__eph as (select * from t) select * from dp_set_union('__dbt__cte__eph'))",
     None),  # the release reads an ephemeral model; the model itself releases once, into a table
    ("insert into t2 select * from dp_set_union('t')", None),
    # dbt-duckdb's incremental materialization stages the new rows in a temporary table
    ('create temporary table "t2__dbt_tmp20261124" as (select * from dp_set_union(\'t\'))', None),
])
def test_stored_release_detection(sql, refused):
    dbt_module = pytest.importorskip("dpsql.frontends.dbt", reason="dbt-duckdb is not installed", exc_type=ImportError)
    reason = dbt_module.stored_release(sql, RELEASES)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def test_release_macros_come_from_the_catalog():
    _plugin_base()
    from dpsql.frontends.dbt import release_macros

    import dpsql
    names = release_macros(dpsql.connect())
    assert {"dp__charge", "dp_set_union", "dp_set_union_weighted_gaussian", "dp_top_k",
            "dp_weighted_sample"} <= names
    assert names.isdisjoint({"dp_budget", "dp_releases", "dp_gaussian_sigma", "dp_eval_hits", "dp__constant"})
