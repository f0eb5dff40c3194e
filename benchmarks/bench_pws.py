"""Benchmark: sanitizing N keys end to end with dp_weighted_sample (target >= 5M keys/s at N = 10M).

Input: an aggregated table (key BIGINT, frequency BIGINT) with Zipf-like frequencies, built in DuckDB, once
without constraint (``agg``: the macro re-aggregates it with a GROUP BY) and once declared
``key BIGINT PRIMARY KEY`` and passed by its three-part name (``memory.main.agg_pk``: no re-aggregation).
Runs keys-only and with-frequencies on both inputs, for each sanitizer kernel asked for (``auto`` = numba when
installed; ``numpy``), interleaved on one private connection, and reports keys/s (input keys per second of wall
time, input validation/aggregation included) with the median and best of the repeats. ``--parts`` also times
the aggregation alone and a no-op Arrow UDF over the same rows (the floors of the two paths). Run by hand:

    python benchmarks/bench_pws.py [--keys 10000000] [--reps 5] [--tau 0.001] [--kernels auto,numpy] [--parts]
                                   [--threads 1] [--perfect-ht 24] [--fetch]
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time

import duckdb
import duckdb.func
import pyarrow as pa

import dpsql
from dpsql import pws


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=0.5)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--tau", type=float, default=None)
    ap.add_argument("--kernels", default="auto", help="comma-separated sanitizer kernels: auto, numba, numpy")
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: DuckDB's choice)")
    ap.add_argument("--parts", action="store_true", help="also time the GROUP BY alone and a no-op UDF")
    ap.add_argument("--fetch", action="store_true",
                    help="fetch the released rows as Arrow (includes the release's ORDER BY key) instead of count(*)")
    ap.add_argument("--perfect-ht", type=int, default=None,
                    help="SET perfect_ht_threshold (bits): integer keys of smaller range get a perfect-hash GROUP BY")
    args = ap.parse_args()

    con = dpsql.connect()
    if args.threads:
        con.execute(f"SET threads = {args.threads}")
    if args.perfect_ht:
        con.execute(f"SET perfect_ht_threshold = {args.perfect_ht}")
    # frequency = floor(1/u^(1/1.2)) for a hashed uniform u: heavy-tailed, max ~ keys^(1/1.2)
    con.execute(f"""CREATE TABLE agg AS SELECT i AS key,
                    greatest(1, floor(pow((hash(i) >> 11)::DOUBLE / 9007199254740992.0 + 1e-12, -1 / 1.2)))::BIGINT
                    AS frequency FROM range({args.keys}) r(i)""")
    con.execute("CREATE TABLE agg_pk (key BIGINT PRIMARY KEY, frequency BIGINT)")
    con.execute("INSERT INTO agg_pk SELECT key, frequency FROM agg")
    maxf = con.execute("SELECT max(frequency) FROM agg").fetchall()[0][0]
    threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
    tau = "NULL" if args.tau is None else repr(args.tau)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, DuckDB {duckdb.__version__}, {threads} threads, "
          f"numba: {pws.numba_available()}; load: {os.getloadavg()}; keys={args.keys:,} max frequency={maxf:,} "
          f"tau={tau} epsilon={args.epsilon} delta={args.delta}")
    runs: list[tuple[str, str, str]] = []  # (label, kernel, SQL)
    for kernel in args.kernels.split(","):
        for name, table in (("GROUP BY", "agg"), ("declared", "memory.main.agg_pk")):
            for label, wf in (("keys only", "false"), ("with frequencies", "true")):
                # count(*) lets the optimizer drop the release's ORDER BY key; --fetch keeps it (sorted rows)
                runs.append((f"{kernel:5s} {name:8s} {label}", kernel,
                             f"SELECT {'*' if args.fetch else 'count(*)'} FROM dp_weighted_sample('{table}', "
                             f"{args.epsilon}, {args.delta}, tau := {tau}, with_frequencies := {wf}, "
                             f"freq_col := 'frequency')"))
    if args.parts:
        con.create_function("bench_noop", lambda a, b: pa.array(a.to_numpy(zero_copy_only=False) * 0),
                            ["BIGINT", "BIGINT"], "BIGINT", type=duckdb.func.ARROW, side_effects=True)
        # the sums are consumed: under count(*) the optimizer drops the unused aggregate
        runs += [("part: GROUP BY of dp__pws_frequencies", "auto",
                  "SELECT sum(frequency) FROM dp__pws_frequencies('agg', freq_col := 'frequency')"),
                 ("part: plain GROUP BY key, sum", "auto",
                  "SELECT sum(s) FROM (SELECT key, sum(frequency) AS s FROM agg GROUP BY key)"),
                 ("part: no-op UDF (BIGINT, BIGINT)", "auto",
                  "SELECT count(*) FROM (SELECT bench_noop(frequency, 1) AS t FROM agg) WHERE t = 0")]
    # warm-up: compile the numba kernels (or load them from numba's cache) outside the timed runs
    con.execute("CREATE TABLE warm AS SELECT * FROM agg ORDER BY frequency DESC LIMIT 10000")
    for kernel in args.kernels.split(","):
        pws.sanitizer.SANITIZER_KERNEL = kernel
        for wf in ("false", "true"):
            con.execute(f"SELECT count(*) FROM dp_weighted_sample('warm', {args.epsilon}, {args.delta}, tau := {tau}, "
                        f"with_frequencies := {wf}, freq_col := 'frequency')").fetchall()
    results: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for rep in range(args.reps):
        for label, kernel, sql in runs:
            pws.sanitizer.SANITIZER_KERNEL = kernel
            t0 = time.perf_counter()
            n = con.execute(sql).to_arrow_table().num_rows if sql.startswith("SELECT *") \
                else con.execute(sql).fetchall()[0][0]
            dt = time.perf_counter() - t0
            results[label].append(args.keys / dt)
            print(f"rep {rep} {label:40s} {dt:6.2f} s  {args.keys / dt / 1e6:5.2f} M keys/s  result {n:,}")
    pws.sanitizer.SANITIZER_KERNEL = "auto"
    for label, r in results.items():
        print(f"{label:40s} median {statistics.median(r) / 1e6:5.2f}, best {max(r) / 1e6:5.2f} M keys/s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"load after: {os.getloadavg()}; peak RSS {rss:.2f} GB")


if __name__ == "__main__":
    main()
