"""Benchmark: dp_set_union_weighted_gaussian against the cost floor of any set union.

Two queries run on the same connection, interleaved (A, B, A, B, ...), after
one unmeasured warm-up run of each:

* **macro** -- the mechanism, whose final result is the released items::

      SELECT count(*) FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := 100)

* **floor** -- what any user-level set union has to do at least: distinct
  (user, item) pairs, then one group per item::

      SELECT count(*), sum(n) FROM (SELECT item, count(*) AS n
                                    FROM (SELECT DISTINCT user_id, item FROM t) GROUP BY item)

Both sides compute their whole final result inside DuckDB and return one row:
the macro must compute every item's weight and noise to decide which items
pass (the ``count(*)`` cannot skip any of it: the noise UDF has side
effects), and the floor's ``sum(n)`` keeps the per-item count alive, so the
optimiser cannot drop it and reduce the floor to ``SELECT DISTINCT item``.
Fetching the results into Python instead would charge the floor for
transferring every distinct item (millions of rows) and the macro only for
the few thousand released items, which would measure the client, not the
engine.

The table lives in a persistent DuckDB database file (generated on first use
by ``zipf_data.py``, default ``benchmarks/data/zipf.duckdb``), opened read-only;
after the warm-up its blocks are in DuckDB's buffer pool, so the runs measure
computation, not disk reads. ``--in-memory`` copies the table into an
in-memory database first.

The report gives, per table size, the median and the minimum wall time of
each side, the ratio of the medians (macro / floor), the median of the
per-pair ratios (each macro run divided by the floor run next to it, which
is robust to the machine's speed drifting during the run), and the 1-minute
load average seen before each pair.

    python benchmarks/bench_set_union.py --rows 10000000 50000000 --reps 7
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

import duckdb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing

import dpsql  # noqa: E402

sys.path.insert(0, str(HERE))
import zipf_data  # noqa: E402

MACRO = ("SELECT count(*) FROM dp_set_union_weighted_gaussian('{t}', epsilon := 1.0, delta := 1e-5, "
         "max_items := {m})")
FLOOR = ("SELECT count(*), sum(n) FROM (SELECT item, count(*) AS n "
         "FROM (SELECT DISTINCT user_id, item FROM {t}) GROUP BY item)")


def machine_info() -> dict:
    info = {"nproc": os.cpu_count(), "python": platform.python_version(), "duckdb": duckdb.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        with open("/proc/meminfo") as f:
            kb = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
        info["ram_gib"] = round(kb / 2 ** 20, 1)
    except (OSError, StopIteration):
        pass
    return info


def table_name(rows: int, item_type: str) -> str:
    name = f"t{rows // 1_000_000}m" if rows % 1_000_000 == 0 else f"t{rows}"
    return name + ("_str" if item_type == "VARCHAR" else "")


def ensure_table(db: str, rows: int, item_type: str) -> str:
    """Create the table in ``db`` unless it is already there; return its name."""
    name = table_name(rows, item_type)
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(db)
    try:
        exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()[0]
        if not exists:
            print(f"generating {name} ({rows} rows, item {item_type}) ...", flush=True)
            t0 = time.perf_counter()
            zipf_data.generate(con, name, rows, item_type=item_type)
            print(f"  done in {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        con.close()
    return name


def _cpu_busy_seconds() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all cores, steal included), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_once(con, sql: str):
    """Wall seconds, result, and the share of the machine's cores other processes kept busy meanwhile."""
    busy0, own0 = _cpu_busy_seconds(), sum(os.times()[:2])
    t0 = time.perf_counter()
    result = con.execute(sql).fetchall()
    seconds = time.perf_counter() - t0
    busy1, own1 = _cpu_busy_seconds(), sum(os.times()[:2])
    others = None
    if busy0 is not None:
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (seconds * (os.cpu_count() or 1))
    return seconds, result, others


