"""Release latency on small tables: what a notebook or dbt user waits for each release.

For each table size (Zipfian rows from ``zipf_data.generate``, in memory) the script runs, interleaved
after one unmeasured warm-up each:

* **floor** -- the cost floor of any set union on that table, fetched to Python::

      SELECT item, count(*) FROM (SELECT DISTINCT user_id, item FROM t) GROUP BY item

* **sql** -- Basic (``dp_set_union_weighted_gaussian``; ``--method`` another method's macro) as a SQL
  query fetched to Python, on a connection prepared by ``dpsql.connect()`` (in-memory ledger: one
  charge per run);
* **python** -- the same release through ``dpsql.set_union(con, 't', 'weighted_gaussian', ...)``,
  which also validates against the declaration and checks the columns first;
* **first** (reported separately) -- the first release in a fresh process: UDF registration and the
  uncached calibration included, measured once per size in a child process.

It reports the median and minimum wall time in milliseconds and the 1-minute load average. The
target (issue "Speed"): Basic under 50 ms on tables of up to 100k rows.

    python benchmarks/bench_latency.py --rows 1000 10000 100000 --reps 21
    python benchmarks/bench_latency.py --rows 5000 --method sips_cumulative   # the default method
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FLOOR = "SELECT item, count(*) FROM (SELECT DISTINCT user_id, item FROM t) GROUP BY item"


def _sql(method: str) -> str:
    return f"SELECT item FROM dp_set_union_{method}('t', epsilon := 1.0, delta := 1e-5, max_items := 100)"


SQL = _sql("weighted_gaussian")


def _table(con, rows: int) -> None:
    import zipf_data

    zipf_data.generate(con, "t", rows)


def _first_release(rows: int, sql: str = SQL) -> float:
    """Milliseconds of the first release in a fresh interpreter (registration and calibration cold)."""
    code = (
        "import time, warnings, sys; sys.path.insert(0, %r)\n"
        "import duckdb, zipf_data\n"
        "con = duckdb.connect(); zipf_data.generate(con, 't', %d)\n"
        "t0 = time.perf_counter(); import dpsql; dpsql.register(con)\n"
        "con.execute(%r).fetchall(); print((time.perf_counter() - t0) * 1000)\n"
    ) % (str(HERE), rows, sql)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def measure(rows: int, reps: int, method: str = "weighted_gaussian") -> dict:
    import dpsql

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        con = dpsql.connect()
    _table(con, rows)
    runs: dict[str, list[float]] = {"floor": [], "sql": [], "python": []}
    sides = {
        "floor": lambda: con.execute(FLOOR).fetchall(),
        "sql": lambda: con.execute(_sql(method)).fetchall(),
        "python": lambda: dpsql.set_union(con, "t", method, epsilon=1.0, delta=1e-5, max_items=100),
    }
    for run in sides.values():  # warm-up: plans, caches, the calibration's lru_cache
        run()
    loads = []
    for _ in range(reps):
        loads.append(os.getloadavg()[0])
        for name, run in sides.items():
            t0 = time.perf_counter()
            run()
            runs[name].append((time.perf_counter() - t0) * 1000)
    con.close()
    result = {"rows": rows, "reps": reps, "load": [min(loads), max(loads)],
              "first_ms": _first_release(rows, _sql(method))}
    for name, times in runs.items():
        result[name] = {"median_ms": statistics.median(times), "min_ms": min(times)}
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--method", default="weighted_gaussian",
                    help="the set-union method released (its macro dp_set_union_<method>; default Basic)")
    ap.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    args = ap.parse_args(argv)
    if not args.json:
        print(f"| rows | floor median (min) ms | {args.method} SQL median (min) ms "
              f"| {args.method} dpsql.set_union median (min) ms | first release in a fresh process ms | load |")
        print("|---:|---:|---:|---:|---:|---|")
    for rows in args.rows:
        r = measure(rows, args.reps, args.method)
        if args.json:
            print(json.dumps(r))
            continue
        cells = [f"{r[k]['median_ms']:.1f} ({r[k]['min_ms']:.1f})" for k in ("floor", "sql", "python")]
        print(f"| {rows:,} | {' | '.join(cells)} | {r['first_ms']:.0f} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
