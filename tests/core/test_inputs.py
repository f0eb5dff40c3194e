"""The data itself as a table: DataFrames, Arrow tables and relations in the Python release functions
(dpsql.core.inputs), the scope each is charged to, and what is left on the connection after a release."""
from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.core.errors import DPParameterError
from dpsql.core.inputs import scope_name

ROWS = [(u, f"w{u % 7}") for u in range(400)] + [(u, "common") for u in range(400)] + [(1, "secret-item-xyz")]


def _arrow() -> pa.Table:
    return pa.table({"user_id": [r[0] for r in ROWS], "item": [r[1] for r in ROWS]})


def _con(seed=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a seeded connection warns that it is not private
        con = dpsql.connect(seed=seed)
    con.register("src", _arrow())
    con.execute("CREATE TABLE t AS FROM src")
    con.unregister("src")
    return con


def _objects(con):
    """Every in-memory form of the table t holds (a DataFrame only where pandas is installed)."""
    forms = {"arrow": _arrow(), "batches": _arrow().to_reader(), "relation": con.sql("FROM t WHERE true")}
    try:
        import pandas  # noqa: F401  (not a core dependency)
        forms["pandas"] = _arrow().to_pandas()
    except ImportError:
        pass
    return forms


def _user_views(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]


@pytest.mark.parametrize("form", ["arrow", "batches", "relation", "pandas"])
def test_the_data_itself_releases_what_its_table_releases(form):
    """On two connections with one seed, a release of the object equals the release of the table it holds."""
    if form == "pandas":
        pytest.importorskip("pandas")
    by_name, by_object = _con(seed=11), _con(seed=11)
    try:
        expected = dpsql.set_union(by_name, "t", epsilon=1.0, delta=1e-5)
        got = dpsql.set_union(by_object, _objects(by_object)[form], epsilon=1.0, delta=1e-5)
        assert got.equals(expected)
        assert "common" in got.column("item").to_pylist()
    finally:
        by_name.close()
        by_object.close()


def test_scopes_an_object_is_its_one_name_a_relation_the_tables_it_reads():
    con = _con()
    try:
        dpsql.set_union(con, "t", "weighted_gaussian", epsilon=1.0, delta=1e-5)
        table_scope = dpsql.releases(con)[-1].table
        for name, obj in _objects(con).items():
            dpsql.set_union(con, obj, "weighted_gaussian", epsilon=1.0, delta=1e-5)
            charged = dpsql.releases(con)[-1].table
            if name == "relation":
                assert charged == table_scope  # traced through the view to the base table
            else:
                assert charged == f"temp.main.{scope_name('table')}"
            assert _user_views(con) == []  # the name exists only while the release runs
        assert len(dpsql.releases(con)) == 1 + len(_objects(con))
    finally:
        con.close()


def test_every_release_function_takes_objects_and_a_public_table_gets_its_own_name():
    con = _con()
    try:
        data = _arrow()
        assert dpsql.top_k(con, data, 1, epsilon=2.0, delta=1e-5).column("item").to_pylist() == ["common"]
        assert dpsql.hitting_set(con, data, 1, epsilon=2.0, delta=1e-5).num_rows == 1
        assert dpsql.top_k_limited_domain(con, data, 1, 2, epsilon=2.0, delta=1e-5).column("item").to_pylist() \
            == ["common"]
        items = pa.table({"item": ["common", "w1", "absent"]})
        out = dpsql.group_by(con, con.sql("FROM t"), epsilon=1.0, items_tbl=items)
        assert out.column("item").to_pylist() == ["absent", "common", "w1"]
        assert scope_name("items_tbl") != scope_name("table")
        assert _user_views(con) == []
    finally:
        con.close()


def test_failed_release_leaves_nothing_registered_and_charges_nothing():
    con = _con()
    try:
        with pytest.raises(DPParameterError, match="user_col := 'uid' is not a column"):
            dpsql.set_union(con, _arrow(), epsilon=1.0, delta=1e-5, user_col="uid")
        assert _user_views(con) == [] and dpsql.releases(con) == []
        dpsql.set_union(con, _arrow(), epsilon=1.0, delta=1e-5)  # the name is free again
        assert len(dpsql.releases(con)) == 1
    finally:
        con.close()


def test_a_taken_name_is_refused_not_replaced():
    con = _con()
    try:
        con.execute(f"CREATE TABLE {scope_name('table')} AS SELECT 1 AS keep")
        with pytest.raises(DPParameterError, match=r"a table or view named dpsql_input exists.*con.register"):
            dpsql.set_union(con, _arrow(), epsilon=1.0, delta=1e-5)
        assert con.execute(f"FROM {scope_name('table')}").fetchall() == [(1,)]
        assert dpsql.releases(con) == []
    finally:
        con.close()


def test_a_relation_of_another_connection_is_refused():
    con, other = _con(), _con()
    try:
        with pytest.raises(DPParameterError, match="relation of another connection"):
            dpsql.set_union(con, other.sql("FROM t"), epsilon=1.0, delta=1e-5)
        assert dpsql.releases(con) == [] and dpsql.releases(other) == []
    finally:
        con.close()
        other.close()


def test_a_relation_reading_a_python_object_by_name_is_refused_by_the_ledger_rule():
    con = _con()
    try:
        with pytest.raises(DPParameterError, match="Python object"):
            dpsql.set_union(con, con.from_arrow(_arrow()), epsilon=1.0, delta=1e-5)
        assert dpsql.releases(con) == [] and _user_views(con) == []
    finally:
        con.close()


@pytest.mark.parametrize("obj", [ROWS, {"user_id": [1], "item": ["secret-item-xyz"]},
                                 np.array(["secret-item-xyz"]), 3.5])
def test_anything_else_is_refused_by_its_type_without_its_contents(obj):
    con = _con()
    try:
        with pytest.raises(DPParameterError) as e:
            dpsql.set_union(con, obj, epsilon=1.0, delta=1e-5)
        assert "secret-item-xyz" not in str(e.value) and "table" in str(e.value)
        assert dpsql.releases(con) == []
    finally:
        con.close()


def test_weighted_sample_takes_an_arrow_table():
    con = _con()
    try:
        keys = pa.table({"key": [f"k{i % 5}" for i in range(5000)]})
        out = dpsql.weighted_sample(con, keys, epsilon=1.0, delta=1e-5)
        assert set(out.column("key").to_pylist()) <= {f"k{i}" for i in range(5)}
        assert dpsql.releases(con)[-1].table == f"temp.main.{scope_name('tbl')}"
    finally:
        con.close()


def test_a_closed_connection_is_not_a_connection():
    """A call without a connection keeps Python's own error (no registration is attempted)."""
    with pytest.raises(TypeError):
        dpsql.set_union(_arrow(), epsilon=1.0, delta=1e-5)  # type: ignore[call-arg]


def test_names_and_paths_pass_as_they_are(tmp_path):
    con = _con()
    try:
        path = tmp_path / "events.parquet"
        con.execute(f"COPY t TO '{path}' (FORMAT parquet)")
        dpsql.set_union(con, path, "weighted_gaussian", epsilon=1.0, delta=1e-5)  # an os.PathLike
        assert str(path) in dpsql.releases(con)[-1].table
    finally:
        con.close()
