"""Benchmark of the sequential policy macros (Policy Gaussian / Laplace, GreedyUpdate).

End to end (SQL call to result) against the Basic macro (``dp_set_union_weighted_gaussian``) on
the same connection, A/B interleaved in one process, for each kernel (numba, python). The time
inside the policy loop is measured by wrapping ``dpsql.union.policy.run_policy``; "entries/s" is
capped entries x passes / loop time. Peak memory (``--memory``) runs every configuration once in
a fresh subprocess and reports its maximum RSS (engine + Python) and the tracemalloc peak of the
Python side (the CSR, the histogram, the noise).

Data: the tables ``t10m``/``t50m`` of ``benchmarks/data/zipf.duckdb`` (made by
``benchmarks/zipf_data.py``; generated here if missing) and the Debian package descriptions of
``../shared/data`` (or ``$DPSQL_SHARED_DATA``), skipped when absent.

    python benchmarks/bench_policy.py --datasets zipf10m,debian --reps 3
    python benchmarks/bench_policy.py --datasets zipf50m --reps 1 --kernels numba --memory
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ZIPF_DB = HERE / "data" / "zipf.duckdb"
ZIPF_ROWS = {"zipf10m": ("t10m", 10_000_000), "zipf50m": ("t50m", 50_000_000)}
MAX_ITEMS, EPSILON, DELTA = 100, 1.0, 1e-5


def shared_data() -> Path | None:
    env = os.environ.get("DPSQL_SHARED_DATA")
    for path in ([Path(env)] if env else []) + [HERE.parents[1] / "shared" / "data"]:
        if path.is_dir():
            return path
    return None


def ensure_zipf(table: str, rows: int) -> None:
    """Create ``table`` in benchmarks/data/zipf.duckdb with benchmarks/zipf_data.py if it is missing."""
    import duckdb

    ZIPF_DB.parent.mkdir(exist_ok=True)
    if ZIPF_DB.exists():
        con = duckdb.connect(str(ZIPF_DB), read_only=True)
        try:
            if con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [table]).fetchall()[0][0]:
                return
        finally:
            con.close()
    con = duckdb.connect(str(ZIPF_DB))
    try:
        sys.path.insert(0, str(HERE))
        from zipf_data import generate

        print(f"generating {table} ({rows:,} rows) ...", file=sys.stderr, flush=True)
        generate(con, table, rows)
    finally:
        con.close()


def open_dataset(name: str):
    """A private dpsql connection with a view ``t`` over the dataset, or None if it is absent."""
    import dpsql

    con = dpsql.connect()
    if name in ZIPF_ROWS:
        table, rows = ZIPF_ROWS[name]
        ensure_zipf(table, rows)
        con.execute(f"ATTACH '{ZIPF_DB}' AS z (READ_ONLY)")
        con.execute(f"CREATE VIEW t AS SELECT user_id, item FROM z.{table}")
    elif name == "debian":
        root = shared_data()
        if root is None:
            con.close()
            return None
        path = root / "debian_bookworm_descriptions" / "package_description_tokens.parquet"
        con.execute(f"CREATE TABLE t AS SELECT user_id, item FROM read_parquet('{path}')")
    else:
        raise SystemExit(f"unknown dataset {name!r}")
    return con


class KernelTimer:
    """Wrap dpsql.union.policy.run_policy to time the policy loop of each macro call."""

    def __init__(self):
        from dpsql.union import policy

        self.policy = policy
        self.real = policy.run_policy
        self.last = None
        self.other = 0.0  # CSR building and the release, also inside the UDF
        policy.run_policy = self
        for name in ("csr_from_keys", "fill_order", "release"):
            setattr(policy, name, self._timed(getattr(policy, name)))

    def _timed(self, fn):
        def wrapper(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.other += time.perf_counter() - t0
        return wrapper

    def __call__(self, kind, indptr, indices, n_items, gamma, passes=1, **kw):
        t0 = time.perf_counter()
        h = self.real(kind, indptr, indices, n_items, gamma, passes, **kw)
        self.last = (time.perf_counter() - t0, len(indices) * passes, self)
        return h


def run_once(con, method: str, kernel: str, timer: KernelTimer):
    from dpsql.union import policy

    policy.KERNEL = kernel
    timer.last = None
    timer.other = 0.0
    t0 = time.perf_counter()
    if method == "basic":
        n = len(con.execute(f"SELECT item FROM dp_set_union_weighted_gaussian('t', epsilon := {EPSILON}, "
                            f"delta := {DELTA}, max_items := {MAX_ITEMS})").fetchall())
    elif method == "greedy_update":
        n = len(con.execute(f"SELECT item FROM dp_set_union_greedy_update('t', epsilon := {EPSILON}, "
                            f"delta := {DELTA})").fetchall())
    else:
        n = len(con.execute(f"SELECT item FROM dp_set_union_{method}('t', epsilon := {EPSILON}, "
                            f"delta := {DELTA}, max_items := {MAX_ITEMS})").fetchall())
    loop = timer.last and (timer.last[0], timer.last[1], timer.other)
    return time.perf_counter() - t0, n, loop


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def single(dataset: str, method: str, kernel: str) -> dict:
    """A warm-up run, then one measured run in this process (for --memory): the peak RSS of the
    process during it (sampled every 20 ms; engine + Python) and, for the numba kernel, the
    tracemalloc peak of the Python side (it would slow the pure-Python kernel down several times)."""
    con = open_dataset(dataset)
    timer = KernelTimer()
    run_once(con, method, kernel, timer)  # warm-up (compiled kernel, file cache), same for every method
    before = _rss_mib()
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.wait(0.02):
            peak[0] = max(peak[0], _rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    traced = kernel == "numba"
    if traced:
        tracemalloc.start()
    total, n, loop = run_once(con, method, kernel, timer)
    py_peak = tracemalloc.get_traced_memory()[1] if traced else None
    if traced:
        tracemalloc.stop()
    done.set()
    sampler.join()
    con.close()
    return {"dataset": dataset, "method": method, "kernel": kernel, "seconds": round(total, 2), "released": n,
            "entries": loop[1] if loop else None, "rss_before_mib": round(before),
            "rss_peak_mib": round(peak[0]),
            "python_peak_mib": None if py_peak is None else round(py_peak / 2 ** 20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="zipf10m,debian")
    ap.add_argument("--methods", default="policy_gaussian,policy_laplace")
    ap.add_argument("--kernels", default="numba,python")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--memory", action="store_true", help="also measure peak memory in subprocesses")
    ap.add_argument("--single", nargs=3, metavar=("DATASET", "METHOD", "KERNEL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    if args.single:
        print(json.dumps(single(*args.single)))
        return

    from dpsql.union import policy

    kernels = [k for k in args.kernels.split(",") if k != "numba" or policy.numba_available()]
    methods = args.methods.split(",")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  load: {os.getloadavg()}  cpus: {os.cpu_count()}")
    print("| dataset | method | kernel | runs | macro s (median) | x Basic | capped entries | loop s | "
          "entries/s in loop | CSR+release s | released |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for dataset in args.datasets.split(","):
        con = open_dataset(dataset)
        if con is None:
            print(f"| {dataset} | skipped: data absent |")
            continue
        timer = KernelTimer()
        # Warm-up: compile/load the numba kernel and the file cache outside the timed runs.
        run_once(con, "policy_gaussian", kernels[0], timer)
        runs: dict = {}
        for _ in range(args.reps):
            configs = [("basic", "-")] + [(m, k) for m in methods for k in kernels]
            for method, kernel in configs:  # interleaved A/B
                runs.setdefault((method, kernel), []).append(run_once(con, method, kernel, timer))
        basic = sorted(r[0] for r in runs[("basic", "-")])[len(runs[("basic", "-")]) // 2]
        for (method, kernel), rs in runs.items():
            med = sorted(rs, key=lambda r: r[0])[len(rs) // 2]
            loop = med[2]
            loop_s = f"{loop[0]:.2f}" if loop else "-"
            rate = f"{loop[1] / loop[0] / 1e6:.1f} M" if loop else "-"
            entries = f"{loop[1]:,}" if loop else "-"
            other = f"{loop[2]:.2f}" if loop else "-"
            print(f"| {dataset} | {method} | {kernel} | {len(rs)} | {med[0]:.2f} | {med[0] / basic:.2f} | "
                  f"{entries} | {loop_s} | {rate} | {other} | {med[1]} |", flush=True)
        con.close()
        if args.memory:
            for method, kernel in [("basic", "-")] + [(m, k) for m in methods for k in kernels]:
                out = subprocess.run([sys.executable, __file__, "--single", dataset, method, kernel],
                                     capture_output=True, text=True, check=True)
                print("memory:", out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
