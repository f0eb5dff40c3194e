"""Out-of-core run: the parallel mechanisms on a table larger than DuckDB's memory limit.

Each mechanism runs in its own child process on the same DuckDB file, with
``memory_limit`` below the table's size so that joins, aggregates and windows
spill to ``temp_directory``. Reported per mechanism: wall time, the child's peak
resident memory (``ru_maxrss``), the peak size of the temp directory (polled
every 0.5 s) and the number of released items.

Generate the data once (1 billion rows take a while; ``order='user'`` avoids
a sort of the whole table)::

    python benchmarks/bench_out_of_core.py generate --db big.duckdb --rows 1000000000
    python benchmarks/bench_out_of_core.py run --db big.duckdb --memory-limit 8GB --temp-dir spill/

The run is not a test: it takes about 70 minutes at 10^9 rows on 2 cores. The
releases are charged to an in-memory ledger (the benchmark's releases are not
publications).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# (label, SQL over table {t}); the top-k domain step is dp_set_union with top-k's default domain
# method at (epsilon/2, delta/2), which is what dp_top_k runs first.
MECHANISMS = {
    "count_gaussian": "SELECT count(*) FROM dp_set_union('{t}', method := 'count_gaussian', epsilon := 1.0, delta := 1e-5)",
    "weighted_gaussian": "SELECT count(*) FROM dp_set_union('{t}', method := 'weighted_gaussian', epsilon := 1.0, delta := 1e-5)",
    "weighted_laplace": "SELECT count(*) FROM dp_set_union('{t}', method := 'weighted_laplace', epsilon := 1.0, delta := 1e-5)",
    "mad": "SELECT count(*) FROM dp_set_union('{t}', method := 'mad', epsilon := 1.0, delta := 1e-5)",
    "mad2r": "SELECT count(*) FROM dp_set_union('{t}', method := 'mad2r', epsilon := 1.0, delta := 1e-5)",
    "sips": "SELECT count(*) FROM dp_set_union('{t}', method := 'sips', epsilon := 1.0, delta := 1e-5)",
    "sips_cumulative": "SELECT count(*) FROM dp_set_union('{t}', method := 'sips_cumulative', epsilon := 1.0, delta := 1e-5)",
    "top_k": "SELECT count(*) FROM dp_top_k('{t}', 100, epsilon := 1.0, delta := 1e-5)",
}


def _dir_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # a spill file removed while we looked
                pass
    return total


def child(db: str, table: str, mechanism: str, memory_limit: str, temp_dir: str, threads: int) -> dict:
    """Run one mechanism in this process and return its measurements."""
    import duckdb
    import dpsql
    from dpsql.core.ledger import Ledger

    con = duckdb.connect(db, read_only=True, config={"memory_limit": memory_limit, "temp_directory": temp_dir,
                                                     "threads": threads, "preserve_insertion_order": False})
    dpsql.register(con, ledger=Ledger(None))
    peak_temp = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak_temp[0] = max(peak_temp[0], _dir_size(Path(temp_dir)))
            done.wait(0.5)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    started = time.perf_counter()
    error = None
    try:
        (released,) = con.execute(MECHANISMS[mechanism].format(t=table)).fetchall()[0]
    except duckdb.Error as exc:  # out of memory or disk: reported, not hidden
        released, error = None, str(exc).splitlines()[0]
    seconds = time.perf_counter() - started
    done.set()
    watcher.join()
    return {"mechanism": mechanism, "seconds": round(seconds, 1), "released": released, "error": error,
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "peak_temp_gb": round(peak_temp[0] / 2**30, 2)}


def cmd_generate(args: argparse.Namespace) -> None:
    import duckdb
    from zipf_data import describe, generate

    con = duckdb.connect(args.db, config={"memory_limit": args.memory_limit, "threads": args.threads,
                                          "preserve_insertion_order": False})
    started = time.perf_counter()
    generate(con, args.table, args.rows, order="user")
    summary = {"rows": args.rows, "seconds": round(time.perf_counter() - started, 1),
               "db_gb": round(os.path.getsize(args.db) / 2**30, 2)}
    if args.describe:  # distinct pairs, users over the cap, ...: a full extra pass with a DISTINCT
        summary.update(describe(con, args.table))
    print(json.dumps(summary))


def cmd_run(args: argparse.Namespace) -> None:
    temp = Path(args.temp_dir)
    results = []
    for mechanism in args.mechanisms:
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir(parents=True)
        done = subprocess.run([sys.executable, __file__, "child", "--db", args.db, "--table", args.table,
                               "--mechanism", mechanism, "--memory-limit", args.memory_limit,
                               "--temp-dir", str(temp), "--threads", str(args.threads)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            row = {"mechanism": mechanism, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        else:
            row = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(row)
        print(json.dumps(row), flush=True)
    shutil.rmtree(temp, ignore_errors=True)
    print("\n| mechanism | time (s) | peak RSS (GB) | peak temp (GB) | released | error |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mechanism']} | {r.get('seconds', '')} | {r.get('peak_rss_gb', '')} | "
              f"{r.get('peak_temp_gb', '')} | {r.get('released', '')} | {r.get('error') or ''} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("generate", "run", "child"):
        p = sub.add_parser(name)
        p.add_argument("--db", required=True)
        p.add_argument("--table", default="t")
        p.add_argument("--memory-limit", default="8GB")
        p.add_argument("--threads", type=int, default=2)
        if name == "generate":
            p.add_argument("--rows", type=int, default=1_000_000_000)
            p.add_argument("--describe", action="store_true", help="also print the data's summary statistics")
        if name in ("run", "child"):
            p.add_argument("--temp-dir", default="spill")
        if name == "run":
            p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
        if name == "child":
            p.add_argument("--mechanism", required=True, choices=list(MECHANISMS))
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        cmd_generate(args)
    elif args.cmd == "run":
        cmd_run(args)
    else:
        print(json.dumps(child(args.db, args.table, args.mechanism, args.memory_limit, args.temp_dir, args.threads)))


if __name__ == "__main__":
    main()
