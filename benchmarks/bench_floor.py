"""Benchmark: every set-union method against the cost floor of any set union, time and memory.

The floor is what any user-level set union has to do at least (``bench_set_union.py`` explains
why it returns ``count(*), sum(n)``)::

    SELECT count(*), sum(n) FROM (SELECT item, count(*) AS n
                                  FROM (SELECT DISTINCT user_id, item FROM t) GROUP BY item)

and each method runs as ``SELECT count(*) FROM dp_set_union_<method>('t', epsilon := 1.0,
delta := 1e-5, max_items := 100)`` (defaults otherwise; ``greedy_update`` has no cap).

**Time.** One connection, the table of ``benchmarks/data/zipf.duckdb`` opened read-only; one
unmeasured run of each query, then ``--reps`` rounds that run every query once in a rotating
order (round r starts at query r), so no query always follows the same one. Reported per query:
median and minimum wall time, the ratio of medians to the floor, the median of the per-round
ratios to the floor and to Basic (``weighted_gaussian``), the 1-minute load average and the share
of the cores other processes kept busy (from ``/proc/stat``, as in ``bench_set_union.py``).

**Before/after** (``--before-sql FILE``). A second connection runs FILE after registering (for
example an earlier version of a macro file: ``git show REV:sql/00_core/20_contribution_bounding.sql``),
and every method runs on both connections in the same rounds (``<method>@before``), so the
change is measured under the same load as the code it replaces.

**Memory** (``--memory``). Each query once in a fresh child process (import, register, one
warm-up-free run); its peak resident set size (``ru_maxrss`` of the child) and its time. The
children run one after another, so their peaks do not overlap.

    python benchmarks/bench_floor.py --rows 10000000 50000000 --reps 5
    python benchmarks/bench_floor.py --rows 10000000 --item-type VARCHAR --memory
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing
sys.path.insert(0, str(HERE))

import dpsql  # noqa: E402
from dpsql.core import sqltext  # noqa: E402
from bench_set_union import FLOOR, _pct, ensure_table, machine_info, run_once  # noqa: E402

METHODS = ("weighted_gaussian", "mad", "mad2r", "sips", "policy_gaussian", "policy_laplace", "greedy_update")


def query(name: str, table: str, max_items: int) -> str:
    if name == "floor":
        return FLOOR.format(t=table)
    cap = "" if name == "greedy_update" else f", max_items := {max_items}"
    return f"SELECT count(*) FROM dp_set_union_{name}('{table}', epsilon := 1.0, delta := 1e-5{cap})"


def bench_time(con, table: str, names: list[str], reps: int, max_items: int, before=None,
               texts: Optional[dict[str, str]] = None) -> dict:
    """``texts``: the SQL of each name, instead of :func:`query`'s (``bench_rounds_time.py``: split variants)."""
    sqls = {n: (con, texts[n] if texts is not None else query(n, table, max_items)) for n in names}
    if before is not None:
        for n in names[1:]:
            sqls[n + "@before"] = (before, query(n, table, max_items))
        names = list(sqls)
    for n in names:
        run_once(*sqls[n])  # warm-up: buffer pool, UDF and macro binding
    times = {n: [] for n in names}
    loads, others = [], []
    for r in range(reps):
        loads.append(os.getloadavg()[0])
        for n in names[r % len(names):] + names[:r % len(names)]:
            seconds, _, busy = run_once(*sqls[n])
            times[n].append(seconds)
            if busy is not None:
                others.append(busy)
    out = {}
    for n in names:
        row = dict(median=statistics.median(times[n]), min=min(times[n]), times=times[n])
        if "floor" in times:
            row["x_floor"] = row["median"] / statistics.median(times["floor"])
            row["x_floor_rounds"] = statistics.median(a / b for a, b in zip(times[n], times["floor"]))
        if "weighted_gaussian" in times:
            row["x_basic_rounds"] = statistics.median(a / b for a, b in zip(times[n], times["weighted_gaussian"]))
        out[n] = row
    return dict(methods=out, loads=loads, others_busy=others)


