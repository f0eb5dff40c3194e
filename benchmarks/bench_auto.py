"""Benchmark: the time of ``auto`` against the two methods it chooses between, and its choice alone.

``auto`` (dpsql/union/auto.py) plans both candidates' bodies and runs the chosen one on the rest of the
budget, after a statistic of the users' degrees and one draw. On two Zipfian tables per size
(``zipf_data.generate``: the defaults, where most users hold more than 5 items, so ``auto`` runs
``sips_cumulative``; and ``--light`` ``min_degree = 1``, where most hold at most 5, so it runs
``greedy_update``), one connection (``dpsql.connect()``, in-memory ledger), one unmeasured run of each
query, then ``--reps`` rounds running every query once in a rotating order (round r starts at query r):

* ``floor``: ``SELECT item, count(*) FROM (SELECT DISTINCT user_id, item FROM t) GROUP BY item``;
* ``sips_cumulative``, ``greedy_update``, ``auto``: ``SELECT count(*) FROM dp_set_union_<method>('t',
  epsilon := 1.0, delta := 1e-5[, max_items := 100])`` (``greedy_update`` has no cap);
* ``choice``: ``SELECT * FROM dp__auto_choice('t', 1.0, 1e-5, 100, 0.02, 5)``, the statistic and the draw
  alone (not a release: nothing charged).

Reported per query: median and minimum wall time (ms), the ratio of ``auto``'s per-round time to the method
it ran, and, per table, the exact statistic (NOT private: the benchmark's own reading, to say which method
``auto`` ran: P[greedy_update] from the discrete Laplace tail), the 1-minute load average.

    python benchmarks/bench_auto.py --rows 1000 10000 100000 --reps 15
    python benchmarks/bench_auto.py --rows 1000000 --reps 5
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

FLOOR = "SELECT item, count(*) FROM (SELECT DISTINCT user_id, item FROM {t}) GROUP BY item"
SHAPES = {"zipf": {}, "light": {"min_degree": 1.0}}


def queries(table: str) -> dict[str, str]:
    call = "('{t}', epsilon := 1.0, delta := 1e-5{cap})"
    return {
        "floor": FLOOR.format(t=table),
        "sips_cumulative": "SELECT count(*) FROM dp_set_union_sips_cumulative" + call.format(t=table, cap=", max_items := 100"),
        "greedy_update": "SELECT count(*) FROM dp_set_union_greedy_update" + call.format(t=table, cap=""),
        "auto": "SELECT count(*) FROM dp_set_union_auto" + call.format(t=table, cap=", max_items := 100"),
        "choice": f"SELECT * FROM dp__auto_choice('{table}', 1.0, 1e-5, 100, 0.02, 5)",
    }


def p_greedy(f: int, eps0: float) -> float:
    a = math.exp(-eps0)
    return 1 - a ** (f + 1) / (1 + a) if f >= 0 else a ** (-f) / (1 + a)


def bench(con, table: str, reps: int) -> dict:
    sqls = queries(table)
    names = list(sqls)
    for n in names:
        con.execute(sqls[n]).fetchall()  # warm-up: plans, caches, the calibration's lru_cache
    times: dict[str, list[float]] = {n: [] for n in names}
    loads = []
    for r in range(reps):
        loads.append(os.getloadavg()[0])
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            con.execute(sqls[n]).fetchall()
            times[n].append((time.perf_counter() - t0) * 1000)
    [(f, users, pairs)] = con.execute(f"FROM dp__auto_statistic('{table}', 5)").fetchall()
    p = p_greedy(int(f), 0.02)
    ran = "greedy_update" if p > 0.5 else "sips_cumulative"
    out = {n: {"median_ms": statistics.median(t), "min_ms": min(t)} for n, t in times.items()}
    return {"table": table, "users": users, "pairs": pairs, "f": f, "p_greedy": p, "ran": ran, "load": loads,
            "methods": out,
            "auto_over_ran": statistics.median(a / b for a, b in zip(times["auto"], times[ran])),
            "auto_over_sips": statistics.median(a / b for a, b in zip(times["auto"], times["sips_cumulative"])),
            "auto_over_greedy": statistics.median(a / b for a, b in zip(times["auto"], times["greedy_update"]))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, help="DuckDB threads (default: DuckDB's, one per core)")
    ap.add_argument("--json", help="also append the raw results to this JSON-lines file")
    args = ap.parse_args(argv)
    import dpsql
    import zipf_data

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        con = dpsql.connect()
    if args.threads:
        con.execute(f"SET threads = {args.threads}")
    print("| rows | table | users | share d <= 5 | P[greedy] | floor | sips_cumulative | greedy_update | auto | "
          "choice | auto / method it ran | auto / sips_cumulative | auto / greedy_update | load |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for rows in args.rows:
        for shape, kw in SHAPES.items():
            table = f"t_{shape}_{rows}"
            zipf_data.generate(con, table, rows, **kw)
            r = bench(con, table, args.reps)
            cell = {n: f"{m['median_ms']:.1f} ({m['min_ms']:.1f})" for n, m in r["methods"].items()}
            share = (r["f"] + r["users"]) / (2 * r["users"])
            print(f"| {rows:,} | {shape} | {r['users']:,} | {share:.3f} | {r['p_greedy']:.3g} | {cell['floor']} | "
                  f"{cell['sips_cumulative']} | {cell['greedy_update']} | {cell['auto']} | {cell['choice']} | "
                  f"{r['auto_over_ran']:.2f} ({r['ran']}) | {r['auto_over_sips']:.2f} | {r['auto_over_greedy']:.2f} | "
                  f"{min(r['load']):.1f}-{max(r['load']):.1f} |", flush=True)
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(json.dumps({"rows": rows, "shape": shape, **r}) + "\n")
            con.execute(f"DROP TABLE {table}")
    con.close()


if __name__ == "__main__":
    main()
