"""Benchmark: MAD2R on Spark local[N] against MAD2R in DuckDB, on one machine.

Both engines read the same Parquet copy of a synthetic Zipfian table (``zipf_data.py``; by
default ``t10m`` of ``benchmarks/data/zipf.duckdb``, generated when missing) and release with
MAD2R at (1, 1e-5, 100), split [0.1, 0.9] (the defaults):

    DuckDB: SELECT count(*) FROM dp_set_union_mad2r('p', ...)   -- p: a view over read_parquet
    Spark:  dpsql.frontends.spark.set_union(spark.read.parquet(path), 'mad2r', ...).count()

DuckDB uses its default thread count (all cores), Spark ``local[N]`` (``--cores``, default 2)
with ``--partitions`` shuffle partitions. One unmeasured warm-up run of each (JVM and Python
workers started, files cached), then ``--reps`` runs interleaved D S, S D, D S, ... The report
gives the median wall time of each, the ratio of the medians, and the 1-minute load average
before every run (the machine may be shared).

    python benchmarks/bench_spark.py --rows 10000000 --reps 3
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing
sys.path.insert(0, str(HERE))

import dpsql  # noqa: E402
from bench_adaptive import ensure_table  # noqa: E402

EPS, DELTA, MAX_ITEMS = 1.0, 1e-5, 100
DUCK_SQL = ("SELECT count(*) FROM dp_set_union_mad2r('p', epsilon := 1.0, delta := 1e-5, max_items := 100, "
            "split := [0.1, 0.9])")


def export_parquet(db: str, table: str, folder: str) -> str:
    path = os.path.join(folder, f"{table}.parquet")
    con = duckdb.connect(db, read_only=True)
    try:
        con.execute(f"COPY {table} TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 1000000)")
    finally:
        con.close()
    return path


def spark_session(cores: int, partitions: int, memory: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(f"local[{cores}]").appName("dpsql-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", memory)
               .config("spark.sql.shuffle.partitions", str(partitions)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def timed(fn):
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result, load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--db", default=str(HERE / "data" / "zipf.duckdb"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--memory", default="4g", help="Spark driver memory (local mode: the whole JVM)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)

    from dpsql.frontends import spark as dpspark

    table = ensure_table(args.db, args.rows)
    with tempfile.TemporaryDirectory() as folder:
        path = export_parquet(args.db, table, folder)
        con = dpsql.connect()
        con.execute(f"CREATE VIEW p AS SELECT user_id, item FROM read_parquet('{path}')")
        session = spark_session(args.cores, args.partitions, args.memory)
        frame = session.read.parquet(path)
        runs = {
            "duckdb": lambda: con.execute(DUCK_SQL).fetchall()[0][0],
            "spark": lambda: dpspark.set_union(frame, "mad2r", epsilon=EPS, delta=DELTA, max_items=MAX_ITEMS).count(),
        }
        for name, fn in runs.items():  # warm-up
            seconds, released, load = timed(fn)
            print(f"warm-up {name}: {seconds:.1f} s, {released} items, load {load:.2f}", flush=True)
        times = {k: [] for k in runs}
        released = {k: [] for k in runs}
        loads = []
        for i in range(args.reps):
            for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
                seconds, n, load = timed(runs[name])
                times[name].append(seconds)
                released[name].append(n)
                loads.append(load)
                print(f"rep {i} {name}: {seconds:.1f} s, {n} items, load {load:.2f}", flush=True)
        session.stop()
        con.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    report = {"rows": args.rows, "table": table, "cores": args.cores, "partitions": args.partitions,
              "median_seconds": med, "spark_over_duckdb": med["spark"] / med["duckdb"], "times": times,
              "released": released, "load_1min": loads, "nproc": os.cpu_count(),
              "python": platform.python_version(), "duckdb": duckdb.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        import pyspark

        report["pyspark"] = pyspark.__version__
    except ImportError:  # pragma: no cover
        pass
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
