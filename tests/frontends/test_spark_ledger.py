"""The Spark backend's ledger (dpsql.frontends.spark_ledger): the same call releases, charges and refuses
the same way on DuckDB and on Spark -- one ledger file, one scope per file read, budgets refused before
any Spark job runs, one charge per release (a multi-step release included), nothing charged on failure."""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.core import ledger as L
from dpsql.core.errors import BudgetExceededError, DPParameterError

from spark_testing import local_session, quiet_spark_warnings  # noqa: F401 (autouse)

pytestmark = pytest.mark.xdist_group("spark")  # one JVM at a time beside the other Spark tests


@pytest.fixture(scope="module")
def spark():
    with local_session("dpsql-ledger-tests") as session:
        yield session


def _rows(n_users=300, seed=5):
    rng = random.Random(seed)
    users, items = [], []
    for u in range(n_users):
        for j in rng.sample(range(12), rng.randint(1, 5)):
            users.append(u)
            items.append(f"w{j}")
        users.append(u)
        items.append("common")
    return pa.table({"user_id": pa.array(users, pa.int64()), "item": pa.array(items, pa.string())})


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "events.parquet"
    pq.write_table(_rows(), path)
    return path


def _jobs(spark) -> set:
    return set(spark.sparkContext.statusTracker().getJobIdsForGroup())


def test_a_file_release_charges_the_file_duckdb_charges_in_the_shared_ledger(spark, data, tmp_path):
    from dpsql.frontends import spark as dspark

    ledger_file = tmp_path / "events.parquet.dpsql-ledger"
    L.Ledger(str(ledger_file)).set_budget(1.0, 1e-5, L.file_scope(data))
    df = spark.read.parquet(str(data))
    out = dspark.set_union(df, "weighted_gaussian", epsilon=0.6, delta=5e-6, ledger=ledger_file)
    assert "common" in [r.item for r in out.collect()]
    (release,) = L.Ledger(str(ledger_file)).releases()
    assert release.table == L.file_scope(data) and release.epsilon == 0.6 and release.delta == 5e-6
    assert release.mechanism == "dp_set_union_weighted_gaussian"
    # DuckDB charges the same file to the same scope in the same ledger: 0.6 + 0.6 > 1.0
    con = dpsql.connect(ledger=str(ledger_file))
    with pytest.raises(Exception, match=r"privacy budget of scope '.*events.parquet' exceeded"):
        con.sql(f"FROM dp_set_union('{data}', epsilon := 0.6, delta := 1e-6)").fetchall()
    con.close()
    assert len(L.Ledger(str(ledger_file)).releases()) == 1


def test_an_exceeded_budget_is_refused_before_any_spark_job(spark, data, tmp_path):
    from dpsql.frontends import spark as dspark

    ledger = L.Ledger(str(tmp_path / "l.dpsql-ledger"))
    ledger.set_budget(0.5, 1e-5, "database")
    df = spark.read.parquet(str(data))
    before = _jobs(spark)
    with pytest.raises(BudgetExceededError, match="scope 'database' exceeded"):
        dspark.set_union(df, "weighted_gaussian", epsilon=0.6, delta=1e-6, ledger=ledger)
    assert _jobs(spark) == before and ledger.releases() == []
    with pytest.raises(BudgetExceededError):
        dspark.group_by(df, epsilon=0.6, delta=1e-6, ledger=ledger)
    assert _jobs(spark) == before and ledger.releases() == []


def test_group_by_is_one_charge_of_its_total(spark, data):
    """The selection and the aggregates are one release: one charge of (epsilon, delta), not one per step."""
    from dpsql.frontends import spark as dspark

    df = spark.read.parquet(str(data))
    before = len(dspark.session_ledger(spark).releases())
    dspark.group_by(df, epsilon=0.8, delta=1e-6, selection="weighted_gaussian", seed=3)
    new = dspark.session_ledger(spark).releases()[before:]
    assert [(r.epsilon, r.delta, r.table) for r in new] == [(0.8, 1e-6, L.file_scope(data))]
    assert new[0].mechanism == "dp_group_by"


def test_an_in_memory_frame_needs_a_named_scope(spark):
    from dpsql.frontends import spark as dspark

    df = spark.createDataFrame(_rows().to_pandas())
    ledger = L.Ledger(None)
    with pytest.raises(DPParameterError, match=r"reads no file.*scope="):
        dspark.set_union(df, "weighted_gaussian", epsilon=0.5, delta=1e-6, ledger=ledger)
    assert ledger.releases() == []
    dspark.set_union(df, "weighted_gaussian", epsilon=0.5, delta=1e-6, ledger=ledger, scope="events")
    assert ledger.releases()[-1].table == "memory.main.events"


def test_a_failure_on_the_data_charges_nothing(spark, tmp_path):
    from dpsql.frontends import spark as dspark

    path = tmp_path / "nulls.parquet"
    rows = _rows()
    pq.write_table(pa.table({"user_id": pa.array(rows.column("user_id").to_pylist()[:-1] + [None], pa.int64()),
                             "item": rows.column("item")}), path)
    ledger = L.Ledger(None)
    with pytest.raises(Exception, match="dpsql: column user_id"):
        dspark.set_union(spark.read.parquet(str(path)), "weighted_gaussian", epsilon=0.5, delta=1e-6, ledger=ledger)
    assert ledger.releases() == []
