"""Benchmark: dp_top_k and dp_hitting_set (k = 100) against the Basic macro on the same table.

Three queries run on one connection, interleaved (basic, top_k, hitting_set, basic, ...),
after one unmeasured warm-up run of each; each computes its whole result inside
DuckDB and returns one row::

    SELECT count(*) FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := 100)
    SELECT count(*) FROM dp_top_k('t', 100, epsilon := 1.0, delta := 1e-5, max_items := 100)
    SELECT count(*) FROM dp_hitting_set('t', 100, epsilon := 1.0, delta := 1e-5, max_items := 100)

Target: each of the two <= 2x the Basic macro's time. Data: the Zipfian table of
``zipf_data.py`` (default ``benchmarks/data/zipf.duckdb``, table ``t10m``, opened
read-only; generated in memory when the file or table is missing).

    python benchmarks/bench_topk.py [--db benchmarks/data/zipf.duckdb] [--table t10m] [--reps 5]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing

import dpsql  # noqa: E402

QUERIES = {
    "basic": "SELECT count(*) FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := 100)",
    "top_k": "SELECT count(*) FROM dp_top_k('t', 100, epsilon := 1.0, delta := 1e-5, max_items := 100)",
    "hitting_set": "SELECT count(*) FROM dp_hitting_set('t', 100, epsilon := 1.0, delta := 1e-5, max_items := 100)",
}


def load_table(con, db: Path, table: str, rows: int) -> str:
    """A view ``t`` over the benchmark table; returns where it came from."""
    if db.exists():
        con.execute(f"ATTACH '{db}' AS bench (READ_ONLY)")
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'bench'").fetchall()}
        if table in tables:
            con.execute(f"CREATE TEMP VIEW t AS SELECT user_id, item FROM bench.{table}")
            return f"{db.name}:{table}"
    sys.path.insert(0, str(HERE))
    import zipf_data  # the shared generator; only needed when the table is missing

    zipf_data.generate(con, "t_generated", rows)
    con.execute("CREATE TEMP VIEW t AS SELECT user_id, item FROM t_generated")
    return f"generated in memory ({rows:,} rows)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=HERE / "data" / "zipf.duckdb")
    ap.add_argument("--table", default="t10m")
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows to generate if the table is missing")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    con = dpsql.connect()
    source = load_table(con, args.db, args.table, args.rows)
    times: dict[str, list[float]] = {name: [] for name in QUERIES}
    loads = []
    for name, q in QUERIES.items():  # warm-up (buffer pool, plan caches)
        con.execute(q).fetchall()
    for _ in range(args.reps):
        loads.append(os.getloadavg()[0])
        for name, q in QUERIES.items():
            t0 = time.perf_counter()
            con.execute(q).fetchall()
            times[name].append(time.perf_counter() - t0)
    con.close()

    med = {n: statistics.median(v) for n, v in times.items()}
    pair = {n: statistics.median(t / b for t, b in zip(times[n], times["basic"])) for n in ("top_k", "hitting_set")}
    doc = {"date": datetime.datetime.now().isoformat(timespec="minutes"), "machine": platform.platform(),
           "cpus": os.cpu_count(), "source": source, "reps": args.reps, "load_1min": loads,
           "median_s": med, "min_s": {n: min(v) for n, v in times.items()},
           "ratio_of_medians": {n: med[n] / med["basic"] for n in ("top_k", "hitting_set")},
           "median_pair_ratio": pair}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{doc['date']}  {doc['machine']}  cpus={doc['cpus']}  data={source}  reps={args.reps}")
        print(f"1-min load before each round: {', '.join(f'{x:.1f}' for x in loads)}")
        for n in QUERIES:
            extra = "" if n == "basic" else (f"  ratio {doc['ratio_of_medians'][n]:.2f}x"
                                             f" (median per-round ratio {pair[n]:.2f}x)")
            print(f"{n:<12} median {med[n]:6.2f} s  min {doc['min_s'][n]:6.2f} s{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