def bench(con, table: str, reps: int, max_items: int) -> dict:
    macro, floor = MACRO.format(t=table, m=max_items), FLOOR.format(t=table)
    run_once(con, macro)  # warm-up: buffer pool, UDF and macro binding
    _, floor_result, _ = run_once(con, floor)
    m_times, f_times, loads, others, released = [], [], [], [], []
    for i in range(reps):
        loads.append(os.getloadavg()[0])
        # alternate which side goes first so neither always runs on a "warmer" machine
        order = (("macro", macro), ("floor", floor)) if i % 2 == 0 else (("floor", floor), ("macro", macro))
        for side, sql in order:
            seconds, result, busy = run_once(con, sql)
            if busy is not None:
                others.append(busy)
            if side == "macro":
                m_times.append(seconds)
                released.append(result[0][0])
            else:
                f_times.append(seconds)
    pair = [m / f for m, f in zip(m_times, f_times)]
    return dict(table=table, reps=reps, macro=m_times, floor=f_times, loads=loads, others_busy=others,
                macro_median=statistics.median(m_times), macro_min=min(m_times),
                floor_median=statistics.median(f_times), floor_min=min(f_times),
                ratio_median=statistics.median(m_times) / statistics.median(f_times),
                ratio_min=min(m_times) / min(f_times), ratio_pairs_median=statistics.median(pair),
                distinct_items=floor_result[0][0], distinct_pairs=floor_result[0][1],
                released_median=statistics.median(released))


def _pct(values) -> str:
    if not values:
        return "n/a"
    return f"{100 * statistics.median(values):.0f}% (max {100 * max(values):.0f}%)"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Time dp_set_union_weighted_gaussian against the DISTINCT/GROUP BY floor.")
    ap.add_argument("--rows", type=int, nargs="+", default=[10_000_000, 50_000_000])
    ap.add_argument("--reps", type=int, default=7, help="measured A/B pairs per size (default 7)")
    ap.add_argument("--db", default=str(HERE / "data" / "zipf.duckdb"), help="DuckDB file holding the tables")
    ap.add_argument("--item-type", choices=["BIGINT", "VARCHAR"], default="BIGINT")
    ap.add_argument("--max-items", type=int, default=100)
    ap.add_argument("--threads", type=int, help="DuckDB threads (default: DuckDB's default, one per core)")
    ap.add_argument("--in-memory", action="store_true", help="copy each table into an in-memory database first")
    ap.add_argument("--json", help="also write the raw results to this JSON file")
    args = ap.parse_args(argv)

    info = machine_info()
    print(json.dumps(info))
    tables = [ensure_table(args.db, rows, args.item_type) for rows in args.rows]
    if args.in_memory:
        con = dpsql.connect()
        con.execute(f"ATTACH '{args.db}' AS src (READ_ONLY)")
        for t in tables:
            con.execute(f"CREATE TABLE {t} AS FROM src.{t}")
        con.execute("DETACH src")
    else:
        con = dpsql.connect(args.db, read_only=True)
    if args.threads:
        con.execute(f"SET threads = {args.threads}")
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    storage = "in-memory table" if args.in_memory else "persistent DuckDB file"
    print(f"storage: {storage}; threads: {threads}; item type: {args.item_type}; max_items: {args.max_items}")

    results = []
    header = (f"{'rows':>12} {'floor med':>10} {'floor min':>10} {'macro med':>10} {'macro min':>10} "
              f"{'ratio med':>10} {'ratio min':>10} {'pair ratio':>10}  load(1min)  others' CPU")
    print(header)
    for rows, t in zip(args.rows, tables):
        r = bench(con, t, args.reps, args.max_items)
        r.update(rows=rows, storage=storage, threads=threads, item_type=args.item_type)
        results.append(r)
        print(f"{rows:>12,} {r['floor_median']:>10.3f} {r['floor_min']:>10.3f} {r['macro_median']:>10.3f} "
              f"{r['macro_min']:>10.3f} {r['ratio_median']:>10.2f} {r['ratio_min']:>10.2f} "
              f"{r['ratio_pairs_median']:>10.2f}  {min(r['loads']):.2f}-{max(r['loads']):.2f}  "
              f"{_pct(r['others_busy'])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=info, results=results), f, indent=1)
    con.close()


if __name__ == "__main__":
    main()
