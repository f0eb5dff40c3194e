"""Benchmark: sanitizing N keys end to end with dp_weighted_sample (target >= 5M keys/s at N = 10M).

Input: an aggregated table (key BIGINT, frequency BIGINT) with Zipf-like frequencies, built in DuckDB, once
without constraint (``agg``: the macro re-aggregates it with a GROUP BY) and once declared
``key BIGINT PRIMARY KEY`` and passed by its three-part name (``memory.main.agg_pk``: no re-aggregation).
Runs keys-only and with-frequencies on both inputs interleaved on one private connection and reports keys/s
(input keys per second of wall time, input validation/aggregation included). Run by hand:

    python benchmarks/bench_pws.py [--keys 10000000] [--reps 3] [--tau 0.001]
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import dpsql


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=0.5)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--tau", type=float, default=None)
    args = ap.parse_args()

    con = dpsql.connect()
    # frequency = floor(1/u^(1/1.2)) for a hashed uniform u: heavy-tailed, max ~ keys^(1/1.2)
    con.execute(f"""CREATE TABLE agg AS SELECT i AS key,
                    greatest(1, floor(pow((hash(i) >> 11)::DOUBLE / 9007199254740992.0 + 1e-12, -1 / 1.2)))::BIGINT
                    AS frequency FROM range({args.keys}) r(i)""")
    con.execute("CREATE TABLE agg_pk (key BIGINT PRIMARY KEY, frequency BIGINT)")
    con.execute("INSERT INTO agg_pk SELECT key, frequency FROM agg")
    maxf = con.execute("SELECT max(frequency) FROM agg").fetchall()[0][0]
    tau = "NULL" if args.tau is None else repr(args.tau)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; "
          f"load: {os.getloadavg()}; keys={args.keys:,} max frequency={maxf:,} tau={tau}")
    runs = [(f"{name}, {label}", table, wf) for name, table in (("GROUP BY", "agg"), ("declared", "memory.main.agg_pk"))
            for label, wf in (("keys only", "false"), ("with frequencies", "true"))]
    results: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for rep in range(args.reps):
        for label, table, wf in runs:
            t0 = time.perf_counter()
            n = con.execute(f"SELECT count(*) FROM dp_weighted_sample('{table}', {args.epsilon}, {args.delta}, "
                            f"tau := {tau}, with_frequencies := {wf}, freq_col := 'frequency')").fetchall()[0][0]
            dt = time.perf_counter() - t0
            results[label].append(args.keys / dt)
            print(f"rep {rep} {label:27s} {dt:6.2f} s  {args.keys / dt / 1e6:5.2f} M keys/s  released {n:,}")
    for label, r in results.items():
        print(f"{label:27s} best {max(r) / 1e6:5.2f} M keys/s, median {sorted(r)[len(r) // 2] / 1e6:5.2f}")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
