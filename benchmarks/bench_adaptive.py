"""Benchmark: MAD and MAD2R against Basic (weighted Gaussian), and released items per method.

Part 1 -- speed. On synthetic Zipfian tables (``zipf_data.py``; by default ``t10m`` and ``t50m``
of ``benchmarks/data/zipf.duckdb``, generated when missing) three queries run on one private
connection, interleaved in a rotating order (B M R, M R B, R B M, ...), after one unmeasured
warm-up run of each::

    SELECT count(*) FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, max_items := 100)
    SELECT count(*) FROM dp_set_union_mad('t', ...)      -- max_adaptive_degree 50, beta 2
    SELECT count(*) FROM dp_set_union_mad2r('t', ...)    -- split [0.1, 0.9], b_min 0.5, b_max 2, c_lb 1, c_ub 3

Each computes its whole release inside DuckDB (every item's weight and noise) and returns one
row. The report gives the median wall time of each, the ratios of the medians and the medians
of the per-round ratios (each MAD / MAD2R run divided by the Basic run of the same round, robust
to the machine's speed drifting), against the targets MAD/Basic <= 2.0 and MAD2R/Basic <= 3.0,
with the 1-minute load average and the share of the cores other processes kept busy.

Part 2 -- utility. Mean and standard deviation over ``--real-runs`` private runs of the number
of released items of every parallel set-union method (count_*, weighted_*, mad, mad2r, sips with
the splits [0.1, 0.9] and [0.05, 0.15, 0.8]) on each dataset of ../shared/data (or
$DPSQL_SHARED_DATA) at (1, 1e-5, 100).

    python benchmarks/bench_adaptive.py --rows 10000000 50000000 --reps 5 --real-runs 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing

import dpsql  # noqa: E402

sys.path.insert(0, str(HERE))
import zipf_data  # noqa: E402
from bench_set_union import _pct, machine_info, run_once  # noqa: E402  (shared measuring helpers)

EPS, DELTA, MAX_ITEMS = 1.0, 1e-5, 100
SPEED = {
    "basic": "SELECT count(*) FROM dp_set_union_weighted_gaussian('{t}', epsilon := 1.0, delta := 1e-5, max_items := 100)",
    "mad": "SELECT count(*) FROM dp_set_union_mad('{t}', epsilon := 1.0, delta := 1e-5, max_items := 100)",
    "mad2r": "SELECT count(*) FROM dp_set_union_mad2r('{t}', epsilon := 1.0, delta := 1e-5, max_items := 100)",
}
TARGETS = {"mad": 2.0, "mad2r": 3.0}
UTILITY = [  # (label, SQL of the release)
    ("count_laplace", "dp_set_union_count_laplace('t', epsilon := 1.0, delta := 1e-5)"),
    ("count_gaussian", "dp_set_union_count_gaussian('t', epsilon := 1.0, delta := 1e-5)"),
    ("weighted_laplace", "dp_set_union_weighted_laplace('t', epsilon := 1.0, delta := 1e-5)"),
    ("weighted_gaussian (Basic)", "dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5)"),
    ("mad", "dp_set_union_mad('t', epsilon := 1.0, delta := 1e-5)"),
    ("mad2r", "dp_set_union_mad2r('t', epsilon := 1.0, delta := 1e-5)"),
    ("sips [0.1, 0.9]", "dp_set_union_sips('t', epsilon := 1.0, delta := 1e-5)"),
    ("sips [0.05, 0.15, 0.8]", "dp_set_union_sips('t', epsilon := 1.0, delta := 1e-5, split := [0.05, 0.15, 0.8])"),
]
DATASETS = {
    "AskReddit unigrams (1 %)": "reddit_askreddit_1pct/unigrams.parquet",
    "AskReddit bigrams (1 %)": "reddit_askreddit_1pct/bigrams.parquet",
    "health news tweets": "health_news_tweets/tweet_tokens.parquet",
    "Debian descriptions": "debian_bookworm_descriptions/package_description_tokens.parquet",
}


def table_name(rows: int) -> str:
    return f"t{rows // 1_000_000}m" if rows % 1_000_000 == 0 else f"t{rows}"


def ensure_table(db: str, rows: int) -> str:
    """The table of ``rows`` rows in ``db`` (zipf_data defaults), generated if missing."""
    name = table_name(rows)
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(db, read_only=True)
        exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()[0]
        con.close()
    except duckdb.IOException:  # the file does not exist yet
        exists = 0
    if not exists:
        con = duckdb.connect(db)
        try:
            print(f"generating {name} ({rows} rows) ...", flush=True)
            zipf_data.generate(con, name, rows)
        finally:
            con.close()
    return name


def bench_speed(con, table: str, reps: int) -> dict:
    names = list(SPEED)
    sql = {k: v.format(t=table) for k, v in SPEED.items()}
    for k in names:  # warm-up: buffer pool, UDF and macro binding
        run_once(con, sql[k])
    times = {k: [] for k in names}
    released = {k: [] for k in names}
    loads, others = [], []
    for i in range(reps):
        loads.append(os.getloadavg()[0])
        order = names[i % len(names):] + names[:i % len(names)]
        for k in order:
            seconds, rows, busy = run_once(con, sql[k])
            n = rows[0][0]
            times[k].append(seconds)
            released[k].append(n)
            if busy is not None:
                others.append(busy)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"table": table, "reps": reps, "times": times, "released": released, "loads": loads,
           "others_busy": others, "median": med}
    for k in TARGETS:
        out[f"{k}_ratio_of_medians"] = med[k] / med["basic"]
        out[f"{k}_ratio_per_round"] = statistics.median(a / b for a, b in zip(times[k], times["basic"]))
    return out


def bench_utility(data_dir: Path, runs: int) -> list[dict]:
    rows = []
    con = dpsql.connect()
    try:
        for name, rel in DATASETS.items():
            path = data_dir / rel
            if not path.exists():
                continue
            con.execute(f"CREATE OR REPLACE VIEW t AS SELECT user_id, item FROM read_parquet('{path}')")
            row = {"dataset": name}
            for label, call in UTILITY:
                counts = [con.execute(f"SELECT count(*) FROM {call}").fetchall()[0][0] for _ in range(runs)]
                row[label] = (statistics.mean(counts), statistics.stdev(counts) if runs > 1 else 0.0)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        con.close()
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Time MAD and MAD2R against Basic; count released items per method.")
    ap.add_argument("--rows", type=int, nargs="*", default=[10_000_000, 50_000_000])
    ap.add_argument("--reps", type=int, default=5, help="measured rounds (one run of each method) per size")
    ap.add_argument("--db", default=str(HERE / "data" / "zipf.duckdb"), help="DuckDB file holding the tables")
    ap.add_argument("--threads", type=int, help="DuckDB threads (default: one per core)")
    ap.add_argument("--real-runs", type=int, default=5, help="runs per method and dataset (0: skip part 2)")
    ap.add_argument("--data", help="folder of the real datasets (default: ../shared/data or $DPSQL_SHARED_DATA)")
    ap.add_argument("--json", help="also write the raw results to this JSON file")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    info = machine_info()
    print(json.dumps(info), flush=True)
    results: dict = {"machine": info, "speed": [], "utility": []}
    if args.rows:
        tables = [ensure_table(args.db, rows) for rows in args.rows]
        con = dpsql.connect(args.db, read_only=True)
        if args.threads:
            con.execute(f"SET threads = {args.threads}")
        threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
        print(f"threads: {threads}; reps: {args.reps}", flush=True)
        print("| rows | Basic median s | MAD median s | MAD2R median s | MAD/Basic (per round) | "
              "MAD2R/Basic (per round) | released B / M / R | load (1 min) | others' CPU |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for rows, t in zip(args.rows, tables):
            r = bench_speed(con, t, args.reps)
            r.update(rows=rows, threads=threads)
            results["speed"].append(r)
            m = r["median"]
            rel = " / ".join(f"{statistics.median(r['released'][k]):.0f}" for k in SPEED)
            print(f"| {rows:,} | {m['basic']:.2f} | {m['mad']:.2f} | {m['mad2r']:.2f} | "
                  f"{r['mad_ratio_of_medians']:.2f} ({r['mad_ratio_per_round']:.2f}) | "
                  f"{r['mad2r_ratio_of_medians']:.2f} ({r['mad2r_ratio_per_round']:.2f}) | {rel} | "
                  f"{statistics.median(r['loads']):.1f} | {_pct(r['others_busy'])} |", flush=True)
            for k, target in TARGETS.items():
                verdict = "meets" if r[f"{k}_ratio_of_medians"] <= target else "MISSES"
                print(f"  {k}/basic = {r[f'{k}_ratio_of_medians']:.2f} {verdict} the target <= {target}",
                      flush=True)
        con.close()

    if args.real_runs > 0:
        data_dir = Path(args.data or os.environ.get("DPSQL_SHARED_DATA") or HERE.parent.parent / "shared" / "data")
        if data_dir.is_dir():
            rows = bench_utility(data_dir, args.real_runs)
            results["utility"] = rows
            labels = [label for label, _ in UTILITY]
            print(f"\nReleased items, mean ± sd of {args.real_runs} private runs, (epsilon, delta, max_items) = "
                  f"({EPS:g}, {DELTA:g}, {MAX_ITEMS}):\n")
            print("| dataset | " + " | ".join(labels) + " |")
            print("|---|" + "---:|" * len(labels))
            for row in rows:
                print(f"| {row['dataset']} | " + " | ".join(f"{row[l][0]:,.1f} ± {row[l][1]:.1f}" for l in labels)
                      + " |")
        else:
            print(f"no real datasets at {data_dir}: part 2 skipped")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
