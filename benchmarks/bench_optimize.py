"""Benchmark: dp_max_coverage with 10^4 sets over 10^6 elements (10^7 membership rows), k = 50.

Run by hand: ``python benchmarks/bench_optimize.py [--rows 10000000] [--reps 3]``. Reports wall time
per query (generation excluded) and the process's peak RSS. Target: <= 30 s per query.
Also times dp_set_cover on the same table (one query).
"""
from __future__ import annotations

import argparse
import os
import resource
import time

import dpsql


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--sets", type=int, default=10_000)
    ap.add_argument("--elements", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--set-cover", action="store_true", help="also time dp_set_cover once")
    args = ap.parse_args()
    con = dpsql.connect()
    t0 = time.perf_counter()
    # Benchmark data only (not noise): skewed set sizes so that greedy has something to find.
    con.execute(f"""CREATE TABLE sets AS
        SELECT (pow(random(), 2) * {args.sets})::BIGINT AS set_id, (random() * {args.elements})::BIGINT AS element
        FROM range({args.rows})""")
    # The candidate sets are public input (a declared table), never read from the private rows.
    con.execute(f"CREATE TABLE cands AS SELECT range AS set_id FROM range({args.sets} + 1)")
    threads = con.sql("SELECT current_setting('threads')").fetchall()[0][0]
    print(f"generated {args.rows:,} rows in {time.perf_counter() - t0:.1f} s; threads={threads}, "
          f"load={os.getloadavg()[0]:.2f}, rss={peak_rss_mb():.0f} MB")
    for rep in range(args.reps):
        t = time.perf_counter()
        out = con.sql(f"FROM dp_max_coverage('sets', 'cands', {args.k}, epsilon := 1.0)").fetchall()
        print(f"dp_max_coverage rep {rep}: {time.perf_counter() - t:.2f} s, {len(out)} sets, "
              f"peak rss {peak_rss_mb():.0f} MB, load {os.getloadavg()[0]:.2f}")
    if args.set_cover:
        t = time.perf_counter()
        out = con.sql("FROM dp_set_cover('sets', 'cands', epsilon := 1.0)").fetchall()
        print(f"dp_set_cover: {time.perf_counter() - t:.2f} s, {len(out)} sets, peak rss {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
