"""Progress and failures of the Spark backend's releases (dpsql.frontends.spark_progress), as DuckDB's:
``progress=`` gets a rising percentage ending at 100 (the convention of ``dpsql.set_union``), and a
failure on an executor is dpsql's InputError, quoting no value of the data, with nothing charged."""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsql.core import ledger as L
from dpsql.core.errors import DPParameterError, InputError

from spark_testing import local_session, quiet_spark_warnings  # noqa: F401 (autouse)

pytestmark = pytest.mark.xdist_group("spark")  # one JVM at a time beside the other Spark tests
SECRET = "SECRET_VALUE_7431"  # a value of the data no message may quote


@pytest.fixture(scope="module")
def spark():
    # the failing tasks' logs would quote the data
    with local_session("dpsql-progress-tests", log_level="OFF") as session:
        yield session


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = random.Random(7)
    users, items = [], []
    for u in range(300):
        for j in rng.sample(range(12), rng.randint(1, 5)):
            users.append(u)
            items.append(f"w{j}")
    path = tmp_path_factory.mktemp("progress") / "events.parquet"
    pq.write_table(pa.table({"user_id": pa.array(users, pa.int64()), "item": pa.array(items, pa.string())}), path)
    return path


def test_progress_rises_to_100_and_the_callers_job_group_is_kept(spark, data):
    from dpsql.frontends import spark as dspark

    sc = spark.sparkContext
    df = spark.read.parquet(str(data))
    sc.setJobGroup("callers-group", "the caller's own jobs")
    seen: list[float] = []
    try:
        dspark.set_union(df, "sips_cumulative", epsilon=1.0, delta=1e-5, seed=3, split=[0.5, 0.5],
                         ledger=L.Ledger(None), progress=seen.append)
        # the release's jobs ran in a group of their own; the caller's group is back afterwards
        assert sc.statusTracker().getJobIdsForGroup("callers-group") == []
        assert sc.getLocalProperty("spark.jobGroup.id") == "callers-group"
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert seen[-1] == 100.0 and all(0 <= a < b <= 100 for a, b in zip(seen, seen[1:])), seen
    assert any(0 < v < 100 for v in seen), seen  # the release's jobs moved it before the end
    with pytest.raises(DPParameterError, match="progress must be a function"):
        dspark.group_by(spark.read.parquet(str(data)), epsilon=1.0, delta=1e-5, progress=5)


def test_a_failure_on_an_executor_is_a_dpsql_error_and_charges_nothing(spark):
    from pyspark.sql import functions as F

    from dpsql.frontends import spark as dspark

    frame = spark.createDataFrame([(u, "7" if u % 50 else SECRET) for u in range(200)], ["user_id", "item"])
    failing = {
        # a cast of a value that does not fit (ANSI mode): the task fails, Spark's message quotes the value
        "cast": frame.select("user_id", F.col("item").cast("int").alias("item")),
        # a Python UDF of the DataFrame raising inside a worker
        "udf": frame.select("user_id", F.udf(lambda v: int(v) if v != SECRET else 1 // 0, "int")("item").alias("item")),
    }
    ledger = L.Ledger(None)
    for name, df in failing.items():
        seen: list[float] = []
        with pytest.raises(InputError) as info:  # with and without a progress callback
            dspark.set_union(df, "weighted_gaussian", epsilon=1.0, delta=1e-5, ledger=ledger, scope="events",
                             progress=seen.append if name == "udf" else None)
        message = str(info.value)
        assert message.startswith("dpsql: Spark failed while computing the release ("), (name, message)
        assert "nothing was released or charged" in message
        assert SECRET not in message and info.value.__cause__ is None and info.value.__suppress_context__, name
        assert 100.0 not in seen, (name, seen)
    assert ledger.releases() == []


# A fresh Spark driver at Spark's default log level (WARN): its logs go to this process's stderr, which
# the test reads. Two releases fail on a value of the data, then the caller's own action on the same
# DataFrame (collect) fails too: its logs (Spark's and PySpark's) must quote the value, so the levels were restored.
_LOGS_SCRIPT = r"""
import sys, time
from pyspark.sql import SparkSession, functions as F
from dpsql.core import ledger as L
from dpsql.core.errors import InputError
from dpsql.frontends import spark as dspark

SECRET = sys.argv[1]
spark = (SparkSession.builder.master("local[1]").appName("dpsql-log-tests").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.sql.ansi.enabled", "true").getOrCreate())
frame = spark.createDataFrame([(u, "7" if u % 50 else SECRET) for u in range(200)], ["user_id", "item"])
failing = [frame.select("user_id", F.col("item").cast("int").alias("item")),
           frame.select("user_id", F.udf(lambda v: int(v) if v != SECRET else 1 // 0, "int")("item").alias("item"))]
for i, df in enumerate(failing):
    try:
        dspark.set_union(df, "weighted_gaussian", epsilon=1.0, delta=1e-5, ledger=L.Ledger(None), scope="events",
                         progress=(lambda p: None) if i else None)
    except InputError:
        print("refused", flush=True)
time.sleep(1)
sys.stderr.write("\n--- the caller's own action ---\n")
sys.stderr.flush()
try:
    failing[0].collect()
except Exception as exc:
    print("own action failed:", type(exc).__name__, flush=True)
time.sleep(1)
spark.stop()
"""


def test_a_failed_release_writes_no_value_to_the_logs_and_the_log_levels_are_restored(tmp_path):
    import os
    import subprocess
    import sys

    from spark_testing import java_or_skip, need

    need("pyspark")
    java_or_skip()
    script = tmp_path / "logs.py"
    script.write_text(_LOGS_SCRIPT)
    env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    done = subprocess.run([sys.executable, str(script), SECRET], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert done.stdout.split("\n")[:3] == ["refused", "refused", "own action failed: NumberFormatException"], (done.stdout, done.stderr)
    during, marker, after = done.stderr.partition("--- the caller's own action ---")
    assert marker, done.stderr
    assert SECRET not in during, during
    # the logs were quiet during the releases only: Spark's and PySpark's loggers report the caller's failure
    assert "Lost task" in after and '"logger": "DataFrameQueryContextLogger"' in after and SECRET in after, after
