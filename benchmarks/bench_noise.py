"""Benchmark: noise samples per second per mode, numpy path and through the SQL UDFs (target: granular
numpy path >= 10M samples/s).

Modes: continuous Laplace / Gaussian (``dp_laplace_noise``, ``dp_gaussian_noise``) and granular Laplace /
Gaussian (``dp_granular_laplace_noise``, ``dp_granular_gaussian_noise``, default grid: 2^16..2^17 steps per
unit of scale). The numpy path is the body of each UDF without Arrow: parameter checks, the draw from a
private NoiseSource and, for granular modes, the scaling of the integer steps by the grid. The SQL path runs
``SELECT sum(<udf>(...)) FROM range(N)`` on a private connection (``range`` + ``sum`` alone is reported as the
floor). Modes are interleaved in every repetition; medians are reported. Run by hand:

    python benchmarks/bench_noise.py [--rows 10000000] [--reps 5]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Callable

import numpy as np

import dpsql
from dpsql import calibration, noise

SCALE = 1.0  # Laplace b and Gaussian sigma, in value units


def numpy_paths(src: noise.NoiseSource, n: int) -> dict[str, Callable[[], np.ndarray]]:
    """One callable per mode drawing n samples the way the UDF bodies do."""
    param = np.full(n, SCALE)
    g = calibration.default_granularity(SCALE)

    def granular(method: str) -> Callable[[], np.ndarray]:
        draw = getattr(src, method)

        def run() -> np.ndarray:
            p = noise._positive_vector("scale", param)
            grid = noise._granularity_vector(g, p.shape)
            return draw(p / grid) * grid

        return run

    return {
        "continuous Laplace": lambda: src.laplace(param),
        "continuous Gaussian": lambda: src.gaussian(param),
        "granular Laplace": granular("discrete_laplace"),
        "granular Gaussian": granular("discrete_gaussian"),
    }


SQL = {
    "floor (range + sum)": "SELECT sum(i::DOUBLE) FROM range({n}) r(i)",
    "continuous Laplace": "SELECT sum(dp_laplace_noise({s})) FROM range({n})",
    "continuous Gaussian": "SELECT sum(dp_gaussian_noise({s})) FROM range({n})",
    "granular Laplace": "SELECT sum(dp_granular_laplace_noise({s}, dp_granularity({s}))) FROM range({n})",
    "granular Gaussian": "SELECT sum(dp_granular_gaussian_noise({s}, dp_granularity({s}))) FROM range({n})",
}


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process). The numpy path is single-threaded, so on a machine
    shared with other jobs its CPU time is the better estimate of what an idle core would take."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    n = args.rows
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus; load before: {os.getloadavg()}; rows={n:,}")

    src = noise.secure_source()
    paths = numpy_paths(src, n)
    con = dpsql.connect()
    queries = {k: q.format(n=n, s=SCALE) for k, q in SQL.items()}
    for fn in paths.values():  # warm-up
        fn()
    np_times: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}
    sql_times: dict[str, list[tuple[float, float]]] = {k: [] for k in queries}
    for _ in range(args.reps):
        for k, fn in paths.items():
            np_times[k].append(timed(fn))
        for k, q in queries.items():
            sql_times[k].append(timed(lambda: con.execute(q).fetchall()))
    print(f"load after: {os.getloadavg()}")

    def rate(ts: list[tuple[float, float]], i: int) -> float:
        return n / statistics.median(t[i] for t in ts) / 1e6

    print("numpy path, M samples/s (median of reps): wall, per CPU second, best wall")
    for k, ts in np_times.items():
        print(f"  {k:22s} {rate(ts, 0):7.2f} {rate(ts, 1):7.2f} {n / min(t[0] for t in ts) / 1e6:7.2f}")
    print("SQL UDF, SELECT sum(noise) FROM range(N), M rows/s (median of reps): wall, best wall")
    for k, ts in sql_times.items():
        print(f"  {k:22s} {rate(ts, 0):7.2f} {n / min(t[0] for t in ts) / 1e6:7.2f}")


if __name__ == "__main__":
    main()