_CHILD = """
import resource, sys, time, duckdb
sys.path.insert(0, {root!r})
import dpsql
con = dpsql.connect({db!r}, read_only=True)
con.execute("SET enable_progress_bar = false")
{threads}
{before}
t0 = time.perf_counter()
con.execute({sql!r}).fetchall()
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def bench_memory(db: str, table: str, names: list[str], max_items: int, threads, before_sql=None) -> dict:
    out = {}
    runs = [(n, "") for n in names]
    if before_sql is not None:
        runs += [(n + "@before", f"con.execute({before_sql!r})") for n in names[1:]]
    for n, before in runs:
        code = _CHILD.format(root=str(HERE.parent), db=db, sql=query(n.split("@")[0], table, max_items),
                             threads=f"con.execute('SET threads = {threads}')" if threads else "", before=before)
        load = os.getloadavg()[0]
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        seconds, kib = done.stdout.split()[-2:]  # the last line: anything printed before is not ours
        out[n] = dict(seconds=float(seconds), peak_rss_mib=int(kib) / 1024, load=load)
        print(f"  {n:18s} {float(seconds):8.2f} s  peak RSS {int(kib) / 1024:8.0f} MiB  load {load:.2f}", flush=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Time (and optionally memory) of every set-union method against the floor.")
    ap.add_argument("--rows", type=int, nargs="+", default=[10_000_000, 50_000_000])
    ap.add_argument("--reps", type=int, default=5, help="measured rounds per size (default 5)")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods (default: %(default)s)")
    ap.add_argument("--db", default=str(HERE / "data" / "zipf.duckdb"), help="DuckDB file holding the tables")
    ap.add_argument("--item-type", choices=["BIGINT", "VARCHAR"], default="BIGINT")
    ap.add_argument("--max-items", type=int, default=100)
    ap.add_argument("--threads", type=int, help="DuckDB threads (default: DuckDB's default, one per core)")
    ap.add_argument("--before-sql", help="SQL file run on a second connection: every method also runs there")
    ap.add_argument("--memory", action="store_true", help="peak RSS of each query in a fresh child process instead")
    ap.add_argument("--json", help="also write the raw results to this JSON file")
    args = ap.parse_args(argv)

    info = machine_info()
    print(json.dumps(info))
    names = ["floor"] + [m for m in args.methods.split(",") if m]
    before_sql = Path(args.before_sql).read_text() if args.before_sql else None
    if before_sql is not None and sqltext.BODY_MARKER in before_sql:  # its bodies get their generated headers
        before_sql = sqltext.parse(before_sql, args.before_sql).sql
    results = []
    for rows in args.rows:
        table = ensure_table(args.db, rows, args.item_type)
        print(f"{table}: {rows:,} rows, item {args.item_type}", flush=True)
        if args.memory:
            results.append(dict(rows=rows, table=table, memory=bench_memory(args.db, table, names, args.max_items,
                                                                            args.threads, before_sql)))
            continue
        con = dpsql.connect(args.db, read_only=True)
        if args.threads:
            con.execute(f"SET threads = {args.threads}")
        before = None
        if before_sql is not None:
            before = dpsql.connect(args.db, read_only=True)
            if args.threads:
                before.execute(f"SET threads = {args.threads}")
            before.execute(before_sql)
        r = bench_time(con, table, names, args.reps, args.max_items, before)
        con.close()
        if before is not None:
            before.close()
        print(f"  load(1min) {min(r['loads']):.2f}-{max(r['loads']):.2f}, others' CPU {_pct(r['others_busy'])}")
        print(f"  {'query':26s} {'median s':>9s} {'min s':>8s} {'x floor':>8s} {'(rounds)':>9s} {'x Basic':>8s}")
        for n, m in r["methods"].items():
            print(f"  {n:26s} {m['median']:9.2f} {m['min']:8.2f} {m.get('x_floor', 0):8.2f} "
                  f"{m.get('x_floor_rounds', 0):9.2f} {m.get('x_basic_rounds', 0):8.2f}", flush=True)
        results.append(dict(rows=rows, table=table, **r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=info, item_type=args.item_type, results=results), f, indent=1)


if __name__ == "__main__":
    main()
