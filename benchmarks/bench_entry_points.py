"""Latency of the public entry points next to the macro each one runs (section "Entry points" of README.md).

On one in-memory Zipfian table (``zipf_data.generate``, default 5,000 rows) and one connection prepared by
``dpsql.connect()`` (in-memory ledger), the script runs every case once unmeasured, then ``--reps`` rounds of
one run of each case, the order rotated every round (A/B interleaved in one process). A case is a release
fetched to Python:

* the set-union macros ``dp_set_union_weighted_gaussian`` (Basic) and ``dp_set_union_sips_cumulative`` (the
  default method), and the entry points that run them: ``dp_set_union(method := ...)``, ``dp_set_union(...)``
  and ``dpsql.set_union``;
* ``dp_top_k`` (its domain step is Basic) and ``dpsql.top_k``;
* ``dp_group_by`` (its selection is the default method) and ``dpsql.group_by``;
* the floor: ``SELECT item, count(*) FROM (SELECT DISTINCT user_id, item FROM t) GROUP BY item``.

It prints, per case, the median and minimum wall time and the median CPU time of the process (every DuckDB
thread included: less sensitive to other processes than wall time) in milliseconds, and the ratio of the
medians to the macro the entry point runs; then the 1-minute load average seen during the rounds.

    python benchmarks/bench_entry_points.py --rows 5000 --reps 15
    python benchmarks/bench_entry_points.py --only sips_cumulative "default method"   # the default method's cases

The script uses only public functions, so the same file measures an older checkout of dpsql (put that
checkout first on PYTHONPATH) for before/after comparisons.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

EPS = "epsilon := 1.0, delta := 1e-5"

# name -> (what it runs, the macro it is compared with)
SQL_CASES = {
    "floor": ("SELECT item, count(*) FROM (SELECT DISTINCT user_id, item FROM t) GROUP BY item", None),
    "dp_set_union_weighted_gaussian": (f"SELECT item FROM dp_set_union_weighted_gaussian('t', {EPS})", None),
    "dp_set_union(method := 'weighted_gaussian')": (
        f"SELECT item FROM dp_set_union('t', {EPS}, method := 'weighted_gaussian')", "dp_set_union_weighted_gaussian"),
    "dp_set_union_sips_cumulative": (f"SELECT item FROM dp_set_union_sips_cumulative('t', {EPS})", None),
    "dp_set_union (default method)": (f"SELECT item FROM dp_set_union('t', {EPS})", "dp_set_union_sips_cumulative"),
    "dp_top_k (k = 10)": (f"SELECT rank, item FROM dp_top_k('t', 10, {EPS})", "dp_set_union_weighted_gaussian"),
    "dp_group_by (count)": (f"SELECT * FROM dp_group_by('t', {EPS})", "dp_set_union_sips_cumulative"),
}
PY_CASES = {
    "dpsql.set_union(method='weighted_gaussian')": "dp_set_union_weighted_gaussian",
    "dpsql.set_union (default method)": "dp_set_union_sips_cumulative",
    "dpsql.top_k (k = 10)": "dp_top_k (k = 10)",
    "dpsql.group_by (count)": "dp_group_by (count)",
}


def cases(con) -> dict[str, Callable[[], object]]:
    import dpsql
    from dpsql import groupby, topk

    run: dict[str, Callable[[], object]] = {name: (lambda q=q: con.execute(q).fetchall())
                                             for name, (q, _) in SQL_CASES.items()}
    run["dpsql.set_union(method='weighted_gaussian')"] = lambda: dpsql.set_union(
        con, "t", "weighted_gaussian", epsilon=1.0, delta=1e-5)
    run["dpsql.set_union (default method)"] = lambda: dpsql.set_union(con, "t", epsilon=1.0, delta=1e-5)
    run["dpsql.top_k (k = 10)"] = lambda: topk.top_k(con, "t", 10, epsilon=1.0, delta=1e-5)
    run["dpsql.group_by (count)"] = lambda: groupby.group_by(con, "t", epsilon=1.0, delta=1e-5)
    return run


def selected(only: list[str] | None) -> list[str]:
    """The cases whose name contains one of ``only`` (all if None), with the macros they are compared with."""
    names = list(SQL_CASES) + list(PY_CASES)
    if not only:
        return names
    base = {**{n: b for n, (_, b) in SQL_CASES.items()}, **PY_CASES}
    keep = {n for n in names if any(o in n for o in only)}
    while True:  # a ratio needs its reference case, and the reference's own reference
        more = {b for n in keep if (b := base.get(n)) is not None} - keep
        if not more:
            break
        keep |= more
    return [n for n in names if n in keep]


def measure(rows: int, reps: int, only: list[str] | None = None) -> dict:
    import dpsql
    import zipf_data

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        con = dpsql.connect()
    zipf_data.generate(con, "t", rows)
    con.execute("SELECT 1").fetchall()  # finish the generator's result
    run = cases(con)
    names = selected(only)
    for name in names:  # warm-up: plans, caches, the calibrations' lru_caches
        run[name]()
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    loads = []
    for r in range(reps):
        loads.append(os.getloadavg()[0])
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0, c0 = time.perf_counter(), time.process_time()
            run[name]()
            wall[name].append((time.perf_counter() - t0) * 1000)
            cpu[name].append((time.process_time() - c0) * 1000)
    con.close()
    out = {"rows": rows, "reps": reps, "load": [min(loads), max(loads)], "cases": {}}
    base = {**{n: b for n, (_, b) in SQL_CASES.items()}, **PY_CASES}
    for name in names:
        med = statistics.median(wall[name])
        ref = base.get(name)
        out["cases"][name] = {"median_ms": med, "min_ms": min(wall[name]), "cpu_ms": statistics.median(cpu[name]),
                              "of": ref, "ratio": med / statistics.median(wall[ref]) if ref else None}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="only the cases whose name contains one of these (and the macros they are compared with)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    r = measure(args.rows, args.reps, args.only)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{args.rows:,} rows, {args.reps} rounds, load {r['load'][0]:.1f}-{r['load'][1]:.1f}")
    print("| case | median (min) ms | CPU ms | ratio to |")
    print("|---|---:|---:|---|")
    for name, c in r["cases"].items():
        ratio = f"{c['ratio']:.2f}x `{c['of']}`" if c["of"] else ""
        print(f"| `{name}` | {c['median_ms']:.1f} ({c['min_ms']:.1f}) | {c['cpu_ms']:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
